"""The viewer's data layer: what each page shows, computed from tracer's public readers.

Nothing here imports Streamlit, so the benchmark and tests call these
functions directly; ``viewer/app.py`` wraps them in Streamlit caches.

Everything is read with column projection (only the columns a view needs are
decompressed) and, where the step is known, step filtering. Trajectory lists
stay Arrow tables: filtering, sorting and paging happen in Arrow and only one
page becomes Python objects.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer

# Column names come from tracer's schema, never spelled here. Unpacking fails
# at import time if tracer's format changes, which is the point.
(
    TRACE_ID,
    SPAN_ID,
    PARENT_SPAN_ID,
    NAME,
    KIND,
    START_NS,
    END_NS,
    STATUS,
    ERROR,
    STEP,
    SAMPLE_INDEX,
    ROLLOUT_N,
    VALIDATE,
    REWARD,
    INPUTS,
    OUTPUTS,
    ATTRIBUTES,
) = tracer.SPAN_COLUMNS
(
    _T_TRACE_ID,
    _T_NAME,
    _T_STEP,
    _T_SAMPLE_INDEX,
    _T_ROLLOUT_N,
    _T_VALIDATE,
    _T_REWARD,
    REWARD_INFO,
    _T_STATUS,
    _T_START_NS,
    _T_END_NS,
    NUM_SPANS,
    NUM_LLM_CALLS,
    NUM_TOOL_CALLS,
    NUM_TOOL_ERRORS,
    NUM_ERRORS,
) = tracer.TRAJECTORY_COLUMNS

# Values of the kind and status columns and attribute keys, from tracer's schema.
KIND_ROLLOUT = tracer.schema.KIND_ROLLOUT
KIND_LLM = tracer.schema.KIND_LLM
KIND_TOOL = tracer.schema.KIND_TOOL
KIND_REWARD = tracer.schema.KIND_REWARD
STATUS_OK = tracer.schema.STATUS_OK
STATUS_ERROR = tracer.schema.STATUS_ERROR
ATTR_TRUNCATED = tracer.schema.ATTR_TRUNCATED
ATTR_TOKENS = tracer.schema.ATTR_TOKENS
#: Name of the span tracer.log_reward writes.
REWARD_SPAN_NAME = tracer.schema.REWARD_SPAN_NAME
#: Key of the advantage in log_reward's extras (``reward_info``).
ADVANTAGE = "advantage"

# Columns the viewer adds to the trajectory table.
ADVANTAGE_COL = "advantage"
LATENCY_COL = "latency_s"
TOOLS_COL = "tools"
FILE_COL = "file"

#: Columns of the span table used by the waterfall, without the heavy JSON ones.
LIGHT_SPAN_COLUMNS = [TRACE_ID, SPAN_ID, PARENT_SPAN_ID, NAME, KIND, START_NS, END_NS, STATUS, STEP]

#: Sort keys the list offers: label -> column.
SORT_COLUMNS = {
    "step": STEP,
    "sample": SAMPLE_INDEX,
    "rollout": ROLLOUT_N,
    "reward": REWARD,
    "advantage": ADVANTAGE_COL,
    "turns": NUM_LLM_CALLS,
    "tool calls": NUM_TOOL_CALLS,
    "tool errors": NUM_TOOL_ERRORS,
    "latency": LATENCY_COL,
    "start time": START_NS,
}


class ViewerPathError(ValueError):
    """The trace path is missing, or holds no trace files; the message says how to fix it."""


def resolve_path(query_path: str | None, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The trace path: the ``path`` query parameter, else the first script argument, else ``ROLLOUT_TRACE_DIR``."""
    environ: Mapping[str, str] = os.environ if env is None else env
    for candidate in (query_path, argv[0] if argv else None, environ.get(tracer.ENV_TRACE_DIR)):
        if candidate:
            return os.path.expanduser(str(candidate))
    return None


def file_signature(path: str) -> tuple[tuple[str, int, int], ...]:
    """(file, size, mtime) of every trace file under ``path``: the cache key of what was read.

    A run still being written gets a new signature when a file grows, so
    cached views refresh.

    Raises:
        ViewerPathError: the path does not exist or holds no trace files.
    """
    try:
        files = tracer.list_trace_files(path)
    except FileNotFoundError as exc:
        raise ViewerPathError(
            f"{exc}. Pass a trace directory: rollout-trace view DIR, ?path=DIR or ROLLOUT_TRACE_DIR=DIR"
        ) from None
    if not files:
        raise ViewerPathError(
            f"no trace files (*.arrow) under {path!r}. Record a run with tracer.init(backend='arrow', "
            f"output_dir=...) and point the viewer at that output_dir."
        )
    sig = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        sig.append((f, st.st_size, st.st_mtime_ns))
    return tuple(sig)


def run_dirs(sig: Sequence[tuple[str, int, int]]) -> list[str]:
    """The directories holding trace files (one per recorded run), newest first by file mtime."""
    newest: dict[str, int] = {}
    for file, _, mtime in sig:
        d = os.path.dirname(file)
        newest[d] = max(newest.get(d, 0), mtime)
    return sorted(newest, key=lambda d: (-newest[d], d))


@dataclass
class Loaded:
    """A table read from trace files, with the readers' warnings about damaged files."""

    table: pa.Table
    warnings: list[str] = field(default_factory=list)


def _reading(fn: Any, *args: Any, **kwargs: Any) -> Loaded:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tracer.TraceFileWarning)
        table = fn(*args, **kwargs)
    msgs = [str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning)]
    return Loaded(table, list(dict.fromkeys(msgs)))


def _json_number(text: str | None, key: str) -> float | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        v = value.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


#: The advantage's number in reward_info's JSON (orjson writes it compactly; spaces allowed).
_ADVANTAGE_RE = r'"advantage"\s*:\s*(?P<v>-?[0-9][0-9.eE+-]*)'


def advantages(reward_info: pa.ChunkedArray) -> pa.ChunkedArray:
    """The ``advantage`` number of each reward_info JSON text, null where absent.

    Vectorised (a regex over the column, no JSON parse per row): 125k rows in
    milliseconds. Only a top-level numeric ``advantage`` is meant; reward_info
    is the flat dict of ``log_reward``'s extras.
    """
    matched = pc.extract_regex(pc.fill_null(reward_info, ""), _ADVANTAGE_RE)
    values = pc.struct_field(matched, [0])
    return pc.cast(pc.if_else(pc.is_valid(matched), values, pa.scalar(None, pa.string())), pa.float64())


def load_trajectories(path: str, steps: Iterable[int] | None = None) -> Loaded:
    """Trajectories under ``path`` (optionally of some steps) with advantage and latency columns added.

    The table has :data:`tracer.TRAJECTORY_COLUMNS` plus ``advantage``
    (from ``reward_info``) and ``latency_s``.
    """
    loaded = _reading(tracer.read_trajectories, path, steps=None if steps is None else list(steps))
    t = loaded.table
    t = t.append_column(ADVANTAGE_COL, advantages(t.column(REWARD_INFO)))
    lat = pc.divide(pc.cast(pc.subtract(t.column(END_NS), t.column(START_NS)), pa.float64()), 1e9)
    t = t.append_column(LATENCY_COL, lat)
    return Loaded(t, loaded.warnings)


def list_steps(path: str) -> Loaded:
    """The run's distinct steps, from the step column alone (cheap: one int column).

    The table has one column, ``step``, ascending, nulls (spans recorded
    outside any step) dropped.
    """
    loaded = _reading(tracer.read_spans, path, columns=[STEP])
    steps = sorted(s for s in pc.unique(loaded.table.column(STEP)).to_pylist() if s is not None)
    return Loaded(pa.table({STEP: pa.array(steps, pa.int64())}), loaded.warnings)


def load_step(path: str, step: int) -> Loaded:
    """The trajectories of one step, with advantage, latency and tools columns."""
    loaded = load_trajectories(path, [step])
    tools = tools_by_trajectory(path, [step])
    return Loaded(with_tools(loaded.table, tools.table), merge_warnings(loaded.warnings, tools.warnings))


def load_run(path: str) -> Loaded:
    """Every trajectory of the run, with advantage, latency and tools columns."""
    loaded = load_trajectories(path)
    tools = tools_by_trajectory(path)
    return Loaded(with_tools(loaded.table, tools.table), merge_warnings(loaded.warnings, tools.warnings))


def merge_warnings(*lists: list[str]) -> list[str]:
    """The messages of several lists, each once, in first-seen order."""
    return list(dict.fromkeys(m for lst in lists for m in lst))


def steps_of(trajectories: pa.Table) -> list[int]:
    """Distinct steps, ascending (trajectories without a step are left out)."""
    return sorted(s for s in pc.unique(trajectories.column(STEP)).to_pylist() if s is not None)


def overview(trajectories: pa.Table) -> list[dict[str, Any]]:
    """One row per (step, validate): the step metrics with the step and split named."""
    rows = []
    for (step, val), metrics in tracer.step_metrics(trajectories).items():
        row: dict[str, Any] = {"step": step, "split": "validation" if val else "train"}
        row.update({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()})
        rows.append(row)
    return rows


def run_totals(trajectories: pa.Table) -> dict[str, Any]:
    """Headline numbers of a run: steps, trajectories, spans, tool calls, tool errors, errors."""
    calls = pc.sum(trajectories.column(NUM_TOOL_CALLS)).as_py() or 0
    errs = pc.sum(trajectories.column(NUM_TOOL_ERRORS)).as_py() or 0
    return {
        "steps": len(steps_of(trajectories)),
        "trajectories": trajectories.num_rows,
        "spans": pc.sum(trajectories.column(NUM_SPANS)).as_py() or 0,
        "tool calls": calls,
        "tool error rate": (errs / calls) if calls else 0.0,
        "failed trajectories": int(
            pc.sum(pc.cast(pc.not_equal(trajectories.column(STATUS), STATUS_OK), pa.int64())).as_py() or 0
        ),
    }


def select(trajectories: pa.Table, step: int | None = None, validate: bool | None = None) -> pa.Table:
    """The trajectories of one step (None: all) and split (None: both)."""
    t = trajectories
    if step is not None:
        t = t.filter(pc.equal(t.column(STEP), step))
    if validate is not None:
        t = t.filter(pc.equal(pc.fill_null(t.column(VALIDATE), False), validate))
    return t


def tools_by_trajectory(path: str, steps: Iterable[int] | None = None) -> Loaded:
    """Table (trace_id, tools): the distinct tool names each trajectory called."""
    loaded = _reading(
        tracer.read_spans, path, columns=[TRACE_ID, KIND, NAME], steps=None if steps is None else list(steps)
    )
    spans = loaded.table
    tools = spans.filter(pc.fill_null(pc.equal(spans.column(KIND), KIND_TOOL), False))
    grouped = tools.group_by(TRACE_ID, use_threads=False).aggregate([(NAME, "distinct")])
    out = pa.table({TRACE_ID: grouped.column(TRACE_ID), TOOLS_COL: grouped.column(f"{NAME}_distinct")})
    return Loaded(out, loaded.warnings)


def with_tools(trajectories: pa.Table, tools: pa.Table) -> pa.Table:
    """The trajectory table with a ``tools`` column (list of tool names, empty when none)."""
    if TOOLS_COL in trajectories.column_names:
        return trajectories
    idx = pc.index_in(trajectories.column(TRACE_ID), value_set=tools.column(TRACE_ID).combine_chunks())
    names = (
        tools.column(TOOLS_COL).combine_chunks().take(idx)
        if tools.num_rows
        else pa.nulls(trajectories.num_rows, pa.list_(pa.string()))
    )
    return trajectories.append_column(TOOLS_COL, names)


def tool_names(trajectories: pa.Table) -> list[str]:
    """Every tool name in the ``tools`` column, sorted."""
    if TOOLS_COL not in trajectories.column_names or trajectories.num_rows == 0:
        return []
    flat = pc.list_flatten(trajectories.column(TOOLS_COL))
    return sorted(x for x in pc.unique(flat).to_pylist() if x is not None)


def search_trace_ids(path: str, text: str, steps: Iterable[int] | None = None) -> Loaded:
    """Trace ids whose spans' inputs or outputs contain ``text`` (case-insensitive).

    Inputs and outputs hold the conversation (the root's messages, llm
    prompts and responses, tool arguments and results) as JSON text, so a
    search also matches JSON-escaped text as written there. Batches are
    searched one at a time and dropped, so memory stays at one batch however
    big the run.
    """
    step_set = None if steps is None else pa.array(list(steps), pa.int64())
    needles = list(dict.fromkeys([text, json.dumps(text)[1:-1]]))
    found: list[pa.Array] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tracer.TraceFileWarning)
        for _, batch in tracer.iter_batches(path, [TRACE_ID, STEP, INPUTS, OUTPUTS]):
            if step_set is not None:
                batch = batch.filter(pc.fill_null(pc.is_in(batch.column(1), value_set=step_set), False))
                if batch.num_rows == 0:
                    continue
            mask = None
            for needle in needles:
                for col in (2, 3):
                    m = pc.fill_null(pc.match_substring(batch.column(col), needle, ignore_case=True), False)
                    mask = m if mask is None else pc.or_(mask, m)
            hits = batch.filter(mask)
            if hits.num_rows:
                found.append(pc.unique(hits.column(0)))
    msgs = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning)))
    ids = pc.unique(pa.concat_arrays(found)) if found else pa.array([], pa.string())
    return Loaded(pa.table({TRACE_ID: ids}), msgs)


@dataclass
class Filters:
    """What the trajectory list keeps. None/empty means no constraint."""

    reward_min: float | None = None
    reward_max: float | None = None
    statuses: Sequence[str] = ()
    validate: bool | None = None
    tools: Sequence[str] = ()
    turns_min: int | None = None
    turns_max: int | None = None
    trace_ids: pa.Array | None = None  # from a text search


def apply_filters(t: pa.Table, f: Filters) -> pa.Table:
    """Keep the rows of ``t`` that pass every filter in ``f`` (vectorised, no Python per row)."""
    masks = []
    if f.reward_min is not None:
        masks.append(pc.greater_equal(t.column(REWARD), f.reward_min))
    if f.reward_max is not None:
        masks.append(pc.less_equal(t.column(REWARD), f.reward_max))
    if f.statuses:
        masks.append(pc.is_in(t.column(STATUS), value_set=pa.array(list(f.statuses), pa.string())))
    if f.validate is not None:
        masks.append(pc.equal(pc.fill_null(t.column(VALIDATE), False), f.validate))
    if f.turns_min is not None:
        masks.append(pc.greater_equal(t.column(NUM_LLM_CALLS), f.turns_min))
    if f.turns_max is not None:
        masks.append(pc.less_equal(t.column(NUM_LLM_CALLS), f.turns_max))
    if f.tools and TOOLS_COL in t.column_names:
        for name in f.tools:
            masks.append(pc.greater(_list_contains(t.column(TOOLS_COL), name), 0))
    if f.trace_ids is not None:
        masks.append(pc.is_in(t.column(TRACE_ID), value_set=f.trace_ids))
    if not masks:
        return t
    mask = masks[0]
    for m in masks[1:]:
        mask = pc.and_(mask, m)
    return t.filter(pc.fill_null(mask, False))


def _list_contains(lists: pa.ChunkedArray, value: str) -> pa.ChunkedArray:
    """Per row, how many elements of the list equal ``value`` (0 for null lists)."""
    chunks = []
    for chunk in lists.chunks:
        flat = chunk.flatten()
        parents = pc.list_parent_indices(chunk)
        hit = pc.equal(flat, value)
        counts = [0] * len(chunk)
        for i in pc.filter(parents, hit).to_pylist():
            counts[i] += 1
        chunks.append(pa.array(counts, pa.int64()))
    return pa.chunked_array(chunks, pa.int64())


def sort_and_page(t: pa.Table, sort: str, descending: bool, page: int, page_size: int) -> tuple[pa.Table, int]:
    """One page of ``t`` sorted by the label ``sort``; also the number of pages.

    Nulls sort last either way. ``page`` is 0-based and clamped.
    """
    pages = max(1, math.ceil(t.num_rows / page_size))
    page = min(max(page, 0), pages - 1)
    col = SORT_COLUMNS.get(sort, STEP)
    order = "descending" if descending else "ascending"
    keys = [(col, order)] + [(k, "ascending") for k in (STEP, SAMPLE_INDEX, ROLLOUT_N) if k != col]
    if t.num_rows <= page_size:
        return t.sort_by(keys), pages
    # Sort only the indices, then take one page: no full copy of the table.
    idx = _sort_indices(t.select([k for k, _ in keys]), keys)
    return t.take(idx.slice(page * page_size, page_size)), pages


def _sort_indices(t: pa.Table, keys: list[tuple[str, str]]) -> pa.Array:
    """Sort indices with nulls last (per-key placement on pyarrow >= 25, the global option before)."""
    try:
        return pc.sort_indices(t, sort_keys=[(k, o, "at_end") for k, o in keys])
    except (TypeError, ValueError, pa.ArrowException):
        return pc.sort_indices(t, sort_keys=keys, null_placement="at_end")


def list_rows(page: pa.Table) -> list[dict[str, Any]]:
    """The rows of one page as the list shows them."""
    rows = []
    for r in page.to_pylist():
        rows.append(
            {
                "trace_id": r[TRACE_ID],
                "step": r[STEP],
                "sample": r[SAMPLE_INDEX],
                "rollout": r[ROLLOUT_N],
                "split": "validation" if r[VALIDATE] else "train",
                "reward": r[REWARD],
                "advantage": r.get(ADVANTAGE_COL),
                "status": r[STATUS],
                "turns": r[NUM_LLM_CALLS],
                "tool calls": r[NUM_TOOL_CALLS],
                "tool errors": r[NUM_TOOL_ERRORS],
                "tools": ", ".join(r.get(TOOLS_COL) or []),
                "latency_s": r.get(LATENCY_COL),
            }
        )
    return rows


def trace_file_index(path: str) -> Loaded:
    """Which file holds which trajectory: a table (trace_id, file), one row per pair.

    Built from the trace id column alone (cheap to decompress). With it, a
    trajectory is read from its own file(s) instead of every file of the run:
    a run written by many rollout workers has one or more files per worker,
    and a trajectory is recorded by one worker.
    """
    ids: list[pa.Array] = []
    names: list[pa.Array] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tracer.TraceFileWarning)
        for file, batch in tracer.iter_batches(path, [TRACE_ID]):
            unique = pc.unique(batch.column(0))
            ids.append(unique)
            names.append(pa.array([file] * len(unique), pa.string()))
    msgs = [str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning)]
    if not ids:
        return Loaded(pa.table({TRACE_ID: pa.array([], pa.string()), FILE_COL: pa.array([], pa.string())}), msgs)
    table = pa.table({TRACE_ID: pa.concat_arrays(ids), FILE_COL: pa.concat_arrays(names)})
    table = table.group_by([TRACE_ID, FILE_COL], use_threads=False).aggregate([])
    return Loaded(table, list(dict.fromkeys(msgs)))


def files_of(index: pa.Table, trace_ids: Sequence[str]) -> list[str]:
    """The files that hold any of ``trace_ids``, per :func:`trace_file_index`."""
    hit = index.filter(pc.is_in(index.column(TRACE_ID), value_set=pa.array(list(trace_ids), pa.string())))
    return sorted(set(hit.column(FILE_COL).to_pylist()))


def _read_from(path: str, files: Sequence[str] | None, **kwargs: Any) -> Loaded:
    """read_spans over ``path``, or over only ``files`` when given."""
    if files is None:
        return _reading(tracer.read_spans, path, **kwargs)
    parts = [_reading(tracer.read_spans, f, **kwargs) for f in files]
    if not parts:
        return _reading(tracer.read_spans, path, **{**kwargs, "trace_ids": []})
    return Loaded(pa.concat_tables([p.table for p in parts]), merge_warnings(*(p.warnings for p in parts)))


def load_trajectory(path: str, trace_id: str, step: int | None = None, files: Sequence[str] | None = None) -> Loaded:
    """Every span of one trajectory, all columns, in start order.

    Args:
        path: The run.
        trace_id: The trajectory.
        step: Its step, when known (a cheaper filter than the trace id).
        files: Read only these files (see :func:`trace_file_index`).
    """
    loaded = _read_from(path, files, trace_ids=[trace_id], steps=None if step is None else [step])
    return Loaded(loaded.table.sort_by([(START_NS, "ascending")]), loaded.warnings)


def trajectory_summary(spans: pa.Table) -> dict[str, Any] | None:
    """A trajectory-table row (see :func:`load_trajectories`) computed from the trajectory's own spans.

    Lets the replay open a deep link without reading the whole step. The
    reward is the last ``log_reward`` (or kind=reward op) recorded under the
    trace id; rewards logged from another process without a trace id are not
    seen here (the caller falls back to the step's table).
    """
    rows = spans.to_pylist()
    if not rows:
        return None
    body = [r for r in rows if not (r[KIND] == KIND_REWARD and r[NAME] == REWARD_SPAN_NAME)]
    rewards = sorted((r for r in rows if r[REWARD] is not None), key=lambda r: (r[NAME] == REWARD_SPAN_NAME, r[END_NS]))
    root = next((r for r in body if r[PARENT_SPAN_ID] is None), None)
    first = root or rows[0]
    reward = rewards[-1] if rewards else None
    info = reward[ATTRIBUTES] if reward is not None and reward[NAME] == REWARD_SPAN_NAME else None
    start = min(r[START_NS] for r in body or rows)
    end = max(r[END_NS] for r in body or rows)
    return {
        TRACE_ID: first[TRACE_ID],
        NAME: root[NAME] if root else None,
        STEP: first[STEP],
        SAMPLE_INDEX: first[SAMPLE_INDEX],
        ROLLOUT_N: first[ROLLOUT_N],
        VALIDATE: first[VALIDATE],
        REWARD: reward[REWARD] if reward is not None else None,
        REWARD_INFO: info,
        STATUS: root[STATUS] if root else "incomplete",
        START_NS: start,
        END_NS: end,
        NUM_SPANS: len(body),
        NUM_LLM_CALLS: sum(r[KIND] == KIND_LLM for r in body),
        NUM_TOOL_CALLS: sum(r[KIND] == KIND_TOOL for r in body),
        NUM_TOOL_ERRORS: sum(r[KIND] == KIND_TOOL and r[STATUS] != STATUS_OK for r in body),
        NUM_ERRORS: sum(r[STATUS] == STATUS_ERROR for r in body),
        ADVANTAGE_COL: _json_number(info, ADVANTAGE),
        LATENCY_COL: (end - start) / 1e9,
    }


def find_trajectory(trajectories: pa.Table, trace_id: str) -> dict[str, Any] | None:
    """The trajectory-table row of ``trace_id``, or None."""
    hit = trajectories.filter(pc.equal(trajectories.column(TRACE_ID), trace_id))
    return hit.slice(0, 1).to_pylist()[0] if hit.num_rows else None


def messages(spans: pa.Table) -> list[dict[str, Any]]:
    """The trajectory's chat messages (see :func:`tracer.trajectory_messages`)."""
    return tracer.trajectory_messages(spans)


def content_text(content: Any) -> str:
    """A message's content as plain text (OpenAI content parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                parts.append(json.dumps(p, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, indent=2)


def pretty_json(text: Any) -> str:
    """Indent a JSON string (or object) for display; non-JSON text comes back unchanged."""
    if isinstance(text, str):
        try:
            return json.dumps(json.loads(text), ensure_ascii=False, indent=2)
        except ValueError:
            return text
    return json.dumps(text, ensure_ascii=False, indent=2, default=str)


def waterfall(spans: pa.Table) -> list[dict[str, Any]]:
    """One row per span for the timing chart: offsets in ms from the trajectory's start, depth, kind, status."""
    rows = spans.select([c for c in LIGHT_SPAN_COLUMNS if c in spans.column_names]).to_pylist()
    if not rows:
        return []
    t0 = min(r[START_NS] for r in rows)
    parent = {r[SPAN_ID]: r[PARENT_SPAN_ID] for r in rows}

    def depth(sid: str) -> int:
        d, seen = 0, set()
        while parent.get(sid) is not None and sid not in seen:
            seen.add(sid)
            sid = parent[sid]
            d += 1
        return d

    out = []
    for i, r in enumerate(sorted(rows, key=lambda r: (r[START_NS], depth(r[SPAN_ID])))):
        d = depth(r[SPAN_ID])
        out.append(
            {
                "span": f"{i:03d} {'  ' * d}{r[NAME]}",
                "name": r[NAME],
                "kind": r[KIND],
                "status": r[STATUS],
                "depth": d,
                "start_ms": (r[START_NS] - t0) / 1e6,
                "end_ms": (r[END_NS] - t0) / 1e6,
                "duration_ms": (r[END_NS] - r[START_NS]) / 1e6,
            }
        )
    return out


def span_errors(spans: pa.Table) -> list[dict[str, Any]]:
    """Spans whose status is error: name, kind, type, message, traceback."""
    out = []
    for r in spans.filter(pc.fill_null(pc.equal(spans.column(STATUS), STATUS_ERROR), False)).to_pylist():
        err = _safe_json(r[ERROR]) or {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        out.append(
            {
                "span_id": r[SPAN_ID],
                "name": r[NAME],
                "kind": r[KIND],
                "type": str(err.get("type", "")),
                "message": str(err.get("message", "")),
                "traceback": str(err.get("traceback", "")),
            }
        )
    return out


def _safe_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return tracer.parse_json(text)
    except ValueError:
        return text


def tool_spans(spans: pa.Table) -> list[dict[str, Any]]:
    """Tool spans in call order: name, status, arguments (inputs) and result (outputs or error)."""
    out = []
    for r in spans.filter(pc.fill_null(pc.equal(spans.column(KIND), KIND_TOOL), False)).to_pylist():
        err = _safe_json(r[ERROR]) if r[STATUS] != STATUS_OK else None
        out.append(
            {
                "name": r[NAME],
                "status": r[STATUS],
                "arguments": pretty_json(r[INPUTS]) if r[INPUTS] is not None else "",
                "result": pretty_json(r[OUTPUTS]) if r[OUTPUTS] is not None else "",
                "error": err if isinstance(err, dict) else ({"message": str(err)} if err else None),
                "duration_ms": (r[END_NS] - r[START_NS]) / 1e6,
            }
        )
    return out


#: Tokens per row of the token grid.
TOKENS_PER_ROW = 16


@dataclass
class TokenTurn:
    """The response tokens of one llm span, for the token view."""

    name: str
    index: int
    token_ids: list[int] | None
    token_texts: list[str] | None
    logprobs: list[float | None] | None
    text: str | None
    recorded: int | None  # tokens the engine produced (before truncation)
    truncated: bool
    finish_reason: str | None
    prompt_tokens: int | None

    @property
    def kept(self) -> int:
        """Tokens kept in the record."""
        if self.token_ids is not None:
            return len(self.token_ids)
        if self.token_texts is not None:
            return len(self.token_texts)
        return 0

    def cells(self, per_row: int = TOKENS_PER_ROW) -> list[dict[str, Any]]:
        """One cell per token for the token grid: row, column, label, id, logprob, probability."""
        n = self.kept or (len(self.logprobs) if self.logprobs else 0)
        cells = []
        for i in range(n):
            tid = self.token_ids[i] if self.token_ids is not None and i < len(self.token_ids) else None
            text = self.token_texts[i] if self.token_texts is not None and i < len(self.token_texts) else None
            lp = self.logprobs[i] if self.logprobs is not None and i < len(self.logprobs) else None
            label = text if text is not None else (str(tid) if tid is not None else "?")
            cells.append(
                {
                    "pos": i,
                    "row": i // per_row,
                    "col": i % per_row,
                    "label": _visible(label)[:8],
                    "token": _visible(label),
                    "token_id": tid,
                    "logprob": lp,
                    "prob": math.exp(lp) if isinstance(lp, (int, float)) else None,
                }
            )
        return cells


def _visible(text: str) -> str:
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u00b7")


_RESPONSE_ID_KEYS = ("response_ids", "token_ids", "output_ids")
_TOKEN_TEXT_KEYS = ("response_tokens", "tokens", "token_texts")


#: Key of the tokenizer in the run config written into every file's metadata.
CONFIG_TOKENIZER = "tokenizer"
#: Key of the config in the file metadata (see tracer.read_file_metadata).
META_CONFIG = "rollout_trace.config"


def run_tokenizer_path(path: str) -> str | None:
    """The tokenizer path the run was recorded with (its config), if it was a path that still exists."""
    try:
        files = tracer.list_trace_files(path)
    except FileNotFoundError:
        return None
    for file in files[:1]:
        try:
            config = json.loads(tracer.read_file_metadata(file).get(META_CONFIG, "{}"))
        except (OSError, ValueError, pa.ArrowException):
            return None
        tok = config.get(CONFIG_TOKENIZER) if isinstance(config, dict) else None
        if isinstance(tok, str) and os.path.exists(tok):
            return tok
    return None


def load_token_decoder(tokenizer_path: str) -> Callable[[list[int]], list[str]]:
    """A function turning token ids into one text piece per token, from a ``tokenizer.json`` (or its folder).

    Needs the ``tokenizers`` package, imported here only.

    Raises:
        FileNotFoundError: no tokenizer.json at ``tokenizer_path``.
        ImportError: ``tokenizers`` is not installed; names the pip line.
    """
    file = tokenizer_path if os.path.isfile(tokenizer_path) else os.path.join(tokenizer_path, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {tokenizer_path!r}; give a tokenizer.json file or its folder")
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ImportError(
            "showing token text needs the tokenizers package: pip install 'rollout-trace[tokenizers]'"
        ) from exc
    tok = Tokenizer.from_file(file)

    def decode(ids: list[int]) -> list[str]:
        return tok.decode_batch([[i] for i in ids], skip_special_tokens=False)

    return decode


def token_turns(spans: pa.Table, decoder: Callable[[list[int]], list[str]] | None = None) -> list[TokenTurn]:
    """The llm spans' response tokens, logprobs and truncation, in call order.

    ``decoder`` (see :func:`load_token_decoder`) gives each token id its text,
    so the token view shows where each token starts and ends.
    """
    llm = spans.filter(pc.fill_null(pc.equal(spans.column(KIND), KIND_LLM), False))
    out = []
    for i, r in enumerate(llm.to_pylist()):
        outputs = _safe_json(r[OUTPUTS])
        inputs = _safe_json(r[INPUTS])
        attrs = _safe_json(r[ATTRIBUTES]) if r[ATTRIBUTES] else {}
        attrs = attrs if isinstance(attrs, dict) else {}
        ids = texts = lps = None
        text = finish = None
        key_used = None
        if isinstance(outputs, dict):
            for k in _RESPONSE_ID_KEYS:
                if isinstance(outputs.get(k), list):
                    ids, key_used = outputs[k], k
                    break
            for k in _TOKEN_TEXT_KEYS:
                v = outputs.get(k)
                if isinstance(v, list) and all(isinstance(x, str) for x in v):
                    texts = v
                    break
            if isinstance(outputs.get("logprobs"), list):
                lps = [float(x) if isinstance(x, (int, float)) else _logprob_of(x) for x in outputs["logprobs"]]
            text = outputs.get("response_text") if isinstance(outputs.get("response_text"), str) else None
            finish = outputs.get("finish_reason")
        elif isinstance(outputs, str):
            text = outputs
        truncated_map = attrs.get(ATTR_TRUNCATED) or {}
        counts = attrs.get(ATTR_TOKENS) or {}
        recorded = None
        truncated = False
        if isinstance(truncated_map, dict):
            for k, v in truncated_map.items():
                if key_used is None or k.split(".")[-1] == key_used:
                    truncated = True
                    recorded = v if isinstance(v, int) else recorded
        if recorded is None and isinstance(counts, dict) and key_used in counts:
            recorded = counts[key_used]
        if texts is None and ids is not None and decoder is not None:
            try:
                texts = decoder([int(i) for i in ids])
            except Exception:  # a tokenizer that does not fit these ids must not break the view
                texts = None
        prompt_tokens = counts.get("prompt_ids") if isinstance(counts, dict) else None
        if prompt_tokens is None and isinstance(inputs, dict) and isinstance(inputs.get("prompt_ids"), list):
            prompt_tokens = len(inputs["prompt_ids"])
        out.append(
            TokenTurn(
                name=r[NAME],
                index=i,
                token_ids=ids,
                token_texts=texts,
                logprobs=lps,
                text=text,
                recorded=recorded,
                truncated=truncated,
                finish_reason=str(finish) if finish is not None else None,
                prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
            )
        )
    return out


def _logprob_of(x: Any) -> float | None:
    # vLLM-style {token_id: {"logprob": ..}} or {"logprob": ..}
    if isinstance(x, dict):
        if isinstance(x.get("logprob"), (int, float)):
            return float(x["logprob"])
        for v in x.values():
            if isinstance(v, dict) and isinstance(v.get("logprob"), (int, float)):
                return float(v["logprob"])
    return None


def group(trajectories: pa.Table, step: int, sample_index: str, validate: bool | None = None) -> pa.Table:
    """The rollouts of one prompt at one step, by rollout index."""
    t = trajectories.filter(
        pc.and_(
            pc.equal(trajectories.column(STEP), step), pc.equal(trajectories.column(SAMPLE_INDEX), str(sample_index))
        )
    )
    if validate is not None:
        t = t.filter(pc.equal(pc.fill_null(t.column(VALIDATE), False), validate))
    return t.sort_by([(ROLLOUT_N, "ascending")])


def sample_across_steps(
    trajectories: pa.Table, sample_index: str, validate: bool | None = None
) -> list[dict[str, Any]]:
    """Per step, the rollouts of one sample: count and reward mean/min/max."""
    t = trajectories.filter(pc.equal(trajectories.column(SAMPLE_INDEX), str(sample_index)))
    if validate is not None:
        t = t.filter(pc.equal(pc.fill_null(t.column(VALIDATE), False), validate))
    g = t.group_by(STEP, use_threads=False).aggregate(
        [(REWARD, "mean"), (REWARD, "min"), (REWARD, "max"), (TRACE_ID, "count")]
    )
    rows = [
        {"step": s, "rollouts": n, "reward mean": m, "reward min": lo, "reward max": hi}
        for s, m, lo, hi, n in zip(
            g.column(STEP).to_pylist(),
            g.column(f"{REWARD}_mean").to_pylist(),
            g.column(f"{REWARD}_min").to_pylist(),
            g.column(f"{REWARD}_max").to_pylist(),
            g.column(f"{TRACE_ID}_count").to_pylist(),
        )
    ]
    return sorted(rows, key=lambda r: (r["step"] is None, r["step"] or 0))


def load_group_spans(
    path: str, trace_ids: Sequence[str], step: int | None, files: Sequence[str] | None = None
) -> Loaded:
    """All spans of several trajectories (one group), in one pass over the files (or only ``files``)."""
    return _read_from(path, files, trace_ids=list(trace_ids), steps=None if step is None else [step])


def split_by_trace(spans: pa.Table) -> dict[str, pa.Table]:
    """Spans of several trajectories, one table per trace id."""
    out = {}
    for tid in pc.unique(spans.column(TRACE_ID)).to_pylist():
        out[tid] = spans.filter(pc.equal(spans.column(TRACE_ID), tid)).sort_by([(START_NS, "ascending")])
    return out


def escape_markdown(text: str) -> str:
    """Backslash-escape every ASCII punctuation character so Markdown shows ``text`` literally.

    Streamlit's Markdown never renders raw HTML (no ``unsafe_allow_html``);
    escaping also keeps ``**``, links, headings and ``<tags>`` as typed.
    """
    out = []
    for ch in text:
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("  \n")
        else:
            out.append(ch)
    return "".join(out)


_MD_SPECIAL = set("\\`*_{}[]()<>#+-.!|~$&:\"'=%")

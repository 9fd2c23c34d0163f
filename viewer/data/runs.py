"""Run-level data: trace paths, trajectory tables, steps, overview numbers, the list's filters and pages, groups.

No Streamlit import: the benchmark and tests call these functions directly.
Everything is read with column projection and, where the step is known,
step filtering; trajectory lists stay Arrow tables until one page is shown.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer
from tracer.index.readers import read_step_partials

# Column names, kinds, statuses and attribute keys come from tracer's schema, never spelled here.
from tracer.schema import (
    END_NS,
    INPUTS,
    KIND,
    KIND_TOOL,
    NAME,
    NUM_LLM_CALLS,
    NUM_SPANS,
    NUM_TOOL_CALLS,
    NUM_TOOL_ERRORS,
    OUTPUTS,
    PARENT_SPAN_ID,
    PART_NOT_OK,
    PART_TRAJECTORIES,
    REWARD,
    REWARD_INFO,
    ROLLOUT_N,
    SAMPLE_INDEX,
    SPAN_ID,
    START_NS,
    STATUS,
    STEP,
    TRACE_ID,
    VALIDATE,
)
from tracer.summary import partial_metrics, step_partials
from viewer.format import one_line, short_ids

#: Key of the advantage in log_reward's extras (``reward_info``).
ADVANTAGE = "advantage"

# Columns the viewer adds to the trajectory table.
ADVANTAGE_COL = "advantage"
LATENCY_COL = "latency_s"
TOOLS_COL = "tools"
FILE_COL = "file"
#: Columns the tables add from a trajectory's conversation (:mod:`tracer.questions`) and the short id.
QUESTION_COL = "question"
ANSWER_COL = "answer"
SHORT_ID_COL = "id"
#: Characters of a question or answer in a table cell (the page shows the whole text).
CELL_TEXT_CHARS = 160

#: Columns of the span table used by the waterfall, without the heavy JSON ones.
LIGHT_SPAN_COLUMNS = [TRACE_ID, SPAN_ID, PARENT_SPAN_ID, NAME, KIND, START_NS, END_NS, STATUS, STEP]

#: Sort keys the list offers: label -> column.
SORT_COLUMNS = {
    STEP: STEP,
    "sample": SAMPLE_INDEX,
    "rollout": ROLLOUT_N,
    REWARD: REWARD,
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


#: Extra directories (``os.pathsep``-separated) that ``?path=`` may name besides those the server was started with.
ENV_VIEW_ALLOW = "ROLLOUT_TRACE_VIEW_ALLOW"


def allowed_roots(argv_paths: Sequence[str | None], env: Mapping[str, str] | None = None) -> list[str]:
    """The directories a URL may open: the server's own paths, ``--allow-path`` entries and ``ROLLOUT_TRACE_VIEW_ALLOW``."""
    environ: Mapping[str, str] = os.environ if env is None else env
    given = [*argv_paths, environ.get(tracer.ENV_TRACE_DIR), *environ.get(ENV_VIEW_ALLOW, "").split(os.pathsep)]
    roots = []
    for p in given:
        if p:
            real = os.path.realpath(os.path.expanduser(p))
            roots.append(real if os.path.isdir(real) else os.path.dirname(real))
    return roots


def check_allowed(path: str, roots: Sequence[str]) -> str:
    """``path`` if it lies inside one of ``roots`` (symbolic links resolved).

    Raises:
        ViewerPathError: it lies outside them; the message says how to allow it.
    """
    real = os.path.realpath(os.path.expanduser(path))
    for root in roots:
        try:
            if os.path.commonpath([real, root]) == root:
                return path
        except ValueError:  # different drives
            continue
    shown = ", ".join(roots) if roots else "none"
    raise ViewerPathError(
        f"the path {path!r} is outside the directories this viewer serves ({shown}). "
        f"Start it on that directory (rollout-trace view DIR), or allow it: rollout-trace view DIR --allow-path "
        f"{path} (or {ENV_VIEW_ALLOW}=DIR)."
    )


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
    #: Span rows read (every row of the files, log_reward rows included), where the reader counts them.
    rows: int | None = None


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

    The table has :data:`tracer.schema.TRAJECTORY_COLUMNS` plus ``advantage``
    (from ``reward_info``) and ``latency_s``.
    """
    loaded = _reading(tracer.read_trajectories, path, steps=None if steps is None else list(steps))
    return Loaded(with_derived(loaded.table), loaded.warnings)


def with_derived(trajectories: pa.Table) -> pa.Table:
    """The summary rows with the viewer's derived columns: ``advantage`` (from reward_info) and ``latency_s``."""
    t = trajectories.append_column(ADVANTAGE_COL, advantages(trajectories.column(REWARD_INFO)))
    return t.append_column(LATENCY_COL, seconds_between(t.column(START_NS), t.column(END_NS)))


def seconds_between(start_ns: Any, end_ns: Any) -> Any:
    """``(end_ns - start_ns) / 1e9`` per row, in float64 throughout: no int64 overflow, no cast error past 2**53 ns."""
    start = pc.cast(start_ns, pa.float64(), safe=False)
    end = pc.cast(end_ns, pa.float64(), safe=False)
    return pc.divide(pc.subtract(end, start), 1e9)


def list_steps(path: str) -> Loaded:
    """The run's distinct steps, from shard indexes or the step column alone (cheap: one int column).

    The table has one column, ``step``, ascending, nulls (spans recorded
    outside any step) dropped. ``rows`` is the number of span rows in the
    files (what ``rollout-trace info`` and ``check`` count, ``log_reward``
    rows included).
    """
    counted: list[int] = []

    def steps_table(p: str) -> pa.Table:
        steps, rows = tracer.read.read_steps(p)  # indexed shards answer without being opened
        counted.append(rows)
        return pa.table({STEP: pa.array(steps, pa.int64())})

    loaded = _reading(steps_table, path)
    return Loaded(loaded.table, loaded.warnings, counted[0])


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


def load_step_partials(path: str) -> Loaded:
    """Per-(step, validate) aggregates of every trajectory of the run: all the overview page shows.

    :func:`tracer.index.readers.read_step_partials`: closed shards' indexes answer
    with their stored aggregates, so the cost follows the steps, not the
    trajectories; other files are read as :func:`load_trajectories` reads them.
    """
    return _reading(read_step_partials, path, value_metrics=True)


def partials_of(trajectories: pa.Table) -> pa.Table:
    """The per-(step, validate) aggregates of some trajectory rows (:func:`tracer.summary.step_partials`)."""
    return step_partials(trajectories)


def select_partials(partials: pa.Table, validate: bool | None = None) -> pa.Table:
    """The aggregates of one split (None: both), as :func:`select` keeps trajectories."""
    if validate is None:
        return partials
    return partials.filter(pc.equal(partials.column(VALIDATE), validate))


def overview(trajectories: pa.Table, token_stats: pa.Table | None = None) -> list[dict[str, Any]]:
    """One row per (step, validate): :func:`tracer.step_metrics` with the step and split named.

    With ``token_stats`` (:func:`tracer.read_token_stats`) the rows carry the
    train/inference mismatch too (``logprob_mismatch``, ``logprob_ratio/max``).
    """
    return overview_of(partials_of(trajectories), token_stats)


#: The per-step fraction of groups whose rewards are all equal (:func:`tracer.step_metrics`'s name).
ZERO_STD_COL = "reward/zero_std_frac"


def with_zero_std(rows: list[dict[str, Any]], fractions: Mapping[tuple[int | None, bool], float]) -> None:
    """Add :data:`ZERO_STD_COL` to overview rows from :func:`tracer.questions.zero_std_fractions` (None where none)."""
    for r in rows:
        r[ZERO_STD_COL] = fractions.get((r[STEP], r["split"] == "validation"))


def overview_of(partials: pa.Table, token_stats: pa.Table | None = None) -> list[dict[str, Any]]:
    """:func:`overview` from per-step aggregates (:func:`load_step_partials`, :func:`partials_of`)."""
    rows = []
    for (step, val), metrics in partial_metrics(partials, token_stats).items():
        row: dict[str, Any] = {STEP: step, "split": "validation" if val else "train"}
        row.update({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()})
        rows.append(row)
    return rows


def run_totals(trajectories: pa.Table, span_rows: int | None = None) -> dict[str, Any]:
    """Headline numbers of a run: steps, trajectories, spans, tool calls, tool errors, errors.

    ``span_rows`` (:func:`list_steps`' ``rows``) is the files' row count, the
    number ``rollout-trace info`` and ``check`` give; without it, the spans
    the trajectories' summaries count (``log_reward`` rows left out).
    """
    return totals_of(partials_of(trajectories), span_rows)


def totals_of(partials: pa.Table, span_rows: int | None = None) -> dict[str, Any]:
    """:func:`run_totals` from per-step aggregates; failed trajectories are those whose status is not ok."""

    def total(column: str) -> int:
        return int(pc.sum(partials.column(column)).as_py() or 0)

    calls, errs = total(NUM_TOOL_CALLS), total(NUM_TOOL_ERRORS)
    return {
        "steps": len({s for s in partials.column(STEP).to_pylist() if s is not None}),
        "trajectories": total(PART_TRAJECTORIES),
        "spans": span_rows if span_rows is not None else total(NUM_SPANS),
        "tool calls": calls,
        "tool error rate": (errs / calls) if calls else 0.0,
        "failed trajectories": total(PART_NOT_OK),
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
    return Loaded(tools_table(loaded.table), loaded.warnings)


def tools_table(spans: pa.Table) -> pa.Table:
    """Table (trace_id, tools): the distinct tool names of each trajectory among ``spans`` (trace_id, kind, name)."""
    tools = spans.filter(pc.fill_null(pc.equal(spans.column(KIND), KIND_TOOL), False))
    grouped = tools.group_by(TRACE_ID, use_threads=False).aggregate([(NAME, "distinct")])
    return pa.table({TRACE_ID: grouped.column(TRACE_ID), TOOLS_COL: grouped.column(f"{NAME}_distinct")})


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


def list_rows(
    page: pa.Table, questions: Mapping[str, tuple[str | None, str | None]] | None = None
) -> list[dict[str, Any]]:
    """The rows of one page as the tables show them: short id, question and answer first, full trace id last.

    ``questions`` maps trace ids to (question, final answer)
    (:func:`tracer.questions.questions_and_answers`); without it the two
    columns are empty.
    """
    rows = []
    records = page.to_pylist()
    shorts = short_ids([r[TRACE_ID] for r in records])
    qa = questions or {}
    for r, short_id in zip(records, shorts, strict=True):
        question, answer = qa.get(r[TRACE_ID], (None, None))
        rows.append(
            {
                SHORT_ID_COL: short_id,
                QUESTION_COL: one_line(question, CELL_TEXT_CHARS),
                ANSWER_COL: one_line(answer, CELL_TEXT_CHARS),
                STEP: r[STEP],
                "sample": r[SAMPLE_INDEX],
                "rollout": r[ROLLOUT_N],
                "split": "validation" if r[VALIDATE] else "train",
                REWARD: r[REWARD],
                "advantage": r.get(ADVANTAGE_COL),
                STATUS: r[STATUS],
                "turns": r[NUM_LLM_CALLS],
                "tool calls": r[NUM_TOOL_CALLS],
                "tool errors": r[NUM_TOOL_ERRORS],
                "tools": ", ".join(r.get(TOOLS_COL) or []),
                "latency_s": r.get(LATENCY_COL),
                TRACE_ID: r[TRACE_ID],
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
        {STEP: s, "rollouts": n, "reward mean": m, "reward min": lo, "reward max": hi}
        for s, m, lo, hi, n in zip(
            g.column(STEP).to_pylist(),
            g.column(f"{REWARD}_mean").to_pylist(),
            g.column(f"{REWARD}_min").to_pylist(),
            g.column(f"{REWARD}_max").to_pylist(),
            g.column(f"{TRACE_ID}_count").to_pylist(),
        )
    ]
    return sorted(rows, key=lambda r: (r[STEP] is None, r[STEP] or 0))


def load_group_spans(
    path: str,
    trace_ids: Sequence[str],
    step: int | None,
    files: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> Loaded:
    """All spans of several trajectories (one group), in one pass over the files (or only ``files``); ``columns``: only those."""
    kwargs: dict[str, Any] = {"columns": list(columns)} if columns is not None else {}
    return _read_from(path, files, trace_ids=list(trace_ids), steps=None if step is None else [step], **kwargs)


def split_by_trace(spans: pa.Table) -> dict[str, pa.Table]:
    """Spans of several trajectories, one table per trace id."""
    out = {}
    for tid in pc.unique(spans.column(TRACE_ID)).to_pylist():
        out[tid] = spans.filter(pc.equal(spans.column(TRACE_ID), tid)).sort_by([(START_NS, "ascending")])
    return out


def repeated_rollouts(group_table: pa.Table) -> dict[int, int]:
    """In one group: rollout index -> how many trajectories hold it, for those held by more than one."""
    counts: dict[int, int] = {}
    for n in group_table.column(ROLLOUT_N).to_pylist():
        counts[n] = counts.get(n, 0) + 1
    return {n: k for n, k in counts.items() if k > 1}

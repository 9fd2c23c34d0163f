"""Table rows of trajectories (:data:`TABLE_COLUMNS`), trace files read step chunk by step chunk, a progress bar,
and a reader of the LevelDB-log framed run files of wandb and swanlab (for ``--verify``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.index.readers import read_trajectories
from tracer.read import TracePaths, list_trace_files, read_file_metadata, read_spans
from tracer.read import parse_json_or_text as _loads
from tracer.summary import prompt_and_response, render_turns, trajectory_turns

#: Columns of the per-step trajectory table, in order (a trajectory column keeps its name).
TABLE_COLUMNS = (
    S.STEP,
    S.SAMPLE_INDEX,
    S.ROLLOUT_N,
    S.VALIDATE,
    S.REWARD,
    "advantage",
    "turns",
    "tool_calls",
    "tool_errors",
    S.STATUS,
    "latency_s",
    "conversation",
    "prompt",
    "response",
    S.TRACE_ID,
)
#: Index of a column in a table row.
COL = {name: i for i, name in enumerate(TABLE_COLUMNS)}

#: Metric name prefixes: training and validation trajectories.
METRIC_PREFIX = "rollout_trace/"
VAL_METRIC_PREFIX = "rollout_trace_val/"
#: Table keys: training and validation trajectories.
TABLE_KEY = "rollout_trace/table"
VAL_TABLE_KEY = "rollout_trace_val/table"
#: Metric carrying the rollout step of each logged step (wandb's charts use it as x-axis).
STEP_KEY = "rollout_trace/step"

#: Longest text kept in one table cell; longer text is cut with a note saying how much.
MAX_CELL_CHARS = 100_000
#: Post-hoc export reads the spans of this many trajectories' steps at a time.
SPANS_PER_CHUNK = 200_000

#: Span columns needed to build table rows: all but the span id.
ROW_SPAN_COLUMNS = tuple(c for c in S.SPAN_COLUMNS if c != S.SPAN_ID)


def cut(text: str, limit: int = MAX_CELL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut by rollout-trace]"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool) within the float range, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past the float range
        return None


def trajectory_row(traj: Mapping[str, Any], spans: Sequence[Mapping[str, Any]] | pa.Table) -> list[Any]:
    """One table row (:data:`TABLE_COLUMNS`) from a summary row and the trajectory's span rows (any order)."""
    turns = trajectory_turns(spans).get(traj[S.TRACE_ID], [])
    prompt, response = prompt_and_response(turns)
    info = _loads(traj.get(S.REWARD_INFO))
    advantage = info.get("advantage") if isinstance(info, Mapping) else None
    start, end = traj.get(S.START_NS), traj.get(S.END_NS)
    latency = (end - start) / 1e9 if start is not None and end is not None else None
    derived = {  # the other columns are the trajectory's own
        S.VALIDATE: bool(traj.get(S.VALIDATE)),
        "advantage": number(advantage),
        "turns": traj.get(S.NUM_LLM_CALLS),
        "tool_calls": traj.get(S.NUM_TOOL_CALLS),
        "tool_errors": traj.get(S.NUM_TOOL_ERRORS),
        "latency_s": latency,
        "conversation": cut(render_turns(turns)),
        "prompt": cut(prompt),
        "response": cut(response),
    }
    return [derived[c] if c in derived else traj.get(c) for c in TABLE_COLUMNS]


@dataclasses.dataclass
class StepData:
    """What a table backend logs for one step: rows (:data:`TABLE_COLUMNS`), capped validation rows, metrics."""

    step: int | None
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    val_rows: list[list[Any]] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunFiles:
    """What a post-hoc export reads from a trace path first: the recorded names and
    ``log_val_generations``, the selected trajectory summaries, how many were not selected."""

    path: TracePaths
    project: str | None
    experiment: str | None
    log_val_generations: int
    trajectories: pa.Table
    not_selected: int


def open_run(path: TracePaths, steps: Iterable[int] | None = None, since_step: int | None = None) -> RunFiles:
    """A trace path's names, config and (selected) trajectory summaries; FileNotFoundError without trace files."""
    p: TracePaths = os.fspath(path) if isinstance(path, (str, os.PathLike)) else list(path)
    files = list_trace_files(p)
    if not files:
        raise FileNotFoundError(f"no trace files (*{S.FILE_SUFFIX}) under {p!r}")
    meta: Mapping[str, Any] = {}
    for f in files:  # the first readable file's names and cap
        with contextlib.suppress(OSError, pa.ArrowException):
            meta = read_file_metadata(f)
            break
    config = _loads(meta.get(S.META_CONFIG))
    cap = config.get("log_val_generations") if isinstance(config, Mapping) else None
    log_val = cap if isinstance(cap, int) else 10
    project, experiment = meta.get(S.META_PROJECT) or None, meta.get(S.META_EXPERIMENT) or None
    table = read_trajectories(p)
    mask = None if steps is None else pc.is_in(table[S.STEP], value_set=pa.array(sorted(set(steps)), pa.int64()))
    if since_step is not None:
        m = pc.greater_equal(table[S.STEP], since_step)
        mask = m if mask is None else pc.and_(mask, m)
    selected = table.filter(pc.fill_null(mask, False)) if mask is not None else table
    return RunFiles(p, project, experiment, log_val, selected, table.num_rows - selected.num_rows)


def iter_step_chunks(
    run: RunFiles, columns: Sequence[str] | None = ROW_SPAN_COLUMNS
) -> Iterator[tuple[pa.Table, dict[str, list[dict[str, Any]]]]]:
    """Yield ``(trajectories, spans_by_trace)`` for groups of whole steps of about :data:`SPANS_PER_CHUNK` spans, in
    step order; ``columns``: the span columns to read (None: all; empty: none, ``spans_by_trace`` is then empty)."""
    table = run.trajectories
    if table.num_rows == 0:
        return
    sums = table.group_by(S.STEP).aggregate([(S.NUM_SPANS, "sum")]).to_pylist()
    counts = {r[S.STEP]: r[S.NUM_SPANS + "_sum"] or 0 for r in sums}
    chunk: list[int | None] = []
    size = 0
    for step in sorted(counts, key=lambda s: (s is None, s or 0)):
        if chunk and size + counts[step] > SPANS_PER_CHUNK:
            yield _read_chunk(run, chunk, columns)
            chunk, size = [], 0
        chunk.append(step)
        size += counts[step]
    yield _read_chunk(run, chunk, columns)


def _read_chunk(
    run: RunFiles, steps: list[int | None], columns: Sequence[str] | None
) -> tuple[pa.Table, dict[str, list[dict[str, Any]]]]:
    table = run.trajectories
    trajs = table.filter(pc.is_in(table[S.STEP], value_set=pa.array(steps, pa.int64()), skip_nulls=False))
    if columns is not None and not columns:
        return trajs, {}
    ids = trajs[S.TRACE_ID].to_pylist()
    wanted = None if columns is None else list(dict.fromkeys([S.TRACE_ID, *columns]))
    numbered = None if None in steps else [s for s in steps if s is not None]
    spans = read_spans(run.path, columns=wanted, steps=numbered, trace_ids=ids)
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in spans.to_pylist():
        by_trace.setdefault(r[S.TRACE_ID], []).append(r)
    return trajs, by_trace


class Progress:
    """A one-line progress bar of trajectories on stderr (silent when not ``enabled``; ``total`` 0: a count)."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total = max(total, 0)
        self.label = label
        self.enabled = enabled
        self.done = 0
        self._start = time.monotonic()
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` items and redraw (at most 10 times a second)."""
        self.done += n
        if self.enabled and (time.monotonic() - self._last >= 0.1 or (self.total and self.done >= self.total)):
            self._draw()

    def _draw(self) -> None:
        self._last = time.monotonic()
        rate = self.done / max(self._last - self._start, 1e-9)
        if self.total:
            filled = int(min(self.done / self.total, 1.0) * 30)
            text = f"{self.label} [{'#' * filled}{'-' * (30 - filled)}] {self.done}/{self.total}"
        else:
            text = f"{self.label}: {self.done}"
        sys.stderr.write(f"\r{text} trajectories ({rate:.0f}/s)")
        sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            if self._last == 0.0:
                self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


#: LevelDB-log framing of wandb's and swanlab's run files: block size, header size, fragment types.
_LOG_BLOCK = 32 * 1024
_LOG_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_leveldb_log(path: str | os.PathLike[str], ident: bytes) -> list[bytes]:
    """Records of a LevelDB-log framed file (wandb's ``.wandb``, swanlab's ``.swanlab``), a torn tail ignored.

    A 7-byte header (``ident``, magic, version), then 32 KiB blocks of ``crc32c:u32 length:u16 type:u8 data``
    fragments. ValueError when the file does not start with ``ident``.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[: len(ident)] != ident:
        raise ValueError(f"{os.fspath(path)}: not a {ident.decode(errors='replace')} run file")
    records: list[bytes] = []
    pos = _LOG_HEADER
    pending: bytes | None = None
    while pos + _LOG_HEADER <= len(data):
        left = _LOG_BLOCK - pos % _LOG_BLOCK
        if left < _LOG_HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _LOG_HEADER])
        pos += _LOG_HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == 0 or len(chunk) < length:
            break
        if kind in (_FULL, _FIRST):
            pending = chunk
        elif kind in (_MIDDLE, _LAST) and pending is not None:
            pending += chunk
        if kind in (_FULL, _LAST) and pending is not None:
            records.append(pending)
            pending = None
    return records

"""Shards written by the real writer (closed, or killed after a flush) and checks of their shard indexes, for storage tests."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st
from storage_fixtures import copy_run

import tracer
from tracer import schema as S
from tracer.index import shard as _si
from tracer.index.closed import shard_closed
from tracer.index.shard import INDEX_SUFFIX, load_shard_index
from tracer.storage.files import read_layout
from tracer.storage.seal import seal_if_abandoned
from tracer.storage.writer import SpanWriter
from tracer.summary import GROUP_METRICS, SUMMARY_SPAN_COLUMNS, summarize

META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}


def trace_span(trace: str, n: int, step: int | None) -> dict[str, Any]:
    """Span ``n`` of trajectory ``trace`` (span 0 is its root) at ``step``."""
    return {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace}-{n}",
        S.PARENT_SPAN_ID: None if n == 0 else f"{trace}-0",
        S.NAME: "agent_loop" if n == 0 else "generate",
        S.KIND: S.KIND_ROLLOUT if n == 0 else S.KIND_LLM,
        S.START_NS: 1_000 + n,
        S.END_NS: 2_000 + n,
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: trace,
        S.ROLLOUT_N: 0,
        S.VALIDATE: False,
    }


def write_shard(run: str, batches: list[list[dict[str, Any]]], close: bool = True) -> str:
    """A shard of ``run`` written by the real writer, one flush per batch of rows; return its path.

    Closed normally (footer and shard index), or with ``close=False`` a writer
    killed after its last flush: no footer, no index, lock gone (readers seal it).
    """
    writer = SpanWriter(run, META, on_close=shard_closed)
    for rows in batches:
        writer.write(pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA))
    path = writer.path
    assert path is not None
    if close:
        writer.close()
    else:
        writer._let_go()
    return path


def bare_copy(run: str, where: str) -> str:
    """A copy of ``run`` at ``where`` without any index, its open shards sealed without one: what
    readers read span by span (the reference the indexed reads are compared with)."""
    copy_run(run, where, indexes=False)
    for root, _, names in os.walk(where):
        for name in names:
            if name.endswith(S.FILE_SUFFIX):
                seal_if_abandoned(os.path.join(root, name), on_sealed=None)
    return where


def trajectory_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Trajectory rows (``TRAJECTORY_SCHEMA``) from hypothesis-drawn dicts of step, validate, reward,
    status, start, length (either may be None) and counts (spans, llm calls, tool calls, tool errors)."""
    out = []
    for i, r in enumerate(rows):
        spans, llm, tools, errs = r["counts"]
        start = r["start"]
        out.append(
            {
                S.TRACE_ID: f"t{i}",
                S.STEP: r["step"],
                S.SAMPLE_INDEX: "0",
                S.ROLLOUT_N: 0,
                S.VALIDATE: r["validate"],
                S.REWARD: r["reward"],
                S.STATUS: r["status"],
                S.START_NS: start,
                S.END_NS: None if r["length"] is None or start is None else start + r["length"],
                S.NUM_SPANS: spans,
                S.NUM_LLM_CALLS: llm,
                S.NUM_TOOL_CALLS: tools,
                S.NUM_TOOL_ERRORS: min(errs, tools),
                S.NUM_ERRORS: 0,
            }
        )
    return pa.Table.from_pylist(out, schema=S.TRAJECTORY_SCHEMA)


def valid_index_of(file: str) -> _si.ShardIndex:
    """The shard index of ``file``, checked against its spans: batch rows, steps, summary rows."""
    index = load_shard_index(file)
    assert index is not None, f"{file} has no valid index"
    layout = read_layout(file)
    assert len(index.batch_rows) == len(layout.batches)
    spans = tracer.read_spans(file, columns=SUMMARY_SPAN_COLUMNS)
    assert sum(index.batch_rows) == spans.num_rows
    assert index.steps() == {s for s in spans.column(S.STEP).to_pylist() if s is not None}
    table = index.table()
    assert table is not None
    rows = table.filter(pc.fill_null(pc.not_equal(table.column(S.TRACE_ID), ""), False))
    mine = rows.select(list(S.TRAJECTORY_COLUMNS)).sort_by(S.TRACE_ID)
    assert mine.equals(summarize(spans).sort_by(S.TRACE_ID))
    return index


def partial_span(trace: str, n: int, step: int | None, validate: bool, **extra: Any) -> dict[str, Any]:
    """Span ``n`` of trajectory ``trace`` (0: its root) in ``step``, for the per-step aggregate tests."""
    row = {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace}-{n}",
        S.PARENT_SPAN_ID: f"{trace}-0" if n else None,
        S.NAME: "generate" if n else "agent_loop",
        S.KIND: S.KIND_LLM if n else S.KIND_ROLLOUT,
        S.START_NS: 1_000 + 7 * n,
        S.END_NS: 2_000 + 13 * n + len(trace),
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: str(n % 2),
        S.ROLLOUT_N: 0,
        S.VALIDATE: validate,
    }
    row.update(extra)
    return row


def partial_reward(trace: str, n: int, step: int | None, reward: float | None, validate: bool) -> dict[str, Any]:
    """A log_reward row: by trace id, or by key when ``trace`` is empty."""
    extra = {S.KIND: S.KIND_REWARD, S.NAME: S.REWARD_SPAN_NAME, S.REWARD: reward, S.END_NS: 3_000 + n}
    return partial_span(trace, n, step, validate, **extra) | {S.PARENT_SPAN_ID: f"{trace}-0"}


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """No TraceFileWarning (torn and open files are what these tests write)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        yield


def bits(values: np.ndarray) -> np.ndarray:
    """8-byte values as their bits (NaN equal to itself, -0.0 unlike 0.0)."""
    return np.ascontiguousarray(values).view(np.uint64) if values.dtype.itemsize == 8 else values


def equal_tables(a: pa.Table, b: pa.Table) -> None:
    """Equal, and every value of the lists the same bits (NaN and -0.0 included)."""
    assert a.schema == b.schema and a.num_rows == b.num_rows
    for name in a.schema.names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if pa.types.is_list(x.type):
            assert x.offsets.equals(y.offsets), name
            assert np.array_equal(bits(pc.list_flatten(x).to_numpy()), bits(pc.list_flatten(y).to_numpy())), name
        else:
            assert x.equals(y), name


def equal_metrics(a: dict[Any, dict[str, float]], b: dict[Any, dict[str, float]]) -> None:
    """The same step metrics, key for key, each value the same float (NaN as NaN, -0.0 as -0.0).

    Metrics of whole groups (:data:`tracer.summary.GROUP_METRICS`), which step partials cannot give, are left out.
    """
    assert list(a) == list(b)
    for k in a:
        assert a[k].keys() - set(GROUP_METRICS) == b[k].keys() - set(GROUP_METRICS)
        for m, v in a[k].items():
            if m in GROUP_METRICS:
                continue
            w = b[k][m]
            assert (math.isnan(v) and math.isnan(w)) or (v == w and math.copysign(1, v) == math.copysign(1, w)), (k, m)


#: A trajectory of :func:`write_random_run`: its spans, step and split, the shards its spans go to (the
#: first holds its root), and its reward: none, by trace id in its root's shard or the next one, or by key.
random_trajectory = st.fixed_dictionaries(
    {
        "spans": st.integers(1, 3),
        "step": st.sampled_from([0, 1, 2, 7, None]),
        "validate": st.booleans(),
        "files": st.lists(st.integers(0, 3), min_size=1, max_size=2),
        "reward": st.sampled_from(["none", "by_id", "by_id", "by_id_elsewhere", "by_key"]),
        "value": st.sampled_from([0.0, -0.0, 0.5, -1.0, 3.0, float("inf"), float("nan"), None]),
    }
)


def write_random_run(
    run: str, trajs: list[dict[str, Any]], killed: set[int], prefix: bool, order: Sequence[int] = range(4)
) -> None:
    """Up to four shards of :data:`random_trajectory` rows, three rows a batch, closed in ``order`` (the
    shards in ``killed`` left by dead writers); with ``prefix``, trace ids as the recorder makes them (each
    shard's range its own), else interleaved."""
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in range(4)}
    for t, spec in enumerate(trajs):
        tid = f"{spec['files'][0]}{t:031x}" if prefix else f"{t:031x}{spec['files'][0]}"
        for n in range(spec["spans"]):
            rows[spec["files"][n % len(spec["files"])]].append(partial_span(tid, n, spec["step"], spec["validate"]))
        if spec["reward"] != "none":
            home = spec["files"][0]
            where = (home + 1) % 4 if spec["reward"].endswith("elsewhere") else home
            by_id = spec["reward"].startswith("by_id")
            reward = partial_reward(tid if by_id else "", 50 + t, spec["step"], spec["value"], spec["validate"])
            rows[where].append(reward)
    for w in order:
        if rows[w]:
            write_shard(run, [rows[w][i : i + 3] for i in range(0, len(rows[w]), 3)], close=w not in killed)

"""Shards written by the real writer (closed, or killed after a flush) and checks of their shard indexes, for storage tests."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer
from tracer import schema as S
from tracer.storage import shard_index as _si
from tracer.storage.files import read_layout
from tracer.storage.shard_index import load_shard_index
from tracer.storage.writer import SpanWriter
from tracer.summary import SUMMARY_SPAN_COLUMNS, summarize

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
    writer = SpanWriter(run, META)
    for rows in batches:
        writer.write(pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA))
    path = writer.path
    assert path is not None
    if close:
        writer.close()
    else:
        writer._let_go()
    return path


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

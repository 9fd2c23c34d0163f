"""A writer keeps nothing of an open shard's spans in memory: its index is built from the file at close."""

from __future__ import annotations

import gc
import os
from typing import Any

import pyarrow as pa
from index_fixtures import META, trace_span

from tracer import schema as S
from tracer.index.closed import shard_closed
from tracer.index.shard import load_shard_index
from tracer.read import read_spans
from tracer.storage.writer import SpanWriter

BATCHES = 20
ROWS = 2_000
#: Arrow bytes a writer may hold per span written to its open shard (the index builder held ~146).
MAX_BYTES_PER_SPAN = 1.0


def _batch(k: int) -> pa.RecordBatch:
    rows = [{**trace_span(f"b{k}t{i // 8}", i % 8, step=k), S.ATTRIBUTES: '{"tokens": 7}'} for i in range(ROWS)]
    return pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA)


def test_an_open_shard_costs_no_memory_per_span_and_gets_its_index_at_close(tmp_path: Any) -> None:
    run = os.fspath(tmp_path)
    writer = SpanWriter(run, META, max_file_bytes=1 << 40, on_close=shard_closed)
    writer.write(_batch(-1))  # the file, its stream and the writer's buffers exist from here on
    gc.collect()
    before = pa.total_allocated_bytes()
    for k in range(BATCHES):
        writer.write(_batch(k))  # each batch dies here, as the recorder's do
    gc.collect()
    held = pa.total_allocated_bytes() - before
    assert held <= MAX_BYTES_PER_SPAN * BATCHES * ROWS, f"{held} bytes held for {BATCHES * ROWS} spans"
    writer.close()
    assert writer.path is not None
    index = load_shard_index(writer.path)
    assert index is not None and sum(index.batch_rows) == (BATCHES + 1) * ROWS
    assert read_spans(run, steps=[3]).num_rows == ROWS

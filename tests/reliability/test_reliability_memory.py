"""Bounded memory under load: a full buffer blocks (nothing lost) or drops (every drop counted, in the files too).

Each test runs ``tests/faults/load.py`` in a fresh process: 32 asyncio tasks
and 2 threads record spans of ~16 KB (8 KB of text in the inputs, the same in
the outputs) as fast as they can for 3 s. The writer thread is the
bottleneck, so the buffer is full most of the time. Resident memory is
sampled every 5 ms; its growth over the warmed-up baseline must stay within
a fixed allowance plus a few copies of the configured buffer (the writer
holds one buffer-full being encoded while callers fill the next).
``bench/bench_memory.py`` shows the same load without a limit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pytest
from reliability_fixtures import FIGURES, start_fault_script

import tracer

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.usefixtures("figures_report")]

SECONDS = 3
LIMIT = 200
PAYLOAD = 8000  # bytes of text per argument; the span holds it twice (inputs and outputs)
SPAN_BYTES = 2 * PAYLOAD
#: Allocator arenas of the threads, pyarrow's memory pool, zstd contexts.
FIXED_ALLOWANCE = 64 * 2**20
#: Copies of a buffer-full alive at once: the records, their JSON, the Arrow batch, the compressed batch.
BUFFER_COPIES = 8


def run_load(out: str, mode: str) -> dict[str, Any]:
    proc = start_fault_script("load.py", out, SECONDS, LIMIT, mode, PAYLOAD, 32, 2)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def growth_bound() -> int:
    return FIXED_ALLOWANCE + BUFFER_COPIES * LIMIT * SPAN_BYTES


def test_full_buffer_in_block_mode_bounds_memory_and_loses_nothing(trace_dir: str) -> None:
    """on_buffer_full='block' under load: memory growth stays within the buffer allowance; every recorded span is read back."""
    load = run_load(trace_dir, "block")
    growth = load["rss_peak"] - load["rss_baseline"]
    spans = tracer.read_spans(trace_dir, columns=["span_id"]).num_rows
    FIGURES["memory, block"] = {
        "max_buffered_spans": LIMIT,
        "spans_recorded": load["recorded"],
        "spans_read_back": spans,
        "rss_growth_MiB": round(growth / 2**20, 1),
        "bound_MiB": round(growth_bound() / 2**20, 1),
    }
    assert load["ok"] and load["spans_dropped"] == 0
    assert spans == load["recorded"]
    assert growth < growth_bound(), FIGURES["memory, block"]


def _dropped_in_metadata(path: str) -> int:
    """The largest spans_dropped any batch of any file under ``path`` carries."""
    most = 0
    for file in tracer.list_trace_files(path):
        with open(file, "rb") as f:
            raw = f.read()
        # A closed shard may be an IPC file: its messages are a stream after the 8-byte magic.
        reader = pa.ipc.open_stream(raw[8:] if raw.startswith(b"ARROW1") else raw)
        while True:
            try:
                batch = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            meta = {k.decode(): v.decode() for k, v in (batch.custom_metadata or {}).items()}
            most = max(most, int(meta.get("rollout_trace.spans_dropped", 0)))
    return most


def test_full_buffer_in_drop_mode_bounds_memory_and_counts_every_drop(trace_dir: str) -> None:
    """on_buffer_full='drop' under load: memory bounded; written + dropped == recorded; the drop count is in the files."""
    load = run_load(trace_dir, "drop")
    growth = load["rss_peak"] - load["rss_baseline"]
    spans = tracer.read_spans(trace_dir, columns=["span_id"]).num_rows
    FIGURES["memory, drop"] = {
        "max_buffered_spans": LIMIT,
        "spans_recorded": load["recorded"],
        "spans_written": spans,
        "spans_dropped": load["spans_dropped"],
        "rss_growth_MiB": round(growth / 2**20, 1),
        "bound_MiB": round(growth_bound() / 2**20, 1),
    }
    assert load["spans_dropped"] > 0 and not load["ok"]
    assert spans + load["spans_dropped"] == load["recorded"]
    assert _dropped_in_metadata(trace_dir) == load["spans_dropped"]
    assert growth < growth_bound(), FIGURES["memory, drop"]

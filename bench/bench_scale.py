"""Reading one step of a big run: shard scan vs compacted, step-indexed files.

Generates a synthetic run of N spans (default 10M) as many closed shard
files, written by tracer's own writer (zstd Arrow IPC streams, as workers
write them), then measures, in this one process:

1. scan: ``tracer.read_spans(run, steps=[k])`` over the shards (every
   shard's step column and the requested columns are decompressed);
2. compaction: ``rollout-trace compact`` of the run;
3. indexed: the same call after compaction (only step k's batches are read).

    python bench/bench_scale.py [--spans 10000000] [--steps 100] [--dir /tmp/rt-scale]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.index.closed import shard_closed  # noqa: E402
from tracer.storage.compact import compact  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402

SPANS_PER_TRAJECTORY = 8
WORKERS = 16


def hex_ids(start: int, n: int, width: int, prefix: str) -> pa.Array:
    return pa.array([f"{prefix}{i:0{width}x}" for i in range(start, start + n)])


def chunk(start: int, n: int, step: int, now: int) -> pa.RecordBatch:
    """n spans of step ``step``: trajectories of 1 rollout root + 7 children (llm/tool alternating)."""
    idx = np.arange(start, start + n)
    traj = idx // SPANS_PER_TRAJECTORY
    pos = idx % SPANS_PER_TRAJECTORY
    trace_id = pc.binary_join_element_wise("t" * 16, pc.cast(pa.array(traj), pa.string()), "")
    span_id = pc.cast(pa.array(idx), pa.string())
    root = pc.cast(pa.array(traj * SPANS_PER_TRAJECTORY), pa.string())
    is_root = pa.array(pos == 0)
    parent = pc.if_else(is_root, pa.nulls(n, pa.string()), root)
    kind = pc.if_else(is_root, "rollout", pc.if_else(pa.array(pos % 2 == 1), "llm", "tool"))
    name = pc.if_else(is_root, "agent_loop", pc.if_else(pa.array(pos % 2 == 1), "generate", "calculator"))
    inputs = pc.binary_join_element_wise('{"expression": "', pc.cast(pa.array(idx % 997), pa.string()), ' * 12"}', "")
    outputs = pc.binary_join_element_wise('"', pc.cast(pa.array((idx % 997) * 12), pa.string()), '"', "")
    starts = pa.array(now + idx * 1000, pa.int64())
    arrays = {
        S.TRACE_ID: trace_id,
        S.SPAN_ID: span_id,
        S.PARENT_SPAN_ID: parent,
        S.NAME: name,
        S.KIND: kind,
        S.START_NS: starts,
        S.END_NS: pc.add(starts, 500),
        S.STATUS: pa.array(np.where(idx % 50 == 7, "error", "ok")),
        S.ERROR: pa.nulls(n, pa.string()),
        S.STEP: pa.array(np.full(n, step), pa.int64()),
        S.SAMPLE_INDEX: pc.cast(pa.array((traj // 8) % 64), pa.string()),
        S.ROLLOUT_N: pa.array(traj % 8, pa.int64()),
        S.VALIDATE: pa.array(np.zeros(n, dtype=bool)),
        S.REWARD: pa.nulls(n, pa.float64()),
        S.INPUTS: inputs,
        S.OUTPUTS: outputs,
        S.ATTRIBUTES: pa.nulls(n, pa.string()),
    }
    return pa.RecordBatch.from_arrays([arrays[c] for c in S.SPAN_COLUMNS], schema=S.SPAN_SCHEMA)


def generate(run_dir: str, spans: int, steps: int) -> None:
    per_step = spans // steps
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, S.META_PROJECT: "bench", S.META_EXPERIMENT: "scale"}
    writers = [
        SpanWriter(run_dir, meta, compression_level=3, max_file_bytes=32 * 1024 * 1024, on_close=shard_closed)
        for _ in range(WORKERS)
    ]
    now = time.time_ns()
    start = 0
    for step in range(steps):
        # Each step's spans spread over the workers, 8192-row batches, as live writers produce them.
        per_worker = per_step // WORKERS
        for writer in writers:
            for off in range(0, per_worker, 8192):
                n = min(8192, per_worker - off)
                writer.write(chunk(start, n, step, now))
                start += n
        if step % 10 == 9:
            print(f"  generated {start:,} spans", flush=True)
    for writer in writers:
        writer.close()


def timed(fn, rounds: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="rt-scale-")
    run = os.path.join(root, "bench", "scale")
    t0 = time.perf_counter()
    generate(run, args.spans, args.steps)
    gen_s = time.perf_counter() - t0
    files = tracer.list_trace_files(run)
    disk = sum(os.path.getsize(f) for f in files)
    print(
        f"{args.spans:,} spans, {args.steps} steps, {len(files)} shard files, {disk / 1e6:.0f} MB on disk (generated in {gen_s:.0f} s)"
    )
    step = args.steps // 2
    cols = ["trace_id", "span_id", "parent_span_id", "name", "kind", "status", "inputs", "outputs"]

    scan_s, t = timed(lambda: tracer.read_spans(run, columns=cols, steps=[step]), rounds=1)
    rows = t.num_rows  # type: ignore[attr-defined]
    scan_traj_s, _ = timed(lambda: tracer.read_trajectories(run, steps=[step]), rounds=1)
    t0 = time.perf_counter()
    report = compact(run)
    compact_s = time.perf_counter() - t0
    files_after = tracer.list_trace_files(run)
    idx_s, t2 = timed(lambda: tracer.read_spans(run, columns=cols, steps=[step]))
    idx_traj_s, _ = timed(lambda: tracer.read_trajectories(run, steps=[step]))
    assert t2.num_rows == rows  # type: ignore[attr-defined]
    print(
        f"compaction: {report.files_in} files -> {report.files_out} in {compact_s:.0f} s ({report.rows / compact_s:,.0f} spans/s), "
        f"{report.bytes_in / 1e6:.0f} MB -> {report.bytes_out / 1e6:.0f} MB"
    )
    print(
        f"read one step ({rows:,} spans, 8 columns): shard scan {scan_s:.2f} s, indexed {idx_s:.3f} s -> {scan_s / idx_s:.0f}x"
    )
    print(
        f"read_trajectories of one step:         shard scan {scan_traj_s:.2f} s, indexed {idx_traj_s:.3f} s -> {scan_traj_s / idx_traj_s:.0f}x"
    )
    factor = 1e9 / args.spans
    print(
        f"prediction for 1B spans ({factor:.0f}x this run, same steps): a shard scan reads the whole run, "
        f"~{scan_s * factor:.0f} s per step read; the indexed read reads one step ({rows * factor:,.0f} spans if steps grow "
        f"with the run: ~{idx_s * factor:.1f} s; with steps of today's size: ~{idx_s:.2f} s) plus one footer per file "
        f"({len(files_after) * factor:.0f} files) and one index per run dir."
    )
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

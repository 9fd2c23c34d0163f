"""Following a growing run: what one refresh costs against the run's size, and against a full re-read.

A run grows step by step toward N spans (default 1M): W workers' writers
(tracer's own storage writer, batches built in Arrow, not through the
decorators) each append one batch per step. After every step the viewer's
live reader (:class:`viewer.data.LiveRun`, over :class:`tracer.follow.RunFollower`)
refreshes and builds the page's tables (trajectory table with advantage,
latency and tools, steps, running trajectories). At a few run sizes the
same tables are built the way the viewer does without ``--follow`` (every
change of a file's size re-reads the run: ``load_run`` + ``list_steps``),
and ``tracer.read_trajectories`` alone, in the same process.

    python bench/bench_follow.py [--spans 1000000] [--step-spans 10000] [--workers 4] [--batches-per-step 1]
                                 [--dir /tmp/rt-follow]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_scale  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from bench_scale import SPANS_PER_TRAJECTORY  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.index.closed import shard_closed  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402
from viewer import data as D  # noqa: E402


def chunk(start: int, n: int, step: int, worker: int, now: int) -> pa.RecordBatch:
    """``bench_scale.chunk``'s n spans, with worker ``worker``'s trace ids and each trajectory's last span its reward."""
    batch = bench_scale.chunk(start, n, step, now)
    traj = np.arange(start, start + n) // SPANS_PER_TRAJECTORY
    is_reward = pa.array(np.arange(start, start + n) % SPANS_PER_TRAJECTORY == SPANS_PER_TRAJECTORY - 1)
    no_str, no_float = pa.nulls(n, pa.string()), pa.nulls(n, pa.float64())
    changed = {
        S.TRACE_ID: pc.binary_join_element_wise(f"w{worker}-", pc.cast(pa.array(traj), pa.string()), ""),
        S.PARENT_SPAN_ID: pc.if_else(is_reward, no_str, batch.column(S.PARENT_SPAN_ID)),
        S.KIND: pc.if_else(is_reward, S.KIND_REWARD, batch.column(S.KIND)),
        S.NAME: pc.if_else(is_reward, S.REWARD_SPAN_NAME, batch.column(S.NAME)),
        S.REWARD: pc.if_else(is_reward, pa.array((traj % 2).astype(float)), no_float),
        S.ATTRIBUTES: pc.if_else(is_reward, pa.scalar('{"advantage": 0.5}'), no_str),
    }
    columns = [changed.get(c, batch.column(c)) for c in S.SPAN_COLUMNS]
    return pa.RecordBatch.from_arrays(columns, schema=S.SPAN_SCHEMA)


def quiet(fn, *args):  # noqa: ANN001, ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def page_tables(live: D.LiveRun) -> None:
    """What the Overview and Trajectories pages take from the live reader."""
    live.trajectories()
    live.steps_loaded()
    live.running_rows()


def full_reread(path: str) -> None:
    """What the viewer does without --follow when a file grew: the run's tables from the files again."""
    D.load_run(path)
    D.list_steps(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--step-spans", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batches-per-step", type=int, default=1, help="batches each worker writes per step (flushes)")
    ap.add_argument("--max-file-mb", type=int, default=256, help="shard rotation size (the writer's default: 256)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="rt-follow-")
    run_dir = os.path.join(root, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, S.META_PROJECT: "bench", S.META_EXPERIMENT: "follow"}
    writers = [
        SpanWriter(run_dir, meta, max_file_bytes=args.max_file_mb * 1024 * 1024, on_close=shard_closed)
        for _ in range(args.workers)
    ]
    per_worker = args.step_spans // args.workers // SPANS_PER_TRAJECTORY * SPANS_PER_TRAJECTORY
    steps = args.spans // (per_worker * args.workers)
    checkpoints = sorted({1, steps // 10, steps // 4, steps // 2, steps} - {0})
    now = time.time_ns()
    live = D.LiveRun(run_dir)
    starts = [w * 10**12 for w in range(args.workers)]
    print(
        f"run grows to {steps * per_worker * args.workers:,} spans: {steps} steps x {args.workers} workers x "
        f"{per_worker:,} spans, {args.batches_per_step} batch(es) per worker per step; "
        f"shards rotate at {args.max_file_mb} MB"
    )
    print(
        f"{'run spans':>10} {'new rows':>9} {'refresh ms':>11} {'tables ms':>10} {'idle ms':>8} "
        f"{'full re-read ms':>16} {'read_trajectories ms':>21} {'full / follow':>14}"
    )
    refresh_times: list[tuple[int, float, float]] = []
    gen_s = 0.0
    for step in range(steps):
        g0 = time.perf_counter()
        for w, writer in enumerate(writers):
            per_batch = per_worker // args.batches_per_step // SPANS_PER_TRAJECTORY * SPANS_PER_TRAJECTORY
            for b in range(args.batches_per_step):
                n = per_batch if b < args.batches_per_step - 1 else per_worker - per_batch * b
                writer.write(chunk(starts[w], n, step, w, now))
                starts[w] += n
        gen_s += time.perf_counter() - g0
        t0 = time.perf_counter()
        update = live.refresh()
        t1 = time.perf_counter()
        page_tables(live)
        t2 = time.perf_counter()
        refresh_times.append((live.follower.rows, t1 - t0, t2 - t1))
        if step + 1 in checkpoints:
            i0 = time.perf_counter()
            live.refresh()  # nothing new: the cost of a look
            page_tables(live)
            idle = time.perf_counter() - i0
            f0 = time.perf_counter()
            quiet(full_reread, run_dir)
            full = time.perf_counter() - f0
            r0 = time.perf_counter()
            quiet(tracer.read_trajectories, run_dir)
            rt = time.perf_counter() - r0
            follow = (t1 - t0) + (t2 - t1)
            print(
                f"{live.follower.rows:>10,} {update.rows:>9,} {1000 * (t1 - t0):>11.1f} {1000 * (t2 - t1):>10.1f} "
                f"{1000 * idle:>8.1f} {1000 * full:>16.0f} {1000 * rt:>21.0f} {full / follow:>13.0f}x",
                flush=True,
            )
    for writer in writers:
        writer.close()
    first = refresh_times[: max(len(refresh_times) // 10, 1)]
    last = refresh_times[-max(len(refresh_times) // 10, 1) :]
    med = statistics.median
    print(
        f"median refresh (read new batches) over the first 10% of steps: {1000 * med(r for _, r, _ in first):.1f} ms, "
        f"last 10%: {1000 * med(r for _, r, _ in last):.1f} ms; page tables: {1000 * med(t for _, _, t in first):.1f} ms "
        f"vs {1000 * med(t for _, _, t in last):.1f} ms"
    )
    live.refresh()
    same = live.follower.trajectories().equals(quiet(tracer.read_trajectories, run_dir))
    files = tracer.list_trace_files(run_dir)
    size = sum(os.path.getsize(f) for f in files)
    print(
        f"follower's table equals read_trajectories: {same}; {len(files)} files, {size / 1e6:.0f} MB; "
        f"generating the batches took {gen_s:.1f} s"
    )
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Shard indexes (issue 13): does the cost follow the question or the run?

Generates runs through the storage writer directly (``SpanWriter``, the
batches of ``bench_scale.chunk``: trajectories of 8 spans, each recorded by
one worker; 16 workers' shards for the big runs), then measures, each
number in a fresh Python process (imports excluded: "cold" means nothing
read yet in that process; the OS page cache is warm):

1. one trajectory, ``tracer.read_spans(run, trace_ids=[t])``: a 10M-span run
   against a 10k-span run, shards uncompacted (target: within 3x);
2. the viewer's landing page (``viewer.data.runs.list_steps`` and
   ``load_trajectories``, what the overview page reads): 1M against 1k spans
   (target: within 2x) and 10M spans (target: under 2 s);
3. one step, ``tracer.read_spans(run, columns=..., steps=[k])``: 10M spans
   uncompacted against the same run after ``rollout-trace compact``
   (target: within 3x).

The same reads with the shard indexes moved aside (what readers did before)
are printed beside them.

    python bench/bench_index.py [--big 10000000] [--mid 1000000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scale import SPANS_PER_TRAJECTORY, chunk  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.storage.compact import compact  # noqa: E402
from tracer.storage.shard_index import INDEX_SUFFIX  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402

BATCH_ROWS = 8192
STEP_COLUMNS = [S.TRACE_ID, S.SPAN_ID, S.PARENT_SPAN_ID, S.NAME, S.KIND, S.STATUS, S.INPUTS, S.OUTPUTS]


def generate(run_dir: str, spans: int, steps: int, workers: int) -> float:
    """Write ``spans`` spans over ``steps`` steps, each step's trajectories spread over ``workers`` writers."""
    t0 = time.perf_counter()
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, S.META_PROJECT: "bench", S.META_EXPERIMENT: "index"}
    writers = [SpanWriter(run_dir, meta, max_file_bytes=32 * 1024 * 1024) for _ in range(workers)]
    unit = SPANS_PER_TRAJECTORY * workers
    per_step = max(unit, spans // steps // unit * unit)
    start = 0
    now = time.time_ns()
    for step in range(steps):
        per_worker = per_step // workers
        for writer in writers:
            for off in range(0, per_worker, BATCH_ROWS):
                n = min(BATCH_ROWS, per_worker - off)
                writer.write(chunk(start, n, step, now))
                start += n
    for writer in writers:
        writer.close()
    return time.perf_counter() - t0


def trace_id(i: int) -> str:
    return "t" * 16 + str(i)


# -- one measurement per process --------------------------------------------------------------


def measure(kind: str, run: str, arg: int) -> dict[str, float]:
    """Time one question in this (fresh) process: the first call, then the median of a few more."""
    if kind == "trajectory":
        calls = [lambda i=i: tracer.read_spans(run, trace_ids=[trace_id(arg + 97 * i)]) for i in range(6)]
    elif kind == "landing":
        from viewer.data import runs as D

        calls = [lambda: (D.list_steps(run), D.load_trajectories(run))] * 3
    elif kind == "step":
        calls = [lambda i=i: tracer.read_spans(run, columns=STEP_COLUMNS, steps=[arg + i]) for i in range(4)]
    else:
        raise SystemExit(f"unknown measurement {kind!r}")
    times = []
    for call in calls:
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        if len(times) == 2 and times[0] > 2.0:  # a whole-run scan: one warm repeat says enough
            break
    rows = out.num_rows if hasattr(out, "num_rows") else out[1].table.num_rows
    return {"cold": times[0], "warm": statistics.median(times[1:]), "rows": rows}


def fresh(kind: str, run: str, arg: int = 0) -> dict[str, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", kind, "--run", run, "--arg", str(arg)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def hide_indexes(run: str) -> list[tuple[str, str]]:
    moved = []
    for side in glob.glob(os.path.join(run, "**", "*" + INDEX_SUFFIX), recursive=True):
        os.rename(side, side + ".off")
        moved.append((side + ".off", side))
    return moved


def restore(moved: list[tuple[str, str]]) -> None:
    for a, b in moved:
        os.rename(a, b)


def both(kind: str, run: str, arg: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """(with the shard indexes, with them moved aside)."""
    with_index = fresh(kind, run, arg)
    moved = hide_indexes(run)
    try:
        without = fresh(kind, run, arg)
    finally:
        restore(moved)
    return with_index, without


def line(label: str, a: dict[str, float], b: dict[str, float], what: str = "cold") -> str:
    return f"{label}: {a[what] * 1e3:8.1f} ms vs {b[what] * 1e3:8.1f} ms -> {a[what] / b[what]:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=10_000_000)
    ap.add_argument("--mid", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--arg", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.run, args.arg)))
        return
    root = args.dir or tempfile.mkdtemp(prefix="rt-index-")
    runs = {
        "1k": (1_000, 10, 1),
        "10k": (10_000, 10, 1),
        "mid": (args.mid, 100, 16),
        "big": (args.big, 100, 16),
    }
    paths = {}
    for name, (spans, steps, workers) in runs.items():
        path = os.path.join(root, name, "bench", "index")
        gen_s = generate(path, spans, steps, workers)
        files = tracer.list_trace_files(path)
        disk = sum(os.path.getsize(f) for f in files)
        side = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*" + INDEX_SUFFIX)))
        print(
            f"{name}: {spans:,} spans, {steps} steps, {len(files)} shard(s), {disk / 1e6:.1f} MB "
            f"+ {side / 1e6:.1f} MB of shard indexes, written in {gen_s:.1f} s",
            flush=True,
        )
        paths[name] = path
    big_traj = runs["big"][0] // SPANS_PER_TRAJECTORY
    small_traj = runs["10k"][0] // SPANS_PER_TRAJECTORY

    print("\n1. one trajectory, read_spans(run, trace_ids=[t]), uncompacted (big vs 10k):")
    big_i, big_n = both("trajectory", paths["big"], big_traj // 3)
    small_i, small_n = both("trajectory", paths["10k"], small_traj // 3)
    for what in ("cold", "warm"):
        print("  " + line(f"indexed, {what}", big_i, small_i, what) + " (target <= 3x)")
        print("  " + line(f"no index, {what}", big_n, small_n, what))

    print("\n2. viewer landing page (list_steps + load_trajectories), fresh process:")
    mid_i, mid_n = both("landing", paths["mid"])
    one_i, one_n = both("landing", paths["1k"])
    big_l = fresh("landing", paths["big"])
    print("  " + line("indexed, mid vs 1k", mid_i, one_i) + " (target <= 2x)")
    print("  " + line("no index, mid vs 1k", mid_n, one_n))
    print(
        f"  indexed, big: {big_l['cold']:.2f} s cold, {big_l['warm']:.2f} s warm ({big_l['rows']:,} trajectories; target < 2 s)"
    )

    print("\n3. one step, read_spans(run, columns=8, steps=[k]), big run:")
    step = runs["big"][1] // 2
    unc_i, unc_n = both("step", paths["big"], step)
    t0 = time.perf_counter()
    report = compact(paths["big"])
    print(f"  (compacted {report.files_in} files -> {report.files_out} in {time.perf_counter() - t0:.0f} s)")
    comp = fresh("step", paths["big"], step)
    for what in ("cold", "warm"):
        print("  " + line(f"uncompacted indexed vs compacted, {what}", unc_i, comp, what) + " (target <= 3x)")
        print("  " + line(f"uncompacted no index vs compacted, {what}", unc_n, comp, what))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Compaction on one machine vs ``compact --ray``, on copies of the same local run, in one process.

Generates a synthetic run (bench_scale's generator: shards of 16 writers,
zstd Arrow IPC) once, copies it, then measures:

1. local: :func:`tracer.storage.compact.compact` (merges one after the other);
2. ray: :func:`tracer.storage.compact_ray.compact_ray` on a local cluster
   started beforehand (its start is timed apart), one task per merge.

Both use the same ``--merges`` groups of input. On a machine with few cores
the ratio measures Ray's overhead (task dispatch, worker processes, results
travelling back), not scale-out: the tasks share the same cores as the
local path's loop.

    python bench/bench_compact_ray.py [--spans 1000000] [--steps 10] [--merges 4] [--cpus 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scale import generate  # noqa: E402

import tracer  # noqa: E402
from tracer.storage.compact import compact  # noqa: E402
from tracer.storage.compact_ray import compact_ray  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--merges", type=int, default=4, help="groups of input (one Ray task each)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray cluster")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="rt-compact-ray-")
    source = os.path.join(root, "source", "bench", "scale")
    generate(source, args.spans, args.steps)
    files = tracer.list_trace_files(source)
    disk = sum(os.path.getsize(f) for f in files)
    target = max(1, disk // args.merges)
    print(f"{args.spans:,} spans, {args.steps} steps, {len(files)} shards, {disk / 1e6:.0f} MB; {args.merges} merges")
    runs = {}
    for name in ("local", "ray"):
        runs[name] = os.path.join(root, name)
        shutil.copytree(os.path.join(root, "source"), runs[name])

    t0 = time.perf_counter()
    local = compact(runs["local"], target_bytes=target)
    local_s = time.perf_counter() - t0

    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        warm = compact_ray(runs["ray"], target_bytes=target)  # the first tasks also start the worker processes
        first_s = time.perf_counter() - t0
        assert warm.rows == local.rows == args.spans, (warm.rows, local.rows)
        shutil.rmtree(runs["ray"])
        shutil.copytree(os.path.join(root, "source"), runs["ray"])
        t0 = time.perf_counter()
        again = compact_ray(runs["ray"], target_bytes=target)
        ray_s = time.perf_counter() - t0
    finally:
        ray.shutdown()
    assert again.rows == local.rows and again.files_out == local.files_out
    same = tracer.read_spans(runs["ray"], columns=["span_id"]).num_rows == args.spans
    print(f"local:          {local_s:6.2f} s  ({local.rows / local_s:,.0f} spans/s), {local.files_out} files out")
    print(f"ray, first run: {first_s:6.2f} s  (worker processes start), cluster start {start_s:.1f} s apart")
    print(f"ray, warm:      {ray_s:6.2f} s  ({again.rows / ray_s:,.0f} spans/s) -> {ray_s / local_s:.2f}x local")
    print(f"rows read back after --ray: {'same' if same else 'DIFFERENT'}; {os.cpu_count()} cores here")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

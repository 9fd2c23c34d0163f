"""Memory under load: peak resident memory against the configured span buffer, block and drop.

Each configuration runs ``tests/faults/load.py`` in a fresh process: 64
asyncio tasks and 2 threads record ~16 KB spans (8 KB of text in, the same
out) as fast as they can for ``--seconds``. The writer is the bottleneck, so
the buffer stays full. Resident memory (RSS, sampled every 5 ms) is reported
as growth over the warmed-up baseline. The last row has no effective limit
(``max_buffered_spans=10**7``): what an unbounded buffer costs under the same
load in a shorter window (its backlog is not written).

    python bench/bench_memory.py [--seconds 15] [--payload 8000] [--limits 100,1000,10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOAD = os.path.join(REPO, "tests", "faults", "load.py")
MIB = 2**20


def run(seconds: float, limit: int, mode: str, payload: int, noflush: bool = False) -> dict[str, object]:
    out = tempfile.mkdtemp(prefix="rt-bench-mem-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("ROLLOUT_TRACE_STRICT", None)
    args = [sys.executable, LOAD, out, str(seconds), str(limit), mode, str(payload), "64", "2"]
    if noflush:
        args.append("noflush")
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600, check=True)
        result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
        if not noflush:
            sys.path.insert(0, REPO)
            import tracer

            result["read_back"] = tracer.read_spans(out, columns=["span_id"]).num_rows
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--payload", type=int, default=8000, help="bytes of text per argument")
    parser.add_argument("--limits", default="100,1000,10000")
    parser.add_argument("--unbounded-seconds", type=float, default=3.0)
    args = parser.parse_args()
    span_kib = 2 * args.payload / 1024
    print(f"load: 64 asyncio tasks + 2 threads, spans of ~{span_kib:.0f} KiB, {args.seconds:g} s per row\n")
    print(
        "| on_buffer_full | max_buffered_spans | buffer (limit x span) | spans recorded | written | dropped | read back | RSS growth at peak | growth / buffer |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = [(mode, int(limit)) for mode in ("block", "drop") for limit in args.limits.split(",")]
    for mode, limit in rows:
        r = run(args.seconds, limit, mode, args.payload)
        growth = (int(r["rss_peak"]) - int(r["rss_baseline"])) / MIB  # type: ignore[call-overload]
        buffer = limit * 2 * args.payload / MIB
        print(
            f"| {mode} | {limit:,} | {buffer:.1f} MiB | {r['recorded']:,} | {r['spans_written']:,} | "
            f"{r['spans_dropped']:,} | {r['read_back']:,} | {growth:.1f} MiB | {growth / buffer:.1f} |",
            flush=True,
        )
    r = run(args.unbounded_seconds, 10**7, "block", args.payload, noflush=True)
    growth = (int(r["rss_peak"]) - int(r["rss_baseline"])) / MIB  # type: ignore[call-overload]
    print(
        f"| block, no limit ({args.unbounded_seconds:g} s) | 10,000,000 | - | {r['recorded']:,} | - | - | - | "
        f"{growth:.1f} MiB | - |"
    )


if __name__ == "__main__":
    main()

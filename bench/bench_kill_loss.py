"""Measure what ``os._exit`` and SIGKILL lose: spans recorded before the end that are not in the files.

A subprocess records trajectories at a known rate (each one a
``rollout_trace_attr`` block around one decorated call: 2 spans) and, after
each, writes one byte to a counter file with ``os.write`` (a syscall: done
before the next trajectory starts, and kept by the kernel whatever ends the
process). Then either the parent sends SIGKILL or the child calls
``os._exit(0)`` itself, at a random moment 1.5-3.5 s in. Neither runs any
hook, so the recorder cannot drain. Afterwards the files are read back
(``tracer.read_spans``, which reads a torn shard up to its damage) and
compared with the counter: lost = recorded - in files, also given in seconds
of recording (lost / rate), to compare with ``flush_interval_s``.

Usage::

    .venv/bin/python bench/bench_kill_loss.py [--runs 8] [--rate 400] [--flush 1.0 0.25]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tracer  # noqa: E402

SPANS_PER_TRAJECTORY = 2

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import tracer

    counter_path, rate, flush, mode, end_after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    tracer.init(project_name="p", experiment_name="e", flush_interval_s=flush)

    @tracer.rollout_trace_op(kind="llm")
    def generate(i):
        return {"response_ids": [i, i + 1, i + 2]}

    counter = os.open(counter_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    print("READY", flush=True)
    start = time.monotonic()
    i = 0
    while True:
        with tracer.rollout_trace_attr(sample_index=i, step=1):
            generate(i)
        os.write(counter, b"x")
        i += 1
        if mode == "exit" and time.monotonic() - start >= end_after:
            os._exit(0)
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    """
)


def one_run(rate: float, flush: float, mode: str, rng: random.Random) -> tuple[int, int]:
    """(spans recorded before the end, spans in the files) of one killed recorder."""
    with tempfile.TemporaryDirectory() as tmp:
        counter = os.path.join(tmp, "counter")
        trace_dir = os.path.join(tmp, "traces")
        end_after = rng.uniform(1.5, 3.5)
        env = {**os.environ, tracer.ENV_TRACE_DIR: trace_dir, "PYTHONPATH": REPO}
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, counter, str(rate), str(flush), mode, str(end_after)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        if mode == "sigkill":
            time.sleep(end_after)
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        recorded = os.path.getsize(counter) * SPANS_PER_TRAJECTORY
        written = tracer.read_spans(trace_dir).num_rows if tracer.list_trace_files(trace_dir) else 0
        return recorded, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--rate", type=float, default=400.0, help="trajectories per second (2 spans each)")
    parser.add_argument("--flush", type=float, nargs="+", default=[1.0, 0.25], help="flush_interval_s values")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    span_rate = args.rate * SPANS_PER_TRAJECTORY
    print(f"rate {args.rate:.0f} trajectories/s ({span_rate:.0f} spans/s), {args.runs} runs each")
    print(
        "| end | flush_interval_s | spans lost per run (min / median / max) | as seconds of recording (max) | runs losing more than one interval |"
    )
    print("|---|---|---|---|---|")
    for flush in args.flush:
        for mode in ("exit", "sigkill"):
            lost, over = [], 0
            for _ in range(args.runs):
                recorded, written = one_run(args.rate, flush, mode, rng)
                if written > recorded:
                    raise SystemExit(f"more spans in the files ({written}) than recorded ({recorded})")
                lost.append(recorded - written)
                over += (recorded - written) > span_rate * flush
            name = "os._exit" if mode == "exit" else "SIGKILL"
            print(
                f"| {name} | {flush} | {min(lost)} / {statistics.median(lost):.0f} / {max(lost)} "
                f"| {max(lost) / span_rate:.2f} s | {over} of {args.runs} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""What each sampling strategy costs: uniform vs extremes vs variance (and no sampling), one process, interleaved.

uniform decides as rollouts start, so the groups it leaves out pass straight
through; extremes and variance record every group (up to
``sample_candidates_per_step``), hold the spans until the rewards are in, then
drop the groups they do not keep. This measures that difference: time in the
recording loop per trajectory, time until flush() returns (the writer's
share), spans written, and peak spans held.

    python bench/bench_sampling.py --steps 4 --groups 64 --n 8 --keep 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import tracer

STRATEGIES = ("none", "uniform", "extremes", "variance")


@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids: list[int], turn: int) -> dict[str, Any]:
    return {"response_ids": list(range(40 + turn)), "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="tool")
def tool(query: str) -> str:
    return "result " + query


def one_run(strategy: str, args: argparse.Namespace, root: str) -> dict[str, float]:
    out = os.path.join(root, strategy)
    shutil.rmtree(out, ignore_errors=True)
    fields: dict[str, Any] = {"output_dir": out, "seed": 1}
    if strategy != "none":
        fields.update(max_samples=args.keep, sample_strategy=strategy)
    tracer.init(**fields)
    loop = flush = 0.0
    peak = 0
    for step in range(args.steps):
        t0 = time.perf_counter()
        for sample in range(args.groups):
            for n in range(args.n):
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    for turn in range(args.turns):
                        generate([sample, n, turn], turn)
                        tool(f"{sample}-{turn}")
        for sample in range(args.groups):
            for n in range(args.n):
                tracer.log_reward(float((sample * 7 + n) % 5), step=step, sample_index=sample, rollout_n=n)
        t1 = time.perf_counter()
        rec = tracer.record.recorder.ACTIVE
        peak = (
            max(peak, len(rec.gate.held if rec.gate is not None else ()) + len(rec.buffer)) if rec is not None else peak
        )
        tracer.flush()
        t2 = time.perf_counter()
        loop += t1 - t0
        flush += t2 - t1
    tracer.shutdown()
    trajectories = args.steps * args.groups * args.n
    written = tracer.read_spans(out).num_rows
    size = sum(os.path.getsize(f) for f in tracer.list_trace_files(out))
    return {
        "loop_us_per_traj": loop / trajectories * 1e6,
        "flush_ms_per_step": flush / args.steps * 1e3,
        "spans_written": written,
        "bytes": size,
        "peak_held": peak,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--keep", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench-sampling-")
    results: dict[str, list[dict[str, float]]] = {s: [] for s in STRATEGIES}
    try:
        for _ in range(args.rounds):
            for s in STRATEGIES:  # interleaved: load on the machine hits every strategy alike
                results[s].append(one_run(s, args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = min(r["loop_us_per_traj"] for r in results["uniform"])
    base_flush = min(r["flush_ms_per_step"] for r in results["uniform"])
    print(
        f"{args.steps} steps x {args.groups} groups x {args.n} rollouts x {args.turns} turns; keep {args.keep} groups/step"
    )
    print(
        f"{'strategy':10} {'loop us/traj':>13} {'x uniform':>9} {'flush ms/step':>14} {'x uniform':>9} "
        f"{'spans':>7} {'bytes':>9} {'peak held':>9}"
    )
    for s, rs in results.items():
        loop = min(r["loop_us_per_traj"] for r in rs)
        fl = min(r["flush_ms_per_step"] for r in rs)
        r0 = rs[0]
        print(
            f"{s:10} {loop:13.1f} {loop / base:9.2f} {fl:14.1f} {fl / base_flush:9.2f} "
            f"{int(r0['spans_written']):7d} {int(r0['bytes']):9d} {int(max(r['peak_held'] for r in rs)):9d}"
        )


if __name__ == "__main__":
    main()

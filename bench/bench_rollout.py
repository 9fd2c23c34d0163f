"""Tracing overhead of a real agent loop: the scripted demo with tracing off vs on.

Runs the same rollout steps (scripted policy, no simulated latency, real
tools: the Python tool spawns subprocesses) in this process, alternating
``backend=None`` and ``backend="arrow"`` (token2text on, as the demo
records), and reports the median wall time of each and the difference per
span. The arrow time includes ``tracer.shutdown()``, i.e. everything
durable on disk. It also reports this process's CPU time (all threads, the
tracer's writer included; not the tool subprocesses), which a busy shared
machine disturbs far less than wall time.

    .venv/bin/python bench/bench_rollout.py --rounds 5 --steps 4 --batch 8 --n 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import tracer
from rollout.agent_loop import ToolAgentLoop
from rollout.engines.scripted import ScriptedEngine
from rollout.runner import RunConfig, load_problems, run_steps
from rollout.tokenizer import load_qwen_tokenizer
from rollout.tools import default_tools

#: (backend, seconds spent in tracer.shutdown()) per run.
SHUTDOWN_S: list[tuple[str | None, float]] = []


def one_run(
    backend: str | None, out: str, tok: object, problems: list[dict], cfg: RunConfig, tag: str
) -> tuple[float, float, int]:
    loop = ToolAgentLoop(ScriptedEngine(tok, problems), tok, default_tools())
    tracer.init(
        project_name="bench", experiment_name=tag, backend=backend, output_dir=out, token2text=True, tokenizer=tok
    )
    start, cpu = time.perf_counter(), time.process_time()
    asyncio.run(run_steps(loop, problems, cfg))
    loop_s = time.perf_counter() - start
    tracer.shutdown()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    SHUTDOWN_S.append((backend, elapsed - loop_s))
    spans = tracer.read_spans(f"{out}/bench/{tag}", columns=["span_id"]).num_rows if backend else 0
    return elapsed, cpu, spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    tok = load_qwen_tokenizer()
    problems = load_problems()
    cfg = RunConfig(steps=args.steps, batch_size=args.batch, n=args.n, val_every=0)
    times: dict[str, list[float]] = {"off": [], "arrow": []}
    cpus: dict[str, list[float]] = {"off": [], "arrow": []}
    spans = 0
    with tempfile.TemporaryDirectory() as out:
        one_run(None, out, tok, problems, cfg, "warmup")
        for r in range(args.rounds):
            for name, backend in (
                (("off", None), ("arrow", "arrow")) if r % 2 == 0 else (("arrow", "arrow"), ("off", None))
            ):
                t, c, n = one_run(backend, out, tok, problems, cfg, f"{name}-{r}")
                times[name].append(t)
                cpus[name].append(c)
                spans = max(spans, n)
    rollouts = args.steps * args.batch * args.n
    off, on = statistics.median(times["off"]), statistics.median(times["arrow"])
    coff, con = statistics.median(cpus["off"]), statistics.median(cpus["arrow"])
    print(f"{rollouts} rollouts/run, {spans} spans recorded/run, {args.rounds} rounds (alternating order)")
    print("| tracing | median wall s | min | max | median CPU s (this process) | min | max |")
    print("|---|---|---|---|---|---|---|")
    for name in times:
        w, c = times[name], cpus[name]
        print(
            f"| {name} | {statistics.median(w):.2f} | {min(w):.2f} | {max(w):.2f} | {statistics.median(c):.2f} | {min(c):.2f} | {max(c):.2f} |"
        )
    shut = [t for b, t in SHUTDOWN_S if b == "arrow"]
    print(f"tracer.shutdown() (final flush) with arrow: median {statistics.median(shut):.2f} s, included above")
    print(f"wall overhead: {100 * (on - off) / off:+.1f}% ({1e6 * (on - off) / max(spans, 1):+.0f} us per span)")
    print(f"CPU overhead: {100 * (con - coff) / coff:+.1f}% ({1e6 * (con - coff) / max(spans, 1):+.0f} us per span)")


if __name__ == "__main__":
    main()

"""Multi-turn history stored once: bytes on disk and writer time of a 10-turn agent.

Each trajectory is an agent of ``--turns`` llm calls; turn k's ``prompt_ids``
are turn k-1's prompt and response plus ``--new`` new ids (a tool result),
responses ``--response`` ids, all random-looking (a 151k vocabulary).
Recorded three ways, in one process, each from the first call until
``tracer.flush()`` returns:

1. whole prompts, stored once (this tracer: later turns hold a reference);
2. whole prompts, every turn stored whole (the writer's history step turned off);
3. only the new ids passed as ``prompt_ids`` (the floor: nothing repeated).

Each run starts after an untimed ``gc.collect()``, so that a full collection the runs before it made due does not land on it.
Besides the wall clock and the process's CPU seconds, each line gives the
writer thread's own CPU seconds (read from
its thread clock after the flush): the target is the writer's time, and the
process figure also holds the caller's call-time copy of every prompt.
An untimed warm-up run comes first (since the same round): the first run in
a process pays one-off imports that otherwise fell on one mode only.

    python bench/bench_history.py [--trajectories 400] [--turns 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracer  # noqa: E402
from tracer.record import recorder as _recorder  # noqa: E402
from tracer.record.span_encoder import SpanEncoder  # noqa: E402

VOCAB = 151_643


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int], sampling_params: dict, response: list[int]) -> dict:
    return {"response_ids": response, "finish_reason": "stop"}


def make_agents(n: int, turns: int, new: int, response: int, system: int) -> list[list[tuple[list[int], list[int]]]]:
    """Per trajectory, per turn: (the ids new in this prompt, the response)."""
    rng = random.Random(0)
    ids = lambda k: [rng.randrange(VOCAB) for _ in range(k)]  # noqa: E731
    return [[(ids(system if t == 0 else new), ids(response)) for t in range(turns)] for _ in range(n)]


def run(agents, out_dir: str, mode: str) -> tuple[float, int, float]:
    """Record every agent; returns (seconds to durable, bytes on disk, CPU seconds of the process meanwhile)."""
    tracer.init(output_dir=out_dir, compression_level=3)

    async def agent(i: int, barrier: asyncio.Barrier) -> None:
        with tracer.rollout_trace_attr(sample_index=i, step=0, rollout_n=0):
            history: list[int] = []
            for new, response in agents[i]:
                prompt = history + new
                await generate(new if mode == "new only" else prompt, {"temperature": 1.0}, response)
                history = prompt + response
                # A turn takes longer than the writer's flush interval: each
                # turn lands in its own batch (compressed on its own).
                if await barrier.wait() == 0:
                    tracer.flush()
                await barrier.wait()

    async def main() -> None:
        for start in range(0, len(agents), 32):  # 32 agents in flight
            group = range(start, min(start + 32, len(agents)))
            barrier = asyncio.Barrier(len(group))
            await asyncio.gather(*(agent(i, barrier) for i in group))

    t0, c0 = time.perf_counter(), time.process_time()
    asyncio.run(main())
    result = tracer.flush()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    writer = writer_cpu()
    run_dir = tracer.get_config().run_dir
    tracer.shutdown()
    assert result.ok, result.message
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(run_dir, "**", "*.arrow"), recursive=True))
    return elapsed, size, cpu, writer


def writer_cpu() -> float:
    """CPU seconds the active recorder's writer thread has used (it starts with the run), or NaN."""
    rec = _recorder.ACTIVE
    thread = None if rec is None else rec._thread
    if thread is None or thread.ident is None or not thread.is_alive():
        return float("nan")
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--new", type=int, default=64, help="new ids per turn (tool result, user message)")
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--system", type=int, default=256, help="ids of the first prompt")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    agents = make_agents(args.trajectories, args.turns, args.new, args.response, args.system)
    tmp = tempfile.mkdtemp(prefix="bench-history-")
    store_once = SpanEncoder._store_history_once
    times: dict[str, list[float]] = {"stored once": [], "stored whole": [], "new only": []}
    sizes: dict[str, int] = {}
    # CPU seconds beside the wall clock: each turn waits for an fsync, whose time on a
    # disk shared with other work swings far more than the work itself.
    cpus: dict[str, list[float]] = {mode: [] for mode in times}
    # The writer thread's own CPU seconds: the target is the
    # writer's time, and the process figure also holds the caller's call-time copies.
    writers: dict[str, list[float]] = {mode: [] for mode in times}
    try:
        # Untimed: what the first run in a process pays once (pyarrow's first array imports
        # pandas on the writer thread, ~0.5 s) would otherwise fall on the first timed "stored once" run only.
        run(agents[:4], os.path.join(tmp, "warm-up"), "stored once")
        for r in range(args.rounds):
            for mode in times:
                if mode == "stored whole":
                    SpanEncoder._store_history_once = lambda self, records, prepared: None  # type: ignore[method-assign]
                gc.collect()  # untimed: a full collection earlier runs made due does not land on this one
                try:
                    t, size, cpu, writer = run(agents, os.path.join(tmp, f"{mode}-{r}".replace(" ", "_")), mode)
                finally:
                    SpanEncoder._store_history_once = store_once  # type: ignore[method-assign]
                times[mode].append(t)
                cpus[mode].append(cpu)
                writers[mode].append(writer)
                sizes[mode] = size
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    spans = args.trajectories * args.turns
    floor_t, floor_b = statistics.median(times["new only"]), sizes["new only"]
    floor_c = statistics.median(cpus["new only"])
    floor_w = statistics.median(writers["new only"])
    print(
        f"{args.trajectories} agents x {args.turns} turns ({spans} llm spans; {args.system} first-prompt ids, "
        f"{args.new} new ids and {args.response} response ids a turn), zstd 3, median of {args.rounds}"
    )
    for mode in times:
        t, b, c = statistics.median(times[mode]), sizes[mode], statistics.median(cpus[mode])
        w = statistics.median(writers[mode])
        print(
            f"  {mode:13s} {b / 1e6:7.2f} MB ({b / floor_b:.2f}x the new-only bytes)   "
            f"{t:6.2f} s ({t / floor_t:.2f}x the new-only time)   CPU {c:5.2f} s ({c / floor_c:.2f}x)   "
            f"writer thread CPU {w:5.2f} s ({w / floor_w:.2f}x)"
        )
    print("  target: stored once within 1.3x of new only, bytes and time")


if __name__ == "__main__":
    main()

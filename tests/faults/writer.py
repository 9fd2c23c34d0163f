"""A rollout worker for fault-injection tests: records forever, prints what flush() acknowledged.

Usage: ``python writer.py OUTPUT_DIR RUN SEED``. Each trajectory has 4 spans
(rollout root, llm, tool, log_reward) and sample_index ``"{RUN}-{i}"``. After
every flush() that returns ok, one line ``ACK <n>`` is printed: trajectories
0..n-1 of this run are durable. The parent kills this process with SIGKILL at
a random moment and checks that every acknowledged trajectory reads back.
"""

from __future__ import annotations

import asyncio
import random
import sys

import tracer

SPANS_PER_TRAJECTORY = 4


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int], pad: str) -> dict[str, object]:
    await asyncio.sleep(0)
    return {"response_ids": prompt_ids[::-1], "finish_reason": "stop", "pad": pad}


@tracer.rollout_trace_op(kind="tool")
async def calculator(expression: str) -> str:
    await asyncio.sleep(0)
    return str(len(expression))


@tracer.rollout_trace_op(kind="rollout")
async def agent_loop(i: int, pad: str) -> dict[str, object]:
    out = await generate(list(range(i % 50)), pad)
    obs = await calculator(f"{i} + 1")
    return {"messages": [{"role": "user", "content": str(i)}, {"role": "assistant", "content": obs}], "out": out}


async def one(run: int, i: int, pad: str) -> None:
    with tracer.rollout_trace_attr(sample_index=f"{run}-{i}", step=run):
        await agent_loop(i, pad)
        tracer.log_reward(float(i % 2), advantage=0.5)


async def main(out: str, run: int, seed: int) -> None:
    rng = random.Random(seed)
    tracer.init(
        output_dir=out,
        project_name="faults",
        experiment_name="kill9",
        flush_interval_s=rng.choice([0.005, 0.02, 0.1]),
        max_file_bytes=rng.choice([16_384, 65_536, 1 << 20]),
    )
    print("READY", flush=True)
    i = 0
    while True:
        n = rng.randint(1, 40)
        # Random text does not compress: big batches take long enough to write that kills tear them.
        pad = rng.randbytes(rng.choice([0, 8, 500, 5000])).hex()
        await asyncio.gather(*(one(run, i + k, pad) for k in range(n)))
        i += n
        if rng.random() < 0.5:
            result = tracer.flush()
            if not result.ok:
                print(f"FAIL {result.message}", flush=True)
                sys.exit(3)
            print(f"ACK {i}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

"""Write sample_data/golden/trace_v{major}.arrow for the current format version (only when it changes on purpose).

python tests/make_golden.py

Each major version keeps its own golden file forever (trace_v1.arrow is an IPC
stream, trace_v2.arrow an IPC file); tests read every one of them.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracer  # noqa: E402
from tracer.storage.files import major_version  # noqa: E402

MAJOR = major_version(tracer.schema.SCHEMA_VERSION)
GOLDEN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data", "golden", f"trace_v{MAJOR}.arrow"
)


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int]) -> dict:
    return {"response_ids": [7, 8], "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="tool")
async def calculator(expression: str) -> str:
    if expression == "1/0":
        raise ZeroDivisionError("division by zero")
    return "4"


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
async def agent_loop(question: str) -> dict:
    await generate([1, 2, 3])
    try:
        await calculator("1/0" if "zero" in question else "2+2")
    except ZeroDivisionError:
        pass
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "4"}], "answer": "4"}


async def main() -> None:
    for n, question in enumerate(["What is 2+2?", "Divide by zero"]):
        with tracer.rollout_trace_attr(sample_index="golden", step=1, rollout_n=n):
            await agent_loop(question)
            tracer.log_reward(1.0 - n, advantage=0.5 - n)


if __name__ == "__main__":
    tmp = tempfile.mkdtemp()
    tracer.init(output_dir=tmp, project_name="golden", experiment_name=f"v{MAJOR}")
    asyncio.run(main())
    tracer.shutdown()
    (path,) = glob.glob(os.path.join(tmp, "golden", f"v{MAJOR}", "*.arrow"))
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    shutil.copy(path, GOLDEN)
    print(f"wrote {GOLDEN}")

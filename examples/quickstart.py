"""Record a tool-using agent with rollout-trace: ``python examples/quickstart.py``.

No model and no GPU: the "model" answers from a script. Swap the bodies of
``generate`` and ``call_tool`` for your engine and tools; the decorators stay.
"""

import asyncio
import random

import tracer

# Files go to ./rollout_traces/quickstart/run-1/ (or under $ROLLOUT_TRACE_DIR).
# With token ids in your calls, add token2text=True, tokenizer="/path/to/tokenizer"
# to record their text beside them.
tracer.init(project_name="quickstart", experiment_name="run-1")


class AgentLoop:
    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, messages, temperature=1.0):
        if messages[-1]["role"] == "user":  # first turn: call the calculator
            return {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
        guess = messages[-1]["content"] if random.random() < 0.75 else "6"
        return {"role": "assistant", "content": f"The answer is {guess}."}

    @tracer.rollout_trace_op(kind="tool")
    async def call_tool(self, name, arguments):
        return str(arguments["a"] + arguments["b"])

    @tracer.rollout_trace_op(kind="rollout")
    async def run(self, messages):
        while True:
            reply = await self.generate(messages)
            messages = [*messages, reply]
            if not reply.get("tool_calls"):
                return {"messages": messages}
            for call in reply["tool_calls"]:
                result = await self.call_tool(call["name"], call["arguments"])
                messages = [*messages, {"role": "tool", "content": result}]


def score(result):
    """Reward 1 for the right answer."""
    return 1.0 if "5" in result["messages"][-1]["content"] else 0.0


async def rollout(loop, messages, sample_index, step, n):
    """One trajectory: its step, its prompt (sample) and its index in the prompt's group."""
    with tracer.rollout_trace_attr(sample_index, step, rollout_n=n):
        result = await loop.run(messages)
        return score(result)


async def train_step(loop, step, group_size=4):
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    rewards = await asyncio.gather(*(rollout(loop, question, 0, step, n) for n in range(group_size)))
    mean = sum(rewards) / len(rewards)
    for n, reward in enumerate(rewards):  # GRPO-style advantage: reward minus the group's mean
        tracer.log_reward(reward, step=step, sample_index=0, rollout_n=n, advantage=reward - mean)


async def main():
    loop = AgentLoop()
    for step in range(1, 4):
        await train_step(loop, step)


asyncio.run(main())
# A normal exit flushes what was recorded; flush() returns once all of it is on disk.
result = tracer.flush()
print(f"recorded {result.spans_written} spans to {tracer.get_config().run_dir}")

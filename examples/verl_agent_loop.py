"""A verl-style agent loop recorded with rollout-trace: ``python examples/verl_agent_loop.py``.

verl records its agent loops with three pieces, and so does this file:
``@rollout_trace_op`` on the server manager's ``generate`` and on each tool's
``execute``, and ``rollout_trace_attr(...)`` around every ``agent_loop.run``
(verl's ``AgentLoopWorker`` does that for you). Token ids are decoded with
``self.tokenizer`` of the decorated object, as verl's ``token2text`` does.
In verl itself you change no code: see "verl in one paragraph" in the README.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from typing import Any

import tracer

# verl's code imports these from verl.utils.rollout_trace; tracer.integrations.verl has the same names and
# signatures (a bare @rollout_trace_op names the span after the method and infers its kind: llm, tool).
from tracer.integrations.verl import rollout_trace_attr, rollout_trace_op


class CharTokenizer:
    """Stands in for a Hugging Face tokenizer: one token per character."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


class ServerManager:
    """verl's AsyncLLMServerManager: token ids in, token ids out (a scripted policy here)."""

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.tokenizer = tokenizer

    @rollout_trace_op
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        prompt = self.tokenizer.decode(prompt_ids)
        if "<tool_response>" not in prompt:
            reply = "<tool_call>add 17 25</tool_call>"
        else:
            reply = "The answer is " + prompt.rsplit("<tool_response>", 1)[1].split("<", 1)[0] + "."
        return {"token_ids": self.tokenizer.encode(reply), "log_probs": [-0.1] * len(reply)}


class AddTool:
    """verl's BaseTool: ``execute`` returns (response, reward, metrics)."""

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        return str(parameters["a"] + parameters["b"]), 0.0, {}


@dataclasses.dataclass
class AgentLoopOutput:
    prompt_ids: list[int]
    response_ids: list[int]
    num_turns: int


class ToolAgentLoop:
    """verl's ToolAgentLoop, reduced: generate, call the tool the model asked for, generate again."""

    def __init__(self, server: ServerManager, tool: AddTool, tokenizer: CharTokenizer, max_turns: int = 4) -> None:
        self.server, self.tool, self.tokenizer, self.max_turns = server, tool, tokenizer, max_turns

    async def run(self, sampling_params: dict[str, Any], *, raw_prompt: str) -> AgentLoopOutput:
        request_id = uuid.uuid4().hex
        prompt_ids = self.tokenizer.encode(raw_prompt)
        response_ids: list[int] = []
        for turn in range(1, self.max_turns + 1):
            out = await self.server.generate(
                request_id, prompt_ids=prompt_ids + response_ids, sampling_params=sampling_params
            )
            response_ids += out["token_ids"]
            call = re.search(r"<tool_call>add (\d+) (\d+)</tool_call>", self.tokenizer.decode(out["token_ids"]))
            if call is None:
                return AgentLoopOutput(prompt_ids, response_ids, turn)
            result, _, _ = await self.tool.execute(request_id, {"a": int(call[1]), "b": int(call[2])})
            response_ids += self.tokenizer.encode(f"<tool_response>{result}</tool_response>")
        return AgentLoopOutput(prompt_ids, response_ids, self.max_turns)


async def run_agent_loop(loop: ToolAgentLoop, step: int, sample_index: int, rollout_n: int, validate: bool) -> None:
    """What verl's AgentLoopWorker does around each agent loop."""
    with rollout_trace_attr(
        step=step, sample_index=sample_index, rollout_n=rollout_n, validate=validate, name="agent_loop"
    ):
        output = await loop.run({"temperature": 1.0}, raw_prompt="What is 17 + 25?")
        answer = loop.tokenizer.decode(output.response_ids)
        tracer.log_reward(1.0 if answer.endswith("42.") else 0.0)


async def main() -> None:
    tokenizer = CharTokenizer()
    loop = ToolAgentLoop(ServerManager(tokenizer), AddTool(), tokenizer)
    for step in range(1, 3):
        await asyncio.gather(*(run_agent_loop(loop, step, 0, n, validate=False) for n in range(4)))


if __name__ == "__main__":
    # verl's trace config: actor_rollout_ref.rollout.trace.backend=... and token2text=True.
    tracer.init(project_name="verl-style", experiment_name="run-1", token2text=True)
    asyncio.run(main())
    print(f"recorded to {tracer.get_config().run_dir}")

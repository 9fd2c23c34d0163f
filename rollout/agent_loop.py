"""The multi-turn tool-calling agent loop, recorded with ``tracer``.

Written the way verl's agent loops are: one ``run`` per rollout that keeps a
growing token sequence (prompt, then model turns and tool observations as
token ids, with a response mask: 1 for model tokens, 0 for observation
tokens), decorated with ``tracer``:

- ``ToolAgentLoop.run`` is ``kind="rollout"``: inside
  ``tracer.rollout_trace_attr(...)`` it becomes the trajectory's root span,
  and returns the conversation as OpenAI-style ``messages``;
- ``ToolAgentLoop.generate`` is ``kind="llm"``: takes ``prompt_ids``, returns
  ``response_ids`` (decoded to text by token2text), ``logprobs`` and
  ``finish_reason``;
- each tool's ``execute`` is ``kind="tool"``; malformed calls are recorded by
  :func:`reject_tool_call` as failed tool spans.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import tracer
from rollout.chat import ChatFormat
from rollout.engines import Engine, Generation, SamplingParams
from rollout.parsing import ParsedTurn, parse_tool_calls
from rollout.reward import extract_answer
from rollout.tools import MAX_OBSERVATION_CHARS, Tool, ToolError

SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the user's word problem. Use the calculator or python "
    "tools for arithmetic instead of computing in your head. When you know the final answer, "
    "reply with one short sentence ending in \\boxed{N}, where N is the number."
)

#: One worked example (OpenAI-style messages) put before the question with
#: ``few_shot=True``: small models copy the tool-call format from it.
FEW_SHOT_EXAMPLE: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "A shop sells pens for $4 each. Mia buys 12 pens and pays with a $100 bill. How much change does she get?",
    },
    {
        "role": "assistant",
        "content": "Mia pays 4 * 12 for the pens, so the change is 100 - 4 * 12. I will use the calculator.",
        "tool_calls": [
            {
                "id": "example_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "100 - 4 * 12"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "example_0", "name": "calculator", "content": "52"},
    {"role": "assistant", "content": "The calculator says 52, so Mia gets $52 in change. The answer is \\boxed{52}."},
]

#: Why a rollout stopped (``stop_reason`` in the root span's output).
STOP_ANSWER = "answer"
STOP_MAX_TURNS = "max_turns"
STOP_MAX_TOKENS = "max_tokens"
STOP_LENGTH = "length"


class ToolCallRejectedError(Exception):
    """A tool call the loop could not run: malformed, or naming an unknown tool."""


@tracer.rollout_trace_op(name="invalid_tool_call", kind="tool")
async def reject_tool_call(raw: str, reason: str) -> str:
    """Record a malformed or unknown tool call as a failed tool span (always raises)."""
    raise ToolCallRejectedError(reason)


@dataclasses.dataclass
class AgentLoopConfig:
    """Budgets of one rollout.

    Attributes:
        max_turns: Most model turns.
        max_new_tokens: Most tokens one model turn may generate.
        max_response_tokens: Most tokens after the prompt (model turns and
            tool observations together), as verl's ``response_length``.
        max_tool_calls_per_turn: Calls beyond this many in a turn are refused.
        max_observation_chars: A tool result is cut to this many characters.
        system_prompt: The system message; None for none.
        few_shot: Put :data:`FEW_SHOT_EXAMPLE` before the question.
        first_turn_prefix: Text that starts the first assistant turn (a
            response prefill, e.g. ``'<tool_call>\\n{"name": "'`` to make a
            small model start with a tool call, like ``tool_choice="required"``).
            Its tokens are part of the prompt (not model tokens); the turn's
            text is parsed with it.
    """

    max_turns: int = 4
    max_new_tokens: int = 256
    max_response_tokens: int = 1024
    max_tool_calls_per_turn: int = 4
    max_observation_chars: int = MAX_OBSERVATION_CHARS
    system_prompt: str | None = SYSTEM_PROMPT
    few_shot: bool = False
    first_turn_prefix: str | None = None


class ToolAgentLoop:
    """Runs one rollout: model turns and tool calls until an answer or a budget.

    Args:
        engine: Generates model turns (see :mod:`rollout.engines`).
        tokenizer: A Hugging Face tokenizer with a chat template; also used
            by token2text (``self.tokenizer``, as in verl).
        tools: The tools the model may call.
        config: Budgets.
    """

    def __init__(self, engine: Engine, tokenizer: Any, tools: list[Tool], config: AgentLoopConfig | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = {t.name: t for t in tools}
        self.tool_schemas = [t.schema() for t in tools]
        self.config = config or AgentLoopConfig()
        self.chat = ChatFormat(tokenizer)

    def initial_messages(self, question: str) -> list[dict[str, Any]]:
        """The chat a rollout starts from: system prompt and the question."""
        messages: list[dict[str, Any]] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        if self.config.few_shot:
            messages.extend(dict(m) for m in FEW_SHOT_EXAMPLE)
        messages.append({"role": "user", "content": question})
        return messages

    @tracer.rollout_trace_op(name="generate", kind="llm")
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """One model turn (an llm span)."""
        out: Generation = await self.engine.generate(prompt_ids, sampling)
        return {"response_ids": out.token_ids, "logprobs": out.logprobs, "finish_reason": out.finish_reason}

    @tracer.rollout_trace_op(name="agent_loop", kind="rollout")
    async def run(self, messages: list[dict[str, Any]], sampling: SamplingParams) -> dict[str, Any]:
        """Run one rollout from ``messages``; return the conversation and its tokens.

        Returns:
            ``messages`` (OpenAI-style, the whole conversation), ``answer``
            (the extracted final answer or None), ``final_text``,
            ``num_turns``, ``num_tool_calls``, ``stop_reason``, and the
            token view an RL trainer uses: ``prompt_ids``, ``response_ids``,
            ``response_mask`` (1 = model token, 0 = observation token) and
            ``response_logprobs`` (None for observation tokens).
        """
        cfg = self.config
        messages = [dict(m) for m in messages]
        prompt_ids = self.chat.encode_prompt(messages, self.tool_schemas)
        prefix = cfg.first_turn_prefix or ""
        if prefix:
            prompt_ids = prompt_ids + self.chat.encode_text(prefix)
        response_ids: list[int] = []
        response_mask: list[int] = []
        response_logprobs: list[float | None] = []
        num_turns = num_tool_calls = 0
        stop_reason = STOP_MAX_TURNS
        final_text: str | None = None
        while num_turns < cfg.max_turns:
            budget = cfg.max_response_tokens - len(response_ids)
            if budget <= 0:
                stop_reason = STOP_MAX_TOKENS
                break
            turn_sampling = dataclasses.replace(sampling, max_new_tokens=min(cfg.max_new_tokens, budget))
            out = await self.generate(prompt_ids + response_ids, turn_sampling)
            num_turns += 1
            ids = list(out["response_ids"])
            logprobs = out["logprobs"]
            response_ids += ids
            response_mask += [1] * len(ids)
            response_logprobs += (
                list(logprobs) if logprobs is not None and len(logprobs) == len(ids) else [None] * len(ids)
            )
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if prefix and num_turns == 1:
                text = prefix + text
            parsed = parse_tool_calls(text, cfg.max_tool_calls_per_turn)
            ended = out["finish_reason"] == "stop"
            if not parsed.attempted_tools:
                messages.append({"role": "assistant", "content": parsed.content})
                final_text = parsed.content
                stop_reason = STOP_ANSWER if ended else STOP_LENGTH
                break
            tool_messages = await self._run_tools(parsed, num_turns, messages)
            num_tool_calls += len(tool_messages)
            if num_turns >= cfg.max_turns:
                stop_reason = STOP_MAX_TURNS
                break
            obs_ids = self.chat.encode_observations(tool_messages, response_ended=ended)
            room = cfg.max_response_tokens - len(response_ids)
            if len(obs_ids) >= room:
                stop_reason = STOP_MAX_TOKENS
                break
            response_ids += obs_ids
            response_mask += [0] * len(obs_ids)
            response_logprobs += [None] * len(obs_ids)
        return {
            "messages": messages,
            "answer": extract_answer(final_text),
            "final_text": final_text,
            "num_turns": num_turns,
            "num_tool_calls": num_tool_calls,
            "stop_reason": stop_reason,
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "response_logprobs": response_logprobs,
        }

    async def _run_tools(self, parsed: ParsedTurn, turn: int, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run a turn's tool calls concurrently; append the assistant and tool messages."""
        calls: list[dict[str, Any]] = []
        jobs = []
        for k, call in enumerate(parsed.calls):
            call_id = f"call_{turn}_{k}"
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
            )
            tool = self.tools.get(call.name)
            if tool is None:
                reason = f"unknown tool {call.name!r}; the tools are {', '.join(self.tools)}"
                jobs.append((call_id, call.name, reject_tool_call(call.raw, reason)))
            else:
                jobs.append((call_id, call.name, tool.execute(call.arguments)))
        for k, error in enumerate(parsed.errors, start=len(parsed.calls)):
            call_id = f"call_{turn}_{k}"
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": "invalid_tool_call", "arguments": error.raw}}
            )
            jobs.append((call_id, "invalid_tool_call", reject_tool_call(error.raw, error.reason)))
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
        results = await asyncio.gather(*(job for _, _, job in jobs), return_exceptions=True)
        tool_messages = []
        for (call_id, name, _), result in zip(jobs, results, strict=True):
            if isinstance(result, (ToolError, ToolCallRejectedError)):
                content = f"Error: {result}"
            elif isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # cancellation and the like propagate
                content = f"Error: the tool failed unexpectedly ({type(result).__name__}: {result})"
            else:
                content = str(result)
            if len(content) > self.config.max_observation_chars:
                content = content[: self.config.max_observation_chars] + " ...(cut)"
            tool_messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
        messages.extend(tool_messages)
        return tool_messages

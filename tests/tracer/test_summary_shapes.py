"""The turn model reads every output shape agent code returns: verl, this project's rollout, OpenAI, vLLM, strings.

Each test records real spans through ``tracer.rollout_trace_op`` (verl's own
classes where they import) and reads them back with ``tracer.read_spans``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tracer
from tracer.summary import prompt_and_response, span_turns, trajectory_messages, trajectory_turns
from viewer import data as D

replica = pytest.importorskip("verl.workers.rollout.replica")
schemas = pytest.importorskip("verl.tools.schemas")


class WordTokenizer:
    """Decodes id ``i`` as ``w<i>`` (enough for token2text)."""

    def batch_decode(self, batch: list[list[int]], **_: Any) -> list[str]:
        return [" ".join(f"w{i}" for i in ids) for ids in batch]


class VerlServer:
    """Stands where verl's AsyncLLMServerManager is: ``generate`` returns verl's TokenOutput."""

    tokenizer = WordTokenizer()

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        return replica.TokenOutput(token_ids=[5, 6, 7], log_probs=[-0.1, -0.2, -0.3], stop_reason="completed")


class VerlTool:
    """A verl BaseTool's ``execute``: returns ``(ToolResponse, reward, metrics)``."""

    tokenizer = WordTokenizer()

    @tracer.rollout_trace_op(kind="tool")
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        if parameters.get("fail"):
            raise ValueError("bad parameters")
        return schemas.ToolResponse(text="42"), 0.0, {}


class VerlParser:
    """verl's tool parser span: returns ``(content, [FunctionCall])``."""

    @tracer.rollout_trace_op
    async def extract_tool_calls(self, responses_ids: list[int]) -> Any:
        return "", [{"name": "calc", "arguments": '{"x": 1}'}]


class VerlLoop:
    """A verl agent loop's ``run`` (kind rollout): the root returns AgentLoopOutput's fields."""

    tokenizer = WordTokenizer()

    @tracer.rollout_trace_op(kind="rollout")
    async def run(self, sampling_params: dict[str, Any], fail_tool: bool = False, **kwargs: Any) -> dict[str, Any]:
        await VerlServer().generate("r", prompt_ids=[1, 2], sampling_params={})
        await VerlParser().extract_tool_calls([5, 6, 7])
        try:
            await VerlTool().execute("i", {"x": 1, "fail": fail_tool})
        except ValueError:
            pass
        return {"prompt_ids": [1, 2], "response_ids": [5, 6, 7], "response_mask": [1, 1, 1], "num_turns": 2}


def _record(trace_dir: str, coro: Any, token2text: bool = True) -> Any:
    tracer.init(output_dir=trace_dir, token2text=token2text)

    async def main() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
            await coro()

    asyncio.run(main())
    tracer.flush()
    return tracer.read_spans(trace_dir)


def test_verl_token_output_is_an_assistant_turn_with_text_tokens_and_logprobs(trace_dir: str) -> None:
    """verl's TokenOutput (token_ids, log_probs, stop_reason, token2text's text) is read, not shown as null."""
    spans = _record(trace_dir, lambda: VerlLoop().run({}, raw_prompt=[{"role": "user", "content": "hi"}]))
    (turns,) = trajectory_turns(spans).values()
    assert [t.role for t in turns] == ["user", "assistant", "tool"]
    reply = turns[1]
    assert reply.text == "w5 w6 w7" and reply.token_ids == [5, 6, 7]
    assert reply.logprobs == [-0.1, -0.2, -0.3] and reply.finish_reason == "completed"
    assert reply.prompt_ids == [1, 2] and reply.prompt_text == "w1 w2"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("calc", '{"x": 1}')]
    grid = D.token_turns(spans)[0]
    assert grid.logprobs == [-0.1, -0.2, -0.3] and grid.cells()[0]["logprob"] == pytest.approx(-0.1)
    assert prompt_and_response(turns) == ("w1 w2", "w5 w6 w7")


def test_verl_tool_response_tuple_is_the_tool_text(trace_dir: str) -> None:
    """A verl tool's (ToolResponse, reward, metrics) shows as the ToolResponse text; its arguments are the parameters."""
    spans = _record(trace_dir, lambda: VerlLoop().run({}))
    (tool,) = [t for t in span_turns(spans) if t.role == "tool"]
    assert tool.text == "42" and tool.arguments == '{"x": 1, "fail": false}'
    assert trajectory_messages(spans)[-1]["content"] == "42"
    assert D.tool_spans(spans)[0]["result"] == "42"


def test_a_failed_tool_is_an_error_turn(trace_dir: str) -> None:
    """A tool span that raised is a tool turn saying the error, with the error's type and message."""
    spans = _record(trace_dir, lambda: VerlLoop().run({}, fail_tool=True))
    (tool,) = [t for t in span_turns(spans) if t.role == "tool"]
    assert tool.text == "error: bad parameters" and tool.status == "error"
    assert tool.error is not None and tool.error["type"] == "ValueError"
    assert D.tool_spans(spans)[0]["error"]["message"] == "bad parameters"


def test_verl_without_token2text_shows_no_null_text(trace_dir: str) -> None:
    """Without token2text an assistant turn has its token ids and an empty text, never the string "null"."""
    spans = _record(trace_dir, lambda: VerlLoop().run({}), token2text=False)
    messages = trajectory_messages(spans)
    assert messages[0] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}],
    }
    assert "null" not in [m["content"] for m in messages]
    assert span_turns(spans)[0].token_ids == [5, 6, 7]


def test_verl_agent_loop_output_without_llm_spans_is_the_reply(trace_dir: str) -> None:
    """A root returning AgentLoopOutput and no llm span: its response ids and text are the assistant turn."""
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")

    class Loop:
        tokenizer = WordTokenizer()

        @tracer.rollout_trace_op(kind="rollout")
        async def run(self, **kwargs: Any) -> Any:
            return agent_loop.AgentLoopOutput(
                prompt_ids=[1],
                response_ids=[8, 9],
                response_mask=[1, 1],
                response_logprobs=[-1.0, -2.0],
                metrics=agent_loop.AgentLoopMetrics(),
            )

    spans = _record(trace_dir, lambda: Loop().run(raw_prompt=[{"role": "user", "content": "q"}]))
    (turns,) = trajectory_turns(spans).values()
    assert [(t.role, t.text) for t in turns] == [("user", "q"), ("assistant", "w8 w9")]
    assert turns[1].logprobs == [-1.0, -2.0]


def test_agent_loop_output_fields_without_llm_spans_are_the_reply(trace_dir: str) -> None:
    """AgentLoopOutput's fields as they land in JSON (verl importable or not) give the assistant turn."""

    class Loop:
        tokenizer = WordTokenizer()

        @tracer.rollout_trace_op(kind="rollout")
        async def run(self, **kwargs: Any) -> dict[str, Any]:
            return {"__type__": "AgentLoopOutput", "prompt_ids": [1], "response_ids": [8, 9], "num_turns": 2}

    spans = _record(trace_dir, lambda: Loop().run(raw_prompt=[{"role": "user", "content": "q"}]))
    assert trajectory_messages(spans) == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "w8 w9"}]


def test_this_projects_rollout_joins_messages_to_their_spans(trace_dir: str) -> None:
    """A root returning messages is the conversation; each assistant message carries its llm span's tokens and logprobs."""

    @tracer.rollout_trace_op(kind="llm", name="generate")
    async def generate(prompt_ids: list[int]) -> dict[str, Any]:
        return {"response_ids": [3, 4], "logprobs": [-0.5, -0.25], "finish_reason": "stop"}

    @tracer.rollout_trace_op(kind="tool", name="calculator")
    async def calculator(arguments: dict[str, Any]) -> str:
        return "4"

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    async def agent_loop() -> dict[str, Any]:
        await generate([1, 2])
        await calculator({"expression": "2+2"})
        await generate([1, 2, 3])
        call = {
            "id": "c0",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
        }
        return {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": "4"},
                {"role": "assistant", "content": "4"},
            ]
        }

    spans = _record(trace_dir, agent_loop, token2text=False)
    (turns,) = trajectory_turns(spans).values()
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1].token_ids == [3, 4] and turns[1].logprobs == [-0.5, -0.25]
    assert turns[2].span_id is not None and turns[2].arguments == '{"expression": "2+2"}'
    assert turns[3].text == "4" and turns[3].tool_calls == ()
    assert trajectory_messages(spans)[2] == {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": "4"}


def test_openai_chat_completion_and_message_prompts(trace_dir: str) -> None:
    """An OpenAI chat completion (choices[0].message) and a messages prompt are read as such."""
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "let me look",
                    "tool_calls": [{"id": "x", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
                },
                "logprobs": {"content": [{"token": "let", "logprob": -0.3}, {"token": " me", "logprob": -0.1}]},
            }
        ]
    }

    @tracer.rollout_trace_op(kind="llm", name="chat")
    async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return completion

    @tracer.rollout_trace_op(kind="rollout", name="agent")
    async def agent() -> None:
        await chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "find it"}])

    spans = _record(trace_dir, agent)
    (turns,) = trajectory_turns(spans).values()
    assert [(t.role, t.text) for t in turns] == [
        ("system", "be brief"),
        ("user", "find it"),
        ("assistant", "let me look"),
    ]
    assert [(c.name, c.id) for c in turns[2].tool_calls] == [("search", "x")]
    assert turns[2].logprobs == [-0.3, -0.1]
    assert turns[2].finish_reason == "tool_calls"


def test_vllm_request_output_and_chat_message_lists(trace_dir: str) -> None:
    """vLLM's RequestOutput as a dict (outputs[0].text/token_ids/logprobs) and a returned message list are replies."""

    @tracer.rollout_trace_op(kind="llm", name="vllm")
    async def vllm(prompt: str) -> dict[str, Any]:
        logprobs = [{"11": {"logprob": -0.7, "rank": 1}}, {"12": {"logprob": -0.2, "rank": 1}}]
        return {"outputs": [{"text": "ok", "token_ids": [11, 12], "logprobs": logprobs, "finish_reason": "length"}]}

    @tracer.rollout_trace_op(kind="llm", name="chat")
    async def chat(prompt: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": [{"type": "text", "text": "b"}]}]

    @tracer.rollout_trace_op(kind="rollout", name="agent")
    async def agent() -> None:
        await vllm("say ok")
        await chat("say b")

    spans = _record(trace_dir, agent)
    first, second = span_turns(spans)
    assert (first.text, first.token_ids, first.logprobs, first.finish_reason) == (
        "ok",
        [11, 12],
        [-0.7, -0.2],
        "length",
    )
    assert first.prompt_text == "say ok" and second.text == "b"


def test_plain_strings_are_turn_texts(trace_dir: str) -> None:
    """An llm or tool returning a string: that string is the turn's text; the first prompt opens the conversation."""

    @tracer.rollout_trace_op(kind="llm", name="complete")
    async def complete(prompt_text: str) -> str:
        return "the answer"

    @tracer.rollout_trace_op(kind="tool", name="lookup")
    async def lookup(query: str) -> str:
        return "found"

    @tracer.rollout_trace_op(kind="rollout", name="agent")
    async def agent() -> None:
        await complete("question?")
        await lookup("q")

    spans = _record(trace_dir, agent)
    assert trajectory_messages(spans) == [
        {"role": "user", "content": "question?"},
        {"role": "assistant", "content": "the answer"},
        {"role": "tool", "name": "lookup", "content": "found"},
    ]

"""The agent loop on real engines: HF transformers on a tiny random Qwen3, OpenAI-compatible HTTP (vLLM: test_rollout_vllm.py)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

import tracer
from rollout.agent_loop import AgentLoopConfig, ToolAgentLoop
from rollout.engines import SamplingParams, create_engine
from rollout.engines.openai import OpenAIEngine
from rollout.engines.scripted import ScriptedEngine
from rollout.runner import RunConfig, run_group, run_steps
from rollout.serve import CompletionServer
from rollout.tools import default_tools


@pytest.fixture(scope="module")
def hf_engine(tiny_qwen3_dir: Path, qwen_tokenizer: Any) -> Any:  # noqa: F811
    """The hf engine on the tiny random Qwen3 model."""
    return create_engine("hf", model=str(tiny_qwen3_dir), tokenizer=qwen_tokenizer, max_batch_size=8)


def _loop(engine: Any, tokenizer: Any, **cfg: Any) -> ToolAgentLoop:
    return ToolAgentLoop(engine, tokenizer, default_tools(), AgentLoopConfig(**cfg))


def _read(run_dir: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return tracer.read_trajectories(run_dir).to_pylist(), tracer.read_spans(run_dir).to_pylist()


@pytest.mark.slow
def test_hf_engine_runs_a_traced_group_with_logprobs(
    hf_engine: Any,
    qwen_tokenizer: Any,
    problems: list[dict[str, Any]],
    tmp_path: Path,  # noqa: F811
) -> None:
    """A GRPO group on the hf engine records llm spans with per-token logprobs and a reward each."""
    cfg = tracer.init(project_name="p", experiment_name="hf", output_dir=str(tmp_path), token2text=True)
    loop = _loop(hf_engine, qwen_tokenizer, max_turns=2, max_new_tokens=12, max_response_tokens=64)
    results = asyncio.run(run_group(loop, problems[0], 0, step=1, n=3, sampling=SamplingParams(temperature=1.0)))
    tracer.shutdown()
    trajs, spans = _read(cfg.run_dir)
    assert len(results) == len(trajs) == 3
    assert all(t["status"] == "ok" and t["reward"] is not None for t in trajs)
    llm = [s for s in spans if s["kind"] == "llm"]
    assert llm
    for s in llm:
        out = json.loads(s["outputs"])
        assert len(out["logprobs"]) == len(out["response_ids"]) > 0
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in out["logprobs"])
        assert isinstance(out["response_text"], str)


@pytest.mark.slow
def test_hf_engine_batches_concurrent_requests(hf_engine: Any, qwen_tokenizer: Any) -> None:  # noqa: F811
    """Concurrent generate calls are served by fewer model.generate batches than requests."""
    before = hf_engine.batches_run
    prompt = qwen_tokenizer.encode("Hello", add_special_tokens=False)

    async def many() -> list[Any]:
        return await asyncio.gather(*(hf_engine.generate(prompt, SamplingParams(max_new_tokens=4)) for _ in range(6)))

    outs = asyncio.run(many())
    assert len(outs) == 6 and all(1 <= len(o.token_ids) <= 4 for o in outs)
    assert hf_engine.batches_run - before < 6


@pytest.mark.slow
def test_hf_engine_greedy_is_deterministic_and_respects_max_new_tokens(hf_engine: Any, qwen_tokenizer: Any) -> None:  # noqa: F811
    """Greedy decoding gives the same tokens twice; a cut turn reports finish_reason=length."""
    prompt = qwen_tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    a = asyncio.run(hf_engine.generate(prompt, greedy))
    b = asyncio.run(hf_engine.generate(prompt, greedy))
    assert a.token_ids == b.token_ids
    if len(a.token_ids) == 5 and a.token_ids[-1] not in hf_engine.stop_token_ids:
        assert a.finish_reason == "length"


def test_response_mask_separates_model_tokens_from_observations(
    qwen_tokenizer: Any, problems: list[dict[str, Any]]
) -> None:  # noqa: F811
    """Mask 0 spans decode to the tool results; mask 1 spans to what the model wrote."""
    loop = _loop(ScriptedEngine(qwen_tokenizer, problems), qwen_tokenizer)
    out = asyncio.run(loop.run(loop.initial_messages(problems[0]["question"]), SamplingParams(temperature=0.0)))
    ids, mask = out["response_ids"], out["response_mask"]
    obs = qwen_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    model = qwen_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
    assert "<tool_response>" in obs and "<tool_call>" not in obs
    assert "<tool_call>" in model and "<tool_response>" not in model
    full = qwen_tokenizer.decode(out["prompt_ids"] + ids)
    assert full.endswith("<|im_end|>") and full.count("<|im_start|>assistant") == out["num_turns"]


@pytest.mark.slow
def test_first_turn_prefix_is_prompt_and_parsed_with_the_turn(
    hf_engine: Any, qwen_tokenizer: Any, problems: list[dict[str, Any]]
) -> None:  # noqa: F811
    """A prefill ends the prompt ids (not model tokens) and the first turn is parsed as starting with it."""
    prefix = '<tool_call>\n{"name": "'
    loop = _loop(hf_engine, qwen_tokenizer, max_turns=1, max_new_tokens=6, first_turn_prefix=prefix)
    out = asyncio.run(loop.run(loop.initial_messages(problems[0]["question"]), SamplingParams(seed=0)))
    assert qwen_tokenizer.decode(out["prompt_ids"]).endswith("<|im_start|>assistant\n" + prefix)
    assert out["response_mask"] == [1] * len(out["response_ids"])
    first = out["messages"][2]
    assert first["role"] == "assistant" and first["tool_calls"]  # the random model's call is malformed, and recorded


def test_loop_stops_at_the_turn_budget(qwen_tokenizer: Any, problems: list[dict[str, Any]]) -> None:  # noqa: F811
    """A policy that keeps calling tools stops with stop_reason=max_turns."""
    engine = ScriptedEngine(qwen_tokenizer, problems)
    loop = _loop(engine, qwen_tokenizer, max_turns=3)
    seed = next(
        s for s in range(500) if engine._behaviour(problems[0]["question"], SamplingParams(seed=s))[0] == "tool_loop"
    )
    out = asyncio.run(loop.run(loop.initial_messages(problems[0]["question"]), SamplingParams(seed=seed)))
    assert out["stop_reason"] == "max_turns" and out["num_turns"] == 3 and out["answer"] is None


@pytest.mark.slow
def test_openai_engine_against_a_local_server(
    qwen_tokenizer: Any,
    problems: list[dict[str, Any]],
    tmp_path: Path,  # noqa: F811
) -> None:
    """The openai engine drives traced rollouts through a completions server on 127.0.0.1."""
    with CompletionServer(ScriptedEngine(qwen_tokenizer, problems), qwen_tokenizer) as server:
        engine = OpenAIEngine(server.base_url, tokenizer=qwen_tokenizer)
        cfg = tracer.init(
            project_name="p",
            experiment_name="openai",
            output_dir=str(tmp_path),
            token2text=True,
            tokenizer=qwen_tokenizer,
        )
        loop = _loop(engine, qwen_tokenizer)
        asyncio.run(run_steps(loop, problems, RunConfig(steps=1, batch_size=2, n=3)))
        tracer.shutdown()
        assert server.requests > 0
    trajs, spans = _read(cfg.run_dir)
    assert len(trajs) == 6 and all(t["status"] == "ok" for t in trajs)
    assert sum(t["num_tool_calls"] for t in trajs) > 0
    assert {t["reward"] for t in trajs} <= {0.0, 1.0}


@pytest.mark.slow
def test_openai_engine_carries_logprobs_from_the_server(hf_engine: Any, qwen_tokenizer: Any) -> None:  # noqa: F811
    """Token ids and logprobs served by an hf engine come back through HTTP unchanged in length."""
    with CompletionServer(hf_engine, qwen_tokenizer) as server:
        engine = OpenAIEngine(server.base_url, tokenizer=qwen_tokenizer)
        prompt = qwen_tokenizer.encode("Hello there", add_special_tokens=False)
        out = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=6, seed=1)))
    assert 1 <= len(out.token_ids) <= 7
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)


def test_openai_engine_names_the_url_when_nothing_listens(qwen_tokenizer: Any) -> None:  # noqa: F811
    """A refused connection raises ConnectionError naming the endpoint."""
    engine = OpenAIEngine("http://127.0.0.1:9/v1", tokenizer=qwen_tokenizer, timeout_s=5)
    with pytest.raises(ConnectionError, match="127.0.0.1:9/v1/completions"):
        asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))


def test_openai_engine_encodes_text_when_the_server_gives_no_ids(qwen_tokenizer: Any) -> None:  # noqa: F811
    """A plain OpenAI response (text only) is tokenised, the stop token restored, logprobs dropped."""
    engine = OpenAIEngine("http://unused/v1", tokenizer=qwen_tokenizer)
    out = engine.parse_choice({"text": "The answer is 4.", "finish_reason": "stop", "logprobs": None})
    assert qwen_tokenizer.decode(out.token_ids) == "The answer is 4.<|im_end|>"
    assert out.logprobs is None and out.finish_reason == "stop"


def test_unknown_engine_lists_the_valid_ones() -> None:
    """create_engine with a bad name says which names exist."""
    with pytest.raises(ValueError, match="scripted, hf, openai, vllm"):
        create_engine("tgi")

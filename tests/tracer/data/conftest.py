"""Runs of the reference rollout (rollout/) recorded for the data tests."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import pytest

import tracer
from rollout.agent_loop import AgentLoopConfig, ToolAgentLoop
from rollout.engines import Generation, SamplingParams
from rollout.engines.scripted import ScriptedEngine
from rollout.runner import RunConfig, load_problems, run_steps
from rollout.tools import default_tools


class LogprobEngine(ScriptedEngine):
    """The scripted policy, with a deterministic logprob per token (the scripted engine gives none)."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        out = await super().generate(prompt_ids, sampling)
        lps = [-((tid % 97) + 1) / 100.0 for tid in out.token_ids]
        return dataclasses.replace(out, logprobs=lps)


def record_run(
    out_dir: str,
    tokenizer: Any,
    *,
    steps: int = 3,
    batch: int = 4,
    n: int = 4,
    val_every: int = 0,
    max_new_tokens: int = 256,
    max_response_tokens: int = 1024,
    seed: int = 0,
    **trace: Any,
) -> str:
    """Record ``steps`` steps of the reference rollout (scripted policy with logprobs); return the run folder."""
    problems = load_problems()
    engine = LogprobEngine(tokenizer, problems)
    cfg = tracer.init(
        project_name="data",
        experiment_name="run",
        output_dir=out_dir,
        token2text=True,
        tokenizer=tokenizer,
        **trace,
    )
    loop = ToolAgentLoop(
        engine,
        tokenizer,
        default_tools(),
        AgentLoopConfig(max_turns=4, max_new_tokens=max_new_tokens, max_response_tokens=max_response_tokens),
    )
    asyncio.run(
        run_steps(
            loop, problems, RunConfig(steps=steps, batch_size=batch, n=n, val_every=val_every, val_size=2, seed=seed)
        )
    )
    tracer.shutdown()
    return cfg.run_dir


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer: Any) -> str:  # noqa: F811
    """Three steps of 4 problems x 4 rollouts with validation every 2 steps (tool calls, tool errors, loops)."""
    os.environ[tracer.config.ENV_STRICT] = "1"
    return record_run(str(tmp_path_factory.mktemp("data-run")), qwen_tokenizer, val_every=2)


@pytest.fixture
def make_run(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer: Any) -> Callable[..., str]:  # noqa: F811
    """Record a run with the given budgets and trace options."""

    def make(**kw: Any) -> str:
        return record_run(str(tmp_path_factory.mktemp("data-run")), qwen_tokenizer, **kw)

    return make

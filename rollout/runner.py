"""GRPO-style rollout steps: B prompts x N rollouts each, rewards and advantages.

This is the part of an RL trainer that drives the agent loop: per step it
samples a batch of problems, runs a group of N rollouts per problem
concurrently (``asyncio.gather``), scores each rollout against the ground
truth, computes the group-relative advantage and records both with
``tracer.log_reward``. A validation pass (``validate=True``, greedy, one
rollout per problem) can run every K steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import tracer
from rollout.agent_loop import ToolAgentLoop
from rollout.engines import SamplingParams
from rollout.reward import compute_score, group_advantages
from rollout.trainer_stats import SyntheticStats, TrainerStats, log_turn_stats

PROBLEMS_RESOURCE = "problems.jsonl"


def load_problems(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read problems (``id``, ``question``, ``answer``, ``expression``) from JSONL.

    Args:
        path: A JSONL file; default: the problems shipped with the package
            (``rollout/data/problems.jsonl``, written for this project).

    Raises:
        ValueError: a line is not a JSON object with ``question`` and ``answer``.
    """
    if path is None:
        text = resources.files("rollout").joinpath("data", PROBLEMS_RESOURCE).read_text(encoding="utf-8")
        where = f"rollout/data/{PROBLEMS_RESOURCE}"
    else:
        text = Path(path).read_text(encoding="utf-8")
        where = str(path)
    problems = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}:{lineno}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or "question" not in obj or "answer" not in obj:
            raise ValueError(f"{where}:{lineno}: each line needs a JSON object with 'question' and 'answer'")
        obj.setdefault("id", f"problem-{lineno}")
        obj["answer"] = str(obj["answer"])
        problems.append(obj)
    return problems


@dataclasses.dataclass
class RunConfig:
    """What to run.

    Attributes:
        steps: Training steps.
        batch_size: Problems per step.
        n: Rollouts per problem (the GRPO group size).
        val_every: Run a validation pass every this many steps (0: never).
        val_size: Problems held out for validation.
        temperature: Sampling temperature of training rollouts.
        top_p: Nucleus mass of training rollouts.
        seed: Seeds the problem order and the per-rollout sampling seeds.
    """

    steps: int = 3
    batch_size: int = 4
    n: int = 4
    val_every: int = 0
    val_size: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclasses.dataclass
class RolloutResult:
    """One finished rollout with its score.

    Attributes:
        sample_index: The problem's index in the dataset.
        rollout_n: Index within its group.
        reward: 1.0 for a correct final answer, else 0.0.
        advantage: Reward minus the group's mean.
        output: What :meth:`ToolAgentLoop.run` returned (None if it failed).
        error: The exception text when the rollout failed.
    """

    sample_index: int
    rollout_n: int
    reward: float
    advantage: float
    output: dict[str, Any] | None
    error: str | None = None


@dataclasses.dataclass
class StepResult:
    """Summary of one step (training or validation)."""

    step: int
    validate: bool
    rollouts: list[RolloutResult]
    seconds: float

    @property
    def reward_mean(self) -> float:
        """Mean reward over the step's rollouts."""
        return sum(r.reward for r in self.rollouts) / max(len(self.rollouts), 1)

    @property
    def errors(self) -> list[str]:
        """Errors of rollouts that failed."""
        return [r.error for r in self.rollouts if r.error]

    def describe(self) -> str:
        """One line for the console."""
        kind = "val " if self.validate else "step"
        outs = [r.output for r in self.rollouts if r.output]
        calls = sum(o["num_tool_calls"] for o in outs) / max(len(outs), 1)
        turns = sum(o["num_turns"] for o in outs) / max(len(outs), 1)
        failed = f", {len(self.errors)} failed" if self.errors else ""
        return (
            f"{kind} {self.step}: {len(self.rollouts)} rollouts, reward {self.reward_mean:.2f}, "
            f"{turns:.1f} turns, {calls:.1f} tool calls each, {self.seconds:.1f} s{failed}"
        )


def rollout_seed(seed: int, step: int, sample_index: int, rollout_n: int) -> int:
    """A per-rollout sampling seed, the same on every rerun."""
    return (seed * 1_000_003 + step * 10_007 + sample_index * 101 + rollout_n) % (2**31)


async def run_group(
    loop: ToolAgentLoop,
    problem: dict[str, Any],
    sample_index: int,
    step: int,
    n: int,
    sampling: SamplingParams,
    validate: bool = False,
    seed: int = 0,
    trainer: TrainerStats | None = None,
) -> list[RolloutResult]:
    """Run ``n`` rollouts of one problem concurrently; score and record them.

    Each rollout runs inside ``tracer.rollout_trace_attr`` (one trajectory).
    Rewards and advantages are logged after the whole group is done, as a
    trainer does, naming each trajectory by step/sample/rollout, with each
    model turn's token stats from ``trainer`` (default: synthetic).
    """

    async def one(rollout_n: int) -> dict[str, Any]:
        s = dataclasses.replace(sampling, seed=rollout_seed(seed, step, sample_index, rollout_n))
        with tracer.rollout_trace_attr(
            sample_index=sample_index, step=step, rollout_n=rollout_n, validate=validate, problem_id=problem.get("id")
        ):
            return await loop.run(loop.initial_messages(problem["question"]), s)

    outputs = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    for out in outputs:
        if isinstance(out, BaseException) and not isinstance(out, Exception):
            raise out
    truth = str(problem["answer"])
    rewards = [compute_score(o["answer"], truth) if isinstance(o, dict) else 0.0 for o in outputs]
    advantages = group_advantages(rewards)
    results = []
    for i, (out, reward, adv) in enumerate(zip(outputs, rewards, advantages, strict=True)):
        error = f"{type(out).__name__}: {out}" if isinstance(out, BaseException) else None
        answer = out.get("answer") if isinstance(out, dict) else None
        tracer.log_reward(
            reward,
            step=step,
            sample_index=sample_index,
            rollout_n=i,
            validate=validate,
            advantage=adv,
            ground_truth=truth,
            answer=answer,
        )
        if isinstance(out, dict):
            rng_seed = rollout_seed(seed, step, sample_index, i)
            log_turn_stats(out, trainer or SyntheticStats(), step, sample_index, i, validate, rng_seed)
        results.append(RolloutResult(sample_index, i, reward, adv, out if isinstance(out, dict) else None, error))
    return results


async def run_steps(
    loop: ToolAgentLoop,
    problems: Sequence[dict[str, Any]],
    config: RunConfig,
    on_step: Callable[[StepResult], None] | None = None,
    trainer: TrainerStats | None = None,
) -> list[StepResult]:
    """Run ``config.steps`` steps of ``batch_size`` problems x ``n`` rollouts.

    The last ``val_size`` problems are held out for validation when
    ``val_every`` > 0; training batches walk a seeded shuffle of the rest.
    """
    problems = list(problems)
    val_idx: list[int] = []
    train_idx = list(range(len(problems)))
    if config.val_every > 0 and len(problems) > config.val_size:
        val_idx = train_idx[-config.val_size :]
        train_idx = train_idx[: -config.val_size]
    order = _epochs(train_idx, config.seed)
    sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p)
    greedy = SamplingParams(temperature=0.0)
    results: list[StepResult] = []

    async def run_batch(step: int, indices: Iterable[int], n: int, s: SamplingParams, validate: bool) -> StepResult:
        start = time.perf_counter()
        groups = await asyncio.gather(
            *(
                run_group(loop, problems[i], i, step, n, s, validate=validate, seed=config.seed, trainer=trainer)
                for i in indices
            )
        )
        res = StepResult(step, validate, [r for g in groups for r in g], time.perf_counter() - start)
        results.append(res)
        if on_step is not None:
            on_step(res)
        return res

    for step in range(1, config.steps + 1):
        batch = [next(order) for _ in range(config.batch_size)]
        await run_batch(step, batch, config.n, sampling, False)
        if val_idx and step % config.val_every == 0:
            await run_batch(step, val_idx, 1, greedy, True)
    return results


def _epochs(indices: list[int], seed: int) -> Any:
    rng = random.Random(seed)
    while True:
        shuffled = indices[:]
        rng.shuffle(shuffled)
        yield from shuffled

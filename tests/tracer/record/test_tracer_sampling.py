"""Per-step sampling: N samples per step per worker, whole groups, reproducible, order-independent."""

from __future__ import annotations

import asyncio
import random

import tracer


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int]) -> list[int]:
    await asyncio.sleep(0)
    return prompt_ids


def run_step(step: int, samples: list[int], n: int = 4, validate: bool = False) -> None:
    async def one(sample: int, k: int) -> None:
        with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=k, validate=validate):
            await generate([sample])
            tracer.log_reward(float(k))

    async def main() -> None:
        await asyncio.gather(*(one(s, k) for s in samples for k in range(n)))

    asyncio.run(main())


def recorded(trace_dir: str, step: int | None = None) -> dict[str, set[int]]:
    table = tracer.read_trajectories(trace_dir, steps=step)
    out: dict[str, set[int]] = {}
    for row in table.to_pylist():
        out.setdefault(row["sample_index"], set()).add(row["rollout_n"])
    return out


def test_n_samples_per_step_with_whole_groups(trace_dir: str) -> None:
    """max_samples=3 records exactly 3 prompts of a 20-prompt step, each with all 4 rollouts."""
    tracer.init(output_dir=trace_dir, max_samples_per_step_per_worker=3, seed=1)
    run_step(0, list(range(20)))
    run_step(1, list(range(20)))
    tracer.flush()
    for step in (0, 1):
        got = recorded(trace_dir, step)
        assert len(got) == 3 and all(rollouts == {0, 1, 2, 3} for rollouts in got.values())
    assert tracer.read_trajectories(trace_dir)["reward"].null_count == 0


def test_fewer_samples_than_the_limit_are_all_recorded(trace_dir: str) -> None:
    """A step with fewer samples than the limit records all of them."""
    tracer.init(output_dir=trace_dir, max_samples=10)
    run_step(0, [0, 1])
    tracer.flush()
    assert set(recorded(trace_dir)) == {"0", "1"}


def test_choice_is_reproducible_and_ignores_arrival_order(tmp_path: object) -> None:
    """The same seed picks the same samples whatever order they start in; not simply the first ones."""
    import os

    chosen = []
    for i, order in enumerate([list(range(30)), list(reversed(range(30))), random.Random(5).sample(range(30), 30)]):
        d = os.path.join(str(tmp_path), f"run{i}")
        tracer.init(output_dir=d, max_samples=4, seed=11)
        run_step(7, order, n=2)
        tracer.shutdown()
        chosen.append(set(recorded(d)))
    assert chosen[0] == chosen[1] == chosen[2] and len(chosen[0]) == 4
    # A first-come sampler would keep 0-3 in the first order and 26-29 in the second: the equality above fails then.
    d = os.path.join(str(tmp_path), "other-seed")
    tracer.init(output_dir=d, max_samples=4, seed=12)
    run_step(7, list(range(30)), n=2)
    tracer.shutdown()
    assert set(recorded(d)) != chosen[0]


def test_training_and_validation_are_sampled_separately(trace_dir: str) -> None:
    """Validation rollouts of a step have their own quota."""
    tracer.init(output_dir=trace_dir, max_samples=2)
    run_step(0, list(range(6)), n=1)
    run_step(0, list(range(6)), n=1, validate=True)
    tracer.flush()
    assert tracer.read_trajectories(trace_dir, validate=True).num_rows == 2
    assert tracer.read_trajectories(trace_dir, validate=False).num_rows == 2

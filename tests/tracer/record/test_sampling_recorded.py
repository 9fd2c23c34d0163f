"""Sampling strategies through the recorder: what the files hold, and what their metadata says was kept."""

from __future__ import annotations

import json
import os
import tempfile
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.config import TraceConfig, TraceConfigError
from tracer.record.sampling import read_sampling


@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids: list[int], length: int) -> dict[str, Any]:
    return {"response_ids": list(range(length)), "finish_reason": "stop"}


def run_step(step: int, rewards: dict[int, list[float]], lengths: dict[int, int] | None = None) -> None:
    """One step: each sample's rollouts, then its rewards logged afterwards by key (as a trainer does)."""
    for sample, group in rewards.items():
        for n in range(len(group)):
            with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                generate([sample], (lengths or {}).get(sample, 3))
    for sample, group in rewards.items():
        for n, r in enumerate(group):
            tracer.log_reward(r, step=step, sample_index=sample, rollout_n=n)


def recorded(trace_dir: str, step: int) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for row in tracer.read_trajectories(trace_dir, steps=step).to_pylist():
        out.setdefault(row[S.SAMPLE_INDEX], set()).add(row[S.ROLLOUT_N])
    return out


#: Ten groups of four: sample i has mean reward i / 10 (all equal for even i, spread for odd i).
REWARDS = {
    i: ([i / 10] * 4 if i % 2 == 0 else [i / 10 - 0.05, i / 10 + 0.05, i / 10 - 0.05, i / 10 + 0.05]) for i in range(10)
}


def test_extremes_records_the_best_and_worst_groups_whole(trace_dir: str) -> None:
    """extremes with N=4 keeps the two highest and two lowest mean-reward groups, all their rollouts and rewards."""
    tracer.init(output_dir=trace_dir, max_samples=4, sample_strategy="extremes")
    run_step(0, REWARDS)
    run_step(1, REWARDS)
    tracer.flush()
    for step in (0, 1):
        got = recorded(trace_dir, step)
        assert set(got) == {"0", "1", "8", "9"}
        assert all(rollouts == {0, 1, 2, 3} for rollouts in got.values())
    assert tracer.read_trajectories(trace_dir)[S.REWARD].null_count == 0


@settings(max_examples=25, deadline=None)
@given(
    # Distinct means by construction (an assume() on them threw away about half the draws).
    groups=st.lists(
        st.lists(st.integers(-5, 5), min_size=1, max_size=4),
        min_size=1,
        max_size=9,
        unique_by=lambda g: Fraction(sum(g), len(g)),
    ),
    limit=st.integers(1, 5),
)
def test_recorded_extremes_are_the_top_and_bottom_groups_for_any_rewards(groups: list[list[int]], limit: int) -> None:
    """For any rewards (distinct group means), the files hold exactly the top and bottom groups, each whole."""
    means = [Fraction(sum(g), len(g)) for g in groups]
    assert len(set(means)) == len(means)
    order = sorted(range(len(groups)), key=lambda i: means[i])
    n_high = min((limit + 1) // 2, len(groups))
    high = order[len(order) - n_high :]
    low = order[: min(limit - n_high, len(order) - n_high)]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "traces")
        # Room for every group: the bound has its own test.
        tracer.init(output_dir=out, max_samples=limit, sample_strategy="extremes", sample_candidates_per_step=9)
        run_step(0, {i: [float(r) for r in g] for i, g in enumerate(groups)})
        tracer.shutdown()
        got = recorded(out, 0)
    assert set(got) == {str(i) for i in high + low}
    assert all(got[str(i)] == set(range(len(groups[i]))) for i in high + low)


def test_variance_prefers_groups_whose_rewards_differ(trace_dir: str) -> None:
    """variance with N=3 keeps three of the five groups with differing rewards, none of the all-equal ones."""
    tracer.init(output_dir=trace_dir, max_samples=3, sample_strategy="variance")
    run_step(0, REWARDS)
    tracer.flush()
    got = recorded(trace_dir, 0)
    assert len(got) == 3 and all(int(k) % 2 == 1 for k in got)


def test_extremes_by_length_keeps_the_longest_and_shortest(trace_dir: str) -> None:
    """sample_by=length ranks groups by the response tokens their llm spans returned."""
    tracer.init(output_dir=trace_dir, max_samples=2, sample_strategy="extremes", sample_by="length")
    run_step(0, {i: [0.0, 0.0] for i in range(6)}, lengths={i: 10 + i for i in range(6)})
    tracer.flush()
    assert set(recorded(trace_dir, 0)) == {"0", "5"}


def test_metadata_names_the_strategy_and_what_it_kept(trace_dir: str) -> None:
    """Each file names the strategy and parameters; each step's decision lists the kept groups and the dropped counts."""
    tracer.init(output_dir=trace_dir, max_samples=4, seed=3, sample_strategy="extremes")
    run_step(0, REWARDS)
    run_step(1, REWARDS)
    tracer.shutdown()
    (meta,) = {tracer.read_file_metadata(f).get(S.META_SAMPLING) for f in tracer.list_trace_files(trace_dir)}
    assert json.loads(meta) == {
        "strategy": "extremes",
        "limit": 4,
        "seed": 3,
        "by": "reward",
        "candidates_per_step": 16,
        "decide_after_s": 1.0,
    }
    decisions = read_sampling(trace_dir)
    assert [(d[S.STEP], d[S.VALIDATE]) for d in decisions] == [(0, False), (1, False)]
    for d in decisions:
        kept = {k[S.SAMPLE_INDEX]: k for k in d["kept"]}
        assert set(kept) == {"0", "1", "8", "9"}
        assert {k: v["rank"] for k, v in kept.items()} == {"9": "high", "8": "high", "0": "low", "1": "low"}
        assert kept["9"]["value"] == pytest.approx(0.9) and kept["9"]["trajectories"] == 4
        assert (d["dropped_groups"], d["dropped_over_bound"], d["strategy"]) == (6, 0, "extremes")


def test_memory_bound_holds_the_first_groups_and_counts_the_rest(trace_dir: str) -> None:
    """With sample_candidates_per_step=5, groups after the fifth are not recorded and are counted as over the bound."""
    tracer.init(output_dir=trace_dir, max_samples=2, sample_strategy="extremes", sample_candidates_per_step=5)
    run_step(0, REWARDS)
    tracer.flush()
    # Among the first five groups (means 0.0-0.4): the highest and the lowest.
    assert set(recorded(trace_dir, 0)) == {"0", "4"}
    (d,) = read_sampling(trace_dir)
    assert (d["dropped_over_bound"], d["dropped_groups"]) == (5, 3)


def test_uniform_decisions_are_recorded_too(trace_dir: str) -> None:
    """The default strategy writes its decision: the kept groups, the dropped count."""
    tracer.init(output_dir=trace_dir, max_samples=3)
    run_step(0, REWARDS)
    tracer.shutdown()
    (d,) = read_sampling(trace_dir)
    assert d["strategy"] == "uniform" and d["dropped_groups"] == 7
    assert {k[S.SAMPLE_INDEX] for k in d["kept"]} == set(recorded(trace_dir, 0))


def test_misspelled_strategy_gets_did_you_mean() -> None:
    """A misspelled strategy or sample_by is refused with the choices and the closest one."""
    with pytest.raises(
        TraceConfigError, match=r"^sample_strategy: 'extremse' is not one of .* \(did you mean 'extremes'\?\)"
    ):
        TraceConfig(sample_strategy="extremse")
    with pytest.raises(TraceConfigError, match=r"did you mean 'length'"):
        TraceConfig(sample_by="lenght")


def test_verl_style_keys_set_the_strategy() -> None:
    """actor_rollout_ref.rollout.trace.sample_strategy and friends set the fields; a bad choice names the key."""
    cfg = TraceConfig.from_overrides(
        [
            "actor_rollout_ref.rollout.trace.sample_strategy=variance",
            "actor_rollout_ref.rollout.trace.sample_by=length",
            "actor_rollout_ref.rollout.trace.sample_candidates_per_step=64",
        ]
    )
    assert (cfg.sample_strategy, cfg.sample_by, cfg.sample_candidates_per_step) == ("variance", "length", 64)
    with pytest.raises(TraceConfigError, match=r"^actor_rollout_ref\.rollout\.trace\.sample_strategy: 'varience'"):
        TraceConfig.from_overrides(["actor_rollout_ref.rollout.trace.sample_strategy=varience"])

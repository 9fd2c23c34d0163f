"""Sampling strategies as a specification: extremes, variance and uniform over any groups and rewards."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.context import Trajectory
from tracer.record.sampling import (
    BY_LATER_STEP,
    BY_LENGTH,
    EXTREMES,
    IN,
    OUT,
    PENDING,
    RANK_HIGH,
    RANK_LOW,
    UNIFORM,
    VARIANCE,
    Group,
    StepSampler,
    choose_groups,
    response_tokens,
    sample_score,
)

#: Rewards as a trainer logs them: a few levels (ties are common), sometimes missing or not finite.
rewards = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, -1.0]),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.none(),
    st.just(math.nan),
    st.just(math.inf),
)
#: One step: sample_index -> the rewards of its rollouts.
steps = st.dictionaries(st.integers(0, 10_000).map(str), st.lists(rewards, min_size=1, max_size=6), max_size=25)
#: A step with at least one group (built so, not assumed).
busy_steps = st.dictionaries(
    st.integers(0, 10_000).map(str), st.lists(rewards, min_size=1, max_size=6), min_size=1, max_size=25
)


def finite(values: list[Any]) -> tuple[float, ...]:
    return tuple(v for v in values if v is not None and math.isfinite(v))


def groups_of(step: dict[str, list[Any]], seed: int = 0) -> list[Group]:
    return [Group(k, sample_score(seed, 3, False, k), finite(v)) for k, v in step.items()]


def exact_mean(g: Group) -> Fraction:
    return sum((Fraction(v) for v in g.values), Fraction(0)) / len(g.values)


def exact_variance(g: Group) -> Fraction:
    m = exact_mean(g)
    return sum(((Fraction(v) - m) ** 2 for v in g.values), Fraction(0)) / len(g.values)


@settings(max_examples=60, deadline=None)
@given(step=steps, limit=st.integers(1, 12), data=st.data())
def test_extremes_keeps_exactly_the_highest_and_lowest_groups(
    step: dict[str, list[Any]], limit: int, data: st.DataObject
) -> None:
    """extremes keeps the ceil(N/2) highest-mean groups and the floor(N/2) lowest of the rest, whole; rewardless last."""
    groups = groups_of(step)
    kept = choose_groups(EXTREMES, data.draw(st.permutations(groups)), limit)
    keys = [g.key for g, _ in kept]
    assert len(keys) == len(set(keys)) == min(limit, len(groups))
    known = [g for g in groups if g.values]
    high = [g for g, rank in kept if rank == RANK_HIGH]
    low = [g for g, rank in kept if rank == RANK_LOW]
    assert len(high) == min((limit + 1) // 2, len(known))
    assert len(low) == min(limit - len(high), len(known) - len(high))
    rest = [g for g in known if g.key not in set(keys)]
    # Every high group beats every group left out; every low group is beaten by every group left out.
    for g in rest:
        assert all(exact_mean(h) >= exact_mean(g) for h in high)
        assert all(exact_mean(lo) <= exact_mean(g) for lo in low)
    # Between groups of equal mean the seeded score decides.
    for g in rest:
        assert all(exact_mean(h) > exact_mean(g) or h.score <= g.score for h in high)
    # Groups without a reward only fill places the rewarded ones cannot.
    unknown = [g for g, rank in kept if rank is None]
    assert all(not g.values for g in unknown)
    assert not unknown or len(known) == len(high) + len(low)


@settings(max_examples=60, deadline=None)
@given(step=steps, limit=st.integers(1, 12), data=st.data())
def test_variance_ranks_differing_groups_first_by_variance(
    step: dict[str, list[Any]], limit: int, data: st.DataObject
) -> None:
    """variance keeps groups whose rewards differ (largest variance first), then all-equal groups, then rewardless."""
    groups = groups_of(step)
    kept = [g for g, _ in choose_groups(VARIANCE, data.draw(st.permutations(groups)), limit)]
    assert len(kept) == min(limit, len(groups))

    def rank(g: Group) -> tuple[int, Fraction, float]:
        if not g.values:
            return (2, Fraction(0), g.score)
        return (0 if len(set(g.values)) > 1 else 1, -exact_variance(g), g.score)

    expected = sorted(groups, key=lambda g: (rank(g), g.key))[:limit]
    assert [g.key for g in kept] == [g.key for g in expected]


@settings(max_examples=30, deadline=None)
@given(step=steps, limit=st.integers(1, 12), seed=st.integers(0, 2**32), data=st.data())
def test_every_strategy_ignores_arrival_order(
    step: dict[str, list[Any]], limit: int, seed: int, data: st.DataObject
) -> None:
    """The same groups in any order give the same choice, for each strategy."""
    groups = groups_of(step, seed)
    for strategy in (UNIFORM, EXTREMES, VARIANCE):
        once = [g.key for g, _ in choose_groups(strategy, groups, limit)]
        again = [g.key for g, _ in choose_groups(strategy, data.draw(st.permutations(groups)), limit)]
        assert once == again


def make_trajectories(step: int, key: str, n: int, ids: Any) -> list[Trajectory]:
    return [Trajectory(step, key, k, False, "t", None, True, next(ids), next(ids)) for k in range(n)]


@settings(max_examples=50, deadline=None)
@given(
    step=busy_steps,
    limit=st.integers(1, 8),
    strategy=st.sampled_from([EXTREMES, VARIANCE]),
    candidates=st.integers(1, 30),
    order_seed=st.integers(0, 1000),
)
def test_sampler_decides_like_the_strategy_within_its_memory_bound(
    step: dict[str, list[Any]], limit: int, strategy: str, candidates: int, order_seed: int
) -> None:
    """The sampler holds at most `candidates` groups, counts the rest, and keeps what choose_groups keeps of the held ones."""
    assert step
    sampler = StepSampler(limit, seed=0, decide_after_s=0.0, strategy=strategy, candidates=candidates)
    ids = itertools.count(1)
    keys = list(step)
    random.Random(order_seed).shuffle(keys)
    held: dict[str, list[Trajectory]] = {}
    for key in keys:
        trajs = make_trajectories(3, key, len(step[key]), ids)
        for t in trajs:
            sample = sampler.admit(3, False, key)
            if sample is None:
                t.recording = False
                continue
            t.sample = sample
            sample.trajectories.append(t)
        if trajs[0].recording:
            held[key] = trajs
    assert list(held) == keys[:candidates]
    for key, trajs in held.items():
        for t, reward in zip(trajs, step[key]):
            sampler.observe(t, True, reward, None, None)
    sampler.decide(force=True)
    expected = {g.key for g, _ in choose_groups(strategy, groups_of({k: step[k] for k in held}), limit)}
    for key, trajs in held.items():
        states = {t.sample.state for t in trajs}
        assert states == ({IN} if key in expected else {OUT})  # a group is never split
        assert all(t.recording == (key in expected) for t in trajs)
    (decision,) = sampler.take_decisions()
    assert {k["sample_index"] for k in decision["kept"]} == expected
    assert decision["dropped_over_bound"] == max(0, len(keys) - candidates)
    assert decision["dropped_groups"] == len(held) - len(expected)
    assert decision["strategy"] == strategy and decision["limit"] == limit


def test_a_step_waits_for_every_reward_then_decides_without_a_flush() -> None:
    """extremes holds a step while a trajectory lacks its reward; the last reward lets the next cycle decide it."""
    sampler = StepSampler(1, seed=0, decide_after_s=0.0, strategy=EXTREMES)
    ids = itertools.count(1)
    trajs = []
    for key in ("a", "b"):
        for t in make_trajectories(0, key, 2, ids):
            t.sample = sampler.admit(0, False, key)
            t.sample.trajectories.append(t)
            trajs.append(t)
    for t in trajs:
        sampler.observe(t, True, None, None, None)  # rollouts over, rewards still to come
    for t, r in zip(trajs[:3], (1.0, 1.0, 0.0)):
        sampler.observe(t, False, r, None, None)
    sampler.decide()
    assert {t.sample.state for t in trajs} == {PENDING}
    sampler.observe(trajs[3], False, 0.0, None, None)
    sampler.decide()
    assert [t.sample.state for t in trajs] == [IN, IN, OUT, OUT]


def test_a_later_step_decides_the_earlier_one_a_writer_cycle_later() -> None:
    """When step 1 starts, step 0 is decided at the second writer cycle, after rewards buffered before are seen."""
    sampler = StepSampler(1, seed=0, decide_after_s=1e9, strategy=VARIANCE)
    sample = sampler.admit(0, False, "a")
    assert sample is not None
    sampler.decide()
    sampler.admit(1, False, "x")
    sampler.decide()
    assert sample.state == PENDING
    sampler.decide()
    assert sample.state == IN
    (decision,) = sampler.take_decisions()
    assert decision["decided_by"] == BY_LATER_STEP and decision["step"] == 0


def test_late_groups_are_kept_only_while_fewer_than_n_are() -> None:
    """After a decision, a late group is kept while the step has room, and counted either way."""
    sampler = StepSampler(2, seed=0, decide_after_s=1e9, strategy=EXTREMES)
    assert sampler.admit(0, False, "a") is not None
    sampler.decide(force=True)
    late = sampler.admit(0, False, "b")
    assert late is not None and late.state == IN
    assert sampler.admit(0, False, "c") is None
    (decision,) = sampler.take_decisions()
    assert decision["late_kept"] == 1 and decision["dropped_groups"] == 1


def test_response_tokens_reads_the_shapes_the_trajectory_model_reads() -> None:
    """Lengths come from response_ids / token_ids / vLLM outputs, in dicts and objects; other replies have none."""

    class TokenOutput:
        token_ids = [1, 2, 3]

    class Completion:
        token_ids = (4, 5)

    class RequestOutput:
        outputs = [Completion()]

    assert response_tokens({"response_ids": [1, 2]}) == 2
    assert response_tokens(TokenOutput()) == 3
    assert response_tokens(RequestOutput()) == 2
    assert response_tokens({"outputs": [{"token_ids": [1]}]}) == 1
    assert response_tokens("text") is None and response_tokens({"text": "hi"}) is None


def test_length_ranks_groups_by_their_mean_response_tokens() -> None:
    """sample_by=length: extremes keeps the longest and the shortest groups."""
    sampler = StepSampler(2, seed=0, decide_after_s=0.0, strategy=EXTREMES, by=BY_LENGTH)
    ids = itertools.count(1)
    lengths = {"short": 2, "mid": 5, "mid2": 6, "long": 9}
    trajs = {}
    for key, n in lengths.items():
        (t,) = make_trajectories(0, key, 1, ids)
        t.sample = sampler.admit(0, False, key)
        t.sample.trajectories.append(t)
        sampler.observe(t, False, None, None, {"response_ids": list(range(n))})
        sampler.observe(t, True, None, None, None)
        trajs[key] = t
    sampler.decide()
    assert {k for k, t in trajs.items() if t.sample.state == IN} == {"short", "long"}

"""The replay names where a trajectory's reward came from, and lists every source on request (AppTest)."""

from __future__ import annotations

from typing import Any

from apptest_fixtures import open_app
from streamlit.testing.v1 import AppTest
from viewer_fixtures import record_run

import tracer
from tracer import schema as S
from tracer.data.rescore import read_rewards, rescore
from viewer import data as D

SOURCE = "graders:strict"


def strict(messages: list[dict[str, Any]], response: str, info: dict[str, Any]) -> float:
    """A corrected reward: 0.25 for every trajectory."""
    return 0.25


def open_replay(path: str, trace_id: str) -> AppTest:
    return open_app(path, trace_id=trace_id)


def test_replay_shows_the_latest_reward_and_every_source(tmp_path: str) -> None:
    """After a rescore the replay shows the new reward with its source; the expander lists recorded and rescored."""
    run = record_run(tmp_path, steps=1, prompts=1, group=2)
    rescore(run, strict, source=SOURCE)
    tid = next(r[S.TRACE_ID] for r in tracer.read_trajectories(run).to_pylist() if r[S.ROLLOUT_N] == 1)
    at = open_replay(run, tid)
    captions = [c.value.replace("\\", "") for c in at.caption]  # safe.md escapes markdown
    assert f"reward 0.25 from {SOURCE} (2 source(s))" in captions
    (exp,) = [e for e in at.expander if e.label.startswith("Reward sources")]
    assert exp.label == "Reward sources (2)"
    table = next(df.value for df in at.dataframe if D.REWARD_SOURCE in df.value.columns)
    assert table[D.REWARD_SOURCE].tolist() == ["recorded", SOURCE]
    assert table[D.REWARD].tolist() == [float((1 + 1) % 2), 0.25]
    assert table[D.REWARD_LATEST].tolist() == [False, True]
    assert table[D.REWARD_TIME].notna().all()


def test_reward_sources_agree_with_read_rewards(tmp_path: str) -> None:
    """The viewer's list is tracer.read_rewards' list for that trajectory: one meaning of 'source' and 'latest'."""
    run = record_run(tmp_path, steps=1, prompts=1, group=2)
    rescore(run, strict, source=SOURCE)
    every = read_rewards(run).to_pylist()
    for tid in {r[S.TRACE_ID] for r in every}:
        spans = D.load_trajectory(run, tid).table
        mine = [(r[D.REWARD_SOURCE], r[D.REWARD], r[D.REWARD_LATEST]) for r in D.reward_sources(spans)]
        theirs = [(r[D.REWARD_SOURCE], r[S.REWARD], r[D.REWARD_LATEST]) for r in every if r[S.TRACE_ID] == tid]
        assert mine == theirs

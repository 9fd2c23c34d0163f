"""Re-scoring a recorded run (rollout-trace rescore, tracer.data.rescore)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from storage_fixtures import copy_run

import tracer
from tracer.cli import main as rollout_trace_main
from tracer.data.rescore import RescoreError, read_rewards, rescore
from tracer.summary import SOURCE_RECORDED

REWARDS_PY = """
def always_half(messages, response, info):
    return 0.5

def by_length(messages, response, info):
    assert messages[0]["role"] == "system" and messages[-1]["role"] in ("assistant", "tool")
    assert "<|im_end|>" not in response
    assert "ground_truth" in info
    return {"reward": float(len(response) % 2), "checked": True}

def skip_validation(messages, response, info):
    return None

def broken(messages, response, info):
    return "high"
"""


@pytest.fixture
def run_copy(recorded_run: str, tmp_path: Path) -> str:
    """A copy of the recorded run (rescoring appends to it)."""
    dst = tmp_path / "run"
    copy_run(recorded_run, dst)
    return str(dst)


@pytest.fixture
def rewards_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of reward functions on sys.path; its name."""
    (tmp_path / "my_rewards.py").write_text(REWARDS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def _rewards(run: str) -> dict[str, float | None]:
    return {r["trace_id"]: r["reward"] for r in tracer.read_trajectories(run).to_pylist()}


def test_readers_report_the_new_reward_and_keep_the_old(run_copy: str, rewards_module: str) -> None:
    """After a rescore the summary's reward is the new one; read_rewards lists both with their sources."""
    before = _rewards(run_copy)
    report = rescore(run_copy, f"{rewards_module}:always_half")
    assert report.trajectories == len(before)
    assert report.changed == sum(1 for r in before.values() if r != 0.5)
    assert set(_rewards(run_copy).values()) == {0.5}
    table = read_rewards(run_copy).to_pylist()
    for tid, old in before.items():
        mine = [r for r in table if r["trace_id"] == tid]
        assert [(r["source"], r["reward"], r["latest"]) for r in mine] == [
            (SOURCE_RECORDED, old, False),
            (f"{rewards_module}:always_half", 0.5, True),
        ]
        assert json.loads(mine[-1]["reward_info"])["previous_reward"] == old
    latest = read_rewards(run_copy, latest_only=True)
    assert latest.num_rows == len(before)


def test_function_gets_messages_response_and_info(run_copy: str, rewards_module: str) -> None:
    """The function sees the conversation, the final response and the recorded info; extras are logged."""
    report = rescore(run_copy, f"{rewards_module}:by_length")
    assert report.trajectories > 0
    info = [json.loads(r["reward_info"]) for r in read_rewards(run_copy, latest_only=True).to_pylist()]
    assert all(i["checked"] is True for i in info)


def test_rescoring_twice_keeps_every_source(run_copy: str, rewards_module: str) -> None:
    """A second rescore adds a third reward; the latest wins."""
    rescore(run_copy, f"{rewards_module}:always_half")
    rescore(run_copy, f"{rewards_module}:by_length")
    table = read_rewards(run_copy).to_pylist()
    tid = table[0]["trace_id"]
    sources = [r["source"] for r in table if r["trace_id"] == tid]
    assert sources == [SOURCE_RECORDED, f"{rewards_module}:always_half", f"{rewards_module}:by_length"]
    assert tracer.to_dataset(run_copy)["reward"].to_pylist() == [
        _rewards(run_copy)[t] for t in tracer.to_dataset(run_copy)["trace_id"].to_pylist()
    ]


def test_none_leaves_the_reward(run_copy: str, rewards_module: str) -> None:
    """A function returning None leaves every reward as it was and writes nothing."""
    before = _rewards(run_copy)
    files = set(os.listdir(run_copy))
    report = rescore(run_copy, f"{rewards_module}:skip_validation")
    assert (report.trajectories, report.unscored, report.path) == (0, len(before), None)
    assert _rewards(run_copy) == before
    assert set(os.listdir(run_copy)) == files


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("my_rewards", "not module:function"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("my_rewards:nope", "has no function 'nope'"),
        ("my_rewards:broken", "return a number"),
    ],
)
def test_bad_functions_name_the_fix(run_copy: str, rewards_module: str, spec: str, message: str) -> None:
    """A missing module or function, or a non-number result, says what to give."""
    with pytest.raises(RescoreError, match=message):
        rescore(run_copy, spec)


def test_cli_prints_changes_and_means(
    run_copy: str, rewards_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rollout-trace rescore prints how many rewards changed and the mean before and after."""
    before = [r for r in _rewards(run_copy).values() if r is not None]
    path = tmp_path / "my_rewards.py"
    assert rollout_trace_main(["rescore", run_copy, "--reward", f"{path}:always_half"]) == 0
    out = capsys.readouterr().out
    changed = sum(1 for r in before if r != 0.5)
    assert f"{changed} rewards changed" in out
    assert f"mean reward {sum(before) / len(before):.4f} -> 0.5000" in out
    assert rollout_trace_main(["rescore", run_copy, "--reward", "my_rewards"]) == 2
    assert "not module:function" in capsys.readouterr().err


def test_no_trace_files_is_an_error(tmp_path: Path) -> None:
    """A folder without trace files is an error naming it."""
    with pytest.raises(FileNotFoundError, match="no trace files"):
        rescore(str(tmp_path), lambda m, r, i: 1.0)


def test_advantage_is_not_carried_to_a_new_reward(run_copy: str, rewards_module: str) -> None:
    """The old advantage does not describe the new reward: the dataset's advantage is null after a rescore."""
    assert any(a is not None for a in tracer.to_dataset(run_copy)["advantage"].to_pylist())
    rescore(run_copy, f"{rewards_module}:always_half")
    assert set(tracer.to_dataset(run_copy)["advantage"].to_pylist()) == {None}
    info = json.loads(read_rewards(run_copy, latest_only=True)["reward_info"][0].as_py())
    assert "ground_truth" in info and "advantage" not in info

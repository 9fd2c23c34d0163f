"""Console backend: one summary line per step on the log and stderr."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from export_fixtures import STEPS, TRAIN_PER_STEP, WAIT_S, init_console, record_rollouts

import tracer
from tracer.exporters.console import format_step_line


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rollout_trace" and r.getMessage().startswith("rollout-trace step")
    ]


def test_each_step_gets_one_line_per_set(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """After shutdown, every step has exactly one training line and one validation line on the log."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    init_console(tmp_path)
    record_rollouts()
    tracer.shutdown()
    lines = _lines(caplog)
    for step in STEPS:
        assert sum(1 for line in lines if line.startswith(f"rollout-trace step {step}: ")) == 1
        assert sum(1 for line in lines if line.startswith(f"rollout-trace step {step} validation: ")) == 1
    assert f"| {TRAIN_PER_STEP} trajectories, 0 failed |" in lines[0]
    assert "tool calls 1.0, errors 25.0%" in lines[0]


def test_line_is_written_once_a_later_step_starts(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A step's line appears when a trajectory of a later step arrives, and the last step's at shutdown."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    init_console(tmp_path)
    record_rollouts(steps=(1, 2), val_per_step=0)
    deadline = time.monotonic() + WAIT_S
    while not any(line.startswith("rollout-trace step 1: ") for line in _lines(caplog)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(line.startswith("rollout-trace step 1: ") for line in _lines(caplog))
    assert not any(line.startswith("rollout-trace step 2") for line in _lines(caplog))
    tracer.shutdown()
    assert any(line.startswith("rollout-trace step 2: ") for line in _lines(caplog))


def test_lines_are_printed_to_stderr(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary lines are also printed to stderr, as verl's console logger does."""
    init_console(tmp_path)
    record_rollouts(steps=(1,), val_per_step=0)
    tracer.flush()
    assert "rollout-trace step 1: reward" in capsys.readouterr().err
    tracer.shutdown()


def test_line_shows_reward_turns_tool_error_rate_and_count() -> None:
    """The line spells out reward statistics, turns, tool calls and error rate, trajectories and latency."""
    metrics = {
        "trajectories": 8.0,
        "reward/mean": 0.625,
        "reward/std": 0.484,
        "reward/min": 0.0,
        "reward/max": 1.0,
        "turns/mean": 2.0,
        "tool_calls/mean": 1.5,
        "tool_error_rate": 0.25,
        "errors": 1.0,
        "latency_s/p50": 1.2,
        "latency_s/p95": 3.41,
    }
    assert format_step_line(3, metrics) == (
        "rollout-trace step 3: reward 0.625 ± 0.484 [0, 1] | turns 2.0 | tool calls 1.5, errors 25.0% | "
        "8 trajectories, 1 failed | latency p50 1.20s p95 3.41s"
    )


def test_late_trajectories_of_a_published_step_update_its_line(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Trajectories arriving after their step was published by a flush give a new line counting all of them."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    init_console(tmp_path)
    record_rollouts(steps=(1,), val_per_step=0)
    tracer.flush()
    record_rollouts(steps=(1,), val_per_step=0)
    tracer.shutdown()
    lines = [line for line in _lines(caplog) if line.startswith("rollout-trace step 1: ")]
    assert len(lines) == 2
    assert f"| {TRAIN_PER_STEP} trajectories," in lines[0]
    assert f"| {2 * TRAIN_PER_STEP} trajectories," in lines[1]


def test_print_can_be_turned_off(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """backend_options console_print=False keeps the lines on the log only."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    init_console(tmp_path, print_lines=False)
    record_rollouts(steps=(1,), val_per_step=0)
    tracer.shutdown()
    assert "rollout-trace step 1" not in capsys.readouterr().err
    assert any(line.startswith("rollout-trace step 1: ") for line in _lines(caplog))


def test_reward_for_a_trajectory_recorded_elsewhere_adds_no_row(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A reward logged by keys for a trajectory this process never recorded is not counted as a trajectory live."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    init_console(tmp_path)
    record_rollouts(steps=(1,), val_per_step=0)
    tracer.log_reward(1.0, step=1, sample_index=999, rollout_n=0)
    tracer.shutdown()
    lines = [line for line in _lines(caplog) if line.startswith("rollout-trace step 1: ")]
    assert len(lines) == 1 and f"| {TRAIN_PER_STEP} trajectories," in lines[0]

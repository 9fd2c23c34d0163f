"""step_metrics and trajectory_messages: the numbers every exporter and the viewer show."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

import tracer


def trajectories(rows: list[dict]) -> pa.Table:
    base = {
        "trace_id": "t",
        "name": "agent_loop",
        "sample_index": "0",
        "rollout_n": 0,
        "reward_info": None,
        "num_spans": 1,
        "num_errors": 0,
    }
    return pa.Table.from_pylist([{**base, **r} for r in rows], schema=tracer.schema.TRAJECTORY_SCHEMA)


def test_step_metrics_by_step_and_split() -> None:
    """Means, population std, min/max, rates, error count and latency percentiles per (step, validate)."""
    s = 1_000_000_000
    table = trajectories(
        [
            {
                "step": 1,
                "validate": False,
                "reward": 1.0,
                "status": "ok",
                "start_ns": 0,
                "end_ns": 1 * s,
                "num_llm_calls": 2,
                "num_tool_calls": 2,
                "num_tool_errors": 1,
            },
            {
                "step": 1,
                "validate": False,
                "reward": 0.0,
                "status": "error",
                "start_ns": 0,
                "end_ns": 3 * s,
                "num_llm_calls": 4,
                "num_tool_calls": 2,
                "num_tool_errors": 0,
            },
            {
                "step": 1,
                "validate": True,
                "reward": None,
                "status": "ok",
                "start_ns": 0,
                "end_ns": 2 * s,
                "num_llm_calls": 1,
                "num_tool_calls": 0,
                "num_tool_errors": 0,
            },
        ]
    )
    metrics = tracer.step_metrics(table)
    assert list(metrics) == [(1, False), (1, True)]
    train = metrics[(1, False)]
    assert train["trajectories"] == 2 and train["reward/mean"] == 0.5 and train["reward/std"] == 0.5
    assert (train["reward/min"], train["reward/max"]) == (0.0, 1.0)
    assert train["turns/mean"] == 3 and train["tool_calls/mean"] == 2 and train["tool_error_rate"] == 0.25
    assert train["errors"] == 1
    assert train["latency_s/p50"] == pytest.approx(2.0) and train["latency_s/p95"] == pytest.approx(2.9)
    val = metrics[(1, True)]
    assert math.isnan(val["reward/mean"]) and val["tool_error_rate"] == 0.0 and val["latency_s/p50"] == 2.0


def test_step_metrics_of_nothing_is_empty() -> None:
    """No trajectories, no groups."""
    assert tracer.step_metrics(tracer.schema.TRAJECTORY_SCHEMA.empty_table()) == {}

"""Per-token stats a trainer logs for a turn: recorded, read back, and the train/inference mismatch per step."""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viewer_fixtures import _agent_loop

import tracer
from tracer.summary import token_stat_metrics


def _run(trace_dir: str, inside: bool = True) -> str:
    cfg = tracer.init(project_name="p", experiment_name="e", backend="arrow", output_dir=trace_dir)
    with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
        _agent_loop("What is 0 + 0?", 1, 0, 0)
        if inside:
            tracer.log_token_stats(
                0, old_logprobs=np.array([-0.1] * 12), entropy=[0.5] * 12, loss_mask=[1] * 10 + [0, 0]
            )
    if not inside:
        tracer.log_token_stats(1, step=1, sample_index=0, rollout_n=0, old_logprobs=[0.0] * 12)
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


def test_stats_logged_inside_a_trajectory_read_back_per_turn(trace_dir: str) -> None:
    """Arrays come back on the trajectory's row for that turn, numpy arrays included."""
    run = _run(trace_dir)
    t = tracer.read_token_stats(run)
    assert t.num_rows == 1
    row = t.to_pylist()[0]
    assert row["turn"] == 0 and row["step"] == 1 and row["sample_index"] == "0"
    assert row["old_logprobs"] == [-0.1] * 12
    assert row["loss_mask"] == [1.0] * 10 + [0.0, 0.0]
    assert row["trace_id"] == tracer.read_trajectories(run).column("trace_id")[0].as_py()


def test_rollout_logprobs_default_to_what_the_turn_recorded(trace_dir: str) -> None:
    """Without rollout_logprobs logged, they are the llm span's own logprobs (viewer_fixtures: -0.05 * k)."""
    row = tracer.read_token_stats(_run(trace_dir)).to_pylist()[0]
    assert row["rollout_logprobs"] == pytest.approx([-0.05 * k for k in range(12)])


def test_stats_logged_outside_a_trajectory_name_it_by_keys(trace_dir: str) -> None:
    """Outside a block, step/sample_index/rollout_n name the trajectory (as log_reward); its trace id is joined."""
    run = _run(trace_dir, inside=False)
    row = tracer.read_token_stats(run).to_pylist()[0]
    assert (row["step"], row["sample_index"], row["rollout_n"], row["turn"]) == (1, "0", 0, 1)
    assert row["trace_id"] == tracer.read_trajectories(run).column("trace_id")[0].as_py()
    assert row["rollout_logprobs"] == pytest.approx([-0.05 * k for k in range(12)])


def test_source_labels_where_the_numbers_came_from(trace_dir: str) -> None:
    """log_token_stats(source=...) comes back in the source column (null when not given)."""
    tracer.init(project_name="p", experiment_name="e", backend="arrow", output_dir=trace_dir)
    with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
        _agent_loop("q", 1, 0, 0)
        tracer.log_token_stats(0, source="synthetic", old_logprobs=[0.0])
        tracer.log_token_stats(1, old_logprobs=[0.0])
    tracer.flush()
    rows = {r["turn"]: r["source"] for r in tracer.read_token_stats(tracer.get_config().run_dir).to_pylist()}
    assert rows == {0: "synthetic", 1: None}


def test_step_metrics_gain_the_logprob_mismatch(trace_dir: str) -> None:
    """logprob_mismatch is the mean |rollout - trainer| over masked-in tokens; the ratio is the largest exp(trainer - rollout)."""
    run = _run(trace_dir)
    metrics = tracer.step_metrics(tracer.read_trajectories(run), tracer.read_token_stats(run))[(1, False)]
    diffs = [-0.05 * k + 0.1 for k in range(10)]  # rollout - trainer, the 10 tokens in the mask
    assert metrics["logprob_mismatch"] == pytest.approx(sum(abs(d) for d in diffs) / 10)
    assert metrics["logprob_ratio/max"] == pytest.approx(math.exp(max(-d for d in diffs)))
    assert metrics["mismatch_tokens"] == 10


def test_step_metrics_without_token_stats_keep_their_keys(trace_dir: str) -> None:
    """Called as before, step_metrics adds no mismatch keys."""
    run = _run(trace_dir)
    assert "logprob_mismatch" not in tracer.step_metrics(tracer.read_trajectories(run))[(1, False)]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, ValueError, "at least one array"),
        ((0,), {"old_logprobs": np.zeros((2, 3))}, ValueError, "2 dimensions"),
        ((0,), {"old_logprobs": "abc"}, TypeError, "sequence of numbers"),
        (("0",), {"old_logprobs": [0.0]}, TypeError, "0-based index"),
        ((0,), {"turn": [0.0]}, TypeError, "turn"),
    ],
)
def test_bad_arguments_get_a_clear_error(args: tuple, kwargs: dict, error: type, match: str) -> None:
    """Wrong arrays or turn raise an error that names what was wrong, even with tracing off."""
    with pytest.raises(error, match=match):
        tracer.log_token_stats(*args, **kwargs)


def test_outside_a_trajectory_without_keys_says_how_to_name_one(trace_dir: str) -> None:
    """Called outside any block with no step/sample_index, the error says what to pass."""
    tracer.init(project_name="p", experiment_name="e", backend="arrow", output_dir=trace_dir)
    with pytest.raises(ValueError, match="sample_index="):
        tracer.log_token_stats(0, old_logprobs=[0.0])


def test_tracing_off_records_nothing(trace_dir: str) -> None:
    """With tracing off, log_token_stats returns and writes nothing."""
    tracer.log_token_stats(0, step=1, sample_index=0, old_logprobs=[0.0])
    assert not os.path.exists(trace_dir)


token_rows = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.lists(
            st.tuples(st.floats(-20, 0), st.floats(-20, 0), st.booleans()),
            min_size=0,
            max_size=20,
        ),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(token_rows)
def test_mismatch_matches_a_direct_computation(rows: list) -> None:
    """For any per-token logprobs and masks, the per-step figures equal a direct numpy computation."""
    table = pa.table(
        {
            "step": pa.array([s for s, _ in rows], pa.int64()),
            "validate": pa.array([False] * len(rows)),
            "old_logprobs": [[a for a, _, _ in toks] for _, toks in rows],
            "rollout_logprobs": [[b for _, b, _ in toks] for _, toks in rows],
            "loss_mask": [[float(m) for _, _, m in toks] for _, toks in rows],
        }
    )
    got = token_stat_metrics(table)
    for step in {s for s, _ in rows}:
        toks = [t for s, ts in rows if s == step for t in ts if t[2]]
        if not toks:
            assert (step, False) not in got
            continue
        old = np.array([a for a, _, _ in toks])
        new = np.array([b for _, b, _ in toks])
        assert got[(step, False)]["logprob_mismatch"] == pytest.approx(np.abs(new - old).mean())
        assert got[(step, False)]["logprob_ratio/max"] == pytest.approx(np.exp((old - new).max()))
        assert got[(step, False)]["mismatch_tokens"] == len(toks)

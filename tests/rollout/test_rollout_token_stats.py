"""The demo records per-token trainer stats, labelled synthetic, that the mismatch figures read."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest

import tracer
from rollout.runner import SYNTHETIC_SOURCE
from tracer.cli import main as rollout_trace_main

pytestmark = pytest.mark.slow  # runs the scripted demo once


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_cache: str) -> str:  # noqa: F811
    out = tmp_path_factory.mktemp("demo_stats")
    argv = [
        "demo", "--steps", "2", "--batch", "2", "--n", "2", "--val-every", "0", "--out", str(out),
        "--experiment", "e1", "--cache", tokenizer_cache, "--scripted-latency", "0", "--seed", "1",
    ]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert rollout_trace_main(argv) == 0
    return str(out / "rollout-demo" / "e1")


def test_every_model_turn_gets_synthetic_trainer_stats(demo_dir: str) -> None:
    """Each rollout's model turns carry old_logprobs, entropy and loss_mask, as long as the turn, labelled synthetic."""
    stats = tracer.read_token_stats(demo_dir).to_pylist()
    trajectories = tracer.read_trajectories(demo_dir)
    assert {r["trace_id"] for r in stats} == set(trajectories.column("trace_id").to_pylist())
    for r in stats:
        assert r["source"] == SYNTHETIC_SOURCE
        assert len(r["old_logprobs"]) == len(r["rollout_logprobs"]) == len(r["loss_mask"]) == len(r["entropy"])


def test_the_demo_has_a_logprob_mismatch_per_step(demo_dir: str) -> None:
    """step_metrics over the demo's stats gives a small, positive mismatch for every step."""
    metrics: dict[Any, dict[str, float]] = tracer.step_metrics(
        tracer.read_trajectories(demo_dir), tracer.read_token_stats(demo_dir)
    )
    assert set(metrics) == {(1, False), (2, False)}
    for m in metrics.values():
        assert 0 < m["logprob_mismatch"] < 1
        assert m["mismatch_tokens"] > 0

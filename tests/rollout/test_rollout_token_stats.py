"""The demo records per-token trainer stats, labelled synthetic, that the mismatch figures read."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest

import tracer
from rollout.trainer_stats import SYNTHETIC_SOURCE
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


def test_a_second_forward_pass_gives_the_trainer_stats(
    tmp_path: Any, tiny_qwen3_dir: Any, tokenizer_cache: str
) -> None:
    """--trainer-dtype float32 against a bfloat16 rollout: real logprobs and entropies of each model token."""
    import math

    argv = ["demo", "--engine", "hf", "--model", str(tiny_qwen3_dir), "--dtype", "bfloat16", "--trainer-dtype"]
    argv += ["float32", "--steps", "1", "--batch", "1", "--n", "2", "--max-new-tokens", "6", "--max-turns", "2"]
    argv += ["--out", str(tmp_path), "--experiment", "e", "--cache", tokenizer_cache, "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert rollout_trace_main(argv) == 0
    run = str(tmp_path / "rollout-demo" / "e")
    stats = tracer.read_token_stats(run).to_pylist()
    assert len(stats) >= 2
    vocab = math.log(151_936)
    diffs = []
    for r in stats:
        assert r["source"] == "trainer: float32 forward pass of the same weights (rollout: bfloat16 generate)"
        assert len(r["old_logprobs"]) == len(r["rollout_logprobs"]) == len(r["entropy"]) == len(r["loss_mask"])
        assert all(lp <= 0 for lp in r["old_logprobs"])
        assert all(0 < h <= vocab + 1e-3 for h in r["entropy"])
        diffs += [abs(a - b) for a, b in zip(r["old_logprobs"], r["rollout_logprobs"], strict=True)]
    # The same weights in two precisions: close, and not bit-equal.
    assert 0 < sum(diffs) / len(diffs) < 0.5


def test_the_trainer_dtype_needs_the_hf_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert rollout_trace_main(["demo", "--trainer-dtype", "float32"]) == 2
    assert "--trainer-dtype applies to --engine hf only" in capsys.readouterr().err

"""The committed sample run (sample_data/sample/qwen2.5-coder-0.5b-instruct) is what sample_data/README.md says."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tracer

RUN = Path(__file__).resolve().parents[2] / "sample_data" / "sample" / "qwen2.5-coder-0.5b-instruct"

pytestmark = pytest.mark.skipif(not RUN.is_dir(), reason=f"{RUN} is not in this checkout")


def test_sample_run_is_small() -> None:
    """The sample run stays under 12 MB."""
    assert sum(f.stat().st_size for f in RUN.rglob("*") if f.is_file()) < 12 * 1024 * 1024


def test_sample_run_has_three_steps_of_groups_of_four_with_rewards() -> None:
    """At least 3 steps, each problem's group has at least 4 rollouts, every trajectory has a reward."""
    rows = tracer.read_trajectories(str(RUN)).to_pylist()
    assert len({r["step"] for r in rows}) >= 3
    groups = Counter((r["step"], r["sample_index"]) for r in rows)
    assert min(groups.values()) >= 4
    assert all(r["reward"] is not None and "advantage" in json.loads(r["reward_info"]) for r in rows)


def test_sample_run_comes_from_a_real_model_with_tool_calls_and_text() -> None:
    """llm spans carry decoded text and real logprobs (the scripted engine has none), and tools were called."""
    spans = tracer.read_spans(str(RUN)).to_pylist()
    llm = [s for s in spans if s["kind"] == "llm"]
    assert llm
    for s in llm:
        out = json.loads(s["outputs"])
        assert (
            isinstance(out["response_text"], str)
            and out["logprobs"]
            and len(out["logprobs"]) == len(out["response_ids"])
        )
        assert "prompt_text" in json.loads(s["inputs"])
    assert any(s["kind"] == "tool" for s in spans)
    meta = tracer.read_file_metadata(tracer.list_trace_files(str(RUN))[0])
    assert "qwen2.5-coder-0.5b-instruct" in json.dumps(meta).lower()


def test_sample_run_rewards_vary_within_groups() -> None:
    """Some rollouts succeed and some fail in the same group, so GRPO advantages are not all zero."""
    rows = tracer.read_trajectories(str(RUN)).to_pylist()
    rewards: dict[tuple[int, str], set[float]] = {}
    for r in rows:
        rewards.setdefault((r["step"], r["sample_index"]), set()).add(r["reward"])
    assert any(len(v) > 1 for v in rewards.values())
    assert any(json.loads(r["reward_info"])["advantage"] != 0.0 for r in rows)


def test_sample_run_trainer_stats_come_from_a_float32_forward_pass() -> None:
    """Every model turn has the trainer's stats from a second forward pass, none synthetic, close to the rollout's."""
    stats = tracer.read_token_stats(str(RUN)).to_pylist()
    assert len(stats) == 48
    assert {r["source"] for r in stats} == {
        "trainer: float32 forward pass of the same weights (rollout: bfloat16 generate)"
    }
    diffs = [abs(a - b) for r in stats for a, b in zip(r["old_logprobs"], r["rollout_logprobs"], strict=True)]
    assert len(diffs) == 1408
    assert 0 < sum(diffs) / len(diffs) < 0.05

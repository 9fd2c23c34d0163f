"""examples/trl_grpo.py runs as a user runs it, records its GRPO steps, and the viewer opens the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("streamlit")

from apptest_fixtures import frame_with, open_app  # noqa: E402

import tracer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def test_trl_grpo_example_records_two_steps_the_viewer_shows(
    tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python examples/trl_grpo.py --output-dir DIR: 2 steps x 8 completions with varying rewards, shown by the viewer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(tracer.ENV_TRACE_DIR, None)
    args = [sys.executable, str(ROOT / "examples" / "trl_grpo.py"), "--output-dir", str(tmp_path)]
    proc = subprocess.run([*args, "--model", str(tiny_qwen3_dir)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "traces" / "trl_grpo" / "run-1"
    assert f"rollout-trace view {run_dir}" in proc.stdout
    rows = tracer.read_trajectories(str(run_dir)).to_pylist()
    assert sorted((r["step"], int(r["sample_index"]), r["rollout_n"]) for r in rows) == [
        (s, g, n) for s in (1, 2) for g in range(2) for n in range(4)
    ]
    assert len({r["reward"] for r in rows}) > 1 and all(r["num_llm_calls"] == 1 for r in rows)
    monkeypatch.setenv("ROLLOUT_TRACE_VIEW_ALLOW", str(tmp_path))  # as rollout-trace view DIR allows it
    steps = frame_with(open_app(str(run_dir)), "reward/mean")
    assert list(steps["step"]) == [1, 2] and list(steps["trajectories"]) == [8, 8]
    listed = frame_with(open_app(str(run_dir), step="1"), "advantage")
    advantages = {r["trace_id"]: json.loads(r["reward_info"])["advantage"] for r in rows}
    assert len(listed) == 8 and all(
        a == pytest.approx(advantages[t]) for t, a in zip(listed["trace_id"], listed["advantage"])
    )

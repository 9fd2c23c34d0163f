"""The examples in examples/ run as a user runs them, record what they say, and the README shows their code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME`` from ``cwd``, importing this tree's tracer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(tracer.ENV_TRACE_DIR, None)
    env.pop(tracer.config.ENV_STRICT, None)  # as a user runs it
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def readme_recording_snippet() -> str:
    """The first python block of the README's "Recording" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Recording\n", 1)[1]
    match = re.search(r"```python\n(.*?)```\n", section, re.DOTALL)
    assert match, "the README's Recording section has no python block"
    return match.group(1)


def test_readme_recording_snippet_is_an_excerpt_of_the_quickstart_example() -> None:
    """Each line of the README's recording code is in examples/quickstart.py, in order (``...`` marks a cut)."""
    example = (EXAMPLES / "quickstart.py").read_text(encoding="utf-8").splitlines()
    at = 0
    for line in readme_recording_snippet().splitlines():
        if not line.strip() or line.strip() == "...":
            continue
        assert line in example[at:], f"not in examples/quickstart.py after line {at}: {line!r}"
        at = example.index(line, at) + 1


def test_quickstart_records_three_steps_of_four_rollouts_with_rewards(tmp_path: Path) -> None:
    """python examples/quickstart.py exits 0 and leaves 12 trajectories, each with a tool call, a reward and its advantage."""
    proc = run_example("quickstart.py", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    run_dir = tmp_path / "rollout_traces" / "quickstart" / "run-1"
    assert f"to {os.path.join('.', 'rollout_traces', 'quickstart', 'run-1')}" in proc.stdout
    rows = tracer.read_trajectories(str(run_dir)).to_pylist()
    assert len(rows) == 12
    assert sorted((r["step"], r["rollout_n"]) for r in rows) == [(s, n) for s in (1, 2, 3) for n in range(4)]
    assert {r["status"] for r in rows} == {"ok"}
    assert all(r["num_tool_calls"] == 1 and r["num_llm_calls"] == 2 for r in rows)
    for step in (1, 2, 3):
        group = [r for r in rows if r["step"] == step]
        mean = sum(r["reward"] for r in group) / 4
        for r in group:
            assert json.loads(r["reward_info"])["advantage"] == pytest.approx(r["reward"] - mean)
    spans = tracer.read_spans(str(run_dir), trace_ids=[rows[0]["trace_id"]])
    messages = tracer.trajectory_messages(spans)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def test_verl_style_example_records_generate_and_execute_with_token_text(tmp_path: Path) -> None:
    """examples/verl_agent_loop.py: bare @rollout_trace_op gives llm/tool spans; token ids are decoded by self.tokenizer."""
    proc = run_example("verl_agent_loop.py", tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = str(tmp_path / "rollout_traces" / "verl-style" / "run-1")
    rows = tracer.read_trajectories(run_dir).to_pylist()
    assert len(rows) == 8
    assert {r["name"] for r in rows} == {"agent_loop"}
    assert {r["reward"] for r in rows} == {1.0}
    spans = tracer.read_spans(run_dir).to_pylist()
    llm = [s for s in spans if s["kind"] == "llm"]
    tools = [s for s in spans if s["kind"] == "tool"]
    assert {s["name"] for s in llm} == {"ServerManager.generate"}
    assert {s["name"] for s in tools} == {"AddTool.execute"}
    assert len(llm) == 16 and len(tools) == 8
    outputs = [json.loads(s["outputs"]) for s in llm]
    # Under the verl drop-in the decoded reply is where verl puts it: outputs["response_text"].
    assert {o["response_text"] for o in outputs} == {"<tool_call>add 17 25</tool_call>", "The answer is 42."}
    inputs = json.loads(llm[0]["inputs"])
    assert inputs["prompt_text"].startswith("What is 17 + 25?")
    assert json.loads(tools[0]["inputs"])["parameters"] == {"a": 17, "b": 25}

"""The scripted engine end to end through `rollout-trace demo`, read back with tracer's readers."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tracer
from tracer.cli import main as rollout_trace_main

pytestmark = pytest.mark.slow  # the module runs the whole demo once (~10 s on 2 cores)

STEPS, BATCH, N, VAL_EVERY, VAL_SIZE = 2, 3, 4, 2, 3


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, tokenizer_cache: str) -> dict[str, Any]:  # noqa: F811
    """Run the demo once (scripted engine) and read back what it recorded."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("demo")
    buf = io.StringIO()
    argv = [
        "demo", "--steps", str(STEPS), "--batch", str(BATCH), "--n", str(N), "--val-every", str(VAL_EVERY),
        "--val-size", str(VAL_SIZE), "--out", str(out), "--experiment", "e1", "--cache", tokenizer_cache,
        "--scripted-latency", "0", "--seed", "3",
    ]  # fmt: skip
    with contextlib.redirect_stdout(buf):
        rc = rollout_trace_main(argv)
    run_dir = out / "rollout-demo" / "e1"
    return {
        "rc": rc,
        "stdout": buf.getvalue(),
        "run_dir": run_dir,
        "trajectories": tracer.read_trajectories(str(run_dir)),
        "spans": tracer.read_spans(str(run_dir)),
    }


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def _json(text: str | None) -> Any:
    return json.loads(text) if text else None


def test_demo_exits_zero_and_says_how_to_view_and_export(demo_run: dict[str, Any]) -> None:
    """The command succeeds and prints the view and export commands for its run directory."""
    assert demo_run["rc"] == 0
    out = demo_run["stdout"]
    assert f"rollout-trace view {demo_run['run_dir']}" in out
    assert f"rollout-trace export {demo_run['run_dir']} --to mlflow" in out
    assert "scripted policy" in out


def test_demo_records_every_rollout_and_validation_pass(demo_run: dict[str, Any]) -> None:
    """steps x batch x n training trajectories plus one greedy rollout per held-out problem per pass."""
    rows = _rows(demo_run["trajectories"])
    train = [r for r in rows if not r["validate"]]
    val = [r for r in rows if r["validate"]]
    assert len(train) == STEPS * BATCH * N
    assert len(val) == (STEPS // VAL_EVERY) * VAL_SIZE
    assert {r["rollout_n"] for r in val} == {0}
    assert {r["status"] for r in rows} == {"ok"}
    groups = defaultdict(list)
    for r in train:
        groups[(r["step"], r["sample_index"])].append(r["rollout_n"])
    assert len(groups) == STEPS * BATCH
    assert all(sorted(v) == list(range(N)) for v in groups.values())


def test_every_trajectory_has_a_reward_and_its_group_advantage(demo_run: dict[str, Any]) -> None:
    """Rewards are 0/1 with the ground truth; advantages are reward minus the group mean."""
    rows = _rows(demo_run["trajectories"])
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        assert r["reward"] in (0.0, 1.0)
        info = _json(r["reward_info"])
        assert set(info) >= {"advantage", "ground_truth", "answer"}
        groups[(r["step"], r["sample_index"], r["validate"])].append(r)
    for members in groups.values():
        mean = sum(m["reward"] for m in members) / len(members)
        for m in members:
            assert _json(m["reward_info"])["advantage"] == pytest.approx(m["reward"] - mean)


def test_span_tree_is_root_rollout_with_llm_tool_and_reward_children(demo_run: dict[str, Any]) -> None:
    """Each trajectory has one kind=rollout root; every other span hangs directly off it."""
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in _rows(demo_run["spans"]):
        by_trace[s["trace_id"]].append(s)
    assert len(by_trace) == demo_run["trajectories"].num_rows
    for spans in by_trace.values():
        roots = [s for s in spans if s["parent_span_id"] is None]
        assert len(roots) == 1 and roots[0]["kind"] == "rollout" and roots[0]["name"] == "agent_loop"
        root_id = roots[0]["span_id"]
        children = [s for s in spans if s is not roots[0]]
        assert all(s["parent_span_id"] == root_id for s in children)
        kinds = [s["kind"] for s in children]
        assert kinds.count("reward") == 1 and kinds.count("llm") >= 1
        assert {s["name"] for s in children if s["kind"] == "tool"} <= {"calculator", "python", "invalid_tool_call"}


def test_llm_spans_carry_token_ids_and_decoded_text(demo_run: dict[str, Any]) -> None:
    """token2text is on: prompt_ids/response_ids are stored with their decoded text."""
    llm = [s for s in _rows(demo_run["spans"]) if s["kind"] == "llm"]
    assert llm
    for s in llm[:20]:
        inputs, outputs = _json(s["inputs"]), _json(s["outputs"])
        assert inputs["prompt_ids"] and inputs["prompt_text"].startswith("<|im_start|>system")
        assert outputs["response_ids"] and outputs["response_text"].endswith("<|im_end|>")
        assert outputs["finish_reason"] == "stop"


def test_root_returns_the_conversation_and_the_token_view(demo_run: dict[str, Any]) -> None:
    """The root's output has OpenAI-style messages matching its tool spans, and a response mask."""
    spans = _rows(demo_run["spans"])
    roots = [s for s in spans if s["parent_span_id"] is None]
    tools_by_trace: dict[str, int] = defaultdict(int)
    for s in spans:
        if s["kind"] == "tool":
            tools_by_trace[s["trace_id"]] += 1
    for root in roots:
        out = _json(root["outputs"])
        roles = [m["role"] for m in out["messages"]]
        assert roles[:2] == ["system", "user"] and roles[2] == "assistant"
        assert roles.count("tool") == tools_by_trace[root["trace_id"]] == out["num_tool_calls"]
        assert len(out["response_ids"]) == len(out["response_mask"]) == len(out["response_logprobs"])
        assert out["response_mask"][0] == 1
        assert out["stop_reason"] in ("answer", "max_turns", "max_tokens", "length")
        tool_calls = [c for m in out["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        tool_ids = [m["tool_call_id"] for m in out["messages"] if m["role"] == "tool"]
        assert [c["id"] for c in tool_calls] == tool_ids


def test_trajectory_messages_reads_the_conversation(demo_run: dict[str, Any]) -> None:
    """tracer.trajectory_messages returns the root's messages for a recorded trajectory."""
    tid = demo_run["trajectories"]["trace_id"][0].as_py()
    messages = tracer.trajectory_messages(tracer.read_spans(str(demo_run["run_dir"]), trace_ids=[tid]))
    assert messages[1]["role"] == "user" and "?" in messages[1]["content"]


def test_scripted_policy_covers_errors_and_wrong_answers(demo_run: dict[str, Any]) -> None:
    """The run holds malformed or unknown tool calls, failing tools, wrong and right answers."""
    spans = _rows(demo_run["spans"])
    failed_tools = {s["name"] for s in spans if s["kind"] == "tool" and s["status"] == "error"}
    assert failed_tools
    rewards = set(demo_run["trajectories"]["reward"].to_pylist())
    assert rewards == {0.0, 1.0}
    for s in spans:
        if s["kind"] == "tool" and s["status"] == "error":
            assert _json(s["error"])["message"]


def test_failed_tool_is_an_observation_for_the_model(demo_run: dict[str, Any]) -> None:
    """A tool span with status error appears in the conversation as a tool message starting 'Error:'."""
    spans = _rows(demo_run["spans"])
    failed = {s["trace_id"] for s in spans if s["kind"] == "tool" and s["status"] == "error"}
    root = next(s for s in spans if s["parent_span_id"] is None and s["trace_id"] in failed)
    tool_msgs = [m for m in _json(root["outputs"])["messages"] if m["role"] == "tool"]
    assert any(m["content"].startswith("Error:") for m in tool_msgs)


def test_step_metrics_cover_training_and_validation(demo_run: dict[str, Any]) -> None:
    """tracer.step_metrics has a row per (step, validate) with the trajectory counts."""
    metrics = tracer.step_metrics(demo_run["trajectories"])
    assert metrics[(1, False)]["trajectories"] == BATCH * N
    assert metrics[(2, True)]["trajectories"] == VAL_SIZE


def test_demo_without_model_for_hf_fails_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--engine hf without --model exits 2 and says which flag is missing."""
    assert rollout_trace_main(["demo", "--engine", "hf", "--out", str(tmp_path)]) == 2
    assert "--model PATH" in capsys.readouterr().err


def test_demo_no_trace_records_nothing(tmp_path: Path, tokenizer_cache: str) -> None:  # noqa: F811
    """--no-trace runs the rollouts with tracing off and writes no files."""
    rc = rollout_trace_main(
        ["demo", "--steps", "1", "--batch", "1", "--n", "2", "--val-every", "0", "--out", str(tmp_path / "t"),
         "--no-trace", "--cache", tokenizer_cache, "--scripted-latency", "0"]
    )  # fmt: skip
    assert rc == 0
    assert not (tmp_path / "t").exists()


def test_few_shot_and_prefill_flags_reach_the_prompt(tmp_path: Path, tokenizer_cache: str) -> None:  # noqa: F811
    """--few-shot puts the worked example before the question; --prefill ends the first prompt."""
    rc = rollout_trace_main(
        ["demo", "--steps", "1", "--batch", "1", "--n", "1", "--val-every", "0", "--out", str(tmp_path), "--experiment", "f",
         "--cache", tokenizer_cache, "--scripted-latency", "0", "--few-shot", "--prefill", '<tool_call>\\n{"name": "', "--quiet"]
    )  # fmt: skip
    assert rc == 0
    spans = _rows(tracer.read_spans(str(tmp_path / "rollout-demo" / "f")))
    first_llm = min((s for s in spans if s["kind"] == "llm"), key=lambda s: s["start_ns"])
    prompt = _json(first_llm["inputs"])["prompt_text"]
    assert "Mia buys 12 pens" in prompt
    assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')

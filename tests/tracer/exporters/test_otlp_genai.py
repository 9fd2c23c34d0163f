"""OpenTelemetry GenAI conventions on the OTLP export, read back field by field (a decoding receiver, MLflow's OTLP endpoint)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from fault_server_fixtures import OtlpReceiver  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.exporters import export_files  # noqa: E402

MODEL = "tiny-qwen3"
TEMPERATURE = 0.7


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(prompt_ids: list[int], sampling_params: dict[str, Any], model: str) -> dict[str, Any]:
    return {"response_ids": [7, 8, 9], "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="tool", name="calculator")
def _calculator(expression: str) -> str:
    return "42"


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _loop(question: str) -> str:
    _generate([1, 2, 3, 4], {"temperature": TEMPERATURE, "top_p": 1.0}, MODEL)
    _calculator("6 * 7")
    return "42"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One step of 2 prompts x 2 rollouts, each with a reward, a format score and an advantage; one validation rollout."""
    cfg = tracer.init(project_name="genai", experiment_name="e", output_dir=str(tmp_path_factory.mktemp("genai")))
    for sample in range(2):
        for n in range(2):
            with tracer.rollout_trace_attr(step=3, sample_index=sample, rollout_n=n):
                _loop(f"q{sample}")
            tracer.log_reward(float(n), step=3, sample_index=sample, rollout_n=n, advantage=n - 0.5, format=0.25)
    with tracer.rollout_trace_attr(step=3, sample_index="v0", rollout_n=0, validate=True):
        _loop("val")
    tracer.shutdown()
    return cfg.run_dir


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def _by_kind(receiver: OtlpReceiver, kind: str) -> list[dict[str, Any]]:
    return [sp for sp in receiver.spans.values() if sp["attrs"].get("rollout_trace.kind") == kind]


def test_operations_usage_model_and_tool_call_follow_the_conventions(run: str, receiver: OtlpReceiver) -> None:
    """chat / execute_tool / invoke_agent, token usage, request model and temperature, tool name."""
    export_files(run, "otlp", endpoint=receiver.url, progress=False)
    llm, tools, roots = _by_kind(receiver, "llm"), _by_kind(receiver, "tool"), _by_kind(receiver, "rollout")
    assert len(llm) == len(tools) == len(roots) == 5
    for sp in llm:
        a = sp["attrs"]
        assert a["gen_ai.operation.name"] == "chat"
        assert (a["gen_ai.request.model"], a["gen_ai.request.temperature"]) == (MODEL, TEMPERATURE)
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (4, 3)
    for sp in tools:
        assert sp["attrs"]["gen_ai.operation.name"] == "execute_tool"
        assert sp["attrs"]["gen_ai.tool.name"] == "calculator"
    for sp in roots:
        assert sp["attrs"]["gen_ai.operation.name"] == "invoke_agent"
        assert sp["attrs"]["gen_ai.agent.name"] == "agent_loop"


def test_rl_keys_live_under_the_project_namespace(run: str, receiver: OtlpReceiver) -> None:
    """step, sample, rollout_n, validate and advantage on the root as rollout_trace.* attributes."""
    export_files(run, "otlp", endpoint=receiver.url, progress=False)
    summaries = {s[S.TRACE_ID]: s for s in tracer.read_trajectories(run).to_pylist()}
    for (tid, _), sp in receiver.spans.items():
        if sp["parent"] is not None:
            continue
        a, s = sp["attrs"], summaries[tid]
        assert (a["rollout_trace.step"], a["rollout_trace.sample_index"], a["rollout_trace.rollout_n"]) == (
            3,
            s[S.SAMPLE_INDEX],
            s[S.ROLLOUT_N],
        )
        assert a["rollout_trace.validate"] is bool(s[S.VALIDATE])
        if s[S.VALIDATE]:
            assert "rollout_trace.advantage" not in a
        else:
            assert a["rollout_trace.advantage"] == s[S.ROLLOUT_N] - 0.5


def test_rewards_are_evaluation_result_events(run: str, receiver: OtlpReceiver) -> None:
    """The reward and each reward component (not the advantage) as gen_ai.evaluation.result events on the root."""
    export_files(run, "otlp", endpoint=receiver.url, progress=False)
    summaries = {s[S.TRACE_ID]: s for s in tracer.read_trajectories(run).to_pylist()}
    for (tid, _), sp in receiver.spans.items():
        events = sp["events"]
        if sp["parent"] is not None or summaries[tid][S.REWARD] is None:
            assert events == []
            continue
        assert all(name == "gen_ai.evaluation.result" for name, _ in events)
        scores = {e["gen_ai.evaluation.name"]: e["gen_ai.evaluation.score.value"] for _, e in events}
        assert scores == {"reward": summaries[tid][S.REWARD], "format": 0.25}


def test_content_is_sent_only_when_asked(run: str, receiver: OtlpReceiver) -> None:
    """Without content: no messages, tool arguments or results, inputs or outputs; with it, all of them."""
    content_keys = {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "input.value",
        "output.value",
    }
    export_files(run, "otlp", endpoint=receiver.url, progress=False)
    assert not any(content_keys & set(sp["attrs"]) for sp in receiver.spans.values())
    export_files(run, "otlp", endpoint=receiver.url, content=True, progress=False)
    llm = _by_kind(receiver, "llm")
    assert all(json.loads(sp["attrs"]["gen_ai.output.messages"])[0]["role"] == "assistant" for sp in llm)
    assert all("6 * 7" in sp["attrs"]["gen_ai.tool.call.arguments"] for sp in _by_kind(receiver, "tool"))


@pytest.mark.slow
def test_mlflow_otlp_endpoint_types_the_spans_and_keeps_the_genai_attributes(run: str, tmp_path: Path) -> None:
    """MLflow's /v1/traces: llm spans come out CHAT_MODEL, tools TOOL, roots AGENT, with the gen_ai attributes."""
    pytest.importorskip("mlflow")
    from server_fixtures import MlflowServer

    with MlflowServer(tmp_path) as server:
        import mlflow

        mlflow.set_tracking_uri(server.uri)
        exp = mlflow.set_experiment("genai").experiment_id
        report = export_files(
            run, "otlp", endpoint=server.uri, headers=f"x-mlflow-experiment-id={exp}", content=True, progress=False
        )
        assert report.complete and report.trajectories_sent == 5
        traces = mlflow.search_traces(locations=[exp], return_type="list", max_results=100)
    assert len(traces) == 5
    types = {"llm": "CHAT_MODEL", "tool": "TOOL", "rollout": "AGENT"}
    for trace in traces:
        spans = trace.data.spans
        assert len(spans) == 3
        for span in spans:
            attrs = span.attributes
            assert span.span_type == types[attrs["rollout_trace.kind"]], (span.name, span.span_type)
            if attrs["rollout_trace.kind"] == "llm":
                assert attrs["gen_ai.request.model"] == MODEL
                assert attrs["gen_ai.usage.output_tokens"] == 3
            if attrs["rollout_trace.kind"] == "tool":
                assert attrs["gen_ai.tool.name"] == "calculator"


def test_tool_spans_carry_the_call_id_the_conversation_gave(tmp_path: Path, receiver: OtlpReceiver) -> None:
    """A tool call answered in the rollout's messages: its tool span carries that call's id."""
    from export_fixtures import record_run

    export_files(record_run(tmp_path), "otlp", endpoint=receiver.url, progress=False)
    tools = _by_kind(receiver, "tool")
    assert tools and all(sp["attrs"]["gen_ai.tool.call.id"] == "call_0" for sp in tools)

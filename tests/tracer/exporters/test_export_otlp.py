"""OTLP export against real receivers on 127.0.0.1: a minimal OTLP/HTTP receiver and MLflow's OTLP endpoint."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from otlp_fixtures import record_tool_run, recorded_spans  # noqa: E402
from server_fixtures import MlflowServer  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.cli import main as rollout_trace_main  # noqa: E402
from tracer.exporters import export_files  # noqa: E402


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class Receiver:
    """An OTLP/HTTP receiver: keeps the last version of every span by (trace id, span id)."""

    def __init__(self) -> None:
        self.spans: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                receiver.requests += 1
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                for rs in req.resource_spans:
                    resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            receiver.spans[(sp.trace_id.hex(), sp.span_id.hex())] = {
                                "name": sp.name,
                                "parent": sp.parent_span_id.hex() or None,
                                "start": sp.start_time_unix_nano,
                                "end": sp.end_time_unix_nano,
                                "status": sp.status.code,
                                "attrs": {kv.key: _value(kv.value) for kv in sp.attributes},
                                "resource": resource,
                            }
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver on a free port of 127.0.0.1."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def otlp_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A run of two steps: multi-turn tool trajectories, a tool error, rewards logged after the group."""
    return record_tool_run(tmp_path_factory.mktemp("otlp-run"), "otlp", steps=(1, 2))


def test_every_span_arrives_with_its_ids_and_times(otlp_run: str, receiver: Receiver) -> None:
    """Each recorded span arrives once, with its trace id, span id, parent and times."""
    report = export_files(otlp_run, "otlp", endpoint=receiver.url, progress=False)
    files = recorded_spans(otlp_run)
    assert set(receiver.spans) == set(files)
    assert report.trajectories_sent == tracer.read_trajectories(otlp_run).num_rows
    for key, got in receiver.spans.items():
        r = files[key]
        assert (got["parent"], got["start"], got["end"], got["name"]) == (
            r[S.PARENT_SPAN_ID],
            r[S.START_NS],
            r[S.END_NS],
            r[S.NAME],
        )
        assert got["resource"]["service.name"] == "rollout-trace"
        assert got["resource"]["rollout_trace.project"] == "otlp"


def test_root_carries_the_trajectory(otlp_run: str, receiver: Receiver) -> None:
    """The root span has step, sample, rollout, validate, reward and status, and invoke_agent."""
    export_files(otlp_run, "otlp", endpoint=receiver.url, progress=False)
    summaries = {s["trace_id"]: s for s in tracer.read_trajectories(otlp_run).to_pylist()}
    roots = {tid: sp for (tid, _), sp in receiver.spans.items() if sp["parent"] is None}
    assert set(roots) == set(summaries)
    for tid, root in roots.items():
        a, s = root["attrs"], summaries[tid]
        assert a["gen_ai.operation.name"] == "invoke_agent"
        assert a["gen_ai.conversation.id"] == tid
        assert (a["rollout_trace.step"], a["rollout_trace.sample_index"], a["rollout_trace.rollout_n"]) == (
            s["step"],
            s["sample_index"],
            s["rollout_n"],
        )
        assert a["rollout_trace.validate"] is False
        assert a["rollout_trace.reward"] == s["reward"]
        assert a["rollout_trace.status"] == s["status"]


def test_llm_and_tool_spans_follow_the_genai_conventions(otlp_run: str, receiver: Receiver) -> None:
    """With content: llm spans are chat with messages and token usage; tool spans execute_tool with name, arguments, result."""
    export_files(otlp_run, "otlp", endpoint=receiver.url, content=True, progress=False)
    llm = [sp for sp in receiver.spans.values() if sp["attrs"].get("rollout_trace.kind") == "llm"]
    tools = [sp for sp in receiver.spans.values() if sp["attrs"].get("rollout_trace.kind") == "tool"]
    assert llm and tools
    for sp in llm:
        a = sp["attrs"]
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.usage.output_tokens"] == 2
        assert a["gen_ai.usage.input_tokens"] in (3, 5)
        assert a["gen_ai.response.finish_reasons"] == ["stop"]
        out = json.loads(a["gen_ai.output.messages"])
        assert out[0]["role"] == "assistant"
        json.loads(a["gen_ai.input.messages"])
    failed = [sp for sp in tools if sp["status"] == 2]  # STATUS_CODE_ERROR
    assert failed and len(failed) < len(tools)
    for sp in tools:
        a = sp["attrs"]
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"].endswith("calculator")
        assert "expression" in a["gen_ai.tool.call.arguments"]
    assert all("division by zero" in sp["attrs"]["gen_ai.tool.call.result"] for sp in failed)


def test_reexport_is_idempotent(otlp_run: str, receiver: Receiver) -> None:
    """Exporting twice sends the same ids: an upserting receiver holds each span once, unchanged."""
    export_files(otlp_run, "otlp", endpoint=receiver.url, progress=False)
    first = dict(receiver.spans)
    export_files(otlp_run, "otlp", endpoint=receiver.url, progress=False)
    assert receiver.spans == first


def test_cli_endpoint_and_headers(otlp_run: str, receiver: Receiver, capsys: pytest.CaptureFixture[str]) -> None:
    """rollout-trace export RUN --to otlp --endpoint URL --headers k=v posts there with the headers."""
    argv = ["export", otlp_run, "--to", "otlp", "--endpoint", receiver.url, "--headers", "x-team=rl", "--no-progress"]
    assert rollout_trace_main(argv) == 0
    assert receiver.headers and all(h.get("x-team") == "rl" for h in receiver.headers)
    assert "otlp: sent 8 trajectories" in capsys.readouterr().out


def test_unreachable_receiver_is_reported(otlp_run: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A receiver that is not there: exit 2 (environment) naming the URL."""
    r = Receiver()
    url = r.url
    r.close()
    assert rollout_trace_main(["export", otlp_run, "--to", "otlp", "--endpoint", url, "--no-progress"]) == 2
    assert f"cannot reach the OTLP receiver at {url}/v1/traces" in capsys.readouterr().err


def test_bad_endpoint_names_the_fix(otlp_run: str) -> None:
    """An endpoint that is not an http(s) URL says what to give."""
    with pytest.raises(ValueError, match="not an http"):
        export_files(otlp_run, "otlp", endpoint="127.0.0.1:4318", progress=False)


def test_live_backend_sends_as_the_run_goes(tmp_path: Path, receiver: Receiver) -> None:
    """backend="otlp" posts each finished trajectory while recording; shutdown sends the rest."""
    cfg = tracer.init(
        project_name="live",
        experiment_name="e",
        output_dir=str(tmp_path),
        backend="otlp",
        backend_options={"otlp": {"endpoint": receiver.url}},
    )

    @tracer.rollout_trace_op(kind="llm")
    def generate(prompt_ids: list[int]) -> dict[str, Any]:
        return {"response_ids": [5], "finish_reason": "stop"}

    for n in range(3):
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=n):
            generate([1])
        tracer.log_reward(1.0, step=1, sample_index=0, rollout_n=n)
    tracer.shutdown()
    assert set(receiver.spans) == set(recorded_spans(cfg.run_dir))


# -- MLflow's OTLP endpoint ------------------------------------------------------------


@pytest.mark.slow
def test_mlflow_otlp_endpoint_receives_each_trajectory_once(otlp_run: str, tmp_path: Path) -> None:
    """MLflow's /v1/traces stores one trace per trajectory; re-exporting upserts (no duplicates)."""
    pytest.importorskip("mlflow")
    with MlflowServer(tmp_path) as server:
        import mlflow

        url = server.uri
        mlflow.set_tracking_uri(url)
        exp = mlflow.set_experiment("otlp-test").experiment_id
        for _ in range(2):
            export_files(otlp_run, "otlp", endpoint=url, headers=f"x-mlflow-experiment-id={exp}", progress=False)
        traces = mlflow.search_traces(locations=[exp], return_type="list", max_results=1000)
        want = {s["trace_id"] for s in tracer.read_trajectories(otlp_run).to_pylist()}
        assert len(traces) == len(want)
        spans = sum(len(t.data.spans) for t in traces)
        assert spans == len(recorded_spans(otlp_run))

"""MLflow exporter against a real SQLite tracking store: traces, tags, run link, metrics, round trip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from export_mlflow_fixtures import (  # noqa: E402
    EXPERIMENT,
    PROJECT,
    comparable_spans,
    empty_store,
    mlflow_traces,
    record_late_reward,
    record_run,
    trajectory_count,
)
from server_fixtures import free_port  # noqa: E402

import tracer  # noqa: E402
from tracer.exporters import mlflow as mlflow_export  # noqa: E402

pytestmark = pytest.mark.usefixtures("in_tmp_dir")  # MLflow's ./mlruns lands in each test's temp folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A recorded run: 2 steps, 2 prompts x 4 rollouts, one validation rollout per step."""
    path = record_run(tmp_path_factory.mktemp("traces"))
    tracer.shutdown()
    return path


@pytest.fixture(scope="module")
def exported(run_dir: str, store_template: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The run exported once into a fresh SQLite store: (tracking URI, report)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(store_template, path)
    uri = f"sqlite:///{path}"
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    return uri, report


@pytest.fixture(scope="module")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An empty MLflow SQLite store, made once and copied by the tests that need a fresh one."""
    return empty_store(tmp_path_factory.mktemp("template") / "mlflow.db")


@pytest.fixture
def fresh_store(store_template: str, tmp_path: Path) -> str:
    """Tracking URI of a fresh, empty SQLite store of this test's own."""
    shutil.copyfile(store_template, tmp_path / "mlflow.db")
    return "sqlite:///" + str(tmp_path / "mlflow.db")


def _by_tags(uri: str, **tags: str) -> Any:
    flt = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    (trace,) = mlflow_traces(uri, filter_string=flt)
    return trace


def _file_spans(run_dir: str, trace_id: str) -> dict[str, dict[str, Any]]:
    return {r["span_id"]: r for r in tracer.read_spans(run_dir, trace_ids=trace_id).to_pylist()}


def test_export_writes_one_trace_per_trajectory(exported: tuple[str, Any]) -> None:
    """Every trajectory of the files becomes exactly one MLflow trace."""
    uri, report = exported
    assert report.trajectories_sent == trajectory_count()
    assert len(mlflow_traces(uri)) == trajectory_count()


def test_report_counts_spans_sent(exported: tuple[str, Any], run_dir: str) -> None:
    """The report counts every span of the files as sent."""
    _, report = exported
    assert report.spans_sent == tracer.read_spans(run_dir).num_rows
    assert report.trajectories_skipped == 0


def test_reexport_creates_no_duplicates(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """Exporting the same files twice leaves one trace per trajectory and reports the rest skipped."""
    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    again = mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    assert again.trajectories_sent == 0
    assert again.trajectories_skipped == trajectory_count()
    assert len(mlflow_traces(uri)) == trajectory_count()


def test_span_types_follow_span_kinds(exported: tuple[str, Any]) -> None:
    """Rollout spans are AGENT, llm spans CHAT_MODEL, tool spans TOOL, rewards EVALUATOR."""
    trace = _by_tags(exported[0], step="1", sample_index="0", rollout_n="0")
    types = {(s.name, s.span_type) for s in trace.data.spans}
    assert types == {
        ("agent_loop", "AGENT"),
        ("generate", "CHAT_MODEL"),
        ("calculator", "TOOL"),
        ("log_reward", "EVALUATOR"),
    }


def test_spans_keep_original_times_and_tree(exported: tuple[str, Any], run_dir: str) -> None:
    """Each MLflow span has the recorded start and end times and the recorded parent."""
    trace = _by_tags(exported[0], step="2", sample_index="1", rollout_n="2")
    rows = _file_spans(run_dir, trace.info.tags["rollout_trace.trace_id"])
    assert {s.span_id for s in trace.data.spans} == set(rows)
    for span in trace.data.spans:
        row = rows[span.span_id]
        assert (span.start_time_ns, span.end_time_ns, span.parent_id) == (
            row["start_ns"],
            row["end_ns"],
            row["parent_span_id"],
        )


def test_failed_tool_span_is_error_with_exception_event_at_its_time(exported: tuple[str, Any], run_dir: str) -> None:
    """A tool that raised is an ERROR span with an exception event stamped at the original failure time."""
    trace = _by_tags(exported[0], step="1", sample_index="1", rollout_n="1")
    (tool,) = [s for s in trace.data.spans if s.span_type == "TOOL"]
    assert tool.status.status_code.value == "ERROR"
    (event,) = tool.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ZeroDivisionError"
    assert event.timestamp == tool.end_time_ns


def test_trace_tags_name_the_trajectory_and_reward(exported: tuple[str, Any]) -> None:
    """Trace tags hold step, sample_index, rollout_n, validate, experiment_name, reward and its extras."""
    trace = _by_tags(exported[0], step="2", sample_index="0", rollout_n="1")
    tags = trace.info.tags
    assert (tags["validate"], tags["experiment_name"]) == ("False", EXPERIMENT)
    assert float(tags["reward"]) == 1.0
    assert float(tags["reward.advantage"]) == 0.5


def test_reward_logged_outside_the_trajectory_is_tagged(exported: tuple[str, Any]) -> None:
    """A reward given with step/sample_index/rollout_n outside the trajectory context reaches its trace."""
    trace = _by_tags(exported[0], step="1", sample_index="0", rollout_n="3")
    assert float(trace.info.tags["reward"]) == 0.0


def test_validation_trajectories_are_tagged(exported: tuple[str, Any]) -> None:
    """Validation rollouts carry validate='True' (str() of the value, as verl tags it)."""
    assert len(mlflow_traces(exported[0], filter_string="tags.validate = 'True'")) == 2


def test_traces_are_linked_to_the_experiments_run(exported: tuple[str, Any]) -> None:
    """Every trace is linked to a run named after the experiment, in an MLflow experiment named after the project."""
    from mlflow.tracking import MlflowClient

    uri = exported[0]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(PROJECT)
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == EXPERIMENT
    assert len(mlflow_traces(uri, run_id=run.info.run_id)) == trajectory_count()


def test_step_metrics_are_logged_on_the_run_per_step(exported: tuple[str, Any], run_dir: str) -> None:
    """Per-step rollout metrics land on the run with step=, training under rollout/ and validation under val/."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=exported[0])
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    expected = tracer.step_metrics(tracer.read_trajectories(run_dir))
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "rollout/reward/mean")}
    assert history == pytest.approx({step: v["reward/mean"] for (step, val), v in expected.items() if not val})
    tool_errors = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "rollout/tool_error_rate")}
    assert tool_errors == pytest.approx({1: 0.25, 2: 0.25})
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/trajectories")] == [1, 2]
    assert {m.value for m in client.get_metric_history(run.info.run_id, "rollout/response_length/mean")} == {12.0}


def test_reexport_does_not_repeat_metric_points(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """Exporting twice logs each step's metric once."""
    from mlflow.tracking import MlflowClient

    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert len(client.get_metric_history(run.info.run_id, "rollout/reward/mean")) == 2
    assert len(client.get_metric_history(run.info.run_id, "rollout/response_length/mean")) == 2


def test_llm_spans_render_as_chat_with_token_usage(exported: tuple[str, Any]) -> None:
    """llm spans carry OpenAI-style messages in, a ChatCompletion out, the openai format and token usage."""
    trace = _by_tags(exported[0], step="1", sample_index="0", rollout_n="0")
    first, second = sorted((s for s in trace.data.spans if s.span_type == "CHAT_MODEL"), key=lambda s: s.start_time_ns)
    assert first.get_attribute("mlflow.message.format") == "openai"
    assert [m["role"] for m in first.inputs["messages"]] == ["system", "user"]
    assert first.outputs["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    assert [m["role"] for m in second.inputs["messages"]] == ["system", "user", "assistant", "tool"]
    assert second.get_attribute("mlflow.chat.tokenUsage") == {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}


def test_rollout_root_renders_the_conversation(exported: tuple[str, Any]) -> None:
    """The AGENT root shows the conversation: messages in, the final assistant answer out."""
    trace = _by_tags(exported[0], step="1", sample_index="0", rollout_n="0")
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert root.get_attribute("mlflow.message.format") == "openai"
    assert root.inputs["messages"][-1]["role"] == "tool"
    assert root.outputs["choices"][0]["message"]["content"] == "The answer is 0."


def test_trace_ids_are_derived_from_ours(exported: tuple[str, Any]) -> None:
    """The MLflow trace id is a function of our trace id and the experiment, so a re-send upserts."""
    traces = mlflow_traces(exported[0])
    assert len(traces) == trajectory_count()
    for trace in traces:
        assert trace.info.trace_id == mlflow_export.mlflow_trace_id(trace.info.tags["rollout_trace.trace_id"], PROJECT)


def test_same_files_into_two_experiments_of_one_store(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """Exporting the files under another experiment name fills that experiment too, leaving the first intact."""
    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, experiment="copy", verify=True, progress=False)
    assert report.verify is not None and report.verify.ok, report.details
    assert report.details[-1].startswith("verify mlflow: OK")
    assert len(mlflow_traces(uri, "copy")) == len(mlflow_traces(uri)) == trajectory_count()


def test_since_step_exports_only_later_steps(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """since_step exports steps >= it and reports the others as skipped."""
    uri = fresh_store
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, since_step=2, progress=False)
    assert report.trajectories_sent == trajectory_count() // 2
    assert report.trajectories_skipped == trajectory_count() // 2
    assert {t.info.tags["step"] for t in mlflow_traces(uri)} == {"2"}


def test_export_catches_up_after_a_partial_export(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """After exporting step 1, exporting everything sends only step 2."""
    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, steps=[1], progress=False)
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    assert (report.trajectories_sent, report.trajectories_skipped) == (trajectory_count() // 2, trajectory_count() // 2)
    assert len(mlflow_traces(uri)) == trajectory_count()


def test_verify_passes_after_export(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """verify=True reads MLflow back and reports every trajectory found with its reward."""
    report = mlflow_export.export_files(run_dir, tracking_uri=fresh_store, verify=True, progress=False)
    assert report.verify is not None and report.verify.ok, report.details
    assert report.details[-1].startswith("verify mlflow: OK")


def test_verify_reports_a_missing_trace(
    fresh_store: str, exported: tuple[str, Any], run_dir: str, tmp_path: Path
) -> None:
    """verify_export fails and counts the trajectory whose trace was deleted from MLflow."""
    from mlflow.tracking import MlflowClient

    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    client = MlflowClient(tracking_uri=uri)
    victim = mlflow_traces(uri)[0]
    client.delete_traces(victim.info.experiment_id, trace_ids=[victim.info.trace_id])
    ok, lines = mlflow_export.verify_export(run_dir, tracking_uri=uri)
    assert not ok
    assert "1 missing" in lines[0]


def test_default_tracking_uri_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit URI, MLFLOW_TRACKING_URI is used, else ./mlflow.db."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert mlflow_export.resolve_tracking_uri() == "http://127.0.0.1:5999"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert mlflow_export.resolve_tracking_uri() == "sqlite:///" + os.path.abspath("mlflow.db")


def test_round_trip_files_mlflow_files(exported: tuple[str, Any], run_dir: str, tmp_path: Path) -> None:
    """files -> MLflow -> files gives back the same rows: ids, tree, times, statuses, rewards, attributes, I/O."""
    report = mlflow_export.import_traces(exported[0], PROJECT, tmp_path / "back", progress=False)
    assert report.trajectories == trajectory_count()
    assert comparable_spans(tmp_path / "back") == comparable_spans(run_dir)


def test_round_trip_keeps_trajectory_summaries(exported: tuple[str, Any], run_dir: str, tmp_path: Path) -> None:
    """Imported files give the same read_trajectories table (rewards, advantages, counts, status)."""
    mlflow_export.import_traces(exported[0], PROJECT, tmp_path / "back", progress=False)
    assert tracer.read_trajectories(tmp_path / "back").equals(tracer.read_trajectories(run_dir))


def test_import_writes_the_original_layout_and_metadata(exported: tuple[str, Any], tmp_path: Path) -> None:
    """Imported files land in <out>/<project>/<experiment>/ with the schema version in their metadata."""
    report = mlflow_export.import_traces(exported[0], PROJECT, tmp_path / "back", progress=False)
    (file,) = report.files
    assert Path(file).parent == tmp_path / "back" / PROJECT / EXPERIMENT
    meta = tracer.read_file_metadata(file)
    assert meta["rollout_trace.schema_version"] == tracer.schema.SCHEMA_VERSION
    assert (meta["rollout_trace.project_name"], meta["rollout_trace.experiment_name"]) == (PROJECT, EXPERIMENT)


def test_import_of_an_unknown_experiment_names_the_existing_ones(exported: tuple[str, Any], tmp_path: Path) -> None:
    """Importing a missing experiment raises ValueError listing the experiments there."""
    with pytest.raises(ValueError, match=PROJECT):
        mlflow_export.import_traces(exported[0], "no-such-experiment", tmp_path, progress=False)


@pytest.mark.slow
def test_import_command_writes_trace_files(exported: tuple[str, Any], tmp_path: Path) -> None:
    """`rollout-trace import mlflow` writes files the readers load."""
    script = Path(sys.executable).with_name("rollout-trace")
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            str(script),
            "import",
            "mlflow",
            "--tracking-uri",
            exported[0],
            "--experiment",
            PROJECT,
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"imported {trajectory_count()} trajectories" in proc.stdout
    assert tracer.read_trajectories(out).num_rows == trajectory_count()


def test_import_maps_foreign_mlflow_traces(fresh_store: str, tmp_path: Path) -> None:
    """Traces made by MLflow's own API come back with kinds from span types, the tree, errors and the reward tag."""
    import mlflow
    from mlflow.entities import SpanStatusCode

    uri = fresh_store
    mlflow.set_tracking_uri(uri)
    exp_id = mlflow.create_experiment("foreign")
    root = mlflow.start_span_no_context(
        "chain", span_type="CHAIN", inputs={"q": "hi"}, experiment_id=exp_id, tags={"reward": "0.5"}
    )
    llm = mlflow.start_span_no_context(
        "chat", span_type="LLM", parent_span=root, inputs={"messages": []}, attributes={"temperature": 0.7}
    )
    llm.end(outputs={"text": "hello"})
    tool = mlflow.start_span_no_context("search", span_type="TOOL", parent_span=root, inputs={"query": "x"})
    tool.record_exception(RuntimeError("boom"))
    tool.end(status=SpanStatusCode.ERROR)
    root.end(outputs={"answer": "hello"})
    mlflow.flush_trace_async_logging()

    mlflow_export.import_traces(uri, "foreign", tmp_path / "out", progress=False)
    rows = {r["name"]: r for r in tracer.read_spans(tmp_path / "out").to_pylist()}
    assert {n: r["kind"] for n, r in rows.items()} == {
        "chain": "rollout",
        "chat": "llm",
        "search": "tool",
        "log_reward": "reward",
    }
    assert rows["chat"]["parent_span_id"] == rows["chain"]["span_id"]
    assert json.loads(rows["chat"]["attributes"]) == {"temperature": 0.7}
    assert rows["search"]["status"] == "error"
    assert json.loads(rows["search"]["error"])["message"] == "boom"
    assert tracer.read_trajectories(tmp_path / "out")["reward"].to_pylist() == [0.5]


@pytest.mark.slow
def test_public_path_round_trip(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """The public-API path (other mlflow versions) also round-trips files -> MLflow -> files."""
    uri = fresh_store
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, method="public", progress=False)
    assert "public path" in report.details[0]
    mlflow_export.import_traces(uri, PROJECT, tmp_path / "back", progress=False)
    assert comparable_spans(tmp_path / "back") == comparable_spans(run_dir)


@pytest.mark.slow
def test_public_path_reexport_creates_no_duplicates(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """The public-API path finds earlier exports by tag and skips them."""
    uri = fresh_store
    mlflow_export.export_files(run_dir, tracking_uri=uri, method="public", progress=False)
    again = mlflow_export.export_files(run_dir, tracking_uri=uri, method="public", progress=False)
    assert again.trajectories_sent == 0
    assert len(mlflow_traces(uri)) == trajectory_count()


def test_live_backend_ships_trajectories_and_metrics(fresh_store: str, tmp_path: Path) -> None:
    """backend=["arrow", "mlflow"] ships every trajectory during recording and logs step metrics by shutdown."""
    from mlflow.tracking import MlflowClient

    uri = fresh_store
    record_run(tmp_path / "traces", backend=["arrow", "mlflow"], backend_options={"mlflow": {"tracking_uri": uri}})
    assert len(mlflow_traces(uri)) == trajectory_count()
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward/mean")] == [1, 2]


def test_live_backend_finds_its_store_in_mlflow_tracking_uri(
    fresh_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backend="mlflow" alone (as verl configures it) ships to the store named by MLFLOW_TRACKING_URI."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh_store)
    run_dir = record_run(tmp_path / "traces", backend="mlflow")
    assert len(list(Path(run_dir).glob("*.arrow"))) >= 1
    assert len(mlflow_traces(fresh_store)) == trajectory_count()


def test_live_backend_then_export_sends_nothing_twice(fresh_store: str, tmp_path: Path) -> None:
    """After live shipping, exporting the files finds every trajectory already there."""
    uri = fresh_store
    run_dir = record_run(
        tmp_path / "traces", backend=["arrow", "mlflow"], backend_options={"mlflow": {"tracking_uri": uri}}
    )
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    assert (report.trajectories_sent, report.trajectories_skipped) == (0, trajectory_count())


def test_live_reward_logged_after_shipping_joins_its_trace(fresh_store: str, tmp_path: Path) -> None:
    """A reward logged after its trajectory was shipped is added to the same trace, with its tag, under the root."""
    record_late_reward(
        tmp_path / "traces", backend=["arrow", "mlflow"], backend_options={"mlflow": {"tracking_uri": fresh_store}}
    )
    (trace,) = mlflow_traces(fresh_store)
    roots = [s for s in trace.data.spans if s.parent_id is None]
    (reward,) = [s for s in trace.data.spans if s.span_type == "EVALUATOR"]
    assert [r.name for r in roots] == ["agent_loop"]
    assert reward.parent_id == roots[0].span_id
    assert (float(trace.info.tags["reward"]), float(trace.info.tags["reward.advantage"])) == (1.0, 0.25)


def test_trajectory_without_root_exports_and_imports_back(fresh_store: str, run_dir: str, tmp_path: Path) -> None:
    """A trajectory whose root span was never written gets a stand-in root in MLflow that the import drops again."""
    import pyarrow as pa

    (file,) = tracer.list_trace_files(run_dir)
    spans = tracer.read_spans(run_dir)
    trace_id = spans["trace_id"][0].as_py()
    rows = [r for r in spans.to_pylist() if r["trace_id"] == trace_id and r["parent_span_id"] is not None]
    torn = tmp_path / "torn" / PROJECT / EXPERIMENT
    torn.mkdir(parents=True)
    schema = tracer.schema.SPAN_SCHEMA.with_metadata(tracer.read_file_metadata(file))
    with pa.OSFile(str(torn / "torn.arrow"), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    mlflow_export.export_files(tmp_path / "torn", tracking_uri=fresh_store, progress=False)
    (trace,) = mlflow_traces(fresh_store)
    (root,) = [s for s in trace.data.spans if s.parent_id is None]
    assert (root.span_type, trace.info.tags["status"]) == ("AGENT", "incomplete")
    mlflow_export.import_traces(fresh_store, PROJECT, tmp_path / "back", progress=False)
    assert comparable_spans(tmp_path / "back") == comparable_spans(tmp_path / "torn")


@pytest.mark.slow
def test_backend_down_loses_nothing_and_export_catches_up(
    fresh_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MLflow unreachable the rollout completes, the files hold everything, and export_files sends it later."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run_dir = record_run(
        tmp_path / "traces", backend=["arrow", "mlflow"], backend_options={"mlflow": {"tracking_uri": down}}
    )
    assert tracer.read_trajectories(run_dir).num_rows == trajectory_count()
    uri = fresh_store
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    assert report.trajectories_sent == trajectory_count()
    assert len(mlflow_traces(uri)) == trajectory_count()

"""MLflow export and import with hostile content and a server that is down (real SQLite stores).

A trajectory MLflow refuses (a lone surrogate, ...) is skipped and named; the
others go. A foreign MLflow trace with odd tag values is imported or skipped
and named, never a crash. A tracking server that does not answer is reported
by its URI before any MLflow call (not after MLflow's minutes of retries).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from export_mlflow_fixtures import empty_store  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from server_fixtures import free_port  # noqa: E402

import tracer  # noqa: E402
from tracer.cli import main  # noqa: E402
from tracer.exporters import export_files  # noqa: E402
from tracer.exporters.mlflow import TrackingUriError, import_traces  # noqa: E402

pytestmark = pytest.mark.usefixtures("in_tmp_dir")  # MLflow's ./mlruns lands in each test's temp folder

TRAJECTORIES = 6
BAD = 2

#: Strings that have broken exporters: lone surrogates, NUL, control and format characters, a huge one.
hostile = st.one_of(
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "nul\x00mid", "\u202e\u200b", "\r\n\t", "x" * 300_000]),
    st.text(min_size=1, max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
)
FIELDS = ("input", "output", "error", "sample_index", "attribute")


@tracer.rollout_trace_op(kind="tool", name="tool")
def _tool(arg: Any, fail: str | None) -> Any:
    if fail is not None:
        raise ValueError(fail)
    return arg


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _loop(question: Any, answer: Any, fail: str | None) -> Any:
    try:
        _tool(question, fail)
    except ValueError:
        pass
    return {"answer": answer}


def _record(root: Path, field: str, value: str) -> str:
    cfg = tracer.init(
        project_name="hostile", experiment_name="e", backend="arrow", output_dir=str(root), flush_interval_s=0.2
    )
    for i in range(TRAJECTORIES):
        bad = i == BAD
        sample = value if bad and field == "sample_index" else str(i)
        extras = {"note": value} if bad and field == "attribute" else {}
        with tracer.rollout_trace_attr(sample_index=sample, step=1, rollout_n=0, **extras):
            _loop(
                value if bad and field == "input" else f"q{i}",
                value if bad and field == "output" else f"a{i}",
                value if bad and field == "error" else None,
            )
            tracer.log_reward(float(i))
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


@pytest.fixture(scope="module")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An empty MLflow SQLite store, migrated once: each example copies it (migrating one takes seconds)."""
    return empty_store(tmp_path_factory.mktemp("template") / "mlflow.db")


def _fresh_store(template: str, root: Path) -> str:
    """Tracking URI of a fresh, empty SQLite store under ``root``: a copy of ``template``."""
    shutil.copyfile(template, root / "mlflow.db")
    return f"sqlite:///{root / 'mlflow.db'}"


def _trace_count(uri: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("hostile")
    return 0 if exp is None else len(client.search_traces(locations=[exp.experiment_id], max_results=1000))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=hostile)
def test_one_hostile_trajectory_leaves_the_others_exported(
    tmp_path_factory: Any, store_template: str, field: str, value: str
) -> None:
    root = tmp_path_factory.mktemp("hostile")
    run = _record(root / "traces", field, value)
    uri = _fresh_store(store_template, root)
    report = export_files(run, "mlflow", tracking_uri=uri, progress=False)
    assert report.trajectories_refused <= 1, report.details
    assert report.trajectories_sent + report.trajectories_refused == TRAJECTORIES, report
    assert _trace_count(uri) == report.trajectories_sent
    if report.trajectories_refused:
        assert any(line.startswith("refused by mlflow, not sent: trajectory ") for line in report.details)


@pytest.mark.slow
def test_lone_surrogate_is_refused_alone_and_the_cli_exits_1(
    tmp_path: Path, store_template: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _record(tmp_path / "traces", "input", "bad \ud800 input")
    uri = _fresh_store(store_template, tmp_path)
    assert main(["export", run, "--to", "mlflow", "--tracking-uri", uri, "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert f"sent {TRAJECTORIES - 1} trajectories" in captured.out
    assert "refused by mlflow, not sent: trajectory" in captured.out
    assert _trace_count(uri) == TRAJECTORIES - 1


def _closed_port_uri() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_export_to_a_down_server_names_its_uri(tmp_path: Path) -> None:
    run = _record(tmp_path / "traces", "input", "fine")
    uri = _closed_port_uri()
    with pytest.raises(TrackingUriError, match=uri.replace(".", r"\.")):
        export_files(run, "mlflow", tracking_uri=uri, progress=False)


def test_import_from_a_down_server_names_its_uri(tmp_path: Path) -> None:
    uri = _closed_port_uri()
    with pytest.raises(TrackingUriError, match=uri.replace(".", r"\.")):
        import_traces(uri, "e", tmp_path / "out", progress=False)


def _foreign_traces(uri: str, tag_sets: list[dict[str, str]]) -> None:
    """MLflow traces made with MLflow's own API (not by rollout-trace), one per tag set."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.set_experiment("foreign")
    for tags in tag_sets:
        root = mlflow.start_span_no_context("agent", span_type="AGENT", tags=tags, experiment_id=exp.experiment_id)
        child = mlflow.start_span_no_context("llm", span_type="LLM", parent_span=root, inputs={"q": 1})
        child.end(outputs={"a": 2})
        root.end()
    mlflow.flush_trace_async_logging()


#: Tag values MLflow accepts that are not what the importer expects.
tag_value = st.one_of(
    st.sampled_from(["99999999999999999999999", "-1e400", "nan", "inf", "maybe", "", "..", "../..", "1.5", "0x10"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
)
TAG_KEYS = ("step", "sample_index", "rollout_n", "validate", "reward", "project_name", "experiment_name", "reward.x")


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tags=st.dictionaries(st.sampled_from(TAG_KEYS), tag_value, min_size=1))
def test_foreign_traces_with_odd_tags_import_without_a_crash(
    tmp_path_factory: Any, store_template: str, tags: dict[str, str]
) -> None:
    root = tmp_path_factory.mktemp("foreign")
    uri = _fresh_store(store_template, root)
    _foreign_traces(uri, [tags, {"step": "1"}])
    out = root / "out"
    report = import_traces(uri, "foreign", out, progress=False)
    assert report.trajectories + len(report.refused) == 2, report.details
    assert report.trajectories >= 1  # the ordinary trace always comes in
    for file in report.files:
        assert Path(file).resolve().is_relative_to(out.resolve()), file

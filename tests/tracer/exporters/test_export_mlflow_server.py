"""MLflow exporter against a real `mlflow server` on 127.0.0.1, started and stopped by these tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from export_mlflow_fixtures import (  # noqa: E402
    PROJECT,
    comparable_spans,
    mlflow_traces,
    record_run,
    trajectory_count,
)
from server_fixtures import MlflowServer  # noqa: E402

import tracer  # noqa: E402
from tracer.exporters import mlflow as mlflow_export  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `mlflow server` with a SQLite store in a temp folder; yields its URL."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as running:
        yield running.uri


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A recorded run: 2 steps, 2 prompts x 4 rollouts, one validation rollout per step."""
    path = record_run(tmp_path_factory.mktemp("traces"))
    tracer.shutdown()
    return path


@pytest.fixture(scope="module")
def exported(server: str, run_dir: str) -> Any:
    """The run exported once to the server."""
    return mlflow_export.export_files(run_dir, tracking_uri=server, progress=False)


def test_export_to_server_writes_one_trace_per_trajectory(server: str, exported: Any) -> None:
    """Every trajectory becomes one trace on the server, through its OTLP endpoint."""
    assert exported.trajectories_sent == trajectory_count()
    assert "fast path" in exported.details[0]
    assert len(mlflow_traces(server)) == trajectory_count()


def test_reexport_to_server_creates_no_duplicates(server: str, exported: Any, run_dir: str) -> None:
    """Exporting the same files to the server again sends nothing and duplicates nothing."""
    again = mlflow_export.export_files(run_dir, tracking_uri=server, progress=False)
    assert (again.trajectories_sent, again.trajectories_skipped) == (0, trajectory_count())
    assert len(mlflow_traces(server)) == trajectory_count()


def test_server_traces_carry_tags_and_run_link(server: str, exported: Any) -> None:
    """Traces on the server have the trajectory tags and are linked to the experiment's run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    traces = mlflow_traces(server, run_id=run.info.run_id)
    assert len(traces) == trajectory_count()
    assert {t.info.tags["step"] for t in traces} == {"1", "2"}
    assert all("reward" in t.info.tags for t in traces)


def test_server_run_has_step_metrics(server: str, exported: Any) -> None:
    """Per-step metrics are logged on the run through the server."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward/mean")] == [1, 2]


def test_round_trip_through_server(server: str, exported: Any, run_dir: str, tmp_path: Path) -> None:
    """files -> mlflow server -> files gives back the same rows."""
    mlflow_export.import_traces(server, PROJECT, tmp_path / "back", progress=False)
    assert comparable_spans(tmp_path / "back") == comparable_spans(run_dir)


def test_verify_against_server(server: str, exported: Any, run_dir: str) -> None:
    """verify_export finds every trajectory with its reward on the server."""
    ok, lines = mlflow_export.verify_export(run_dir, tracking_uri=server)
    assert ok, lines


def test_live_backend_ships_to_server(server: str, tmp_path: Path) -> None:
    """A recording with backend mlflow pointed at the server ships every trajectory (experiment from the project)."""
    run_dir = record_run(
        tmp_path / "traces",
        project_name="live-server",
        backend=["arrow", "mlflow"],
        backend_options={"mlflow": {"tracking_uri": server}},
    )
    assert len(mlflow_traces(server, "live-server")) == tracer.read_trajectories(run_dir).num_rows

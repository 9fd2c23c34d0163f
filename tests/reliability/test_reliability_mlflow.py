"""Fault injection: an MLflow server killed with SIGKILL and restarted during live export.

Its own module because starting ``mlflow server`` twice takes 20-120 s here.
Run with ``pytest -m faults`` together with the other fault tests.
"""

from __future__ import annotations

import os

import pytest
from reliability_fixtures import FIGURES

import tracer

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("figures_report")]


@pytest.fixture()
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead backend is the exporter's to count, not to raise: turn off the tests' strict mode."""
    monkeypatch.delenv(tracer.config.ENV_STRICT, raising=False)


# -- a backend killed during live export -----------------------------------------------

MLFLOW_PHASES = (("up", 30), ("down", 30), ("back", 30))  # (server state, trajectories recorded)


@pytest.mark.slow
def test_mlflow_server_killed_and_restarted_during_live_export_loses_nothing(
    lenient: None, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live MLflow export while the server is SIGKILLed and restarted: the files hold everything and export_files catches up, no duplicates."""
    mlflow_export = pytest.importorskip("tracer.exporters.mlflow", reason="MLflow exporter not in this tree yet")
    if not hasattr(mlflow_export, "MlflowSink") or "mlflow" not in tracer.available_backends():
        pytest.skip("the mlflow live backend is not registered yet")
    pytest.importorskip("mlflow")
    from faults import workers
    from server_fixtures import MlflowServer

    root = os.fspath(tmp_path)
    server = MlflowServer(root)
    server.start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        cfg = tracer.init(
            backend=["arrow", "mlflow"],
            output_dir=os.path.join(root, "traces"),
            project_name="faults-mlflow",
            experiment_name="kill",
            flush_interval_s=0.1,
        )
        for step, (state, n) in enumerate(MLFLOW_PHASES):
            if state == "down":
                server.kill()
                # MLflow's client retries a refused request for minutes; while the server is dead,
                # fail fast so the live exporter gives up and the catch-up export has work to do.
                monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            elif state == "back":
                server.start()
                monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
            for i in range(n):
                with tracer.rollout_trace_attr(sample_index=f"{state}-{i}", step=step):
                    workers.agent_loop(i)
                    tracer.log_reward(float(i % 2))
            tracer.flush()
        tracer.shutdown()
        recorded = tracer.read_trajectories(cfg.run_dir)
        total = sum(n for _, n in MLFLOW_PHASES)
        assert recorded.num_rows == total, "the local files lost trajectories"
        live = _mlflow_trace_ids(server.uri, "faults-mlflow")
        report = mlflow_export.export_files(cfg.run_dir, tracking_uri=server.uri, progress=False)
        after = _mlflow_trace_ids(server.uri, "faults-mlflow")
    finally:
        server.kill()
    assert len(after) == len(set(after)) == total, f"{len(after)} traces, {len(set(after))} distinct, want {total}"
    assert set(after) == set(recorded["trace_id"].to_pylist())
    FIGURES["mlflow server killed"] = {
        "trajectories_recorded": total,
        "server_kills": 1,
        "in_mlflow_after_live_export": len(set(live)),
        "sent_by_catch_up_export": report.trajectories_sent,
        "in_mlflow_after_catch_up": len(set(after)),
    }


def _mlflow_trace_ids(uri: str, experiment: str) -> list[str]:
    """Our trace ids (tag rollout_trace.trace_id) of every MLflow trace in ``experiment``."""
    from export_mlflow_fixtures import mlflow_traces

    ids = []
    for t in mlflow_traces(uri, experiment):
        tags = t.info.tags or {}
        ids.append(tags.get("rollout_trace.trace_id"))
    return ids

"""Catching up from the files what live exporters of ended processes had not shipped (tracer.exporters.catch_up).

Runs recorded with live MLflow export into a SQLite store that cannot be
created yet (a file stands where its folder goes), so nothing ships live; then the folder
exists and the catch-up (the Ray driver's, and ``rollout-trace export``) sends
each trajectory once to the store the recording process named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from export_mlflow_fixtures import mlflow_traces, record_run, trajectory_count
from scale_fixtures import REPO, need

import tracer
from tracer.config import DEFAULT_DRAIN_S
from tracer.exporters.catch_up import catch_up, live_backends, writers_running
from tracer.integrations.verl_plugin import HOOK, drain_plan

#: The second run's size (record_run's steps, prompts, group).
SMALL = {"steps": 1, "prompts": 1, "group": 2}


@pytest.fixture(scope="module")
def unshipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs recorded with live MLflow export into a store whose folder does not exist yet."""
    need("mlflow", "mlflow")
    work = tmp_path_factory.mktemp("catch-up")
    store = work / "later"
    store.write_text("a file where the store's folder will be: MLflow cannot create the store yet")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    runs = {}
    for experiment, size in (("by-driver", {}), ("by-export", SMALL)):
        runs[experiment] = record_run(
            work / experiment,
            experiment_name=experiment,
            backend="mlflow",
            backend_options={"mlflow": {"tracking_uri": uri}},
            shutdown_timeout_s=2.0,
            **size,
        )
    assert store.is_file()
    store.unlink()
    store.mkdir()
    return {"uri": uri, "runs": runs, "root": str(work / "by-driver")}


def test_the_catch_up_ships_each_trajectory_once_to_where_the_recorder_meant(unshipped: dict[str, Any]) -> None:
    """Every trajectory of the run reaches the store named in its recorded options; a second pass sends none."""
    run = unshipped["runs"]["by-driver"]
    assert live_backends(run) == {"mlflow": {"tracking_uri": unshipped["uri"], "method": "auto", "timeout_s": 120.0}}
    done = catch_up(unshipped["root"], since=0.0, timeout_s=DEFAULT_DRAIN_S)
    assert [c.run_dir for c in done] == [run]
    assert [(c.backend, c.sent, c.present, c.problem) for c in done] == [("mlflow", trajectory_count(), 0, "")]
    assert f"caught up {trajectory_count()} trajectories of {run} that mlflow lacked" in done[0].describe()
    ids = [t.info.tags["rollout_trace.trace_id"] for t in mlflow_traces(unshipped["uri"])]
    assert sorted(ids) == sorted(tracer.read_trajectories(run).column("trace_id").to_pylist())
    again = catch_up(unshipped["root"], since=0.0, timeout_s=DEFAULT_DRAIN_S)
    assert [(c.sent, c.present) for c in again] == [(0, trajectory_count())]


def test_export_says_how_many_it_caught_up(unshipped: dict[str, Any]) -> None:
    """rollout-trace export of a run recorded live to MLflow names what the destination lacked."""
    cli = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    run = unshipped["runs"]["by-export"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": unshipped["uri"]}
    proc = subprocess.run(
        [cli, "export", run, "--to", "mlflow", "--no-progress"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = trajectory_count(**SMALL)
    assert proc.stdout.startswith(f"mlflow: sent {n} trajectories"), proc.stdout
    assert f"caught up {n} the destination lacked" in proc.stdout, proc.stdout
    assert f"caught up {n} trajectories the destination did not have yet" in proc.stdout, proc.stdout


def test_a_run_whose_writer_still_runs_is_left_to_it(tmp_path: Path) -> None:
    """A file another live process holds open counts as running; once that process is killed it is sealed, not running."""
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        import tracer
        tracer.init(project_name="p", experiment_name="e", output_dir={str(tmp_path)!r}, flush_interval_s=0.1)
        @tracer.rollout_trace_op(kind="rollout")
        def run():
            return "done"
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
            run()
        tracer.flush()
        print("READY", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        run = str(tmp_path / "p" / "e")
        running = writers_running(run)
        assert len(running) == 1 and f"_{proc.pid}_" in os.path.basename(running[0])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert writers_running(run) == []
    assert len(tracer.read_trajectories(run)) == 1


@pytest.mark.parametrize(
    ("runtime_env", "environ", "expected"),
    [
        ({"worker_process_setup_hook": HOOK, "env_vars": {"ROLLOUT_TRACE_DIR": "/t"}}, {}, ("/t", DEFAULT_DRAIN_S)),
        ({"worker_process_setup_hook": HOOK}, {"ROLLOUT_TRACE_DIR": "/d"}, ("/d", DEFAULT_DRAIN_S)),
        (
            {"worker_process_setup_hook": "tracer.verl_compat.install"},
            {"ROLLOUT_TRACE_DIR": "/d"},
            ("/d", DEFAULT_DRAIN_S),
        ),
        ({"env_vars": {"ROLLOUT_TRACE_DIR": "/t", "ROLLOUT_TRACE_DRAIN_S": "5"}}, {}, ("/t", 5.0)),
        (
            {"worker_process_setup_hook": HOOK, "env_vars": {"ROLLOUT_TRACE_DIR": "/t"}},
            {"ROLLOUT_TRACE_DRAIN_S": "0"},
            None,
        ),
        ({"worker_process_setup_hook": HOOK}, {}, None),  # no folder known: nothing to look at
        ({"worker_process_setup_hook": "my.hook"}, {"ROLLOUT_TRACE_DIR": "/d"}, None),  # not our job
        ({}, {}, None),
    ],
)
def test_the_driver_drains_only_a_job_that_records_with_rollout_trace(
    runtime_env: dict[str, Any], environ: dict[str, str], expected: tuple[str, float] | None
) -> None:
    """The driver's catch-up runs for jobs installing the drop-in or naming ROLLOUT_TRACE_DIR, with the bound they give."""
    plan = drain_plan(runtime_env, environ)
    assert (None if plan is None else (plan.root, plan.timeout_s)) == expected


def test_the_job_variables_the_backends_read_are_taken() -> None:
    """MLFLOW_*/ROLLOUT_TRACE_* of the job's runtime environment go with the plan; others do not."""
    env = {"ROLLOUT_TRACE_DIR": "/t", "MLFLOW_TRACKING_URI": "sqlite:///x.db", "HF_TOKEN": "secret", "PATH": "/bin"}
    plan = drain_plan({"worker_process_setup_hook": HOOK, "env_vars": env}, {})
    assert plan is not None and plan.env == {"ROLLOUT_TRACE_DIR": "/t", "MLFLOW_TRACKING_URI": "sqlite:///x.db"}

"""verl on Ray through the drop-in: two real AgentLoopWorker actors, backend=mlflow, ray.shutdown() 3 s after the last step.

The job (``verl_ray_run.py``, a subprocess joining the module's cluster, so its
``ray.shutdown()`` ends only its own actors) uses the documented overrides:
``worker_process_setup_hook=tracer.integrations.verl.install`` and
``ROLLOUT_TRACE_DIR`` in the runtime environment, ``trace.backend=mlflow``
with ``token2text=True`` in verl's config. ``ray.shutdown()`` ends the actors
without running anything in them (no atexit, no signal: FACTS.md), so what a
live exporter had not shipped is only in the files; rollout-trace's verl
plugin in the driver ships it from there once the actors are gone, before
``ray.shutdown()`` returns, and says how many. A later ``rollout-trace
export`` then has nothing left to send.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reliability_fixtures import FIGURES
from scale_fixtures import REPO, need

import tracer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
STEPS, SAMPLES_PER_WORKER, WORKERS = 3, 1, 2
TRAJECTORIES = STEPS * WORKERS * SAMPLES_PER_WORKER * 2  # two rollouts per question: 12
WAIT_S = 3.0

pytestmark = pytest.mark.slow


def _mlflow_traces(uri: str) -> list[Any]:
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("verl-ray")
    return [] if exp is None else mlflow.search_traces(locations=[exp.experiment_id], return_type="list")


@pytest.fixture(scope="module")
def job(ray_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_dir: Path) -> dict[str, Any]:
    """The verl job run to its end; what MLflow held right after it, and the trace folder."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    need("datasets", "datasets")
    need("mlflow", "mlflow")
    work = tmp_path_factory.mktemp("verl-ray")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONPATH": os.pathsep.join([HERE, TESTS_DIR, REPO, os.environ.get("PYTHONPATH", "")]),
    }
    args = [ray_cluster["address"], str(tiny_qwen3_dir), str(work), str(STEPS), str(SAMPLES_PER_WORKER), str(WAIT_S)]
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "verl_ray_run.py"), *args],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "RESULT" in proc.stdout, proc.stderr[-4000:]
    return {
        "uri": uri,
        "env": env,
        "run_dir": str(work / "traces" / "verl-ray" / "ray"),
        "at_end": _mlflow_traces(uri),
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


def test_every_trajectory_is_in_the_files(job: dict[str, Any]) -> None:
    """ray.shutdown() 3 s after the last step: 12 of 12 trajectories are in the two workers' files."""
    trajs = tracer.read_trajectories(job["run_dir"]).to_pylist()
    assert len(trajs) == TRAJECTORIES
    assert sorted({t["step"] for t in trajs}) == list(range(1, STEPS + 1))
    assert all(t["num_llm_calls"] == 2 and t["num_tool_calls"] == 1 and t["name"] == "agent_loop" for t in trajs)
    pids = {os.path.basename(f).split("_")[1] for f in tracer.list_trace_files(job["run_dir"])}
    assert len(pids) == WORKERS


def test_every_trajectory_is_in_mlflow_when_the_job_ends(job: dict[str, Any], figures_report: dict[str, Any]) -> None:
    """12 of 12 in MLflow right after the job: shipped live, or by the driver from the files after ray.shutdown()."""
    traces = job["at_end"]
    assert len(traces) == TRAJECTORIES, job["stderr"][-3000:]
    assert len({t.info.tags["rollout_trace.trace_id"] for t in traces}) == TRAJECTORIES
    assert {t.info.tags["mlflow.traceName"] for t in traces} == {"agent_loop"}
    said = re.search(
        r"caught up (\d+) trajectories of (\S+) that mlflow lacked \((\d+) were there already", job["stderr"]
    )
    assert said, job["stderr"][-3000:]
    caught, run_dir, live = int(said.group(1)), said.group(2), int(said.group(3))
    assert caught + live == TRAJECTORIES
    assert os.path.realpath(run_dir) == os.path.realpath(job["run_dir"])
    shutdown_s = re.search(r"SHUTDOWN_S (\S+)", job["stdout"])
    FIGURES["verl on Ray, ray.shutdown() 3 s after the last step"] = {
        "in MLflow when the job ended": f"{len(traces)} of {TRAJECTORIES}",
        "shipped live by the workers": live,
        "shipped by the driver from the files": caught,
        "ray.shutdown() took (s)": shutdown_s.group(1) if shutdown_s else "?",
    }


def test_a_later_export_has_nothing_left_to_send(job: dict[str, Any]) -> None:
    """rollout-trace export after the job sends nothing twice: every trajectory is there already."""
    cli = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    proc = subprocess.run(
        [cli, "export", job["run_dir"], "--to", "mlflow", "--no-progress"],
        env=job["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"mlflow: sent 0 trajectories, skipped {TRAJECTORIES}"), proc.stdout
    assert len(_mlflow_traces(job["uri"])) == TRAJECTORIES

"""verl's config, read by the drop-in: its whole config kept as run_config; a backend named without the hook, said loudly."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from scale_fixtures import REPO, need

import tracer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.abspath(os.path.join(HERE, ".."))
FIX = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracer.integrations.verl.install"

#: Builds verl's real AgentLoopWorker twice (verl calls RolloutTraceConfig.init
#: in its __init__) with trace.backend=arrow; with the drop-in, runs one step.
SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    mode, model, work = sys.argv[1:4]
    if mode == "dropin":
        import tracer.integrations.verl
        tracer.integrations.verl.install()
    sys.path.insert(0, sys.argv[4])
    from verl_agent_run import ScriptedClient, ScriptedServer, compose_config, make_batch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.rollout_trace import RolloutTraceConfig

    config = compose_config(model, work, project="verl-config", experiment=mode, backend="arrow")
    for _ in range(2):
        RolloutTraceConfig.reset()
        client = ScriptedClient(config)
        worker = AgentLoopWorker(config, client)
    if mode == "dropin":
        client.server = ScriptedServer(worker.tokenizer)
        asyncio.run(worker.generate_sequences(make_batch(1, 1)))
        tracer.shutdown()
    print("DONE", flush=True)
    """
)


def _verl_worker(model: Path, work: Path, mode: str) -> str:
    """Run SCRIPT in a fresh process with verl's plugin discovery limited to ours; return its stderr."""
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        tracer.ENV_TRACE_DIR: str(work / "traces"),
        "VERL_USE_EXTERNAL_PLUGINS": "rollout_trace",
        "PYTHONPATH": os.pathsep.join([HERE, TESTS_DIR, REPO, os.environ.get("PYTHONPATH", "")]),
    }
    env.pop(tracer.config.ENV_STRICT, None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(model), str(work), HERE],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-4000:]
    return proc.stderr


@pytest.fixture(scope="module")
def verl_workers(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_dir: Path) -> dict[str, Any]:
    """verl's AgentLoopWorker configured for backend=arrow: once without the hook, once through the drop-in."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    need("datasets", "datasets")
    root = tmp_path_factory.mktemp("verl-config")
    return {
        "nohook": _verl_worker(tiny_qwen3_dir, root / "nohook", "nohook"),
        "dropin": _verl_worker(tiny_qwen3_dir, root / "dropin", "dropin"),
        "dropin_dir": str(root / "dropin" / "traces"),
        "nohook_dir": str(root / "nohook" / "traces"),
    }


@pytest.fixture()
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The verl plugin imported here, its once-per-process flag cleared, its import watcher removed afterwards."""
    from tracer.integrations import verl_plugin

    monkeypatch.setattr(verl_plugin, "_warned", False)
    yield verl_plugin
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, verl_plugin._Watcher)]


def _verl_rollout_trace(alias: str) -> Any:
    """A fresh copy of verl's own verl/utils/rollout_trace.py (not the drop-in), loaded under ``alias``."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "rollout_trace.py")
    file_spec = importlib.util.spec_from_file_location(alias, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_whole_verl_config_is_the_run_config(verl_workers: dict[str, Any]) -> None:
    """Through the drop-in, the trace files keep verl's whole config (OmegaConf made plain) as run_config."""
    run_config = tracer.read_run_config(verl_workers["dropin_dir"])
    assert run_config["trainer"]["project_name"] == "verl-config"
    assert run_config["actor_rollout_ref"]["rollout"]["trace"]["backend"] == "arrow"
    assert run_config["actor_rollout_ref"]["rollout"]["multi_turn"]["format"] == "hermes"
    json.dumps(run_config)  # plain JSON: no DictConfig, no enum left
    assert tracer.read_trajectories(verl_workers["dropin_dir"]).num_rows == 2


@pytest.mark.slow
def test_verl_config_becomes_mlflow_params(verl_workers: dict[str, Any], tmp_path: Path) -> None:
    """Exported to MLflow, the run's params are verl's config keys, dotted."""
    need("mlflow", "mlflow")
    from mlflow.tracking import MlflowClient

    from tracer.exporters import export_files

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export_files(verl_workers["dropin_dir"], "mlflow", tracking_uri=uri, progress=False)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("verl-config")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["actor_rollout_ref.rollout.trace.backend"] == "arrow"
    assert run.data.params["trainer.project_name"] == "verl-config"


@pytest.mark.slow
def test_backend_without_hook_warns_once_with_the_fix(verl_workers: dict[str, Any]) -> None:
    """verl's AgentLoopWorker with trace.backend=arrow and no hook: one warning, with the override that fixes it."""
    lines = [
        line for line in verl_workers["nohook"].splitlines() if "tracer.integrations.verl is not installed" in line
    ]
    assert len(lines) == 1, verl_workers["nohook"][-3000:]
    assert FIX in lines[0] and "'arrow'" in lines[0] and "records nothing" in lines[0]
    assert not os.path.exists(verl_workers["nohook_dir"])  # and, as the warning says, nothing was recorded


@pytest.mark.slow
def test_drop_in_installed_gives_no_warning(verl_workers: dict[str, Any]) -> None:
    """With the hook installed the plugin stays silent."""
    assert "tracer.integrations.verl is not installed" not in verl_workers["dropin"]


def test_plugin_is_registered_where_verl_looks() -> None:
    """The installed package offers tracer.integrations.verl_plugin in verl's plugin group (verl.plugins)."""
    found = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    plugin = found.get("rollout_trace")
    assert plugin == "tracer.integrations.verl_plugin", "reinstall: pip install -e . (pyproject.toml changed)"


@pytest.mark.parametrize(
    ("backend", "env", "warns"),
    [
        ("arrow", {}, True),
        ("console", {}, True),
        ("mlflow", {}, False),  # verl's own MLflow tracing records: not silent
        ("mlflow", {tracer.ENV_TRACE_DIR: "/x"}, True),  # but rollout-trace was meant
        ("weave", {tracer.ENV_TRACE_DIR: "/x"}, False),
        ("trackio", {}, False),  # verl's own trackio tracing records
        ("trackio", {tracer.ENV_TRACE_DIR: "/x"}, True),  # rollout-trace's trackio was meant
        (None, {tracer.ENV_TRACE_DIR: "/x"}, False),
        ("no-such-backend", {}, False),  # verl's own error path, not ours
    ],
)
def test_misconfiguration_names_only_our_backends(
    plugin: Any, monkeypatch: pytest.MonkeyPatch, backend: str | None, env: dict[str, str], warns: bool
) -> None:
    """A warning only for a backend rollout-trace has and verl would not record (or that was meant for rollout-trace)."""
    for name in plugin.INTENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    message = plugin.misconfiguration(backend)
    assert (message is not None) is warns
    if message is not None:
        assert FIX in message


def test_watched_verl_init_warns_once_and_still_runs(plugin: Any, caplog: pytest.LogCaptureFixture) -> None:
    """verl's own RolloutTraceConfig, watched: init still sets verl's fields; the warning comes once per process."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    module = _verl_rollout_trace("verl.utils._rollout_trace_watch_test")
    plugin.watch(module)
    plugin.watch(module)  # idempotent
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        for _ in range(2):
            module.RolloutTraceConfig.reset()
            module.RolloutTraceConfig.init("p", "e", "arrow")
            assert module.RolloutTraceConfig.get_backend() == "arrow"
    assert sum("tracer.integrations.verl is not installed" in r.getMessage() for r in caplog.records) == 1

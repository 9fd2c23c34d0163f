"""The run's training config reaches every backend: MLflow params, wandb config (offline run files)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
from compare_fixtures import CONFIG_A, record_compare_run

pytest.importorskip("mlflow")

from export_fixtures import wandb_env  # noqa: E402
from export_mlflow_fixtures import empty_store  # noqa: E402

import tracer  # noqa: E402


@pytest.fixture()
def run_dir(tmp_path: Path) -> str:
    path = record_compare_run(os.fspath(tmp_path / "traces"), "a", CONFIG_A, lambda s, p, n: 1.0)
    tracer.shutdown()
    return path


def test_mlflow_export_logs_the_run_config_as_params(run_dir: str, in_tmp_dir: Path) -> None:
    """`export --to mlflow` logs run_config's dotted keys as the run's params, the secret redacted."""
    from mlflow.tracking import MlflowClient

    from tracer.exporters import mlflow as mlflow_export

    uri = f"sqlite:///{empty_store(in_tmp_dir / 'mlflow.db')}"
    mlflow_export.export_files(run_dir, tracking_uri=uri, progress=False)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("compare-test").experiment_id])
    params = run.data.params
    assert params["actor.lr"] == "1e-06"
    assert params["data.train_batch_size"] == "8"
    assert CONFIG_A["api_key"] not in params.values()


def test_wandb_export_logs_the_run_config(run_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`export --to wandb` (offline) puts run_config in the run's config records."""
    pytest.importorskip("wandb")
    import wandb

    from tracer.exporters import wandb as wandb_export

    wandb.teardown()  # a wandb set up by an earlier test keeps its settings: start from its environment
    wandb_env(monkeypatch, tmp_path / "wandb")
    wandb_export.export_files(run_dir, progress=False)
    wandb.teardown()
    files = glob.glob(os.fspath(tmp_path / "wandb" / "**" / "*.wandb"), recursive=True)
    assert files
    raw = b""
    for file in files:
        with open(file, "rb") as f:
            raw += f.read()
    # Config records carry each key with its value as JSON text (wandb_internal.proto ConfigItem.value_json).
    assert b"train_batch_size" in raw and b"actor" in raw
    assert CONFIG_A["api_key"].encode() not in raw

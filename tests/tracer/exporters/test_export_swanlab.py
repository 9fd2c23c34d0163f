"""SwanLab exporter: local/offline runs read back from their log directory."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("swanlab")

from export_fixtures import (  # noqa: E402
    EXPERIMENT,
    PROJECT,
    STEPS,
    TRAIN_PER_STEP,
    record_rollouts,
    record_run,
    reward_of,
)

import tracer  # noqa: E402
from tracer.exporters import swanlab as swanlab_export  # noqa: E402

VAL_CAP = 2


def _run_dir(log_dir: str) -> str:
    runs = glob.glob(os.path.join(log_dir, "run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def _rows(run_dir: str) -> list[dict[str, Any]]:
    rows = []
    for file in glob.glob(os.path.join(run_dir, "media", "echarts", "*.json")):
        with open(file, encoding="utf-8") as f:
            rows.extend(json.load(f)["rowData"])
    return rows


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One local-mode export of the fixture run, shared by the read-back tests."""
    root = tmp_path_factory.mktemp("swanlab")
    traces = record_run(root / "traces", log_val_generations=VAL_CAP)
    log_dir = str(root / "swanlog")
    report = swanlab_export.export_files(traces, mode="local", log_dir=log_dir, progress=False, verify=True)
    yield {"report": report, "dir": _run_dir(log_dir), "traces": traces}


def test_every_trajectory_is_a_table_row(exported: dict[str, Any]) -> None:
    """Each training trajectory is a row of its step's table with its reward; validation rows are capped per step."""
    rows = _rows(exported["dir"])
    train = [r for r in rows if not r["validate"]]
    val = [r for r in rows if r["validate"]]
    assert len(train) == len(STEPS) * TRAIN_PER_STEP
    assert len(val) == len(STEPS) * VAL_CAP
    for row in train:
        assert row["reward"] == reward_of(row["step"], int(row["sample_index"]), row["rollout_n"])


def test_conversations_are_logged_as_text(exported: dict[str, Any]) -> None:
    """The first conversations of each step are logged as text files with the tool call spelled out."""
    texts = glob.glob(os.path.join(exported["dir"], "media", "text", "*.txt"))
    assert len(texts) == len(STEPS) * swanlab_export.MAX_TEXTS
    with open(sorted(texts)[0], encoding="utf-8") as f:
        assert "-> calculator(" in f.read()


def test_step_metrics_are_logged_at_their_step(exported: dict[str, Any]) -> None:
    """The per-step rollout metrics are in the run's records at their step and equal step_metrics of the files."""
    _, metrics = swanlab_export.read_back(exported["dir"])
    expected = tracer.step_metrics(tracer.read_trajectories(exported["traces"]))
    for step in STEPS:
        assert metrics[(step, "rollout_trace/reward/mean")] == pytest.approx(expected[(step, False)]["reward/mean"])
        assert metrics[(step, "rollout_trace_val/trajectories")] == 3


def test_verify_reports_agreement(exported: dict[str, Any]) -> None:
    """verify=True reads the log directory back and reports that rows, rewards and metrics match."""
    lines = [d for d in exported["report"].details if d.startswith("verify")]
    assert len(lines) == 2 and all(": OK:" in line for line in lines), lines


@pytest.mark.slow
def test_live_exporter_logs_steps_during_recording(tmp_path: Any) -> None:
    """With backend swanlab, recorded trajectories reach an offline run's tables."""
    log_dir = str(tmp_path / "swanlog")
    tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend=["swanlab"],
        output_dir=str(tmp_path / "traces"),
        flush_interval_s=0.1,
        log_val_generations=VAL_CAP,
        backend_options={"swanlab_mode": "offline", "swanlab_log_dir": log_dir},
    )
    record_rollouts()
    tracer.shutdown()
    rows = _rows(_run_dir(log_dir))
    assert sum(1 for r in rows if not r["validate"]) == len(STEPS) * TRAIN_PER_STEP
    assert sum(1 for r in rows if r["validate"]) == len(STEPS) * VAL_CAP

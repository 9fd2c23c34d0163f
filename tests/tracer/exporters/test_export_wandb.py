"""WandB exporter: offline runs read back from their run files."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc
import pyarrow.ipc as pa_ipc
import pytest

pytest.importorskip("wandb")

from export_fixtures import (  # noqa: E402
    EXPERIMENT,
    GROUP,
    PROJECT,
    PROMPTS,
    STEPS,
    TRAIN_PER_STEP,
    record_rollouts,
    record_run,
    reward_of,
    wandb_env,
)

import tracer  # noqa: E402
from tracer.backends import resolve_options  # noqa: E402
from tracer.exporters import wandb as wandb_export  # noqa: E402
from tracer.exporters.base import ReadBack, Target, VerifyResult  # noqa: E402

#: The recorded config's cap on validation rows per step (the fixture records 3).
VAL_CAP = 2
#: A small row limit so that splitting is exercised without 10,000 rows.
SMALL_MAX_ROWS = 3


def _table_rows(run_dir: str, key: str) -> list[dict[str, Any]]:
    files = glob.glob(
        os.path.join(run_dir, "files", "media", "table", *key.split("/")[:-1], key.split("/")[-1] + "_*.table.json")
    )
    rows = []
    for file in files:
        with open(file, encoding="utf-8") as f:
            table = json.load(f)
        rows.extend(dict(zip(table["columns"], row, strict=True)) for row in table["data"])
    return rows


def _run_files(report: Any) -> str:
    prefix = "wandb run files: "
    return next(d[len(prefix) :] for d in report.details if d.startswith(prefix))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One offline export of the fixture run, shared by the read-back tests."""
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        wandb_env(mp, root / "wandb")
        run_dir = record_run(root / "traces", log_val_generations=VAL_CAP)
        report = wandb_export.export_files(run_dir, progress=False, verify=True, max_rows=SMALL_MAX_ROWS)
        import wandb

        wandb.teardown()
        yield {"report": report, "dir": _run_files(report), "traces": run_dir}


def test_every_training_trajectory_is_a_table_row(exported: dict[str, Any]) -> None:
    """Each training trajectory of each step is one row of the training table, with its reward."""
    rows = _table_rows(exported["dir"], "rollout_trace/table")
    assert len(rows) == len(STEPS) * TRAIN_PER_STEP
    for row in rows:
        assert row["reward"] == reward_of(row["step"], int(row["sample_index"]), row["rollout_n"])
        assert row["validate"] is False


def test_validation_rows_are_capped_by_log_val_generations(exported: dict[str, Any]) -> None:
    """At most log_val_generations validation trajectories per step go into the validation table; the report says how many were left out."""
    rows = _table_rows(exported["dir"], "rollout_trace_val/table")
    per_step = {s: sum(1 for r in rows if r["step"] == s) for s in STEPS}
    assert per_step == dict.fromkeys(STEPS, VAL_CAP)
    assert any("validation trajectories left out" in d for d in exported["report"].details)
    assert exported["report"].trajectories_skipped == len(STEPS) * 1


def test_rows_carry_advantage_conversation_and_counts(exported: dict[str, Any]) -> None:
    """A row has the advantage, the rendered conversation with its tool call, turns, tool calls and tool errors."""
    rows = _table_rows(exported["dir"], "rollout_trace/table")
    failing = next(r for r in rows if r["step"] == 1 and r["sample_index"] == "0" and r["rollout_n"] == 1)
    rewards = [reward_of(1, 0, n) for n in range(GROUP)]
    assert failing["advantage"] == pytest.approx(rewards[1] - sum(rewards) / GROUP)
    assert failing["turns"] == 2 and failing["tool_calls"] == 1 and failing["tool_errors"] == 1
    assert "[user]\nWhat is 0 + 1?" in failing["conversation"]
    assert '-> calculator({"expression": "1/0"})' in failing["conversation"]
    assert "error: division by zero" in failing["conversation"]
    assert failing["response"] == "turn 1 text"
    assert failing["status"] == "ok" and failing["latency_s"] > 0


def test_rows_over_the_limit_are_split_not_dropped(exported: dict[str, Any]) -> None:
    """A step with more rows than the per-table limit is logged as several increments, and the report says so."""
    files = glob.glob(os.path.join(exported["dir"], "files", "media", "table", "rollout_trace", "table_*.table.json"))
    expected_increments = len(STEPS) * -(-TRAIN_PER_STEP // SMALL_MAX_ROWS)
    assert len(files) == expected_increments
    notes = [d for d in exported["report"].details if "split into" in d]
    assert len(notes) == len(STEPS)
    assert "wandb.Table.MAX_ROWS = 10000" in notes[0]


def test_step_metrics_are_logged_at_their_step(exported: dict[str, Any]) -> None:
    """The per-step rollout metrics are in the run history at their step and equal step_metrics of the files."""
    _, metrics = wandb_export.read_back(exported["dir"])
    expected = tracer.step_metrics(tracer.read_trajectories(exported["traces"]))
    for step in STEPS:
        assert metrics[(step, "rollout_trace/reward/mean")] == pytest.approx(expected[(step, False)]["reward/mean"])
        assert metrics[(step, "rollout_trace/trajectories")] == TRAIN_PER_STEP
        assert metrics[(step, "rollout_trace/tool_error_rate")] == pytest.approx(1 / GROUP)
        assert metrics[(step, "rollout_trace_val/trajectories")] == 3


def test_verify_reports_agreement(exported: dict[str, Any]) -> None:
    """verify=True reads the run back and reports that rows, rewards and metrics match the files."""
    lines = [d for d in exported["report"].details if d.startswith("verify")]
    assert len(lines) == 2
    assert all(": OK:" in line for line in lines), lines


def test_report_counts_what_was_sent(exported: dict[str, Any]) -> None:
    """The report counts the rows sent and says where the run's files are."""
    report = exported["report"]
    assert report.backend == "wandb"
    assert report.trajectories_sent == len(STEPS) * (TRAIN_PER_STEP + VAL_CAP)
    assert any(d.startswith("upload it with: wandb sync ") for d in report.details)


@pytest.mark.slow
def test_live_exporter_logs_steps_during_recording(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With backend wandb, recorded trajectories reach an offline run's tables as steps complete."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend=["wandb"],
        output_dir=str(tmp_path / "traces"),
        flush_interval_s=0.1,
        log_val_generations=VAL_CAP,
        backend_options={"wandb_mode": "offline", "wandb_dir": str(tmp_path / "wandb")},
    )
    record_rollouts()
    tracer.shutdown()
    import wandb

    wandb.teardown()
    run_dirs = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*"))
    assert len(run_dirs) == 1
    rows = _table_rows(run_dirs[0], "rollout_trace/table")
    assert sorted((r["step"], r["sample_index"], r["rollout_n"]) for r in rows) == sorted(
        (s, str(p), n) for s in STEPS for p in range(PROMPTS) for n in range(GROUP)
    )
    assert len(_table_rows(run_dirs[0], "rollout_trace_val/table")) == len(STEPS) * VAL_CAP
    _, metrics = wandb_export.read_back(run_dirs[0])
    assert {s for s, k in metrics if k == "rollout_trace/reward/mean"} == set(STEPS)


@pytest.mark.slow
def test_failing_backend_costs_nothing_in_the_files(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A wandb backend that cannot start (online, no API key): the rollout and the files complete, shutdown not ok, saying how to catch up."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend=["wandb"],
        output_dir=str(tmp_path / "traces"),
        flush_interval_s=0.1,
        backend_options={"wandb_mode": "online"},
    )
    record_rollouts()
    result = tracer.shutdown()
    assert not result.ok and f"rollout-trace export {cfg.run_dir} --to wandb" in result.message, result
    assert result.spans_failed == result.spans_dropped == 0
    table = tracer.read_trajectories(cfg.run_dir)
    assert table.num_rows == len(STEPS) * (TRAIN_PER_STEP + 3)
    assert set(table["status"].to_pylist()) == {"ok"}
    assert any(f"rollout-trace export {cfg.run_dir} --to wandb" in r.getMessage() for r in caplog.records)


def test_live_backend_without_its_library_fails_at_init(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tracer.init with backend wandb and no wandb installed raises ImportError with the pip line."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    from tracer.extras import install_command

    with pytest.raises(ImportError, match=re.escape(install_command("wandb"))):
        tracer.init(backend=["wandb"], output_dir=str(tmp_path))
    assert tracer.get_config() is None


def test_wandb_proxy_option_reaches_the_run_settings(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's wandb_proxy is passed to wandb as its HTTPS and HTTP proxy."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    sink = wandb_export.WandbSink(resolve_options("wandb", {"proxy": "http://127.0.0.1:3128"}))
    sink.open(Target(PROJECT, "proxy"))
    try:
        assert sink.run.settings.https_proxy == "http://127.0.0.1:3128"
        assert sink.run.settings.http_proxy == "http://127.0.0.1:3128"
    finally:
        sink.close()


def test_verify_catches_a_changed_reward(exported: dict[str, Any], tmp_path: Any) -> None:
    """Verification (what `export --verify` runs) is not ok, naming the row, when a row in the run's files has a different reward than was sent."""
    copy = shutil.copytree(exported["dir"], tmp_path / "run")
    sent, metrics = wandb_export.read_back(str(copy))
    file = sorted(glob.glob(os.path.join(copy, "files", "media", "table", "rollout_trace", "table_*.table.json")))[0]
    with open(file, encoding="utf-8") as f:
        table = json.load(f)
    table["data"][0][table["columns"].index("reward")] += 1.0
    with open(file, "w", encoding="utf-8") as f:
        json.dump(table, f)
    result = VerifyResult.compare("wandb", sent, metrics, ReadBack(*wandb_export.read_back(str(copy))))
    assert not result.ok and len(result.mismatched) == 1 and not (result.missing or result.metrics_mismatched)
    assert result.lines[0].startswith("verify wandb: FAILED:") and "1 with a different reward" in result.lines[0]
    assert result.lines[1].startswith("verify wandb: OK:")


def test_an_advantage_past_the_float_range_is_a_row_without_advantage(tmp_path: Any, monkeypatch: Any) -> None:
    """An int advantage past the float range (10**400) leaves the row's advantage empty; the report counts every
    trajectory sent, none refused, and no spans (a table holds rows)."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    cfg = tracer.init(project_name=PROJECT, experiment_name=EXPERIMENT, backend="arrow", output_dir=str(tmp_path / "t"))
    generate = tracer.rollout_trace_op(kind="llm", name="generate")(lambda prompt: prompt + " 4")
    for n, advantage in enumerate((10**400, -(10**400), 0.5)):
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=n):
            generate("2 + 2?")
            tracer.log_reward(1.0, advantage=advantage)
    tracer.shutdown()
    # The recorder writes such an int as a string; a file from another writer holds the JSON number itself.
    (file,) = glob.glob(os.path.join(cfg.run_dir, "*.arrow"))
    table = pa_ipc.open_file(file).read_all()
    column = table.schema.get_field_index("attributes")
    unquoted = pc.replace_substring_regex(table["attributes"], r'"advantage":"(-?\d+)"', r'"advantage":\1')
    with pa_ipc.new_file(file, table.schema) as out:
        out.write_table(table.set_column(column, table.schema.field(column), unquoted))
    report = wandb_export.export_files(cfg.run_dir, progress=False, verify=True)
    import wandb

    wandb.teardown()
    rows = _table_rows(_run_files(report), "rollout_trace/table")
    assert sorted((r["rollout_n"], r["advantage"]) for r in rows) == [(0, None), (1, None), (2, 0.5)]
    assert (report.trajectories_sent, report.trajectories_refused, report.spans_sent) == (3, 0, 0)
    assert report.complete, report.details

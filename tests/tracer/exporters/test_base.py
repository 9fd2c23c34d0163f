"""One exporter interface: the registry, the live and file drivers over the same sinks, structured verify."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
from export_fixtures import EXPERIMENT, PROJECT, STEPS, TRAIN_PER_STEP, VAL_PER_STEP, record_rollouts, wandb_env
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer.backends import resolve_options
from tracer.cli import main
from tracer.exporters import (
    BACKENDS,
    Backend,
    ExportOptionError,
    Option,
    ReadBack,
    SinkBase,
    StepBatch,
    Target,
    VerifyResult,
    Written,
    export_files,
)
from tracer.exporters.tables import TABLE_COLUMNS, trajectory_row


def record_run(output_dir: Any, **init: Any) -> str:
    """Record the fixture run with ``init`` overriding tracer.init's fields (the backend); return its directory."""
    fields: dict[str, Any] = {
        "project_name": PROJECT,
        "experiment_name": EXPERIMENT,
        "output_dir": os.fspath(output_dir),
        "flush_interval_s": 0.2,
    }
    cfg = tracer.init(**{**fields, **init})
    record_rollouts()
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


# -- the registry ------------------------------------------------------------------------


def test_unknown_backend_names_the_valid_ones_and_the_closest() -> None:
    """An unknown backend is an error listing every backend and suggesting the nearest name."""
    with pytest.raises(
        ExportOptionError, match=r"'wandbb' \(did you mean 'wandb'\?\).*" + re.escape(", ".join(BACKENDS))
    ):
        export_files("anywhere", "wandbb")


def test_misspelled_option_is_an_error_with_a_suggestion(tmp_path: Any) -> None:
    """A misspelled option is refused (not swallowed), naming the closest option and all valid ones."""
    with pytest.raises(ExportOptionError, match=r"'mdoe' \(did you mean 'mode'\?\); wandb options are: project"):
        export_files(tmp_path, "wandb", mdoe="offline")


def test_option_value_outside_its_choices_names_them() -> None:
    """A value not among an option's choices is refused with the valid values."""
    with pytest.raises(ExportOptionError, match="valid values are local, offline, online"):
        resolve_options("swanlab", {"mode": "cloud"})


def test_options_table_drives_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """Every option declared in the registry is a flag of `rollout-trace export`."""
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    for backend in BACKENDS.values():
        for option in backend.options:
            flag = option.cli_flag if option.type is not bool else "--" + option.name.replace("_", "-")
            assert flag in out, (backend.name, option.name)


def test_cli_opt_with_a_misspelled_name_exits_2_with_a_suggestion(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--opt NAME=VALUE goes through the same check as the Python API."""
    assert main(["export", str(tmp_path), "--to", "wandb", "--opt", "max_rowz=3"]) == 2
    assert "did you mean 'max_rows'?" in capsys.readouterr().err


# -- live and file export through the same sink ------------------------------------------------


def _console_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("rollout-trace step")]


def test_console_live_and_file_exports_write_the_same_lines(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The console lines of a live export equal those of exporting the run's files afterwards."""
    caplog.set_level(logging.INFO, logger="rollout_trace")
    run_dir = record_run(tmp_path, backend=["console"])
    live = _console_lines(caplog)
    caplog.clear()
    report = export_files(run_dir, "console", progress=False, print=False)
    assert sorted(_console_lines(caplog)) == sorted(live)
    assert len(live) == 2 * len(STEPS)
    assert report.trajectories_sent == len(STEPS) * (TRAIN_PER_STEP + VAL_PER_STEP)


def _wandb_rows(run_dir: str) -> list[tuple[Any, ...]]:
    rows = []
    for file in glob.glob(os.path.join(run_dir, "files", "media", "table", "**", "*.table.json"), recursive=True):
        with open(file, encoding="utf-8") as f:
            table = json.load(f)
        rows.extend(tuple(json.dumps(v) for v in row) for row in table["data"])
    return sorted(rows)


@pytest.mark.slow
def test_wandb_live_and_file_exports_write_the_same_rows(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live wandb run and an offline export of the same files hold identical table rows."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    run_dir = record_run(
        tmp_path / "traces",
        backend=["wandb"],
        backend_options={"wandb_mode": "offline", "wandb_dir": str(tmp_path / "live")},
    )
    (live_dir,) = glob.glob(str(tmp_path / "live" / "wandb" / "offline-run-*"))
    report = export_files(run_dir, "wandb", run_dir=str(tmp_path / "file"), progress=False, verify=True)
    (file_dir,) = glob.glob(str(tmp_path / "file" / "wandb" / "offline-run-*"))
    live, file = _wandb_rows(live_dir), _wandb_rows(file_dir)
    assert len(live) == len(STEPS) * (TRAIN_PER_STEP + VAL_PER_STEP)
    assert live == file
    assert report.verify is not None and report.verify.ok, report.details


@pytest.mark.slow
def test_verify_is_not_ok_when_a_row_is_missing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting one row from the exported run makes the structured verify result not ok, naming that row."""
    from tracer.exporters.wandb import read_back

    wandb_env(monkeypatch, tmp_path / "wandb")
    run_dir = record_run(tmp_path / "traces")
    report = export_files(run_dir, "wandb", progress=False, verify=True)
    assert report.verify is not None and report.verify.ok
    (run,) = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*"))
    sent, metrics = read_back(run)
    copy = shutil.copytree(run, tmp_path / "copy")
    file = sorted(glob.glob(os.path.join(copy, "files", "media", "table", "rollout_trace", "table_*.table.json")))[0]
    with open(file, encoding="utf-8") as f:
        table = json.load(f)
    victim = table["data"].pop(0)[table["columns"].index("trace_id")]
    with open(file, "w", encoding="utf-8") as f:
        json.dump(table, f)
    rows, found_metrics = read_back(str(copy))
    result = VerifyResult.compare("wandb", sent, metrics, ReadBack(rows, found_metrics))
    assert not result.ok
    assert (result.missing, result.unexpected, result.mismatched) == ([victim], [], [])
    assert (result.expected, result.found) == (len(sent), len(sent) - 1)


# -- a new backend is one class and one registry line ------------------------------------------

#: What :class:`MemorySink` wrote, per export: ``(tag, step, trace ids, metrics)``.
WRITTEN: list[tuple[str, int | None, list[str], dict[bool, dict[str, float]] | None]] = []

#: ``tag -> trace_id -> reward`` of what :class:`MemorySink` wrote.
REWARDS: dict[str, dict[str, float | None]] = {}


class MemorySink(SinkBase):
    """A sink that keeps each step's trajectory ids in a list."""

    span_columns: ClassVar[tuple[str, ...]] = ()

    def write(self, batch: StepBatch) -> Written:
        """Keep the step's trace ids."""
        ids = [t.summary["trace_id"] for t in batch.trajectories]
        WRITTEN.append((self.options["tag"], batch.step, ids, batch.metrics))
        rows = {t.summary["trace_id"]: t.summary["reward"] for t in batch.trajectories}
        REWARDS.setdefault(self.options["tag"], {}).update(rows)
        return Written(sent=len(ids), rows=rows)

    def read_back(self) -> ReadBack:
        """Everything this sink's tag wrote, with the rewards."""
        return ReadBack(dict(REWARDS.get(self.options["tag"], {})))

    def open(self, target: Target) -> set[str]:
        """Nothing is there before; keep the target for the test."""
        self.target = target
        return set()


@pytest.fixture()
def memory_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register :class:`MemorySink` as backend ``memory``: the one registry line a new backend needs."""
    WRITTEN.clear()
    REWARDS.clear()
    monkeypatch.setitem(
        BACKENDS, "memory", Backend("memory", f"{__name__}:MemorySink", options=(Option("tag", str, "x", "a label"),))
    )


def _by_step(tag: str) -> Mapping[int | None, list[str]]:
    out: dict[int | None, list[str]] = {}
    for t, step, ids, metrics in WRITTEN:
        if t == tag:
            assert metrics is not None, "a non-streaming sink gets only complete steps"
            out.setdefault(step, []).extend(ids)
    return out


def test_a_sink_defined_here_works_live_from_files_and_on_the_cli(
    memory_backend: None, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sink class plus one registry entry is a backend: tracer.init, export_files and the CLI use it."""
    run_dir = record_run(tmp_path, backend=["memory"], backend_options={"memory": {"tag": "live"}})
    report = export_files(run_dir, "memory", tag="files", progress=False, verify=True)
    assert main(["export", run_dir, "--to", "memory", "--opt", "tag=cli", "--no-progress"]) == 0
    assert "memory: sent" in capsys.readouterr().out
    live, files, cli = _by_step("live"), _by_step("files"), _by_step("cli")
    assert set(live) == set(files) == set(STEPS)
    assert {s: sorted(v) for s, v in live.items()} == {s: sorted(v) for s, v in files.items()}
    assert files == cli
    assert sum(len(v) for v in files.values()) == tracer.read_trajectories(run_dir).num_rows
    assert report.verify is not None and report.verify.ok


@settings(max_examples=200, deadline=None)
@given(
    advantage=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.integers(2**1023, 10**400),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=6,
    )
)
def test_a_rows_advantage_is_a_float_or_none_whatever_reward_info_holds(advantage: Any) -> None:
    """Any JSON value as ``reward_info``'s advantage (ints past the float range too) gives a row, its advantage a
    float when it is a number within the float range and None otherwise."""
    summary = {"trace_id": "t", "reward_info": {"advantage": advantage}}
    row = dict(zip(TABLE_COLUMNS, trajectory_row(summary, []), strict=True))
    in_range = type(advantage) in (int, float) and (type(advantage) is float or abs(advantage) < 2**1024)
    assert row["advantage"] == (float(advantage) if in_range else None) or advantage != advantage

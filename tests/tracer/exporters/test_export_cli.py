"""``rollout-trace export``: bad input, missing libraries, exports with step selection and --verify."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from export_fixtures import STEPS, TRAIN_PER_STEP, VAL_PER_STEP, record_run, wandb_env

from tracer.backends import BACKENDS
from tracer.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fixture run, recorded once for this module."""
    return record_run(tmp_path_factory.mktemp("traces"))


def test_unknown_backend_names_the_valid_ones(run_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --to exits with status 2 and lists the valid backends."""
    assert main(["export", run_dir, "--to", "neptune"]) == 2
    err = capsys.readouterr().err
    assert "'neptune'" in err and ", ".join(BACKENDS) in err


def test_missing_path_is_a_clear_error(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that does not exist exits with status 2 and names the path."""
    missing = str(tmp_path / "nowhere")
    assert main(["export", missing, "--to", "wandb"]) == 2
    assert f"{missing!r} does not exist" in capsys.readouterr().err


def test_directory_without_trace_files_is_a_clear_error(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory with no trace files exits with status 2 and says so."""
    assert main(["export", str(tmp_path), "--to", "console"]) == 2
    assert "no trace files" in capsys.readouterr().err


def test_bad_mode_names_the_valid_modes(run_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A --mode the backend does not have exits with status 2 and lists its modes."""
    assert main(["export", run_dir, "--to", "swanlab", "--mode", "cloud"]) == 2
    assert "local, offline, online" in capsys.readouterr().err


def test_option_of_another_backend_is_refused(run_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--log-dir with --to wandb exits with status 2 rather than being ignored."""
    assert main(["export", run_dir, "--to", "wandb", "--log-dir", "x"]) == 2
    assert "--log-dir does not apply to wandb" in capsys.readouterr().err


def test_missing_backend_library_gives_the_pip_line(
    run_dir: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When wandb cannot be imported, the command exits with status 2 and prints the install line."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["export", run_dir, "--to", "wandb", "--no-progress"]) == 2
    from tracer.extras import install_command

    assert install_command("wandb") in capsys.readouterr().err


def test_console_export_prints_one_line_per_step(run_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--to console prints a summary line per step and validation set, and the report."""
    assert main(["export", run_dir, "--to", "console"]) == 0
    out = capsys.readouterr()
    for step in STEPS:
        assert f"rollout-trace step {step}: reward" in out.err
        assert f"rollout-trace step {step} validation: reward" in out.err
    assert f"console: sent {len(STEPS) * (TRAIN_PER_STEP + VAL_PER_STEP)} trajectories, skipped 0" in out.out


@pytest.mark.slow
def test_wandb_export_of_one_step_verifies(
    run_dir: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--to wandb --step 2 --verify sends only step 2, reports the rest as skipped, and verifies OK."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    rc = main(
        ["export", run_dir, "--to", "wandb", "--step", "2", "--dir", str(tmp_path / "wb"), "--verify", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    sent = TRAIN_PER_STEP + VAL_PER_STEP
    skipped = (len(STEPS) - 1) * (TRAIN_PER_STEP + VAL_PER_STEP)
    assert f"wandb: sent {sent} trajectories, skipped {skipped}" in out
    assert out.count(": OK:") == 2
    assert str(tmp_path / "wb") in out


@pytest.mark.slow
def test_swanlab_export_since_step_verifies(run_dir: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """--to swanlab --mode offline --since-step 2 --verify sends steps 2 and 3 and verifies OK."""
    log_dir = str(tmp_path / "swanlog")
    rc = main(
        [
            "export",
            run_dir,
            "--to",
            "swanlab",
            "--mode",
            "offline",
            "--log-dir",
            log_dir,
            "--since-step",
            "2",
            "--verify",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"swanlab: sent {2 * (TRAIN_PER_STEP + VAL_PER_STEP)} trajectories" in out
    assert out.count(": OK:") == 2
    assert f"swanlab run files: {log_dir}" in out


def test_backend_failure_exits_2_with_its_message(
    run_dir: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend that refuses the export (wandb online without an API key) gives exit status 2 (environment) and wandb's reason."""
    wandb_env(monkeypatch, tmp_path / "wandb")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    assert main(["export", run_dir, "--to", "wandb", "--mode", "online", "--no-progress"]) == 2
    assert "rollout-trace export: wandb failed: UsageError" in capsys.readouterr().err

"""Live exporters' lag: each driver's lag file next to the shards, read back by ``rollout-trace info``."""

from __future__ import annotations

from typing import Any

import pytest
from export_fixtures import TRAIN_PER_STEP, init_console, lag_on_every_look, record_rollouts, wait_for_lag

import tracer
from tracer.cli import main
from tracer.exporters import lag


def test_a_held_step_shows_as_waiting_then_shipped(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step held until complete is waiting in the lag file and in ``info``; after shutdown all shipped, final."""
    lag_on_every_look(monkeypatch)
    cfg = init_console(tmp_path, print_lines=False)
    record_rollouts(steps=(1,), val_per_step=0)
    held = wait_for_lag(cfg.run_dir, lambda r: r.waiting == TRAIN_PER_STEP)
    assert (held.backend, held.shipped, held.final) == ("console", 0, False)
    assert held.oldest_waiting_s >= 0.0
    capsys.readouterr()
    assert main(["info", cfg.run_dir]) == 0
    out = capsys.readouterr().out
    assert "live exporters (how far behind the files):" in out
    assert f"console ({held.host} pid {held.pid}): 0 shipped, {TRAIN_PER_STEP} waiting (oldest" in out
    tracer.shutdown()
    done = lag.read_lag(cfg.run_dir)[0]
    assert (done.shipped, done.waiting, done.final) == (TRAIN_PER_STEP, 0, True)
    assert main(["info", cfg.run_dir]) == 0
    assert f"{TRAIN_PER_STEP} shipped, 0 waiting; finished" in capsys.readouterr().out


def test_a_lag_file_not_rewritten_reads_as_stale_and_names_the_catch_up() -> None:
    """A process that stopped writing its lag file is called gone or stuck; failures name the export command."""
    now = 1_000_000.0
    record = lag.LagRecord("mlflow", "h", 7, now - 60, shipped=3, failed=2, waiting=1, path="/runs/r/_lag.x.json")
    line = record.describe(now)
    assert record.stale(now)
    assert "3 shipped, 1 waiting (oldest 0.0 s), 2 failed" in line
    assert "no update for 60 s: the process is gone or stuck" in line
    assert line.endswith("catch up: rollout-trace export /runs/r --to mlflow")
    assert not lag.LagRecord("mlflow", "h", 7, now - 1).stale(now)

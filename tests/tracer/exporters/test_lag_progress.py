"""A live driver's progress snapshot is what its lag file is made of (a real console driver fed recorded spans)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from export_fixtures import (
    EXPERIMENT,
    PROJECT,
    TRAIN_PER_STEP,
    WAIT_S,
    lag_on_every_look,
    record_rollouts,
    wait_for_lag,
)

import tracer
from tracer import schema as S
from tracer.exporters import lag
from tracer.exporters.attach import attach_backend

#: Lag-file fields that are counts copied from the snapshot (waiting and its age are derived from it).
COPIED = ("shipped", "failed", "running", "queued_spans", "dropped_spans")


def test_every_count_a_lag_file_holds_comes_from_the_snapshot() -> None:
    """The lag record's counts are fields of the snapshot, and the rest is what the reporter itself knows."""
    snapshot = {f.name for f in dataclasses.fields(lag.DriverProgress)}
    written = {f.name for f in dataclasses.fields(lag.LagRecord)}
    assert set(COPIED) <= snapshot & written
    assert written - set(COPIED) == {
        "backend", "host", "pid", "written_at", "waiting", "oldest_waiting_s", "final", "every_s", "path",
    }  # fmt: skip


def test_a_live_drivers_progress_matches_its_lag_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1 held (step 2 still running): held, running and shipped agree with the lag file, then after shutdown."""
    lag_on_every_look(monkeypatch)
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        output_dir=str(tmp_path),
        flush_interval_s=0.1,
        backend_options={"console_print": False},
    )
    record_rollouts(steps=(1, 2), val_per_step=0)
    tracer.shutdown()
    spans = tracer.read_spans(cfg.run_dir)
    step = spans.column(S.STEP)
    first = spans.filter(pc.equal(step, 1))
    # One trajectory of step 2 without its root: running, and step 1 not complete yet.
    tid = pc.filter(spans.column(S.TRACE_ID), pc.equal(step, 2))[0].as_py()
    running = spans.filter(pc.and_(pc.equal(spans.column(S.TRACE_ID), tid), pc.equal(spans.column(S.KIND), "llm")))
    driver = attach_backend("console", cfg)
    try:
        for batch in pa.concat_tables([first, running]).to_batches():
            driver.export(batch)
        deadline = time.monotonic() + WAIT_S
        while len(driver.progress().held) < TRAIN_PER_STEP and time.monotonic() < deadline:
            time.sleep(0.05)  # past the grace period: step 1 finished and held
        progress = driver.progress()
        held = wait_for_lag(cfg.run_dir, lambda r: r.waiting == TRAIN_PER_STEP and r.running == 1)
        assert len(set(progress.held)) == TRAIN_PER_STEP and not progress.in_grace
        assert set(progress.held) == set(pc.unique(first.column(S.TRACE_ID)).to_pylist())
        assert (progress.shipped, progress.running, progress.queued_spans) == (0, 1, 0)
        assert {k: getattr(held, k) for k in COPIED} == {k: getattr(progress, k) for k in COPIED}
    finally:
        driver.shutdown(60)
    done = lag.read_lag(cfg.run_dir)[0]
    progress = driver.progress()
    assert done.final and (done.waiting, progress.held, dict(progress.in_grace)) == (0, (), {})
    assert {k: getattr(done, k) for k in COPIED} == {k: getattr(progress, k) for k in COPIED}
    assert progress.shipped == TRAIN_PER_STEP + 1  # shutdown writes the rootless trajectory too

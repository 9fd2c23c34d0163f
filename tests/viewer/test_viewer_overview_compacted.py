"""The overview of a compacted run (its aggregates and sorted values from the compacted file's index):
the same page as from every trajectory row."""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

from storage_fixtures import copy_run
from viewer_fixtures import record_run

import tracer
from tracer.storage.compact import compact
from viewer import data as D


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return bool(a == b)


def test_a_compacted_runs_overview_is_its_trajectory_rows_overview(tmp_path: Any) -> None:
    """Tiles and per-step rows from the compacted files' indexes equal those of every trajectory row."""
    run = record_run(tmp_path / "rec")
    tracer.shutdown()
    copy = os.fspath(tmp_path / "copy")
    copy_run(run, copy)
    report = compact(copy)
    assert report.files_out == 1 and not report.failed
    rows = D.load_trajectories(copy).table
    parts = D.load_step_partials(copy).table
    got, want = D.overview_of(parts), D.overview(rows)
    assert [r.keys() for r in got] == [r.keys() for r in want]
    assert all(_same(a[k], b[k]) for a, b in zip(got, want, strict=True) for k in a)
    span_rows = D.list_steps(copy).rows
    assert D.totals_of(parts, span_rows) == D.run_totals(rows, span_rows)
    assert D.overview_of(D.load_step_partials(run).table) == got  # and the run before compaction

"""trackio exporter: wandb's per-step tables and metrics in a trackio run (a local SQLite store under ``TRACKIO_DIR``,
which ``trackio show`` opens)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tracer import schema as S
from tracer.exporters.base import ExportReport, ReadBack, Target
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.steps import TableSink
from tracer.exporters.tables import STEP_KEY, TABLE_COLUMNS, TABLE_KEY, VAL_TABLE_KEY, StepData
from tracer.extras import import_backend

#: Key of trackio's own step in each logged entry of its store.
TRACKIO_STEP = "step"


class TrackioSink(TableSink):
    """Per-step tables and metrics into one trackio run (a run of its own per export, and per live recorder)."""

    def start(self, target: Target) -> Any:
        """Start the run."""
        self._project, self._name = (self.run_names(target)[k] for k in ("project", "name"))
        run = import_backend("trackio", "trackio").init(
            project=self._project,
            name=self._name,
            config=dict(target.run_config or {}),
            auto_log_cpu=False,
            auto_log_gpu=False,
        )
        self._name = getattr(run, "name", self._name)
        return run

    def log_step(self, data: StepData, step: int) -> list[str]:
        """Log the step's tables and metrics at ``step``."""
        trackio = import_backend("trackio", "trackio")
        self.run.log(self.payload(data, lambda rows: trackio.Table(columns=list(TABLE_COLUMNS), data=rows)), step=step)
        return []

    def close(self) -> list[str]:
        """Finish the run; say where its store is."""
        if self.run is None:
            return []
        self.run.finish()
        from trackio.utils import TRACKIO_DIR

        return [f"trackio run {self._project}/{self._name} in {TRACKIO_DIR}; browse it with: trackio show"]

    def read_back(self) -> ReadBack:
        """The rows and metrics the finished run holds in trackio's local store."""
        return ReadBack(*read_back(self._project, str(self._name)), where=f"trackio {self._project}/{self._name}")


def read_back(project: str, run: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics (``(rollout step, key) -> value``) of a trackio run's store."""
    from trackio.sqlite_storage import SQLiteStorage

    rows: dict[str, float | None] = {}
    metrics: dict[tuple[Any, str], float] = {}
    for entry in SQLiteStorage.get_logs(project, run):
        rollout_step = entry.get(STEP_KEY, entry.get(TRACKIO_STEP))
        for key, value in entry.items():
            if key in (TABLE_KEY, VAL_TABLE_KEY) and isinstance(value, Mapping):
                rows.update((row[S.TRACE_ID], row[S.REWARD]) for row in value.get("_value") or ())
            elif key.startswith("rollout_trace") and key != STEP_KEY and isinstance(value, (int, float)):
                metrics[(rollout_step, key)] = float(value)
    return rows, metrics


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to one trackio run (:func:`tracer.exporters.export_files` with ``to="trackio"``)."""
    return _export_files(path, "trackio", **options)

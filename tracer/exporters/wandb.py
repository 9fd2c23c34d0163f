"""WandB exporter: per-step trajectory tables and rollout metrics.

Each step logs an incremental table's new rows (``rollout_trace/table``;
``rollout_trace_val/table``, at most ``log_val_generations``) and its metrics
(``rollout_trace/...``) against ``rollout_trace/step``. A step with more rows than a
logged table keeps (``wandb.Table.MAX_ROWS``) is split into several increments at the
same step, and the report says so.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tracer.exporters.base import ExportReport, Target
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.steps import TableSink, backend_step
from tracer.exporters.tables import (
    METRIC_PREFIX,
    TABLE_COLUMNS,
    TABLE_KEY,
    VAL_METRIC_PREFIX,
    VAL_TABLE_KEY,
    StepData,
    read_leveldb_log,
)
from tracer.extras import import_backend

logger = logging.getLogger("rollout_trace")

#: Metric that every logged step carries; charts of our metrics use it as x-axis.
STEP_METRIC = "rollout_trace/step"
#: Header of a ``.wandb`` run file.
WANDB_FILE_IDENT = b":W&B"


def _wandb() -> Any:
    return import_backend("wandb", "wandb")


class WandbRun:
    """One wandb run receiving per-step tables and metrics (``mode`` None: ``WANDB_MODE`` or wandb's default;
    ``run_dir``: wandb's ``dir``; ``proxy``: verl's ``wandb_proxy``; ``max_rows`` per table increment)."""

    def __init__(
        self,
        project: str,
        name: str | None,
        mode: str | None = None,
        run_dir: str | None = None,
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
        proxy: str | None = None,
        max_rows: int | None = None,
        job_type: str = "rollout_trace",
    ) -> None:
        wandb = _wandb()
        self._wandb = wandb
        settings = wandb.Settings(https_proxy=proxy, http_proxy=proxy) if proxy else None
        if run_dir is not None:
            os.makedirs(run_dir, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            group=group,
            job_type=job_type,
            dir=run_dir,
            mode=mode,
            config=dict(config or {}),
            settings=settings,
            reinit="create_new",
        )
        self.run.define_metric(STEP_METRIC)
        for prefix in (METRIC_PREFIX, VAL_METRIC_PREFIX):
            self.run.define_metric(prefix + "*", step_metric=STEP_METRIC)
        self.max_rows = min(max_rows or wandb.Table.MAX_ROWS, wandb.Table.MAX_ROWS)
        self.tables = {
            key: wandb.Table(columns=list(TABLE_COLUMNS), log_mode="INCREMENTAL") for key in (TABLE_KEY, VAL_TABLE_KEY)
        }
        self._last_wandb_step = -1
        self._last_step: int | None = None
        #: Where the run's files are (``.../offline-run-*`` or ``.../run-*``).
        self.directory = os.path.dirname(self.run.dir)

    def log_step(self, data: StepData) -> list[str]:
        """Log one step's rows (split at ``max_rows``) and metrics; return notes on splits."""
        wandb_step = backend_step(data.step, self._last_wandb_step, self._last_step, same_again=True)
        notes = []
        parts: dict[str, list[list[list[Any]]]] = {}
        for key, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)):
            parts[key] = [rows[i : i + self.max_rows] for i in range(0, len(rows), self.max_rows)]
            if len(parts[key]) > 1:
                notes.append(
                    f"step {data.step}: {len(rows)} rows of {key} split into {len(parts[key])} table increments "
                    f"of at most {self.max_rows} rows (a logged wandb table keeps at most wandb.Table.MAX_ROWS = "
                    f"{self._wandb.Table.MAX_ROWS}), all logged at that step"
                )
        payload: dict[str, Any] = dict(data.metrics)
        if data.step is not None:
            payload[STEP_METRIC] = data.step
        for i in range(max((len(p) for p in parts.values()), default=0) or 1):
            for key, chunks in parts.items():
                if i < len(chunks):
                    table = self.tables[key]
                    for row in chunks[i]:
                        table.add_data(*row)
                    payload[key] = table
            if payload:
                self.run.log(payload, step=wandb_step)
            payload = {}
        self._last_wandb_step = wandb_step
        self._last_step = data.step
        return notes

    def finish(self) -> None:
        """Finish the run (its files are complete afterwards)."""
        self.run.finish()


def read_back(directory: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics a finished wandb run holds.

    Reads the table increments under ``files/media/table`` and the history records of the ``.wandb`` file.
    """
    rows: dict[str, float | None] = {}
    for key in (TABLE_KEY, VAL_TABLE_KEY):
        pattern = os.path.join(
            directory, "files", "media", "table", *key.split("/")[:-1], key.split("/")[-1] + "_*.table.json"
        )
        for file in sorted(glob.glob(pattern)):
            with open(file, encoding="utf-8") as f:
                table = json.load(f)
            cols = table["columns"]
            t, r = cols.index("trace_id"), cols.index("reward")
            for row in table["data"]:
                rows[row[t]] = row[r]
    metrics: dict[tuple[Any, str], float] = {}
    files = glob.glob(os.path.join(directory, "*.wandb"))
    if files:
        from wandb.proto import wandb_internal_pb2 as pb

        for raw in read_leveldb_log(files[0], WANDB_FILE_IDENT):
            record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module, no stubs
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {(i.key or "/".join(i.nested_key)): i.value_json for i in record.history.item}
            step = json.loads(items[STEP_METRIC]) if STEP_METRIC in items else None
            for key, value in items.items():
                if (
                    key.startswith((METRIC_PREFIX, VAL_METRIC_PREFIX))
                    and key != STEP_METRIC
                    and not key.startswith((TABLE_KEY + "/", VAL_TABLE_KEY + "/"))
                ):
                    metrics[(step, key)] = float(json.loads(value))
    return rows, metrics


class WandbSink(TableSink):
    """Per-step tables and metrics into one wandb run.

    Live, the run is named after the experiment, grouped by it, started on the driver's thread at the first
    write, in ``WANDB_MODE``/wandb's mode. Post hoc, every export is a new run (mode ``offline`` by default).
    """

    read_files = staticmethod(read_back)

    def start(self, target: Target) -> WandbRun:
        """Start the run."""
        o = self.options
        return WandbRun(
            **self.run_names(target), mode=o["mode"], run_dir=o["run_dir"], proxy=o["proxy"], max_rows=o["max_rows"]
        )

    def confirms(self) -> bool:
        """An offline run is files here: read back after every export."""
        return self.options["mode"] == "offline"

    def close(self) -> list[str]:
        """Finish the run; say where its files are."""
        if self.run is None:
            return []
        self.run.finish()
        wandb = _wandb()
        if wandb.run is None:
            wandb.teardown()
        notes = [f"wandb run files: {self.run.directory}"]
        if self.options["mode"] == "offline":
            notes.append(f"upload it with: wandb sync {self.run.directory}")
        return notes


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to one wandb run (:func:`tracer.exporters.export_files` with ``to="wandb"``)."""
    return _export_files(path, "wandb", **options)

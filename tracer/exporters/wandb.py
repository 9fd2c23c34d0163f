"""WandB exporter: per-step trajectory tables and rollout metrics.

Each step logs an incremental table's new rows (``rollout_trace/table``; ``rollout_trace_val/table``, at most
``log_val_generations``) and its metrics (``rollout_trace/...``) against ``rollout_trace/step``. A step with more rows
than a logged table keeps (``wandb.Table.MAX_ROWS``) is split into several increments at the same step, and the report
says so.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from tracer.exporters.base import ExportReport, ReadBack, Target
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.steps import TableSink
from tracer.exporters.tables import (
    METRIC_PREFIX,
    STEP_KEY,
    TABLE_COLUMNS,
    TABLE_KEY,
    VAL_METRIC_PREFIX,
    VAL_TABLE_KEY,
    StepData,
    read_leveldb_log,
)
from tracer.extras import import_backend

#: Header of a ``.wandb`` run file.
WANDB_FILE_IDENT = b":W&B"


def read_back(directory: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics a finished wandb run holds: its table increments under
    ``files/media/table`` and the history records of its ``.wandb`` file."""
    rows: dict[str, float | None] = {}
    for key in (TABLE_KEY, VAL_TABLE_KEY):
        pattern = os.path.join(directory, "files", "media", "table", *key.split("/")) + "_*.table.json"
        for file in sorted(glob.glob(pattern)):
            with open(file, encoding="utf-8") as f:
                table = json.load(f)
            t, r = table["columns"].index("trace_id"), table["columns"].index("reward")
            rows.update((row[t], row[r]) for row in table["data"])
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
            step = json.loads(items[STEP_KEY]) if STEP_KEY in items else None
            for key, value in items.items():
                ours = key.startswith((METRIC_PREFIX, VAL_METRIC_PREFIX)) and key != STEP_KEY
                if ours and not key.startswith((TABLE_KEY + "/", VAL_TABLE_KEY + "/")):
                    metrics[(step, key)] = float(json.loads(value))
    return rows, metrics


class WandbSink(TableSink):
    """Per-step tables and metrics into one wandb run (options ``mode``, ``run_dir``: wandb's ``dir``, ``proxy``:
    verl's ``wandb_proxy``, ``max_rows`` per table increment). Live, the run is named after the experiment, grouped
    by it, started on the driver's thread at the first write, in ``WANDB_MODE``/wandb's mode. Post hoc, every export
    is a new run (mode ``offline`` by default)."""

    same_again = True

    def start(self, target: Target) -> Any:
        """Start the run, its step metric and its two incremental tables."""
        wandb, o = import_backend("wandb", "wandb"), self.options
        proxy = o["proxy"]
        if o["run_dir"] is not None:
            os.makedirs(o["run_dir"], exist_ok=True)
        run = wandb.init(
            **self.run_names(target),
            job_type="rollout_trace",
            dir=o["run_dir"],
            mode=o["mode"],
            settings=wandb.Settings(https_proxy=proxy, http_proxy=proxy) if proxy else None,
            reinit="create_new",
        )
        run.define_metric(STEP_KEY)
        for prefix in (METRIC_PREFIX, VAL_METRIC_PREFIX):
            run.define_metric(prefix + "*", step_metric=STEP_KEY)
        self.max_rows = min(o["max_rows"] or wandb.Table.MAX_ROWS, wandb.Table.MAX_ROWS)
        self.tables = {
            k: wandb.Table(columns=list(TABLE_COLUMNS), log_mode="INCREMENTAL") for k in (TABLE_KEY, VAL_TABLE_KEY)
        }
        self.destination = os.path.dirname(run.dir)  # .../offline-run-* or .../run-*
        return run

    def log_step(self, data: StepData, step: int) -> list[str]:
        """Log the step's rows (split at ``max_rows``, all at ``step``) and metrics; return notes on splits."""
        notes = []
        parts: dict[str, list[list[list[Any]]]] = {}
        for key, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)):
            parts[key] = [rows[i : i + self.max_rows] for i in range(0, len(rows), self.max_rows)]
            if len(parts[key]) > 1:
                notes.append(
                    f"step {data.step}: {len(rows)} rows of {key} split into {len(parts[key])} table increments "
                    f"of at most {self.max_rows} rows (a logged wandb table keeps at most wandb.Table.MAX_ROWS = "
                    f"{import_backend('wandb', 'wandb').Table.MAX_ROWS}), all logged at that step"
                )
        payload = self.payload(data)
        for i in range(max((len(p) for p in parts.values()), default=0) or 1):
            for key, chunks in parts.items():
                if i < len(chunks):
                    for row in chunks[i]:
                        self.tables[key].add_data(*row)
                    payload[key] = self.tables[key]
            if payload:
                self.run.log(payload, step=step)
            payload = {}
        return notes

    def read_back(self) -> ReadBack:
        """The rows and metrics of the finished run's files."""
        return ReadBack(*read_back(self.destination), where=self.destination)

    def confirms(self) -> bool:
        """An offline run is files here: read back after every export."""
        return self.options["mode"] == "offline"

    def close(self) -> list[str]:
        """Finish the run; say where its files are."""
        if self.run is None:
            return []
        self.run.finish()
        wandb = import_backend("wandb", "wandb")
        if wandb.run is None:
            wandb.teardown()
        notes = [f"wandb run files: {self.destination}"]
        if self.options["mode"] == "offline":
            notes.append(f"upload it with: wandb sync {self.destination}")
        return notes


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to one wandb run (:func:`tracer.exporters.export_files` with ``to="wandb"``)."""
    return _export_files(path, "wandb", **options)

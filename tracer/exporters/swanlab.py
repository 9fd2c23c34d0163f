"""SwanLab exporter: per-step trajectory tables, conversations and rollout metrics.

Each step logs tables of its training and validation trajectories, the first :data:`MAX_TEXTS` conversations as
``swanlab.Text`` and its metrics. Modes: ``local`` (browsed with ``swanlab watch``; needs ``swanboard``, else written as
``offline``, the same files), ``offline`` (``swanlab sync`` later), ``online``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from typing import Any

from tracer import schema as S
from tracer.exporters.base import ExportReport, ReadBack, Target
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.steps import TableSink
from tracer.exporters.tables import COL, STEP_KEY, TABLE_COLUMNS, TABLE_KEY, VAL_TABLE_KEY, StepData, read_leveldb_log
from tracer.extras import import_backend

#: Key of the per-step conversation texts.
TEXT_KEY = "rollout_trace/conversations"
#: Conversations logged as ``swanlab.Text`` per step (all are in the table).
MAX_TEXTS = 8
#: Header of a ``.swanlab`` run file.
SWANLAB_FILE_IDENT = b":SWL"


def read_back(directory: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics a finished SwanLab run's files hold."""
    from swanlab.proto.swanlab.record.v1 import record_pb2

    rows: dict[str, float | None] = {}
    scalars: dict[tuple[int, str], float] = {}
    files = glob.glob(os.path.join(directory, "*.swanlab"))
    if not files:
        return rows, {}
    for raw in read_leveldb_log(files[0], SWANLAB_FILE_IDENT):
        record = record_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "media" and record.media.key in (TABLE_KEY, VAL_TABLE_KEY):
            for item in record.media.value.items:
                with open(os.path.join(directory, "media", "echarts", item.filename), encoding="utf-8") as f:
                    table = json.load(f)
                rows.update((row[S.TRACE_ID], row[S.REWARD]) for row in table.get("rowData", []))
        elif kind == "scalar":
            scalars[(record.scalar.step, record.scalar.key)] = record.scalar.value.number
    # Metrics are keyed by the rollout step each logged step carries.
    step_of = {s: int(v) for (s, k), v in scalars.items() if k == STEP_KEY}
    metrics = {(step_of.get(s, s), k): v for (s, k), v in scalars.items() if k != STEP_KEY}
    return rows, metrics


class SwanlabSink(TableSink):
    """Per-step tables, conversations and metrics into one SwanLab run: live, the process's active run (left running at
    :meth:`close`), else one named after the experiment; post hoc, a run of its own (mode ``local`` by default)."""

    def start(self, target: Target) -> Any:
        """Start (or, live, join) the run."""
        swanlab = import_backend("swanlab", "swanlab")
        self.note: str | None = None
        self.mode = self.options["mode"]
        self.owned = not (target.live and swanlab.has_run())
        if self.owned:
            if self.mode == "local" and importlib.util.find_spec("swanboard") is None:
                self.mode = "offline"
                self.note = (
                    "swanlab local mode needs the swanboard package (pip install swanboard); wrote an offline run "
                    "instead, with the same files"
                )
            if self.options["log_dir"] is not None:
                os.makedirs(self.options["log_dir"], exist_ok=True)
            run = swanlab.init(**self.run_names(target), mode=self.mode, log_dir=self.options["log_dir"])
        else:
            run = swanlab.get_run()
        self.destination = os.fspath(run.dir)  # its .swanlab file and media/
        return run

    def log_step(self, data: StepData, step: int) -> list[str]:
        """Log the step's tables, first :data:`MAX_TEXTS` conversation texts and metrics at ``step``."""
        swanlab = import_backend("swanlab", "swanlab")

        def table(rows: list[list[Any]]) -> Any:
            out = swanlab.echarts.Table()
            out.add(list(TABLE_COLUMNS), [list(r) for r in rows])
            return out

        payload = self.payload(data, table)
        texts = [
            swanlab.Text(
                r[COL["conversation"]],
                caption=f"sample {r[COL[S.SAMPLE_INDEX]]} rollout {r[COL[S.ROLLOUT_N]]} reward {r[COL[S.REWARD]]}",
            )
            for r in data.rows[:MAX_TEXTS]
        ]
        if texts:
            payload[TEXT_KEY] = texts
        self.run.log(payload, step=step)
        return []

    def read_back(self) -> ReadBack:
        """The rows and metrics of the finished run's files."""
        return ReadBack(*read_back(self.destination), where=self.destination)

    def confirms(self) -> bool:
        """A local or offline run is files here: read back after every export."""
        return self.options["mode"] != "online"

    def close(self) -> list[str]:
        """Finish the run if this sink started it; say where its files are."""
        if self.run is None:
            return []
        if self.owned:
            self.run.finish()
        notes = [self.note] if self.note else []
        notes.append(f"swanlab run files: {self.destination}")
        if self.mode == "offline":
            notes.append(f"upload it with: swanlab sync {self.destination}")
        elif self.mode == "local":
            notes.append(f"browse it with: swanlab watch {os.path.dirname(self.destination)}")
        return notes


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to one SwanLab run (:func:`tracer.exporters.export_files` with ``to="swanlab"``)."""
    return _export_files(path, "swanlab", **options)

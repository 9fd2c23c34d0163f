"""SwanLab exporter: per-step trajectory tables, conversations and rollout metrics.

Each step logs tables of its training and validation trajectories, the first
:data:`MAX_TEXTS` conversations as ``swanlab.Text`` and its metrics. Modes:
``local`` (browsed with ``swanlab watch``; needs ``swanboard``, else written as
``offline``, the same files), ``offline`` (``swanlab sync`` later), ``online``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from collections.abc import Mapping
from typing import Any

from tracer import schema as S
from tracer.exporters.base import ExportReport, Target
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.steps import TableSink, backend_step
from tracer.exporters.tables import (
    COL,
    TABLE_COLUMNS,
    TABLE_KEY,
    VAL_TABLE_KEY,
    StepData,
    read_leveldb_log,
)
from tracer.extras import import_backend

#: Key of the per-step conversation texts.
TEXT_KEY = "rollout_trace/conversations"
#: Conversations logged as ``swanlab.Text`` per step (all are in the table).
MAX_TEXTS = 8
#: Header of a ``.swanlab`` run file.
SWANLAB_FILE_IDENT = b":SWL"


def _swanlab() -> Any:
    return import_backend("swanlab", "swanlab")


def effective_mode(mode: str) -> tuple[str, str | None]:
    """The mode to run in and a note when ``local`` falls back to ``offline`` (no swanboard)."""
    if mode == "local" and importlib.util.find_spec("swanboard") is None:
        return "offline", (
            "swanlab local mode needs the swanboard package (pip install swanboard); wrote an offline run "
            "instead, with the same files"
        )
    return mode, None


class SwanlabRun:
    """A SwanLab run receiving per-step tables and metrics; the process's own (``swanlab.get_run()``) when it has
    one, left running at :meth:`finish`."""

    def __init__(
        self,
        project: str,
        name: str | None,
        mode: str | None,
        log_dir: str | None,
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
        use_current: bool = True,
    ) -> None:
        swanlab = _swanlab()
        self._swanlab = swanlab
        self.note: str | None = None
        self.owned = not (use_current and swanlab.has_run())
        if self.owned:
            if mode is not None:
                mode, self.note = effective_mode(mode)
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
            self.run = swanlab.init(
                project=project,
                name=name,
                group=group,
                mode=mode,
                log_dir=log_dir,
                config=dict(config or {}),
            )
        else:
            self.run = swanlab.get_run()
        self.mode = mode
        #: The run's directory (its ``.swanlab`` file and ``media/``).
        self.directory = os.fspath(self.run.dir)
        self._last_swanlab_step = -1
        self._last_step: int | None = None

    def log_step(self, data: StepData) -> list[str]:
        """Log one step's tables, conversation texts and metrics at that step; return notes (none)."""
        swanlab = self._swanlab
        # A step published again (late trajectories) goes one later: SwanLab keeps one value per step and key.
        sl_step = backend_step(data.step, self._last_swanlab_step, self._last_step, same_again=False)
        payload: dict[str, Any] = dict(data.metrics)
        for key, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)):
            if rows:
                table = swanlab.echarts.Table()
                table.add(list(TABLE_COLUMNS), [list(r) for r in rows])
                payload[key] = table
        texts = [
            swanlab.Text(
                r[COL["conversation"]],
                caption=f"sample {r[COL[S.SAMPLE_INDEX]]} rollout {r[COL[S.ROLLOUT_N]]} reward {r[COL[S.REWARD]]}",
            )
            for r in data.rows[:MAX_TEXTS]
        ]
        if texts:
            payload[TEXT_KEY] = texts
        if data.step is not None:
            payload["rollout_trace/step"] = data.step
        self.run.log(payload, step=sl_step)
        self._last_swanlab_step = sl_step
        self._last_step = data.step
        return []

    def finish(self) -> None:
        """Finish the run if this object started it."""
        if self.owned:
            self.run.finish()


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
                for row in table.get("rowData", []):
                    rows[row[S.TRACE_ID]] = row[S.REWARD]
        elif kind == "scalar":
            scalars[(record.scalar.step, record.scalar.key)] = record.scalar.value.number
    # Metrics are keyed by the rollout step each logged step carries.
    step_of = {s: int(v) for (s, k), v in scalars.items() if k == "rollout_trace/step"}
    metrics = {(step_of.get(s, s), k): v for (s, k), v in scalars.items() if k != "rollout_trace/step"}
    return rows, metrics


class SwanlabSink(TableSink):
    """Per-step tables, conversations and metrics into one SwanLab run.

    Live, the process's active run, else one named after the experiment started at the first write. Post hoc,
    every export is a run of its own (mode ``local`` by default).
    """

    read_files = staticmethod(read_back)

    def start(self, target: Target) -> SwanlabRun:
        """Start (or, live, join) the run."""
        return SwanlabRun(
            **self.run_names(target),
            mode=self.options["mode"],
            log_dir=self.options["log_dir"],
            use_current=target.live,
        )

    def confirms(self) -> bool:
        """A local or offline run is files here: read back after every export."""
        return self.options["mode"] != "online"

    def close(self) -> list[str]:
        """Finish the run if this sink started it; say where its files are."""
        sl = self.run
        if sl is None:
            return []
        sl.finish()
        notes = [sl.note] if sl.note else []
        notes.append(f"swanlab run files: {sl.directory}")
        if sl.mode == "offline":
            notes.append(f"upload it with: swanlab sync {sl.directory}")
        elif sl.mode == "local":
            notes.append(f"browse it with: swanlab watch {os.path.dirname(sl.directory)}")
        return notes


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to one SwanLab run (:func:`tracer.exporters.export_files` with ``to="swanlab"``)."""
    return _export_files(path, "swanlab", **options)

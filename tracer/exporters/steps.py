"""TableSink: what the table-shaped sinks (WandB, SwanLab, trackio) share.

A :class:`~tracer.exporters.base.StepBatch` becomes a :class:`~tracer.exporters.tables.StepData`:
one row per new trajectory, validation rows capped at ``log_val_generations`` per step,
metrics under the ``rollout_trace/`` and ``rollout_trace_val/`` prefixes.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.base import NEW, ReadBack, SinkBase, StepBatch, Target, Written
from tracer.exporters.tables import (
    COL,
    METRIC_PREFIX,
    ROW_SPAN_COLUMNS,
    VAL_METRIC_PREFIX,
    StepData,
    trajectory_row,
)


def backend_step(step: int | None, last_backend: int, last_step: int | None, same_again: bool) -> int:
    """The backend's step to log rollout ``step`` at: the step itself while it rises, else one past the last
    (``same_again``: a step published again is logged at the backend step it had)."""
    if step is not None and step == last_step:
        return last_backend if same_again else last_backend + 1
    return step if step is not None and step > last_backend else last_backend + 1


class TableSink(SinkBase):
    """Base of sinks that log per-step tables and metrics to a run that :meth:`start` returns."""

    span_columns: ClassVar[tuple[str, ...]] = ROW_SPAN_COLUMNS
    #: Reads a finished run's files back: ``directory -> (rows, metrics)``.
    read_files: ClassVar[Any] = None

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.cap = 10
        self._val_written: dict[int | None, int] = {}
        #: The backend's run (``directory``, ``log_step(data)``, ``finish()``); None before :meth:`open`.
        self.run: Any = None
        self.destination = self.options.get("run_dir") or self.options.get("log_dir") or ""

    def start(self, target: Target) -> Any:
        """Start the backend's run for ``target``."""
        raise NotImplementedError

    def run_names(self, target: Target) -> dict[str, Any]:
        """The run's project, name, group and config: the options', else the target's."""
        project = self.options.get("project") or target.project or "rollout_trace"
        name = self.options.get("experiment") or target.experiment
        return {"project": project, "name": name, "group": target.experiment, "config": target.run_config}

    def open(self, target: Target) -> set[str]:
        """Keep the run's validation cap and start the run."""
        self.cap = target.log_val_generations
        self.run = self.start(target)
        self.destination = getattr(self.run, "directory", self.destination)
        return set()

    def log_step(self, data: StepData) -> list[str]:
        """Send one step's new rows and its metrics; return notes for the report."""
        assert self.run is not None, "open() first"
        notes: list[str] = self.run.log_step(data)
        return notes

    def read_back(self) -> ReadBack:
        """The rows and metrics of the finished run's files."""
        assert self.run is not None, "open() first"
        rows, metrics = type(self).read_files(self.run.directory)
        return ReadBack(rows, metrics, where=self.run.directory)

    def write(self, batch: StepBatch) -> Written:
        """Build the step's rows and metrics and log them."""
        data = StepData(batch.step)
        for validate, values in (batch.metrics or {}).items():
            prefix = VAL_METRIC_PREFIX if validate else METRIC_PREFIX
            data.metrics.update({prefix + k: float(v) for k, v in values.items()})
            data.raw_metrics[validate] = dict(values)
        room = max(self.cap - self._val_written.get(batch.step, 0), 0)
        # Late spans (t.state LATE): the row is logged already; nothing was there before a table export.
        new = [t for t in batch.trajectories if t.state == NEW]
        validation = [t for t in new if t.summary[S.VALIDATE]]
        data.val_dropped = max(len(validation) - room, 0)
        shown = [t for t in new if not t.summary[S.VALIDATE]] + validation[:room]
        refused_before = len(self.refused)
        for t, row in self.payloads(shown, lambda t: trajectory_row(t.summary, t.spans)):
            (data.val_rows if t.summary[S.VALIDATE] else data.rows).append(row)
        notes = list(self.log_step(data))
        self._val_written[batch.step] = self._val_written.get(batch.step, 0) + len(data.val_rows)
        if data.val_dropped:
            notes.append(
                f"step {data.step}: {data.val_dropped} validation trajectories left out of the table "
                f"(log_val_generations={self.cap})"
            )
        refused = len(self.refused) - refused_before  # counted as sent: the drivers take them back out
        written = Written(sent=len(data.rows) + len(data.val_rows) + refused, skipped=data.val_dropped, notes=notes)
        for row in (*data.rows, *data.val_rows):
            written.rows[row[COL[S.TRACE_ID]]] = row[COL[S.REWARD]]
        if data.step is not None:
            written.metrics.update({(data.step, k): v for k, v in data.metrics.items()})
        return written

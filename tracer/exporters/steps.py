"""TableSink: what the table-shaped sinks (WandB, SwanLab) share.

A :class:`~tracer.exporters.base.StepBatch` becomes a
:class:`~tracer.exporters.tables.StepData`: one table row per new trajectory
(:func:`~tracer.exporters.tables.trajectory_row`), validation rows capped at
``log_val_generations`` per step (counting rows of the step written before),
metrics under the ``rollout_trace/`` and ``rollout_trace_val/`` prefixes.
A subclass opens its run and implements :meth:`TableSink.log_step`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.base import NEW, SinkBase, StepBatch, Target, Written
from tracer.exporters.tables import (
    COL,
    METRIC_PREFIX,
    ROW_SPAN_COLUMNS,
    VAL_METRIC_PREFIX,
    StepData,
    trajectory_row,
)


class TableSink(SinkBase):
    """Base of sinks that log per-step tables and metrics; implement :meth:`log_step`."""

    span_columns: ClassVar[tuple[str, ...]] = ROW_SPAN_COLUMNS

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.cap = 10
        self._val_written: dict[int | None, int] = {}

    def open(self, target: Target) -> set[str]:
        """Keep the run's validation cap; a subclass starts its run and calls this."""
        self.cap = target.log_val_generations
        return set()

    def log_step(self, data: StepData) -> list[str]:
        """Send one step's new rows and its metrics; return notes for the report."""
        raise NotImplementedError

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

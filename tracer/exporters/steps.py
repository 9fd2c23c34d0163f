"""TableSink: what the table sinks (WandB, SwanLab, trackio) share: a :class:`~tracer.exporters.base.StepBatch` as
one table row per new trajectory (validation rows capped at ``log_val_generations`` per step) and its metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.base import NEW, SinkBase, StepBatch, Target, Written
from tracer.exporters.tables import (
    COL,
    METRIC_PREFIX,
    ROW_SPAN_COLUMNS,
    STEP_KEY,
    TABLE_KEY,
    VAL_METRIC_PREFIX,
    VAL_TABLE_KEY,
    StepData,
    trajectory_row,
)


class TableSink(SinkBase):
    """Base of sinks that log per-step tables and metrics to the run that :meth:`open` starts."""

    span_columns: ClassVar[tuple[str, ...]] = ROW_SPAN_COLUMNS
    #: A step published again (late trajectories) is logged at the backend step it had, not one later.
    same_again: ClassVar[bool] = False

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.cap = 10
        self._val_written: dict[int | None, int] = {}
        #: The backend's run; None before :meth:`open`.
        self.run: Any = None
        self.destination = self.options.get("run_dir") or self.options.get("log_dir") or ""
        self._last_backend_step = -1
        self._last_step: int | None = None

    def start(self, target: Target) -> Any:
        """Start the backend's run for ``target`` (and set :attr:`destination` to its directory)."""
        raise NotImplementedError

    def log_step(self, data: StepData, step: int) -> list[str]:
        """Send one step's new rows and its metrics at backend step ``step``; return notes for the report."""
        raise NotImplementedError

    def run_names(self, target: Target) -> dict[str, Any]:
        """The run's project, name, group and config: the options', else the target's."""
        project = self.options.get("project") or target.project or "rollout_trace"
        name = self.options.get("experiment") or target.experiment
        return {"project": project, "name": name, "group": target.experiment, "config": target.run_config}

    def payload(self, data: StepData, table: Callable[[list[list[Any]]], Any] | None = None) -> dict[str, Any]:
        """The step's metrics, its rollout step and, given ``table``, ``table(rows)`` of its nonempty row lists."""
        out: dict[str, Any] = dict(data.metrics)
        if table is not None:
            out.update({k: table(rows) for k, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)) if rows})
        if data.step is not None:
            out[STEP_KEY] = data.step
        return out

    def open(self, target: Target) -> set[str]:
        """Keep the run's validation cap and start the run."""
        self.cap = target.log_val_generations
        self.run = self.start(target)
        return set()

    def write(self, batch: StepBatch) -> Written:
        """Log the step's rows and metrics at the backend's next step (the rollout step while it rises)."""
        data = StepData(batch.step)
        for validate, values in (batch.metrics or {}).items():
            prefix = VAL_METRIC_PREFIX if validate else METRIC_PREFIX
            data.metrics.update({prefix + k: float(v) for k, v in values.items()})
        room = max(self.cap - self._val_written.get(batch.step, 0), 0)
        # Late spans (t.state LATE): the row is logged already; nothing was there before a table export.
        new = [t for t in batch.trajectories if t.state == NEW]
        validation = [t for t in new if t.summary[S.VALIDATE]]
        dropped = max(len(validation) - room, 0)
        shown = [t for t in new if not t.summary[S.VALIDATE]] + validation[:room]
        for t, row in self.payloads(shown, lambda t: trajectory_row(t.summary, t.spans)):
            (data.val_rows if t.summary[S.VALIDATE] else data.rows).append(row)
        last, step = self._last_backend_step, batch.step
        if step is not None and step == self._last_step:
            at = last if self.same_again else last + 1
        else:
            at = step if step is not None and step > last else last + 1
        notes = list(self.log_step(data, at))
        self._last_backend_step, self._last_step = at, step
        self._val_written[step] = self._val_written.get(step, 0) + len(data.val_rows)
        if dropped:
            notes.append(
                f"step {step}: {dropped} validation trajectories left out of the table (log_val_generations={self.cap})"
            )
        written = Written(sent=len(shown), skipped=dropped, notes=notes)  # the drivers take the refused back out
        written.rows.update((r[COL[S.TRACE_ID]], r[COL[S.REWARD]]) for r in (*data.rows, *data.val_rows))
        if step is not None:
            written.metrics.update({(step, k): v for k, v in data.metrics.items()})
        return written

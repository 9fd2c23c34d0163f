"""StepShipper: live exporters that publish one step at a time.

WandB, SwanLab and the console show per-step tables and metrics. The live
feed (:class:`tracer.exporters.live.LiveShipper`) hands over finished
trajectories in any order; this class keeps them per step and publishes a
step once it is complete (a trajectory of a later step arrived), or on
``flush()``/``shutdown()``. A step published early (by a flush) and later
joined by more trajectories is published again with only the new rows and
metrics over all its trajectories seen so far.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.config import TraceConfig
from tracer.exporters.live import LiveShipper
from tracer.exporters.tables import (
    COL,
    METRIC_PREFIX,
    VAL_METRIC_PREFIX,
    StepData,
    summarize_trajectories,
    trajectory_row,
)
from tracer.summary import step_metrics

#: Steps this far behind the newest one forget their trajectories (a late
#: trajectory of such a step is published with metrics over the late ones only).
KEEP_STEPS = 8


class StepShipper(LiveShipper):
    """Base of live exporters that publish per-step :class:`StepData`; implement :meth:`publish`."""

    def __init__(self, config: TraceConfig, backend: str, **kwargs: Any) -> None:
        # Set before the base class starts its thread.
        self._step_lock = threading.RLock()
        self._summaries: dict[int | None, dict[str, dict[str, Any]]] = {}
        self._rows: dict[int | None, dict[str, list[Any]]] = {}
        self._published: dict[int | None, set[str]] = {}
        self._val_published: dict[int | None, int] = {}
        self._newest: int | None = None
        super().__init__(config, backend, **kwargs)

    # -- to implement ----------------------------------------------------------

    def publish(self, data: StepData) -> None:
        """Send one step's new rows and its metrics to the backend."""
        raise NotImplementedError

    def close_backend(self) -> None:
        """Release the backend after the last publish."""

    # -- LiveShipper -------------------------------------------------------------

    def ship(self, trajectories: list[pa.Table]) -> None:
        """Keep the trajectories by step; publish the steps that are complete."""
        with self._step_lock:
            for spans in trajectories:
                summary = summarize_trajectories(spans).to_pylist()
                if not summary:
                    continue
                traj = summary[0]
                step, tid = traj[S.STEP], traj[S.TRACE_ID]
                if not tid or traj["num_spans"] == 0:
                    # Rewards logged for a trajectory this process did not
                    # record: the files join them (post-hoc export); live, there
                    # is no row to put them on.
                    continue
                self._summaries.setdefault(step, {})[tid] = traj
                if tid not in self._published.get(step, ()):
                    self._rows.setdefault(step, {})[tid] = trajectory_row(traj, spans.to_pylist())
                if step is not None and (self._newest is None or step > self._newest):
                    self._newest = step
            if self._newest is not None:
                done = [s for s in self._rows if s is not None and s < self._newest]
                self._publish_steps(done)

    def flush(self, timeout: float | None) -> bool:
        """Ship what is queued, then publish every step seen so far."""
        ok = super().flush(timeout)
        return self._publish_all("flush") and ok

    def close(self) -> None:
        """Publish every step seen so far, then release the backend."""
        try:
            self._publish_all("close")
        finally:
            self.close_backend()

    def _publish_all(self, when: str) -> bool:
        """Publish every step held; on failure warn once (the files hold everything) and return False."""
        with self._step_lock:
            try:
                self._publish_steps(list(self._rows))
                return True
            except Exception as exc:
                self._warn_once(
                    "publish",
                    f"steps not published at {when} ({type(exc).__name__}: {exc}); the files hold them: "
                    f"rollout-trace export {self.config.run_dir} --to {self.backend}",
                )
                return False

    # -- internals ------------------------------------------------------------------

    def _publish_steps(self, steps: Sequence[int | None]) -> None:
        for step in sorted(steps, key=lambda s: (s is None, s or 0)):
            rows = self._rows.get(step)
            if not rows:
                continue
            data = self._step_data(step, rows)
            self.publish(data)
            self._published.setdefault(step, set()).update(rows)
            self._val_published[step] = self._val_published.get(step, 0) + len(data.val_rows)
            del self._rows[step]
        if self._newest is not None:
            for old in [s for s in self._summaries if s is not None and s < self._newest - KEEP_STEPS]:
                self._summaries.pop(old, None)
                self._published.pop(old, None)
                self._val_published.pop(old, None)

    def _step_data(self, step: int | None, rows: dict[str, list[Any]]) -> StepData:
        summaries = list(self._summaries.get(step, {}).values())
        data = StepData(step)
        for (_, validate), values in step_metrics(pa.Table.from_pylist(summaries, schema=S.TRAJECTORY_SCHEMA)).items():
            prefix = VAL_METRIC_PREFIX if validate else METRIC_PREFIX
            data.metrics.update({prefix + k: float(v) for k, v in values.items()})
            data.raw_metrics[bool(validate)] = dict(values)
        room = max(self.config.log_val_generations - self._val_published.get(step, 0), 0)
        for row in rows.values():
            if row[COL["validate"]]:
                if len(data.val_rows) < room:
                    data.val_rows.append(row)
                else:
                    data.val_dropped += 1
            else:
                data.rows.append(row)
        return data

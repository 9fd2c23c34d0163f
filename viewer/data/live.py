"""A run followed while it is written: the viewer's tables kept up to date from the new batches only.

:class:`LiveRun` wraps :class:`tracer.follow.RunFollower` (which remembers,
per file, the batches already read and summarises again only the
trajectories that got new rows) and adds what the pages show: the
advantage, latency and tools columns, computed again only for the steps
that changed; the steps and the span count; trajectories in progress (no
root span yet, their shard still open) with their spans so far and how long
they have been running; per step, how many rollouts finished and how many
still run.

No Streamlit import. One :class:`LiveRun` may serve several browser
sessions: :meth:`LiveRun.refresh` holds a lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer.follow import RUNNING_S, RunFollower, Update, step_progress
from tracer.schema import (
    NUM_SPANS,
    ROLLOUT_N,
    SAMPLE_INDEX,
    STEP,
    TRACE_ID,
)
from viewer.data.runs import Loaded, merge_warnings, tools_table, with_derived, with_tools

__all__ = ["RUNNING_S", "LiveCounts", "LiveRun"]


@dataclass(frozen=True)
class LiveCounts:
    """What a followed run holds now: the numbers "new since you opened" subtracts."""

    steps: int
    trajectories: int
    spans: int

    def since(self, base: LiveCounts) -> LiveCounts:
        """What was added since ``base`` (never negative: a run read again from the start counts from zero)."""
        return LiveCounts(
            max(self.steps - base.steps, 0),
            max(self.trajectories - base.trajectories, 0),
            max(self.spans - base.spans, 0),
        )


def _enriched(summary: pa.Table, tools: pa.Table) -> pa.Table:
    """The summary rows with the columns :func:`viewer.data.runs.load_step` adds (advantage, latency, tools)."""
    return with_tools(with_derived(summary), tools)


class LiveRun:
    """The viewer's view of a run that is still being written.

    Args:
        path: The run directory (or a trace file).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.follower = RunFollower(path)
        self._lock = threading.Lock()
        self._steps: dict[int | None, tuple[tuple[int, int], pa.Table]] = {}
        self._table: tuple[tuple[int, int], pa.Table] | None = None
        self.last_update = Update()
        #: Seconds the last refresh took (shown in the sidebar; the benchmark measures it properly).
        self.last_refresh_s = 0.0
        self.refreshes = 0

    def refresh(self) -> Update:
        """Read what was written since the last refresh (cheap when nothing was)."""
        with self._lock:
            start = time.perf_counter()
            update = self.follower.poll()
            self.last_refresh_s = time.perf_counter() - start
            self.last_update = update
            self.refreshes += 1
            return update

    # -- tables ----------------------------------------------------------------

    def _step_table(self, step: int | None) -> pa.Table:
        f = self.follower
        key = (f.generation, f.step_versions.get(step, 0))
        cached = self._steps.get(step)
        if cached is not None and cached[0] == key:
            return cached[1]
        summary = f.trajectories([step])
        tools = tools_table(f.summary_spans(step))
        table = _enriched(summary, tools)
        self._steps[step] = (key, table)
        return table

    def trajectories(self, step: int | None = None) -> pa.Table:
        """The trajectory table of one step (None: the whole run), as ``load_step``/``load_run`` build it."""
        with self._lock:
            f = self.follower
            if step is not None:
                return self._step_table(step)
            key = (f.generation, f.version)
            if self._table is not None and self._table[0] == key:
                return self._table[1]
            steps = sorted({*f.step_versions}, key=lambda s: (s is None, s or 0))
            parts = [self._step_table(s) for s in steps]
            parts = [p for p in parts if p.num_rows]
            table = pa.concat_tables(parts) if parts else _enriched(f.trajectories(), tools_table(f.spans([])))
            self._table = (key, table)
            return table

    def loaded(self, step: int | None = None) -> Loaded:
        """:meth:`trajectories` with the last refresh's warnings, as the cached readers return it."""
        return Loaded(self.trajectories(step), merge_warnings(self.last_update.warnings))

    def steps_loaded(self) -> Loaded:
        """The steps (one ``step`` column) and the span row count, as :func:`viewer.data.runs.list_steps`."""
        with self._lock:
            steps = self.follower.steps()
            rows = self.follower.rows
        return Loaded(pa.table({STEP: pa.array(steps, pa.int64())}), list(self.last_update.warnings), rows)

    def files_of(self, trace_ids: tuple[str, ...]) -> list[str]:
        """The files holding these trajectories (what ``trace_file_index`` says, without reading the run)."""
        with self._lock:
            return self.follower.files_of(trace_ids)

    # -- in progress -----------------------------------------------------------

    def running(self, step: int | None = None, now_ns: int | None = None) -> pa.Table:
        """Trajectories still running (no root yet, shard open), longest-running first, with ``running_s``."""
        with self._lock:
            table = self.follower.running(now_ns)
        if step is not None:
            table = table.filter(pc.fill_null(pc.equal(table.column(STEP), step), False))
        return table.sort_by([(RUNNING_S, "descending")])

    def running_rows(self, step: int | None = None, now_ns: int | None = None) -> list[dict[str, Any]]:
        """The running trajectories as the page lists them: ids, spans so far, running for."""
        return [
            {
                TRACE_ID: r[TRACE_ID],
                STEP: r[STEP],
                "sample": r[SAMPLE_INDEX],
                "rollout": r[ROLLOUT_N],
                "spans so far": r[NUM_SPANS],
                "running for (s)": round(r[RUNNING_S], 1) if r[RUNNING_S] is not None else None,
            }
            for r in self.running(step, now_ns).to_pylist()
        ]

    def progress(self, step: int | None = None) -> list[dict[str, Any]]:
        """Per step (or one step): rollouts finished, running and abandoned."""
        table = self.trajectories(step)
        with self._lock:
            running = self.follower.running()
        return step_progress(table, running)

    def counts(self) -> LiveCounts:
        """Steps, trajectories and span rows read so far."""
        with self._lock:
            f = self.follower
            return LiveCounts(len(f.steps()), f.trajectories().num_rows, f.rows)

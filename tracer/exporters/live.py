"""LiveShipper: the common machinery of live exporters.

The recorder hands every durable batch to :meth:`LiveShipper.export` on its
writer thread; that only appends to a queue. A thread of the shipper's own
groups spans by trajectory and, once a trajectory's root span has been seen
for ``grace_s`` (so rewards logged just after the rollout are included),
hands finished trajectories to :meth:`LiveShipper.ship`, which a backend
implements. A failing backend is retried with backoff; what still fails is
counted and logged once with the command that catches up from the files (the
files already hold everything, so nothing is lost). The rollout never waits
for a backend.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import pyarrow as pa

from tracer.config import TraceConfig
from tracer.schema import PARENT_SPAN_ID, TRACE_ID

logger = logging.getLogger("rollout_trace")


class LiveShipper:
    """Base class of live exporters; subclasses implement :meth:`ship`.

    Args:
        config: The tracer config in force.
        backend: Backend name (for messages).
        grace_s: Wait this long after a root span before shipping its trajectory.
        max_queued_spans: Beyond this, the oldest queued batches are dropped
            (counted; the files still hold them).
        retries: Attempts per shipment before it counts as failed.
    """

    def __init__(
        self,
        config: TraceConfig,
        backend: str,
        grace_s: float | None = None,
        max_queued_spans: int = 500_000,
        retries: int = 5,
    ) -> None:
        self.config = config
        self.backend = backend
        self.grace_s = 2 * config.flush_interval_s if grace_s is None else grace_s
        self.max_queued_spans = max_queued_spans
        self.retries = retries
        self._queue: collections.deque[pa.RecordBatch] = collections.deque()
        self._queued_spans = 0
        self._pending: dict[str, list[pa.RecordBatch]] = {}
        self._root_seen: dict[str, float] = {}
        self._wake = threading.Event()
        self._stop = False
        self._flush_now = False
        self._idle = threading.Event()
        self._lock = threading.Lock()
        self.trajectories_shipped = 0
        self.trajectories_failed = 0
        self.spans_dropped = 0
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=f"rollout-trace-{backend}", daemon=True)
        self._thread.start()

    # -- called by the recorder ------------------------------------------

    def export(self, batch: pa.RecordBatch) -> None:
        """Queue a durable batch (writer thread; never blocks)."""
        with self._lock:
            self._queue.append(batch)
            self._queued_spans += batch.num_rows
            while self._queued_spans > self.max_queued_spans and len(self._queue) > 1:
                old = self._queue.popleft()
                self._queued_spans -= old.num_rows
                self.spans_dropped += old.num_rows
                self._warn_once("queue full", f"live queue full; {old.num_rows} spans left to catch up from the files")
        self._idle.clear()
        self._wake.set()

    def shutdown(self, timeout: float | None) -> None:
        """Ship everything queued (root seen or not), then stop the thread."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._warn_once("shutdown", f"gave up after {timeout} s with trajectories unshipped")
        self.close()

    def flush(self, timeout: float | None) -> bool:
        """Ship every queued trajectory whose root was seen, now; wait until done."""
        self._flush_now = True
        self._idle.clear()
        self._wake.set()
        return self._idle.wait(timeout)

    # -- to implement ------------------------------------------------------

    def ship(self, trajectories: list[pa.Table]) -> None:
        """Send finished trajectories (one table of spans each) to the backend."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend (after the last ship)."""

    # -- thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=max(self.grace_s / 2, 0.05))
            self._wake.clear()
            stopping = self._stop
            flushing, self._flush_now = self._flush_now, False
            with self._lock:
                batches = list(self._queue)
                self._queue.clear()
                self._queued_spans = 0
            now = time.monotonic()
            for batch in batches:
                self._absorb(batch, now)
            ready = [t for t, seen in self._root_seen.items() if stopping or flushing or now - seen >= self.grace_s]
            if stopping:
                ready.extend(t for t in self._pending if t not in self._root_seen)
            if ready:
                tables = [pa.Table.from_batches(self._pending.pop(t)) for t in ready if t in self._pending]
                for t in ready:
                    self._root_seen.pop(t, None)
                self._ship_with_retry(tables, stopping)
            if flushing or (not self._pending and not self._queue):
                self._idle.set()
            if stopping:
                return

    def _absorb(self, batch: pa.RecordBatch, now: float) -> None:
        traces = batch.column(batch.schema.get_field_index(TRACE_ID))
        parents = batch.column(batch.schema.get_field_index(PARENT_SPAN_ID))
        order: dict[str, list[int]] = {}
        for i, tid in enumerate(traces.to_pylist()):
            order.setdefault(tid, []).append(i)
        roots = {traces[i].as_py() for i in range(batch.num_rows) if not parents[i].is_valid}
        for tid, rows in order.items():
            self._pending.setdefault(tid, []).append(batch.take(pa.array(rows, pa.int64())))
            if tid in roots:
                self._root_seen.setdefault(tid, now)

    def _ship_with_retry(self, tables: list[pa.Table], stopping: bool) -> None:
        delay = 0.5
        for attempt in range(1, self.retries + 1):
            try:
                self.ship(tables)
                self.trajectories_shipped += len(tables)
                return
            except Exception as exc:
                if attempt == self.retries or (stopping and attempt >= 2):
                    self.trajectories_failed += len(tables)
                    self._warn_once(
                        "ship failed",
                        f"{len(tables)} trajectories not shipped after {attempt} attempts ({type(exc).__name__}: {exc}); "
                        f"the files hold them: rollout-trace export {self.config.run_dir} --to {self.backend}",
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("rollout-trace %s exporter: %s (logged once)", self.backend, message)


def group_trajectories(table: pa.Table) -> list[pa.Table]:
    """Split a span table into one table per trace_id, in first-seen order."""
    order: dict[Any, list[int]] = {}
    for i, tid in enumerate(table.column(TRACE_ID).to_pylist()):
        order.setdefault(tid, []).append(i)
    return [table.take(pa.array(rows, pa.int64())) for rows in order.values()]

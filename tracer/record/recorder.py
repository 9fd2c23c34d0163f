"""The process's recorder (``ACTIVE``, set by :func:`tracer.init`): the buffer decorators append to, and a writer
thread that drains it every ``flush_interval_s`` (sooner when full or on :func:`tracer.flush`) through the sampler
and the span encoder, writes a zstd Arrow batch with ``fsync``, then feeds the live exporters (one driver each).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import itertools
import os
import secrets
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracer import schema as S
from tracer.config import ENV_STRICT, TraceConfig
from tracer.index.closed import shard_closed
from tracer.record import lifecycle
from tracer.record.accounting import Accounting
from tracer.record.accounting import FlushResult as FlushResult
from tracer.record.redact import Redactor
from tracer.record.sampling import StepSampler, decisions_json
from tracer.record.span_encoder import SpanEncoder
from tracer.record.trajectories import CALLER, Trajectories
from tracer.storage.upload import UploadingSpanWriter
from tracer.storage.uri import is_remote, join_uri
from tracer.storage.writer import SpanWriter, file_meta

if TYPE_CHECKING:
    from tracer.exporters.base import Driver

#: The configured recorder of this process, or None when tracing is off.
ACTIVE: Recorder | None = None

#: Rows per Arrow batch written.
BATCH_ROWS = 8192
#: Seconds a call in ``on_buffer_full="block"`` mode waits for a writer making no progress before it drops the span.
MAX_STALL_WAIT_S = 10.0


class Recorder:
    """Buffer and writer thread for one process and one config: flush and shutdown."""

    def __init__(self, config: TraceConfig, ids_from: Recorder | None = None) -> None:
        self.config = config
        self.buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self.limit = config.max_buffered_spans
        #: Below this many buffered spans decorators append directly; from it on, through append().
        self.fast_limit = min(BATCH_ROWS, self.limit)
        self.block_when_full = config.on_buffer_full == "block"
        self.strict = os.environ.get(ENV_STRICT, "") not in ("", "0")
        # A re-init keeps one id space: spans opened under the old recorder keep their links.
        self.span_ids: itertools.count[int] = itertools.count(1)
        self.trace_ids: itertools.count[int] = itertools.count(1)
        self.span_prefix, self.trace_prefix = secrets.token_hex(4), secrets.token_hex(8)
        if ids_from is not None:
            self.span_ids, self.trace_ids = ids_from.span_ids, ids_from.trace_ids
            self.span_prefix, self.trace_prefix = ids_from.span_prefix, ids_from.trace_prefix
        c = config
        n = c.max_samples_per_step_per_worker
        sampling = (c.seed, c.flush_interval_s, c.sample_strategy, c.sample_by, c.sample_candidates_per_step)
        self.sampler = StepSampler(n, *sampling) if n else None
        self.account = Accounting()
        self.problems = self.account.problems
        self.redactor = Redactor(c.redact_patterns) if c.redact else None
        self.encoder = SpanEncoder(c, self.problems, self.span_prefix, self.trace_prefix, self.redactor)
        #: Live exporters fed each durable batch (writer thread); a driver's failure is counted in ``problems``.
        self.drivers: list[Driver] = []
        self.trajectories = Trajectories(self.span_ids, self.trace_ids, self.sampler, self.append)
        self.open_span = self.trajectories.open_span
        self._wake = threading.Event()
        # Event.set's lock is not reentrant (a signal handler inside set() would deadlock): setters try this first.
        self._wake_guard = threading.Lock()
        # Reentrant: a signal handler that records runs on the thread it interrupts.
        self._cond = threading.Condition(threading.RLock())
        self._flush_requested = 0
        self._flush_done = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.RLock()
        #: Held by the writer during a cycle; fork() waits for it (see _before_fork).
        self._fork_lock = threading.RLock()
        #: Set once shut down: late spans go to the active recorder.
        self.closed = False
        self._cycles = 0
        meta = file_meta(c.to_dict(), c.project_name, c.experiment_name, self.sampler and self.sampler.parameters())
        sizes = (c.compression_level, c.max_file_bytes)
        if not is_remote(c.output_dir):
            self.writer: SpanWriter = SpanWriter(c.run_dir, meta, *sizes, on_close=shard_closed)
        else:  # stages locally, uploads each closed file; at exit it calls back to flush the buffer first (upload.py)
            dest = join_uri(c.output_dir, c.project_dir, c.experiment_dir)
            hook = functools.partial(_shutdown_at_exit, self)
            self.writer = UploadingSpanWriter(
                dest, meta, *sizes, c.upload_interval_s, self.problems.report, at_exit=hook
            )
        self._start_thread()

    def append(self, record: tuple[Any, ...]) -> None:
        """Add a finished span; the slow path when the buffer is filling up."""
        if self.closed:
            self._forward(record)
            return
        buf = self.buffer
        if len(buf) >= self.limit and not self._make_room():
            self.account.dropped += 1
            return
        buf.append(record)
        if len(buf) >= self.fast_limit and not self._wake.is_set():
            self._wake_writer()

    def _wake_writer(self) -> None:
        """Wake the writer thread; safe to call from a signal handler that interrupted this very call."""
        if self._wake_guard.acquire(blocking=False):
            try:
                self._wake.set()
            finally:
                self._wake_guard.release()

    def _forward(self, record: tuple[Any, ...]) -> None:
        """A span finished after this recorder was shut down: the active one writes it."""
        active = ACTIVE
        if active is not None and active is not self and not active.closed:
            active.append(record)
        else:
            self.account.dropped += 1

    def _make_room(self) -> bool:
        """The buffer is full: wait for the writer (block mode, while it progresses within MAX_STALL_WAIT_S) or drop."""
        if not self.block_when_full or self._stopping or getattr(CALLER, "busy", False):
            return False
        self._start_thread()
        self._wake_writer()
        cycles, since = self._cycles, time.monotonic()
        CALLER.busy = True
        try:
            with self._cond:
                while len(self.buffer) >= self.limit:
                    thread = self._thread
                    if thread is None or not thread.is_alive():
                        return False
                    if self._cycles != cycles:
                        cycles, since = self._cycles, time.monotonic()
                    elif time.monotonic() - since >= MAX_STALL_WAIT_S:
                        self.problems.report(
                            "writer stalled",
                            f"the writer finished no batch in {MAX_STALL_WAIT_S} s with the buffer full; "
                            "spans are dropped (and counted) instead of blocking the rollout",
                        )
                        return False
                    self._cond.wait(timeout=0.05)
            return True
        finally:
            CALLER.busy = False

    def internal_error(self, what: str, exc: BaseException) -> None:
        """Count a failure of the tracer itself; raise it under ROLLOUT_TRACE_STRICT."""
        self.problems.report("internal error", f"{what}: {type(exc).__name__}: {exc}", exc)
        if self.strict:
            raise exc

    def _start_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="rollout-trace-writer", daemon=True)
                self._thread.start()

    def add_driver(self, driver: Driver) -> None:
        """Feed ``driver`` each durable batch (writer thread), flush it in flush(), shut it down last."""
        self.drivers.append(driver)

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=self.config.flush_interval_s)
            self._wake.clear()
            with self._cond:
                target = self._flush_requested
                stopping = self._stopping
            try:
                with self._fork_lock:
                    self._cycle(force=stopping or target > self._flush_done)
            except BaseException as exc:  # never let the writer thread die silently
                self.problems.report("writer error", f"{type(exc).__name__}: {exc}", exc)
            with self._cond:
                self._flush_done = max(self._flush_done, target)
                self._cycles += 1
                self._cond.notify_all()
            if stopping and not self.buffer:
                return

    def _cycle(self, force: bool) -> None:
        buf = self.buffer
        records = [buf.popleft() for _ in range(len(buf))]
        if records:
            with self._cond:
                self._cond.notify_all()  # room for blocked callers
        if self.sampler is not None:
            try:
                records = self.sampler.gate(records, force)
            except Exception as exc:  # write them all rather than lose them
                self.problems.report("sampling failed", f"{type(exc).__name__}: {exc}; spans written unsampled", exc)
        for i in range(0, len(records), BATCH_ROWS):
            encoded = self.encoder.encode(records[i : i + BATCH_ROWS], getattr(self.writer, "path", None))
            self.account.replaced += encoded.replaced
            self.account.failed += encoded.failed
            for batch in encoded.batches:
                self._write_batch(batch)
        if force and self.sampler is not None and self.sampler.has_decisions:
            # Decisions no span carried (every group dropped, late arrivals): an empty batch holds them.
            self._write_batch(pa.RecordBatch.from_pylist([], schema=S.SPAN_SCHEMA))

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        try:
            meta = {
                S.BATCH_META_SPANS_WRITTEN: str(self.account.total("written") + n),
                S.BATCH_META_SPANS_DROPPED: str(self.account.total("dropped")),
                S.BATCH_META_INTERNAL_ERRORS: str(sum(self.problems.counts.values())),
            }
            if self.sampler is not None and self.sampler.has_decisions:
                decisions = self.sampler.take_decisions()  # sample ids redacted as the columns are
                redacted = self.redactor.value(decisions) if self.redactor is not None else decisions
                meta[S.BATCH_META_SAMPLING] = decisions_json(redacted)
            self.writer.write(batch, meta)
        except Exception as exc:
            self.account.failed += n
            self.encoder.history.clear()  # later turns must not refer to spans that were not written
            self.problems.report(
                "write failed", f"{n} spans not written to {self.writer.run_dir}: {type(exc).__name__}: {exc}", exc
            )
            return
        self.account.written += n
        for driver in self.drivers:
            try:
                driver.export(batch)
            except Exception as exc:
                self.problems.report("exporter error", f"{type(driver).__qualname__}: {exc}", exc)

    def flush(self, timeout: float | None = 30.0) -> FlushResult:
        """Wait until everything recorded before this call is durable."""
        if self._thread is None and not self.buffer and not (self.sampler is not None and self.sampler.held):
            return self.account.result(True)
        self._start_thread()
        with self._cond:
            self._flush_requested += 1
            target = self._flush_requested
        self._wake_writer()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._flush_done < target:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return self.account.result(False, f"flush timed out after {timeout} s; the writer is still busy")
                self._cond.wait(timeout=0.1 if left is None else min(left, 0.1))
        # What each live backend failed to take, all within the same deadline.
        exported: list[str] = []
        if self.drivers:
            from tracer.exporters.bounded import flush_drivers

            exported = flush_drivers(self.drivers, None if deadline is None else deadline - time.monotonic())
        first = self.problems.first_exception
        if self.strict and first is not None:
            self.problems.first_exception = None
            raise first
        return self.account.result(self._flush_done >= target and not exported, "; ".join(exported))

    def shutdown(self, timeout: float | None = 30.0) -> FlushResult:
        """Flush, stop the writer, close the file; later spans go to the recorder active then (or are dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout  # one bound for every stage
        result = self.flush(timeout)
        self.fast_limit = 0  # every later span takes append(), which sees `closed`
        with self._cond:
            self._stopping = True
        self._wake_writer()
        thread = self._thread
        if thread is not None:
            thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        self.closed = True
        try:
            self.writer.close()
        except Exception as exc:
            self.problems.report("close failed", str(exc), exc)
        if self.drivers:
            from tracer.exporters.bounded import shutdown_drivers

            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            for line in shutdown_drivers(self.drivers, left):
                self.problems.report("exporter shutdown failed", line)
        buf = self.buffer
        while buf:  # appended after the writer's last cycle
            self._forward(buf.popleft())
        late = self.account.result(True)
        if not late.ok or late.message:
            message = "; ".join(m for m in (result.message, late.message) if m)
            result = dataclasses.replace(late, ok=result.ok and late.ok, message=message)
        return result


def set_active(rec: Recorder | None) -> FlushResult | None:
    """Install ``rec`` as this process's recorder, taking over the previous one's counts and late spans; returns the
    previous recorder's shutdown result (None without one)."""
    global ACTIVE
    old, ACTIVE = ACTIVE, rec
    if rec is not None:
        # SIGTERM, SIGHUP, ray.shutdown() skip atexit: drain on those too, bounded.
        lifecycle.install(_drain_active, rec.config.shutdown_timeout_s)
    if old is None or old is rec:
        return None
    marks = old.account.marks()
    result = old.shutdown()
    if rec is not None:
        rec.account.adopt(old.account, marks)
    return result


_FORK_HELD: list[Recorder] = []
# Imported now: imported during a fork's wait, its after-fork hook would release a lock it never took.
import concurrent.futures.thread  # noqa: E402,F401


def _before_fork() -> None:
    # A lock the writer holds at fork() stays held forever in the child: wait (bounded) for its cycle to end.
    rec = ACTIVE
    if rec is not None and rec._fork_lock.acquire(timeout=30.0):
        _FORK_HELD.append(rec)


def _after_fork_in_parent() -> None:
    while _FORK_HELD:
        _FORK_HELD.pop()._fork_lock.release()


def _after_fork_in_child() -> None:
    # The writer thread does not survive fork(): the child gets a recorder (file, ids) of its own.
    global ACTIVE
    _after_fork_in_parent()
    if ACTIVE is not None:
        ACTIVE = Recorder(ACTIVE.config)  # fresh ids: the parent's continue in the parent
        # A multiprocessing child skips atexit: flush through its exit hook, registered after its registry clears.
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            mp_util.register_after_fork(ACTIVE, _flush_at_multiprocessing_exit)


def _flush_at_multiprocessing_exit(rec: Recorder) -> None:
    # No object: runs once, at the child's exit, on whatever recorder is active then.
    sys.modules["multiprocessing.util"].Finalize(None, _at_exit, exitpriority=100)


def _shutdown_at_exit(rec: Recorder) -> None:
    # The uploading writer's exit hook: shut its recorder down once (the module's exit hook then skips it).
    global ACTIVE
    if ACTIVE is not rec:
        rec.writer.close()  # shut down already (or replaced): upload what is left
        return
    ACTIVE = None
    rec.shutdown(timeout=30.0)


def _drain_active(timeout: float) -> None:
    # lifecycle's stop hooks: flush only (a SIGINT the application catches goes on recording).
    rec = ACTIVE
    if rec is not None:
        rec.flush(timeout)


def _at_exit() -> None:
    rec = ACTIVE
    if rec is not None:
        rec.shutdown(timeout=rec.config.shutdown_timeout_s)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(_at_exit)

"""One exporter interface: a :class:`Sink` per backend (the wire), driven two ways.

:class:`LiveDriver` (``tracer.init(backend=...)``) feeds it the recorder's durable batches on a thread of its own;
:func:`export_files` (``rollout-trace export``) feeds it the trace files step chunk by step chunk. A step is complete
when a later step arrived, or at flush, shutdown or the end of the files.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.backends import load_sink, resolve_options
from tracer.compare import read_run_config, recorded_configs
from tracer.exporters import lag
from tracer.exporters.bounded import CALL_TIMEOUT_S, BackendTimeoutError, Deadline, call_within
from tracer.exporters.tables import Progress, iter_step_chunks, open_run
from tracer.read import TracePaths
from tracer.record.redact import Redactor
from tracer.storage.history import expand_history
from tracer.summary import step_metrics, summarize

if TYPE_CHECKING:
    from tracer.config import TraceConfig

logger = logging.getLogger("rollout_trace")

#: Trajectory states in a :class:`StepBatch`.
NEW = "new"  # to be written
EXISTING = "existing"  # already at the destination (post-hoc re-export): count it, do not write it
LATE = "late"  # spans arriving after their trajectory was written (a reward logged afterwards)

#: Steps this far behind the newest forget their trajectories (later ones get metrics over the late ones only).
KEEP_STEPS = 8
#: Spans a live driver queues; past them the oldest batches are dropped (the files hold them).
MAX_QUEUED_SPANS = 500_000
#: Tries a live driver gives one write.
WRITE_TRIES = 5
#: Seconds before a live driver whose destination failed to open tries again.
OPEN_RETRY_S = 30.0
#: Free bytes below which a destination's disk counts as full (in messages about a destination that hangs).
DISK_FULL_BYTES = 64 * 1024
#: Trajectory ids a live driver remembers as written (to recognise late spans).
WRITTEN_MEMORY = 1_000_000


# -- what flows between drivers and sinks ------------------------------------------


@dataclasses.dataclass
class Trajectory:
    """One trajectory handed to a sink: its summary row, its span rows (the sink's
    :attr:`SinkBase.span_columns`), and its state (:data:`NEW`, :data:`EXISTING`, :data:`LATE`)."""

    summary: dict[str, Any]
    spans: list[dict[str, Any]]
    state: str = NEW


@dataclasses.dataclass
class StepBatch:
    """One step's trajectories not handed over before (by sample index and rollout), as :meth:`Sink.write` gets them;
    ``metrics`` (``{validate: step_metrics values}``) and ``summaries`` cover every trajectory of the step so far;
    ``metrics`` is None while the step is not complete (only sinks that stream get such batches)."""

    step: int | None
    trajectories: list[Trajectory]
    metrics: dict[bool, dict[str, float]] | None
    summaries: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Target:
    """The run a sink opens its destination for: names (None when unknown), the validation
    rows per step in tables, the config to record, whether a :class:`LiveDriver` feeds it,
    and how every payload is redacted before a sink sees it (:func:`redacted`)."""

    project: str | None
    experiment: str | None
    log_val_generations: int = 10
    run_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    live: bool = False
    redact: bool = True
    redact_patterns: tuple[str, ...] = ()

    def redactor(self) -> Redactor | None:
        """The redactor every payload of this run goes through (None when redaction is off)."""
        return Redactor(self.redact_patterns) if self.redact else None


def redacted(redactor: Redactor | None, summary: dict[str, Any], rows: list[dict[str, Any]]) -> Trajectory:
    """A trajectory as sinks get it, live and post hoc: every text of its rows through ``redactor``."""
    if redactor is None:
        return Trajectory(summary, rows)
    return Trajectory(redact_rows(redactor, [summary])[0], redact_rows(redactor, rows))


#: Columns never redacted: ids that join rows (a secret cannot be in them, and a change would break the joins).
_ID_COLUMNS = frozenset((S.TRACE_ID, S.SPAN_ID, S.PARENT_SPAN_ID))


def redact_rows(redactor: Redactor, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (span or trajectory rows) with every string and list of strings redacted, ids aside."""
    return [{k: v if k in _ID_COLUMNS else _redact_value(redactor, v) for k, v in row.items()} for row in rows]


def _redact_value(redactor: Redactor, value: Any) -> Any:
    if type(value) is str:
        return redactor.text(value)
    if type(value) is list and value and all(type(v) is str for v in value):
        return redactor.pieces(value)  # per-token texts: a secret split over tokens is caught
    return value


@dataclasses.dataclass
class Written:
    """What one :meth:`Sink.write` sent: counts, the ``rows`` (``trace_id -> reward``) and
    ``metrics`` (``(step, key) -> value``) the destination should now hold, report notes, and
    ``problems``: what it did not accept although it answered (the export is then not complete)."""

    sent: int = 0
    skipped: int = 0
    spans: int = 0
    rows: dict[str, float | None] = dataclasses.field(default_factory=dict)
    metrics: dict[tuple[Any, str], float] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: Written) -> None:
        """Accumulate ``other`` into this one (counts summed, rows and metrics updated, lines appended)."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, mine | theirs if isinstance(mine, dict) else mine + theirs)


@dataclasses.dataclass
class ReadBack:
    """What :meth:`Sink.read_back` found: rows, metrics (None: not read back), whether the
    destination is ``shared`` with other exports (rows not sent are then not unexpected), where."""

    rows: dict[str, float | None]
    metrics: dict[tuple[Any, str], float] | None = None
    shared: bool = False
    where: str = ""


@dataclasses.dataclass
class VerifyResult:
    """Whether a destination holds what was sent (``ok``: nothing missing, unexpected or different). Rows are trace
    ids (``mismatched``: another reward), metrics ``(step, key)`` (``metrics_expected`` 0: metrics not checked);
    ``lines`` say it in words."""

    backend: str
    ok: bool
    expected: int
    found: int
    missing: list[str] = dataclasses.field(default_factory=list)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    mismatched: list[str] = dataclasses.field(default_factory=list)
    metrics_expected: int = 0
    metrics_missing: list[tuple[Any, str]] = dataclasses.field(default_factory=list)
    metrics_mismatched: list[tuple[Any, str]] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def compare(
        cls, backend: str, rows: Mapping[str, float | None], metrics: Mapping[tuple[Any, str], float], found: ReadBack
    ) -> VerifyResult:
        """Compare what was sent (``rows``, ``metrics``) with what was read back."""
        got = {t: r for t, r in found.rows.items() if t in rows} if found.shared else dict(found.rows)
        out = cls(backend, True, len(rows), len(got), unexpected=[t for t in got if t not in rows])
        out.missing, out.mismatched = _diff(rows, got)
        where = f" in {found.where}" if found.where else ""
        row_ok = not (out.missing or out.unexpected or out.mismatched)
        out.lines.append(
            f"verify {backend}: {'OK' if row_ok else 'FAILED'}: {len(got)} trajectory rows read back{where}, "
            f"{len(rows)} expected; {len(out.missing)} missing, {len(out.unexpected)} unexpected, "
            f"{len(out.mismatched)} with a different reward"
        )
        if found.metrics is not None:
            out.metrics_expected = len(metrics)
            out.metrics_missing, out.metrics_mismatched = _diff(metrics, found.metrics)
            bad = out.metrics_missing or out.metrics_mismatched
            out.lines.append(
                f"verify {backend}: {'FAILED' if bad else 'OK'}: {len(metrics)} step metric values expected, "
                f"{len(out.metrics_missing)} missing, {len(out.metrics_mismatched)} different"
            )
        out.ok = row_ok and not (out.metrics_missing or out.metrics_mismatched)
        return out

    def merge(self, other: VerifyResult) -> VerifyResult:
        """Both results as one (several destinations of one export)."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)[2:]}
        return VerifyResult(self.backend, self.ok and other.ok, **summed)


def _diff(sent: Mapping[Any, float | None], there: Mapping[Any, float | None]) -> tuple[list[Any], list[Any]]:
    """``(missing, mismatched)``: keys of ``sent`` not ``there``, and those there with another value."""
    return [k for k in sent if k not in there], [k for k in sent if k in there and not same_value(sent[k], there[k])]


def short_error(exc: BaseException, limit: int = 300) -> str:
    """The error's message on one line, at most ``limit`` characters, printable whatever it held."""
    text = " ".join(str(exc).split()).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def same_value(a: float | None, b: float | None) -> bool:
    """Equal rewards or metric values (None equals None, NaN equals NaN, floats within 1e-9)."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@dataclasses.dataclass
class ExportReport:
    """What an export sent and skipped (already there, filtered, capped), with notes and the
    read-back check when one was asked for."""

    backend: str
    trajectories_sent: int = 0
    trajectories_skipped: int = 0
    spans_sent: int = 0
    details: list[str] = dataclasses.field(default_factory=list)
    verify: VerifyResult | None = None
    #: Trajectories a live export of the run missed, sent now.
    caught_up: int = 0
    #: Trajectories the backend refused one by one (their content), named in :attr:`details`.
    trajectories_refused: int = 0
    #: What the destination did not accept or does not hold (one line each, with what to do).
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        """The destination accepted every trajectory sent: nothing refused, no problem."""
        return not (self.trajectories_refused or self.problems)


# -- the interface a backend implements --------------------------------------------


class SinkBase:
    """The wire of one backend, built as ``SinkClass(options)``; every method may raise. A backend implements
    :meth:`write`; the defaults: all span columns, whole steps, nothing buffered or there before, no read-back."""

    #: Span columns :attr:`Trajectory.spans` carries (None: all; empty: none, and the file driver reads none).
    span_columns: ClassVar[Sequence[str] | None] = None
    #: Hand over finished trajectories before their step is complete (:attr:`StepBatch.metrics` None until it is).
    streams: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        #: ``(trace_id, spans, why)`` of trajectories refused after :meth:`write` counted them and ``spans`` of their
        #: spans in :attr:`Written.spans` (drivers take them out).
        self.refused: list[tuple[str, int, str]] = []
        #: Where the destination is, for messages (a URL, a directory); set by :meth:`open`.
        self.destination = ""

    @property
    def timeout_s(self) -> float:
        """Seconds a driver waits for one call into this sink (option ``timeout_s``, else :data:`CALL_TIMEOUT_S`)."""
        return float(self.options.get("timeout_s") or CALL_TIMEOUT_S)

    def confirms(self) -> bool:
        """True when :meth:`read_back` is cheap and local (files): the file driver then always counts what arrived."""
        return False

    @classmethod
    def sources(cls, path: str, options: Mapping[str, Any]) -> Iterator[tuple[TracePaths, str | None, str | None]]:
        """``(paths to read, project, experiment)`` per destination (default: one; None: the files' names)."""
        yield path, None, None

    def open(self, target: Target) -> set[str]:
        """Open the destination for a run; return the trace ids already there (skipped post hoc)."""
        return set()

    def payloads(self, trajectories: Sequence[Trajectory], build: Any) -> list[tuple[Trajectory, Any]]:
        """``(trajectory, build(trajectory))`` for each; one whose payload cannot be built goes to
        :attr:`refused` alone, with no spans (count it as sent, not its spans: the drivers take it back out)."""
        out = []
        for t in trajectories:
            try:
                out.append((t, build(t)))
            except Exception as exc:
                why = f"{type(exc).__name__}: {short_error(exc)}"
                self.refused.append((str(t.summary.get(S.TRACE_ID)), 0, f"its payload cannot be built ({why})"))
        return out

    def write(self, batch: StepBatch) -> Written:
        """Write one step's trajectories (and its metrics when ``batch.metrics`` is set); may buffer."""
        raise NotImplementedError

    def flush(self) -> None:
        """Send whatever :meth:`write` buffered."""

    def close(self) -> list[str]:
        """Flush and release the destination; return notes for the report (where it is)."""
        return []

    def read_back(self) -> ReadBack:
        """Read what the destination holds (after :meth:`close`), for ``--verify``."""
        raise NotImplementedError(f"{type(self).__name__} cannot be read back for --verify")


# -- the live driver ---------------------------------------------------------------


def _sort_key(t: Trajectory) -> tuple[Any, ...]:
    sample = t.summary.get(S.SAMPLE_INDEX) or ""
    return (bool(t.summary.get(S.VALIDATE)), len(str(sample)), str(sample), t.summary.get(S.ROLLOUT_N) or 0)


def _step_order(step: int | None) -> tuple[bool, int]:
    return (step is None, step or 0)


def _metrics_of(summaries: Sequence[dict[str, Any]]) -> dict[bool, dict[str, float]]:
    if not summaries:
        return {}
    table = pa.Table.from_pylist(list(summaries), schema=S.TRAJECTORY_SCHEMA)
    return {bool(validate): dict(values) for (_, validate), values in step_metrics(table).items()}


class LiveDriver:
    """Feeds a sink from the recorder on a thread of its own: queue, group into steps, retry, never raise.

    A trajectory is finished ``grace_s`` after its root span (rewards logged just after are in); a step is written
    once a later step arrived or at :meth:`flush`/:meth:`shutdown`. Past :data:`MAX_QUEUED_SPANS` the oldest batches
    are dropped (counted; the files hold them)."""

    def __init__(self, sink: SinkBase, backend: str, target: Target, run_dir: str, grace_s: float) -> None:
        self.sink = sink
        self.backend = backend
        self.target = target
        self.run_dir = run_dir
        self.grace_s = grace_s
        self.trajectories_written = self.trajectories_failed = self.spans_dropped = 0
        self._queue: collections.deque[pa.RecordBatch] = collections.deque()
        self._queued_spans = 0
        self._pending: dict[str, list[pa.RecordBatch]] = {}
        self._root_seen: dict[str, float] = {}
        self._held: dict[int | None, list[Trajectory]] = {}
        self._seen: dict[int | None, dict[str, dict[str, Any]]] = {}
        self._due: set[int | None] = set()  # steps with trajectories whose metrics are not written yet
        self._written: set[str] = set()
        self._newest: int | None = None
        self._opened = self._stop = self._flush_now = False
        self._open_error: Exception | None = None
        self._open_failed_at = 0.0
        self._warned: set[str] = set()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._lock = threading.Lock()
        self._deadline = Deadline(None)
        self._redactor = target.redactor()
        self._failures: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"rollout-trace-{backend}", daemon=True)
        self._thread.start()

    def export(self, batch: pa.RecordBatch) -> None:
        """Queue a durable batch (writer thread; never blocks)."""
        with self._lock:
            self._queue.append(batch)
            self._queued_spans += batch.num_rows
            while self._queued_spans > MAX_QUEUED_SPANS and len(self._queue) > 1:
                old = self._queue.popleft()
                self._queued_spans -= old.num_rows
                self.spans_dropped += old.num_rows
                self._warn_once("queue full", f"live queue full; {old.num_rows} spans left to catch up from the files")
        self._idle.clear()
        self._wake.set()

    def flush(self, timeout: float | None) -> bool:
        """Write every queued trajectory whose root was seen, and every step held, now; wait until done."""
        self._flush_now = True
        self._idle.clear()
        self._wake.set()
        return self._idle.wait(timeout)

    def stop(self, deadline: Deadline) -> None:
        """Begin stopping: write everything queued until ``deadline``, then close; do not wait."""
        self._deadline = deadline
        self._stop = True
        self._wake.set()

    def shutdown(self, timeout: float | None) -> None:
        """Write everything queued (root seen or not), close the sink, stop the thread: ``timeout`` seconds at most."""
        if not self._stop:
            self.stop(Deadline(timeout))
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._fail(
                "shutdown",
                f"gave up at the stop's deadline with trajectories unwritten ({self.sink.destination or self.backend} "
                f"does not answer); the files hold them: rollout-trace export {self.run_dir} --to {self.backend}",
            )

    def failures(self) -> list[str]:
        """What failed since the last call, one line each (and forget it)."""
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def progress(self) -> lag.DriverProgress:
        """What this driver has shipped and still holds (for :mod:`tracer.exporters.lag`, on the driver's thread)."""
        with self._lock:
            queued, dropped = self._queued_spans, self.spans_dropped
        in_grace = dict(self._root_seen)
        held = tuple(str(t.summary.get(S.TRACE_ID) or f"#{id(t)}") for ts in list(self._held.values()) for t in ts)
        running = sum(1 for tid in list(self._pending) if tid not in in_grace)
        done, failed = self.trajectories_written, self.trajectories_failed
        return lag.DriverProgress(done, failed, in_grace, held, running, queued, dropped)

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=max(self.grace_s / 2, 0.05))
            self._wake.clear()
            stopping = self._stop
            flushing, self._flush_now = self._flush_now, False
            try:
                self._cycle(stopping, flushing)
            except Exception as exc:  # the driver's own bug: never let it kill the thread silently
                self._warn_once("internal", f"internal error ({type(exc).__name__}: {exc})")
            lag.observe(self, final=stopping)  # how far behind the files this backend is (never raises)
            if flushing or (not self._pending and not self._queue):
                self._idle.set()
            if stopping:
                try:
                    for note in self._call(self.sink.close, "close") if self._opened else []:
                        logger.debug("rollout-trace %s exporter: %s", self.backend, note)
                except Exception as exc:
                    self._fail("close", f"could not close ({type(exc).__name__}: {exc})")
                self._idle.set()
                return

    def _cycle(self, stopping: bool, flushing: bool) -> None:
        with self._lock:
            batches = list(self._queue)
            self._queue.clear()
            self._queued_spans = 0
        now = time.monotonic()
        for batch in batches:
            traces = batch.column(S.TRACE_ID)
            order: dict[str, list[int]] = {}
            for i, tid in enumerate(traces.to_pylist()):
                order.setdefault(tid, []).append(i)
            roots = set(traces.filter(batch.column(S.PARENT_SPAN_ID).is_null()).to_pylist())
            for tid, rows in order.items():
                self._pending.setdefault(tid, []).append(batch.take(pa.array(rows, pa.int64())))
                if tid in roots:
                    self._root_seen.setdefault(tid, now)
        ready = [t for t, seen in self._root_seen.items() if stopping or flushing or now - seen >= self.grace_s]
        if stopping:
            ready.extend(t for t in self._pending if t not in self._root_seen)
        for tid in ready:
            self._root_seen.pop(tid, None)
            parts = self._pending.pop(tid, None)
            if parts:
                self._take(expand_history(pa.Table.from_batches(parts)))  # multi-turn prompt_ids made whole
        out: list[StepBatch] = []
        for step in sorted(self._due, key=_step_order):
            complete = stopping or flushing or (step is not None and self._newest is not None and step < self._newest)
            held = self._held.pop(step, [])
            if not (complete or (self.sink.streams and held)):
                self._held[step] = held
                continue
            summaries = list(self._seen.get(step, {}).values())
            if complete:
                self._due.discard(step)
            out.append(
                StepBatch(step, sorted(held, key=_sort_key), _metrics_of(summaries) if complete else None, summaries)
            )
        if out:
            self._write(out, stopping)
        # Steps far behind the newest forget their trajectories (later late ones get metrics of their own).
        if (newest := self._newest) is not None:
            for old in [s for s in self._seen if s is not None and s < newest - KEEP_STEPS and s not in self._due]:
                self._seen.pop(old, None)

    def _take(self, spans: pa.Table) -> None:
        """Turn one finished trajectory's spans into a held :class:`Trajectory` (or drop it)."""
        summaries = summarize(spans).to_pylist()
        if not summaries:
            return
        rows = spans.to_pylist()
        late = summaries[0][S.TRACE_ID] in self._written and not any(r[S.PARENT_SPAN_ID] is None for r in rows)
        columns = self.sink.span_columns
        if columns is not None:
            rows = [{c: r.get(c) for c in columns} for r in rows] if columns else []
        clean = redacted(self._redactor, summaries[0], rows)  # the payload every sink gets, redacted once
        summary, rows = clean.summary, clean.spans
        tid, step = summary[S.TRACE_ID], summary[S.STEP]
        if not tid or (summary[S.NUM_SPANS] == 0 and not late):
            # Rewards for a trajectory this process did not record: only a post-hoc export can join them.
            return
        seen = self._seen.setdefault(step, {})
        if late and tid in seen:
            earlier = seen[tid]
            if summary[S.REWARD] is not None:
                earlier[S.REWARD], earlier[S.REWARD_INFO] = summary[S.REWARD], summary[S.REWARD_INFO]
            summary = earlier
        else:
            seen[tid] = summary
        self._held.setdefault(step, []).append(Trajectory(summary, rows, LATE if late else NEW))
        self._due.add(step)
        if step is not None and (self._newest is None or step > self._newest):
            self._newest = step

    def _open(self) -> None:
        if self._opened:
            return
        # A destination that failed to open is not retried for a while: flushes do not wait on it each time.
        if self._open_error is not None and time.monotonic() - self._open_failed_at < OPEN_RETRY_S:
            raise self._open_error
        try:
            self._call(lambda: self.sink.open(self.target), "open")
        except Exception as exc:
            self._open_error, self._open_failed_at = exc, time.monotonic()
            raise
        self._opened = True
        # The backend registered its exit teardown while opening; the tracer's, registered again, runs first.
        atexit.unregister(_shutdown_before_backends)
        atexit.register(_shutdown_before_backends)

    def _call(self, fn: Any, what: str) -> Any:
        """``fn()`` bounded by the sink's ``timeout_s`` and, once stopping, by the stop's deadline."""
        return _call(self.sink, f"{self.backend} exporter", fn, what, self._deadline.left())

    def _write(self, batches: list[StepBatch], stopping: bool) -> None:
        """Write each batch, tried up to :data:`WRITE_TRIES` times with backoff (fewer once stopping)."""
        for batch in batches:
            n = sum(1 for t in batch.trajectories if t.state == NEW)
            written: Written | None = None
            delay = 0.5
            for attempt in range(1, WRITE_TRIES + 1):
                try:
                    self._open()
                    written = self._call(functools.partial(self.sink.write, batch), f"write of step {batch.step}")
                    self._call(self.sink.flush, "flush")
                    break
                except Exception as exc:
                    left = self._deadline.left()
                    last = attempt == WRITE_TRIES or (stopping and attempt >= 2) or (left is not None and left < delay)
                    if last or isinstance(exc, BackendTimeoutError):  # hung: another try would wait on the same call
                        self._fail(
                            "write failed",
                            f"{n} trajectories of step {batch.step} not written after {attempt} attempts "
                            f"({type(exc).__name__}: {exc}); the files hold them: "
                            f"rollout-trace export {self.run_dir} --to {self.backend}",
                        )
                        written = None
                        break
                    time.sleep(delay)
                    delay = min(delay * 2, 10.0)
            refused, self.sink.refused[:] = list(self.sink.refused), []
            if written is None:
                self.trajectories_failed += n
                continue
            for note in written.notes:
                logger.info("rollout-trace %s exporter: %s", self.backend, note)
            self.trajectories_written += n - len(refused)
            self.trajectories_failed += len(refused)
            for tid, _, why in refused[:3]:
                self._fail("refused", f"trajectory {tid} refused: {why}")
            for line in written.problems:
                self._fail("not accepted", line)
            if len(self._written) > WRITTEN_MEMORY:
                self._written.clear()  # bounded memory; later late spans then count as trajectories of their own
            self._written.update(t.summary[S.TRACE_ID] for t in batch.trajectories)

    def _fail(self, kind: str, message: str) -> None:
        """Keep ``message`` for the next :meth:`failures` and log it (once per ``kind``)."""
        with self._lock:
            self._failures.append(f"{self.backend} exporter: {message}")
        self._warn_once(kind, message)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("rollout-trace %s exporter: %s (logged once)", self.backend, message)


#: What a backend implements, and what the recorder holds per live backend.
Sink = SinkBase
Driver = LiveDriver


def _shutdown_before_backends() -> None:
    """At exit, before the backends' own teardowns: drain and close the tracer (within its ``shutdown_timeout_s``)."""
    from tracer.record import recorder

    rec, recorder.ACTIVE = recorder.ACTIVE, None
    if rec is not None:
        rec.shutdown(rec.config.shutdown_timeout_s)


def live_target(config: TraceConfig) -> Target:
    """The run a live driver opens its sink for: this process's names; as config, the training run's
    (``run_config``) with the tracer's under ``rollout_trace``."""
    recorded = config.to_dict()
    run_config = recorded.pop("run_config", None)
    return Target(
        config.project_name,
        config.experiment_name,
        config.log_val_generations,
        {**(run_config if isinstance(run_config, Mapping) else {}), "rollout_trace": recorded},
        live=True,
        redact=config.redact,
        redact_patterns=tuple(config.redact_patterns),
    )


# -- the file driver ---------------------------------------------------------------


def _call(sink: SinkBase, label: str, fn: Any, what: str, left: float | None = None) -> Any:
    """``fn()`` bounded by the sink's ``timeout_s`` (and ``left``), said while it waits (:func:`call_within`)."""
    where = f" at {sink.destination}" if sink.destination else ""
    return call_within(fn, f"{label}{where}: {what}", sink.timeout_s if left is None else min(sink.timeout_s, left))


def _send_run(
    sink: SinkBase, call: Any, run: Any, target: Target, report: ExportReport, progress: bool
) -> tuple[set[str], Written, list[str]]:
    """Open ``sink``, write ``run`` step chunk by step chunk, close; return (ids there before, written, notes)."""
    total = Written()
    redactor = target.redactor()
    bar = Progress(run.trajectories.num_rows, f"export {report.backend}", progress)
    try:
        existing: set[str] = call(functools.partial(sink.open, target), "open")
        for trajs, spans in iter_step_chunks(run, sink.span_columns):
            by_step: dict[int | None, list[Trajectory]] = {}
            for summary in trajs.to_pylist():
                tid = summary[S.TRACE_ID]
                traj = redacted(redactor, summary, spans.get(tid, []))
                traj.state = EXISTING if tid in existing else NEW
                by_step.setdefault(summary[S.STEP], []).append(traj)
            for step in sorted(by_step, key=_step_order):
                held = sorted(by_step[step], key=_sort_key)
                batch = StepBatch(step, held, _metrics_of([t.summary for t in held]), [t.summary for t in held])
                what = f"write of step {step} ({len(held)} trajectories)"
                total.add(call(functools.partial(sink.write, batch), what))
                bar.update(len(held))
        call(sink.flush, "flush")
        notes: list[str] = call(sink.close, "close")
    except BackendTimeoutError as exc:
        raise BackendTimeoutError(
            f"{exc}{_disk_full(sink.destination)}; {report.trajectories_sent + total.sent} trajectories were "
            "handed over before it stopped answering; check that it answers and run the export again"
        ) from None  # its thread still waits inside the sink: closing would wait on it too
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the export is the one to say
            call(sink.close, "close")
        raise
    finally:
        bar.close()
    return existing, total, notes


def _disk_full(destination: str) -> str:
    """A note when ``destination`` is a local directory with no space left, else ``""``."""
    try:
        full = os.path.isdir(destination) and shutil.disk_usage(destination).free < DISK_FULL_BYTES
    except OSError:
        return ""
    return f" (the disk of {destination} is full: free space)" if full else ""


def recorded_backends(config: Mapping[str, Any]) -> list[str]:
    """The backend names a recorded config gives (``backend`` is one name or a list of them)."""
    named = config.get("backend")
    names = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    return [n for n in names if isinstance(n, str)]


def export_files(
    path: str | os.PathLike[str],
    to: str,
    *,
    steps: int | Sequence[int] | None = None,
    since_step: int | None = None,
    progress: bool = True,
    verify: bool = False,
    log_val_generations: int | None = None,
    **options: Any,
) -> ExportReport:
    """Export the trace files under ``path`` (``steps``, or those >= ``since_step``) to backend ``to``.

    ``verify`` reads the backend back and compares rows, rewards and metrics (``report.verify``);
    ``log_val_generations`` defaults to the recorded config's; ``options`` are :attr:`Backend.options`.

    Raises:
        ExportOptionError: unknown backend or option, or a bad option value.
        FileNotFoundError: ``path`` holds no trace files.
        ImportError: the backend's library is not installed (with the pip line).
        BackendTimeoutError: the destination stopped answering; the message says what was sent and what to do.
    """
    options = resolve_options(to, options)
    sink_class: type[SinkBase] = load_sink(to)
    report = ExportReport(to)
    wanted = [steps] if isinstance(steps, int) else steps
    p = os.fspath(path)
    for read_path, project, experiment in sink_class.sources(p, options):
        run = open_run(read_path, wanted, since_step)
        cap = run.log_val_generations if log_val_generations is None else log_val_generations
        target = Target(
            project or run.project,
            experiment or run.experiment,
            cap,
            {**read_run_config(read_path), "rollout_trace_source": os.path.abspath(p)},
        )
        sink = sink_class(options)
        call = functools.partial(_call, sink, to)
        existing, total, notes = _send_run(sink, call, run, target, report, progress)
        for tid, spans, why in sink.refused:  # counted as written: what the destination accepted is less
            total.sent -= 1
            total.spans -= spans
            total.rows.pop(tid, None)
            report.trajectories_refused += 1
            report.details.append(f"refused by {to}, not sent: trajectory {tid}: {why}")
        report.trajectories_sent += total.sent
        report.spans_sent += total.spans
        report.details.extend(total.notes)
        report.problems.extend(total.problems)
        # Sent to a destination that had some, or that the run was recorded live to: all it lacked was a catch-up.
        if total.sent and (existing or any(to in recorded_backends(c) for _, c in recorded_configs(read_path))):
            report.caught_up += total.sent
            report.details.append(
                f"caught up {total.sent} trajectories the destination did not have yet "
                f"({len(existing)} were there already, e.g. shipped live)"
            )
        report.trajectories_skipped += total.skipped + run.not_selected
        report.details.extend(notes)
        if run.not_selected:
            report.details.append(f"{run.not_selected} trajectories outside the selected steps not exported")
        if not (verify or sink.confirms()):
            continue
        # Read back for --verify, and always where the destination is local files (a full disk cuts them short).
        try:
            found = call(sink.read_back, "read-back")
        except Exception as exc:
            report.problems.append(
                f"{to}: what was written cannot be read back from {sink.destination or 'the destination'} "
                f"({type(exc).__name__}: {exc}); check its disk and export again"
            )
            continue
        result = VerifyResult.compare(to, total.rows, total.metrics, found)
        if verify:
            report.verify = result if report.verify is None else report.verify.merge(result)
            report.details.extend(result.lines)
        elif not result.ok:
            report.problems.append(
                f"{to}: {found.where or 'the destination'} holds {result.found} of the {result.expected} "
                f"trajectories written ({len(result.missing)} missing, {len(result.metrics_missing)} step metric "
                "values missing): its files stop early (a full disk?); free space and export again"
            )
    return report

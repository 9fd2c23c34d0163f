"""The process's recorder: the buffer decorators append to, and the writer thread.

``ACTIVE`` is the one configured recorder of this process (None when tracing
is off); :func:`tracer.init` replaces it. Decorators append one tuple per
finished span to :attr:`Recorder.buffer` and return; the writer thread drains
the buffer every ``flush_interval_s`` (sooner when it fills or on
:func:`tracer.flush`), applies sampling, encodes, decodes tokens, and writes a
zstd Arrow batch with ``fsync``.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import inspect
import itertools
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracer import schema as S
from tracer.config import ENV_STRICT, TraceConfig
from tracer.index.closed import shard_closed
from tracer.record import lifecycle
from tracer.record.capture import capture
from tracer.record.context import Trajectory
from tracer.record.encode import Encoder, error_fields, to_json
from tracer.record.redact import Redactor
from tracer.record.sampling import IN, OUT, PENDING, StepSampler, decisions_json
from tracer.storage.history import HistoryTracker
from tracer.storage.upload import UploadingSpanWriter
from tracer.storage.uri import is_remote, join_uri
from tracer.storage.writer import SpanWriter

if TYPE_CHECKING:
    from tracer.exporters.base import Driver

logger = logging.getLogger("rollout_trace")

#: The configured recorder of this process, or None when tracing is off.
ACTIVE: Recorder | None = None

#: Rows per Arrow batch written.
BATCH_ROWS = 8192
#: Characters of JSON text (inputs, outputs, attributes, errors) per batch; a
#: batch is cut sooner when its rows hold more (Arrow string columns hold at
#: most 2 GiB, and a batch is built in memory at once).
BATCH_CHARS = 64 * 1024 * 1024
#: Records turned into JSON text at a time within a batch (see
#: :meth:`Recorder.encode_batches`): small enough that what one chunk builds
#: dies young, large enough that the per-chunk work (one secret scan, one
#: decode call per tokenizer) stays negligible.
ENCODE_CHUNK = 128
#: One value's UTF-8 bytes an Arrow string column can hold; larger ones
#: become a marked placeholder.
MAX_VALUE_BYTES = 2**31 - 2**20
#: How long a recording call in ``on_buffer_full="block"`` mode waits for a
#: writer that makes no progress at all before it drops the span (and counts
#: it): the rollout never hangs on the tracer's own stall.
MAX_STALL_WAIT_S = 10.0
#: Attribute naming the values of a span that were replaced by a placeholder.
ATTR_REPLACED = "rollout_trace.replaced"

#: Per thread: set while the caller holds a lock the writer also takes (the
#: sampler's) or waits for room. A signal handler that records runs on the
#: thread it interrupted; seeing this set, it never waits for the writer
#: (which may be waiting for that very lock): a full buffer drops and counts.
_CALLER = threading.local()
#: Trajectories remembered for log_reward calls made after the rollout.
MAX_REMEMBERED_TRAJECTORIES = 200_000

# Positions in a span record tuple (built on the caller's path).
R_SPAN, R_PARENT, R_TRACE, R_SPEC, R_TRAJ, R_START, R_END, R_EXC, R_ARGS, R_KWARGS, R_OUT, R_SELF = range(12)


#: Function attribute asking for another inputs/outputs layout; the verl
#: drop-in sets it to :data:`LAYOUT_VERL` on the methods verl decorates.
LAYOUT_ATTR = "__rollout_trace_layout__"
#: verl's own layout: inputs bound with defaults applied and ``**kwargs`` kept
#: as one ``kwargs`` entry; token2text's ``prompt_text``/``response_text`` also
#: in the outputs (verl's ``rollout_trace_op``).
LAYOUT_VERL = "verl"


class OpSpec:
    """What the decorator knows about a traced function, computed once."""

    __slots__ = ("name", "kind", "params", "varargs", "has_self", "special", "signature")

    def __init__(
        self, fn: Callable[..., Any] | None, name: str | None, kind: str | None, special: str | None = None
    ) -> None:
        self.name: str = name or str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "span"))
        self.kind = kind or S.KIND_SPAN
        self.special = special
        self.params: tuple[str, ...] = ()
        self.varargs: str | None = None
        self.has_self = False
        #: Set for the verl layout: calls are bound to it as verl binds them.
        self.signature: inspect.Signature | None = None
        if fn is None:
            return
        try:
            sig = inspect.signature(fn)
            params = list(sig.parameters.values())
        except (TypeError, ValueError):
            sig, params = None, []
        if sig is not None and getattr(fn, LAYOUT_ATTR, None) == LAYOUT_VERL:
            self.signature = sig
        if params and params[0].name in ("self", "cls"):
            self.has_self = True
            params = params[1:]
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.params = tuple(p.name for p in params if p.kind in positional)
        self.varargs = next((p.name for p in params if p.kind == inspect.Parameter.VAR_POSITIONAL), None)

    def bind(self, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """Name the captured arguments."""
        if self.signature is not None:
            try:
                bound = self.signature.bind(*((None,) if self.has_self else ()), *(args or ()), **(kwargs or {}))
            except TypeError:
                pass  # the call itself failed to bind: record what was passed
            else:
                given = set(bound.arguments)
                bound.apply_defaults()
                named = dict(bound.arguments)
                for name in named.keys() - given:
                    # Defaults were not captured at call time: the writer takes only captured tuples as ids.
                    named[name] = capture(named[name])
                if self.varargs is not None and type(named.get(self.varargs)) is tuple:
                    named[self.varargs] = list(named[self.varargs])  # not an id tuple (see capture)
                if self.has_self:
                    named.pop(next(iter(self.signature.parameters)), None)
                return named
        out: dict[str, Any] = {}
        if args:
            n = len(self.params)
            for i, value in enumerate(args):
                if i < n:
                    out[self.params[i]] = value
                else:
                    out.setdefault(self.varargs or "args", []).append(value)
        if kwargs:
            out.update(kwargs)
        return out


ROOT_SPEC = OpSpec(None, "rollout_trace", S.KIND_ROLLOUT, special="root")
REWARD_SPEC = OpSpec(None, S.REWARD_SPAN_NAME, S.KIND_REWARD, special="reward")


@dataclasses.dataclass
class FlushResult:
    """What :func:`tracer.flush` achieved. Truthy when nothing failed.

    Attributes:
        ok: Everything recorded before the call is durable on disk.
        spans_written: Spans written by this process so far.
        spans_dropped: Spans dropped because the buffer was full (``on_buffer_full="drop"``).
        spans_failed: Spans that could not be written (storage errors).
        internal_errors: Tracer errors counted (encoding, decoding, ...).
        message: What happened since the previous result: losses, values
            replaced, the tracer's problems. Empty when there were none.
        values_replaced: Values written as a marked placeholder because their
            column could not hold them (a name that is not a string, an int
            beyond int64, ...); named in the span's ``rollout_trace.replaced``.
    """

    ok: bool
    spans_written: int = 0
    spans_dropped: int = 0
    spans_failed: int = 0
    internal_errors: int = 0
    message: str = ""
    values_replaced: int = 0

    def __bool__(self) -> bool:
        return self.ok


class _ProblemLog:
    """Counts the tracer's own problems and logs each kind once."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.last: dict[str, str] = {}
        self.first_exception: BaseException | None = None

    def report(self, kind: str, detail: str, exc: BaseException | None = None) -> None:
        self.counts[kind] += 1
        self.last[kind] = detail
        if exc is not None and self.first_exception is None:
            self.first_exception = exc
        if self.counts[kind] == 1:
            logger.warning(
                "rollout-trace: %s: %s (logged once; later ones are counted, see tracer.flush())",
                kind,
                detail,
            )


class Recorder:
    """Buffer, sampler and writer thread for one process and one config."""

    def __init__(self, config: TraceConfig, ids_from: Recorder | None = None) -> None:
        self.config = config
        self.buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self.limit = config.max_buffered_spans
        #: Below this many buffered spans, decorators append directly; at or
        #: above it they go through append() (wake the writer, enforce limit).
        self.fast_limit = min(BATCH_ROWS, self.limit)
        self.block_when_full = config.on_buffer_full == "block"
        self.strict = os.environ.get(ENV_STRICT, "") not in ("", "0")
        self.span_ids: itertools.count[int]
        self.trace_ids: itertools.count[int]
        self.span_prefix: str
        self.trace_prefix: str
        if ids_from is not None:
            # A re-init in the same process: one id space, so spans opened under
            # the old recorder and finished under this one keep their links.
            self.span_ids, self.trace_ids = ids_from.span_ids, ids_from.trace_ids
            self.span_prefix, self.trace_prefix = ids_from.span_prefix, ids_from.trace_prefix
        else:
            self.span_ids = itertools.count(1)
            self.trace_ids = itertools.count(1)
            self.span_prefix = secrets.token_hex(4)
            self.trace_prefix = secrets.token_hex(8)
        self.sampler = (
            StepSampler(
                config.max_samples_per_step_per_worker,
                config.seed,
                config.flush_interval_s,
                config.sample_strategy,
                config.sample_by,
                config.sample_candidates_per_step,
            )
            if config.max_samples_per_step_per_worker
            else None
        )
        self.problems = _ProblemLog()
        self.redactor = Redactor(config.redact_patterns) if config.redact else None
        self._trajectories: collections.OrderedDict[tuple[Any, ...], Trajectory] = collections.OrderedDict()
        # Reentrant locks: a signal handler that records runs on the thread it
        # interrupts, maybe while that thread holds one of them.
        self._traj_lock = threading.RLock()
        self._held: list[tuple[Any, ...]] = []
        #: Live exporters (one per backend): fed each durable batch, flushed, shut down.
        self._drivers: list[Driver] = []
        self._wake = threading.Event()
        # Event.set takes a lock that is not reentrant: a signal handler that
        # interrupted a set() and calls set() again would deadlock. Setters
        # take this guard without blocking; whoever holds it is setting anyway.
        self._wake_guard = threading.Lock()
        self._cond = threading.Condition(threading.RLock())
        self._flush_requested = 0
        self._flush_done = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.RLock()
        #: Held by the writer during a cycle; fork() waits for it (see _before_fork).
        self._fork_lock = threading.RLock()
        self.spans_written = 0
        self.spans_dropped = 0
        self.spans_failed = 0
        self._failed_at_last_result = 0
        self._dropped_at_last_result = 0
        #: Values replaced by a placeholder because a column could not hold them.
        self.values_replaced = 0
        self._replaced_at_last_result = 0
        self._problems_at_last_result: collections.Counter[str] = collections.Counter()
        #: Totals of the recorders this one replaced (see :func:`set_active`).
        self._base = _Totals()
        #: Set once shut down: late spans go to the active recorder.
        self.closed = False
        self._cycles = 0
        self.spans_sampled_out = 0
        self._tokenizer: Any = None
        self._tokenizer_loaded = False
        #: Multi-turn prompt_ids stored once (writer thread; tracer/storage/history.py).
        self._history = HistoryTracker()
        self._history_file: str | None = None
        if is_remote(config.output_dir):
            # Stage locally, upload each closed file (tracer/storage/upload.py). At exit the
            # writer calls back here to flush the buffer before it uploads.
            self.writer: SpanWriter = UploadingSpanWriter(
                join_uri(config.output_dir, config.project_dir, config.experiment_dir),
                self._file_metadata(),
                compression_level=config.compression_level,
                max_file_bytes=config.max_file_bytes,
                upload_interval_s=config.upload_interval_s,
                report=self.problems.report,
                at_exit=functools.partial(_shutdown_at_exit, self),
            )
        else:
            self.writer = SpanWriter(
                config.run_dir,
                self._file_metadata(),
                compression_level=config.compression_level,
                max_file_bytes=config.max_file_bytes,
                on_close=shard_closed,
            )
        self._start_thread()

    def _file_metadata(self) -> dict[str, str]:
        return {
            S.META_SCHEMA_VERSION: S.SCHEMA_VERSION,
            S.META_CONFIG: json.dumps(self.config.to_dict()),
            S.META_PROJECT: self.config.project_name,
            S.META_EXPERIMENT: self.config.experiment_name,
            S.META_HOST: socket.gethostname(),
            S.META_PID: str(os.getpid()),
            S.META_CREATED_NS: str(time.time_ns()),
            **({S.META_SAMPLING: json.dumps(self.sampler.parameters())} if self.sampler is not None else {}),
        }

    # -- caller's path -----------------------------------------------------

    def open_span(
        self, spec: OpSpec, parent: tuple[int, int, Trajectory | None] | None
    ) -> tuple[tuple[int, int, Trajectory | None], int | None] | None:
        """Return (frame, parent span id) for a new span, or None to not record."""
        if parent is None:
            if spec.kind == S.KIND_ROLLOUT:
                traj = self.new_trajectory(None, None, None, None, spec.name, None, True)
                traj.root_claimed = True
                traj.spans = 1
                return (traj.root_span_id, traj.trace_id, traj), None
            return (next(self.span_ids), next(self.trace_ids), None), None
        ptraj = parent[2]
        if ptraj is not None:
            traj = ptraj
            if not traj.recording:
                return None
            traj.spans += 1
            if spec.kind == S.KIND_ROLLOUT:
                if parent[0] == traj.root_span_id and not traj.root_claimed:
                    traj.root_claimed = True
                    return (traj.root_span_id, traj.trace_id, traj), None
                # A rollout inside a trajectory starts a trajectory of its own.
                child = self.new_trajectory(
                    traj.step,
                    traj.sample_index,
                    traj.rollout_n,
                    traj.validate,
                    spec.name,
                    traj.extra,
                    True,
                    remember=False,
                )
                child.root_claimed = True
                child.spans = 1
                child.sample = traj.sample
                return (child.root_span_id, child.trace_id, child), None
        return (next(self.span_ids), parent[1], ptraj), parent[0]

    def append(self, record: tuple[Any, ...]) -> None:
        """Add a finished span; the slow path when the buffer is filling up."""
        if self.closed:
            self._forward(record)
            return
        buf = self.buffer
        if len(buf) >= self.limit and not self._make_room():
            self.spans_dropped += 1
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
            self.spans_dropped += 1

    def _make_room(self) -> bool:
        """The buffer is full: wait for the writer (block mode) or give up (drop).

        The wait is bounded by the writer's progress: when it finishes no
        cycle for :data:`MAX_STALL_WAIT_S` (stuck in a user's ``__repr__``, a
        hung file system), the span is dropped and counted instead.
        """
        if not self.block_when_full or self._stopping or getattr(_CALLER, "busy", False):
            return False
        self._start_thread()
        self._wake_writer()
        cycles, since = self._cycles, time.monotonic()
        _CALLER.busy = True
        try:
            return self._wait_for_room(cycles, since)
        finally:
            _CALLER.busy = False

    def _wait_for_room(self, cycles: int, since: float) -> bool:
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

    def new_trajectory(
        self,
        step: int | None,
        sample_index: str | None,
        rollout_n: int | None,
        validate: bool | None,
        name: str,
        extra: dict[str, Any] | None,
        trace: bool,
        remember: bool = True,
    ) -> Trajectory:
        """Start a trajectory: ids, sampling decision, and log_reward lookup."""
        traj = Trajectory(
            step, sample_index, rollout_n, validate, name, extra, trace, next(self.span_ids), next(self.trace_ids)
        )
        if trace and self.sampler is not None and sample_index is not None:
            busy = getattr(_CALLER, "busy", False)
            _CALLER.busy = True
            try:
                sample = self.sampler.admit(step, validate, sample_index)
            finally:
                _CALLER.busy = busy
            if sample is None:
                traj.recording = False
            else:
                traj.sample = sample
                sample.trajectories.append(traj)
                if sample.state == OUT:
                    traj.recording = False
        if remember and sample_index is not None:
            key = (step, sample_index, rollout_n, bool(validate))
            with self._traj_lock:
                self._trajectories[key] = traj
                if len(self._trajectories) > MAX_REMEMBERED_TRAJECTORIES:
                    self._trajectories.popitem(last=False)
        return traj

    def end_trajectory(self, traj: Trajectory, start: int, exc: BaseException | None) -> None:
        """Close a rollout_trace_attr block: write its root unless an op was the root."""
        if traj.recording and not traj.root_claimed and traj.spans > 0:
            self.append(
                (
                    traj.root_span_id,
                    None,
                    traj.trace_id,
                    ROOT_SPEC,
                    traj,
                    start,
                    time.time_ns(),
                    exc,
                    None,
                    None,
                    None,
                    None,
                )
            )

    def find_trajectory(self, step: Any, sample_index: str | None, rollout_n: Any, validate: Any) -> Trajectory | None:
        with self._traj_lock:
            return self._trajectories.get((step, sample_index, rollout_n, bool(validate)))

    def internal_error(self, what: str, exc: BaseException) -> None:
        """Count a failure of the tracer itself; raise it under ROLLOUT_TRACE_STRICT."""
        self.problems.report("internal error", f"{what}: {type(exc).__name__}: {exc}", exc)
        if self.strict:
            raise exc

    # -- writer thread -----------------------------------------------------

    def _start_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="rollout-trace-writer", daemon=True)
                self._thread.start()

    def add_driver(self, driver: Driver) -> None:
        """Feed ``driver`` each durable batch (writer thread), flush it in flush(), shut it down last."""
        self._drivers.append(driver)

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
                if self.sampler.watches:
                    self._observe_for_sampling(records)
                self.sampler.decide(force)
                records = self._apply_sampling(records)
            except Exception as exc:  # write them all rather than lose them
                self.problems.report("sampling failed", f"{type(exc).__name__}: {exc}; spans written unsampled", exc)
        for i in range(0, len(records), BATCH_ROWS):
            self._write(records[i : i + BATCH_ROWS])
        if force and self.sampler is not None and self.sampler.has_decisions:
            # Decisions no span carried (every group dropped, late arrivals): an empty batch holds them.
            self._write_batch(pa.RecordBatch.from_pylist([], schema=S.SPAN_SCHEMA))

    def _redacted(self, value: Any) -> Any:
        """``value`` with secrets replaced, as the columns are (sample ids in sampling decisions)."""
        return self.redactor.value(value) if self.redactor is not None else value

    def _observe_for_sampling(self, records: list[tuple[Any, ...]]) -> None:
        """Show extremes/variance the rewards, lengths and ends of the held groups' spans."""
        observe = self.sampler.observe if self.sampler is not None else None
        for rec in records:
            traj = rec[R_TRAJ]
            if traj is None or observe is None or traj.sample is None or traj.sample.state != PENDING:
                continue
            spec: OpSpec = rec[R_SPEC]
            ok = rec[R_EXC] is None
            op = spec.special is None and ok
            observe(
                traj,
                rec[R_SPAN] == traj.root_span_id,
                rec[R_ARGS][0] if spec.special == "reward" else None,
                _as_reward(rec[R_OUT]) if op and spec.kind == S.KIND_REWARD else None,
                rec[R_OUT] if op and spec.kind == S.KIND_LLM else None,
            )

    def _apply_sampling(self, records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        ready: list[tuple[Any, ...]] = []
        held: list[tuple[Any, ...]] = []
        for rec in itertools.chain(self._held, records):
            traj = rec[R_TRAJ]
            sample = traj.sample if traj is not None else None
            state = sample.state if sample is not None else IN
            if state == IN:
                ready.append(rec)
            elif state == PENDING:
                held.append(rec)
            else:
                self.spans_sampled_out += 1
        self._held = held
        return ready

    def _tokenizer_for(self, self_obj: Any) -> Any:
        if not self.config.token2text:
            return None
        if not self._tokenizer_loaded:
            self._tokenizer_loaded = True
            tok = self.config.tokenizer
            if isinstance(tok, (str, os.PathLike)):
                from tracer.record.tokenizer import load_tokenizer

                try:
                    tok = load_tokenizer(os.fspath(tok))
                except Exception as exc:
                    self.problems.report("tokenizer", f"cannot load {tok!r}: {exc}", exc)
                    tok = None
            self._tokenizer = tok
        if self._tokenizer is not None:
            return self._tokenizer
        return getattr(self_obj, "tokenizer", None) if self_obj is not None else None

    def _write(self, records: list[tuple[Any, ...]]) -> None:
        try:
            batches = self.encode_batches(records)
        except Exception as exc:
            # Something in one span the column fixes did not catch: encode
            # them one by one so that only the bad ones are lost (and counted).
            self.problems.report("internal error", f"encoding a batch: {type(exc).__name__}: {exc}", exc)
            self._history.clear()  # it may hold spans of the failed pass: no reference to them, nor to itself
            batches = []
            for rec in records:
                try:
                    batches.extend(self.encode_batches([rec]))
                except Exception as err:
                    self.spans_failed += 1
                    self.problems.report(
                        "span not encodable", f"{rec[R_SPEC].name!r}: {type(err).__name__}: {err}", err
                    )
        for batch in batches:
            self._write_batch(batch)

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        try:
            self.writer.write(batch, self._batch_metadata(n))
        except Exception as exc:
            self.spans_failed += n
            self._history.clear()  # later turns must not refer to spans that were not written
            self.problems.report(
                "write failed",
                f"{n} spans not written to {self.writer.run_dir}: {type(exc).__name__}: {exc}",
                exc,
            )
            return
        self.spans_written += n
        for driver in self._drivers:
            try:
                driver.export(batch)
            except Exception as exc:
                self.problems.report("exporter error", f"{type(driver).__qualname__}: {exc}", exc)

    def _batch_metadata(self, n: int) -> dict[str, str]:
        return {
            S.BATCH_META_SPANS_WRITTEN: str(self._base.written + self.spans_written + n),
            S.BATCH_META_SPANS_DROPPED: str(self._base.dropped + self.spans_dropped),
            S.BATCH_META_INTERNAL_ERRORS: str(sum(self.problems.counts.values())),
            **(
                {S.BATCH_META_SAMPLING: decisions_json(self._redacted(self.sampler.take_decisions()))}
                if self.sampler is not None and self.sampler.has_decisions
                else {}
            ),
        }

    def encode(self, records: list[tuple[Any, ...]]) -> pa.RecordBatch:
        """Turn span records into one Arrow batch (writer thread; see :meth:`encode_batches`)."""
        batches = self.encode_batches(records)
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches, schema=S.SPAN_SCHEMA).combine_chunks().to_batches()[0]

    def encode_batches(self, records: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
        """Turn span records into Arrow batches of at most :data:`BATCH_CHARS` of text (writer thread).

        A value a column cannot hold (a name that is not a string, a lone
        surrogate, an int beyond int64, a value over 2 GiB) is replaced by a
        marked placeholder, named in the span's ``rollout_trace.replaced``
        attribute and counted; every other value and span is written.

        Records are turned into JSON text :data:`ENCODE_CHUNK` at a time:
        what a chunk builds on the way (prepared values, decode jobs,
        per-token texts) is garbage before the next chunk starts, so the
        garbage collector never sees a whole batch of it survive into its
        old generation (which would cost full collections of the process).
        """
        n = len(records)
        rewards: list[float | None] = [None] * n
        statuses: list[str] = [S.STATUS_OK] * n
        errors: list[Any] = [None] * n
        names: list[Any] = [None] * n
        steps: list[int | None] = [None] * n
        samples: list[Any] = [None] * n
        rollouts: list[int | None] = [None] * n
        validates: list[bool | None] = [None] * n
        inputs_col: list[str | None] = []
        outputs_col: list[str | None] = []
        attrs_col: list[str | None] = []
        for lo in range(0, n, ENCODE_CHUNK):
            texts = self._encode_chunk(records, lo, min(n, lo + ENCODE_CHUNK), rewards, statuses, errors, names)
            inputs_col.extend(texts[0])
            outputs_col.extend(texts[1])
            attrs_col.extend(texts[2])
        for i, rec in enumerate(records):
            traj: Trajectory | None = rec[R_TRAJ]
            if traj is not None:
                steps[i] = traj.step
                samples[i] = traj.sample_index
                rollouts[i] = traj.rollout_n
                validates[i] = traj.validate
        redactor = self.redactor
        if redactor is not None:
            errors = [None if e is None else redactor.value(e) for e in errors]
            names = redactor.texts(names)
            samples = redactor.texts(samples)
        errors_col = [None if e is None else to_json(e) for e in errors]
        sp, tp = self.span_prefix, self.trace_prefix
        cols: dict[str, list[Any]] = {
            S.TRACE_ID: [f"{tp}{r[R_TRACE]:016x}" if r[R_TRACE] else "" for r in records],
            S.SPAN_ID: [f"{sp}{r[R_SPAN]:08x}" for r in records],
            S.PARENT_SPAN_ID: [None if r[R_PARENT] is None else f"{sp}{r[R_PARENT]:08x}" for r in records],
            S.NAME: names,
            S.KIND: [r[R_SPEC].kind for r in records],
            S.START_NS: [r[R_START] for r in records],
            S.END_NS: [r[R_END] for r in records],
            S.STATUS: statuses,
            S.ERROR: errors_col,
            S.STEP: steps,
            S.SAMPLE_INDEX: samples,
            S.ROLLOUT_N: rollouts,
            S.VALIDATE: validates,
            S.REWARD: rewards,
            S.INPUTS: inputs_col,
            S.OUTPUTS: outputs_col,
            S.ATTRIBUTES: attrs_col,
        }
        slices, big = _byte_bounded_slices(cols, n)
        return [self._build_batch(cols, lo, hi, big) for lo, hi in slices]

    def _encode_chunk(
        self,
        records: list[tuple[Any, ...]],
        lo: int,
        hi: int,
        rewards: list[float | None],
        statuses: list[str],
        errors: list[Any],
        names: list[Any],
    ) -> tuple[list[str | None], list[str | None], list[str | None]]:
        """JSON text of the inputs, outputs and attributes of ``records[lo:hi]``.

        Also fills rows ``lo:hi`` of the reward, status, error and name columns.
        """
        cfg = self.config
        enc = Encoder(cfg.token_fields, cfg.token2text, cfg.max_tokens, cfg.store_full_token, cfg.redact)
        prepared: list[tuple[Any, Any, dict[str, Any], bool]] = []
        tokenizer_for = self._tokenizer_for
        prepare = enc.prepare_captured  # every value of a record was captured at call time
        chunk = records[lo:hi]
        for j, rec in enumerate(chunk):
            i = lo + j
            enc.begin_record()
            spec: OpSpec = rec[R_SPEC]
            traj: Trajectory | None = rec[R_TRAJ]
            exc = rec[R_EXC]
            special = spec.special
            attrs: dict[str, Any] = {}
            inputs: Any = None
            outputs: Any = None
            try:
                if special == "reward":
                    rewards[i] = rec[R_ARGS][0]
                    attrs.update(prepare(rec[R_KWARGS] or {}, None, {}))
                elif special is None:
                    tok = tokenizer_for(rec[R_SELF])
                    inputs = prepare(spec.bind(rec[R_ARGS], rec[R_KWARGS]), tok, attrs)
                    if exc is None:
                        out = rec[R_OUT]
                        outputs = prepare(out, tok, attrs)
                        if spec.kind == S.KIND_REWARD:
                            rewards[i] = _as_reward(out)
                if traj is not None and rec[R_PARENT] is None and traj.extra:
                    attrs.update(prepare(traj.extra, None, {}))
            except Exception as err:
                self.problems.report("internal error", f"encoding span {spec.name!r}: {type(err).__name__}: {err}", err)
                inputs, outputs = f"<not recorded: {type(err).__name__}: {err}>", None
                enc.opaque.add(j)
            prepared.append((inputs, outputs, attrs, special is None and exc is None))
            names[i] = traj.name if special == "root" and traj is not None else spec.name
            if exc is not None:
                if _is_cancel(exc):
                    statuses[i] = S.STATUS_CANCELLED
                else:
                    statuses[i] = S.STATUS_ERROR
                    errors[i] = error_fields(exc)
        failed = enc.decode_pending()
        if failed:
            self.problems.report("token2text", f"{failed} batch_decode call(s) failed; decoded one by one")
        redactor = self.redactor
        flags = redactor.records_to_scan(enc.strings, enc.opaque) if redactor is not None else None
        done: set[int] = set()
        if flags is not None and redactor is not None:
            done = enc.redact_pieces(redactor, flags)  # each decoded text with its tokens, before verl moves it
        for j, rec in enumerate(chunk):
            if rec[R_SPEC].signature is not None:
                _verl_texts(prepared[j][0], prepared[j][1])
        if redactor is not None and flags is not None:
            # Redact the strings themselves, before JSON escaping: a secret
            # holding a quote or backslash is matched as it is.
            clean = functools.partial(redactor.value, done=done)
            prepared = [(clean(p[0]), clean(p[1]), clean(p[2]), p[3]) if f else p for p, f in zip(prepared, flags)]
        self._store_history_once(chunk, prepared)
        return (
            [None if p[0] is None else to_json(p[0]) for p in prepared],
            [to_json(p[1]) if p[3] else None for p in prepared],
            [to_json(p[2]) if p[2] else None for p in prepared],
        )

    def _store_history_once(self, records: list[tuple[Any, ...]], prepared: list[tuple[Any, Any, Any, bool]]) -> None:
        """Turn each llm span's prompt_ids that extend its trajectory's last llm turn into a reference."""
        path = getattr(self.writer, "path", None)
        if path != self._history_file:
            if self._history_file is not None:
                # The file was closed (rotated): references stay within one file,
                # so that each file reads back on its own.
                self._history.clear()
            self._history_file = path
        history, sp = self._history, self.span_prefix
        for rec, (inputs, outputs, _, has_outputs) in zip(records, prepared):
            trace = rec[R_TRACE]
            if not trace:
                continue
            spec: OpSpec = rec[R_SPEC]
            if spec.kind == S.KIND_LLM and spec.special is None:
                history.encode(trace, f"{sp}{rec[R_SPAN]:08x}", inputs, outputs if has_outputs else None)
            elif rec[R_PARENT] is None:
                history.end(trace)

    def _build_batch(self, cols: dict[str, list[Any]], lo: int, hi: int, big: bool = False) -> pa.RecordBatch:
        """One batch of rows ``lo:hi``; values a column refuses become placeholders."""
        arrays = []
        notes: dict[int, dict[str, str]] = {}
        for name, typ, _, _ in S.SPAN_FIELDS:
            values = cols[name][lo:hi] if (lo, hi) != (0, len(cols[name])) else cols[name]
            arr = None if big and name in _JSON_COLUMNS else _try_array(values, typ)
            if arr is None:
                values = _fit_column(name, values, typ, notes)
                arr = pa.array(values, type=typ)
            arrays.append(arr)
        if notes:
            self.values_replaced += sum(len(v) for v in notes.values())
            attrs = arrays[S.SPAN_COLUMNS.index(S.ATTRIBUTES)].to_pylist()
            for i, note in notes.items():
                old = json.loads(attrs[i]) if attrs[i] else {}
                old[ATTR_REPLACED] = note
                attrs[i] = to_json(old)
            arrays[S.SPAN_COLUMNS.index(S.ATTRIBUTES)] = pa.array(attrs, type=pa.string())
            self.problems.report(
                "value replaced",
                "; ".join(f"{col}: {why}" for note in notes.values() for col, why in note.items())[:500],
            )
        return pa.RecordBatch.from_arrays(arrays, schema=S.SPAN_SCHEMA)

    # -- flush and shutdown -------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> FlushResult:
        """Wait until everything recorded before this call is durable."""
        if self._thread is None and not self.buffer and not self._held:
            return self.result(True)
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
                    return self.result(False, f"flush timed out after {timeout} s; the writer is still busy")
                self._cond.wait(timeout=0.1 if left is None else min(left, 0.1))
        exported = []
        if self._drivers:  # what each live backend failed to take, all within the same deadline
            from tracer.exporters.bounded import flush_drivers

            exported = flush_drivers(self._drivers, None if deadline is None else deadline - time.monotonic())
        first = self.problems.first_exception
        if self.strict and first is not None:
            self.problems.first_exception = None
            raise first
        return self.result(self._flush_done >= target and not exported, "; ".join(exported))

    def result(self, done: bool, message: str = "") -> FlushResult:
        """The flush result: ok when nothing failed or was dropped since the previous result.

        The counts in it are running totals of this process (recorders a
        re-init replaced included); ``ok`` looks only at what happened since
        the last result, so recording is reported healthy again once a storage
        failure is over. ``message`` says what happened since then: losses,
        values replaced by placeholders, and every kind of tracer problem.
        """
        base = self._base
        failed = base.failed + self.spans_failed
        dropped = base.dropped + self.spans_dropped
        replaced = base.replaced + self.values_replaced
        new_failed = failed - self._failed_at_last_result
        new_dropped = dropped - self._dropped_at_last_result
        new_replaced = replaced - self._replaced_at_last_result
        counts = collections.Counter(self.problems.counts)
        new_problems = counts - self._problems_at_last_result
        self._failed_at_last_result, self._dropped_at_last_result = failed, dropped
        self._replaced_at_last_result, self._problems_at_last_result = replaced, counts
        # A writer error is a cycle that ended early: what it held is unaccounted for.
        ok = done and new_failed == 0 and new_dropped == 0 and not new_problems["writer error"]
        parts = [message] if message else []
        if new_dropped:
            parts.append(f"{new_dropped} spans dropped since the last flush (buffer full or writer stalled)")
        if new_failed:
            parts.append(f"{new_failed} spans not written since the last flush")
        if new_replaced:
            parts.append(f"{new_replaced} values replaced by placeholders (see the spans' {ATTR_REPLACED!r})")
        parts.extend(f"{k} x{v}: {self.problems.last.get(k, '')}" for k, v in new_problems.items())
        return FlushResult(
            ok,
            base.written + self.spans_written,
            dropped,
            failed,
            sum(counts.values()),
            "; ".join(parts),
            replaced,
        )

    def marks(self) -> tuple[int, int, int, collections.Counter[str]]:
        """What the last result had reported (pass to :meth:`adopt`)."""
        return (
            self._failed_at_last_result,
            self._dropped_at_last_result,
            self._replaced_at_last_result,
            collections.Counter(self._problems_at_last_result),
        )

    def adopt(self, old: Recorder, marks: tuple[int, int, int, collections.Counter[str]] | None = None) -> None:
        """Take over the counts of ``old``, which this recorder replaces.

        ``marks`` (``old.marks()`` taken before its shutdown) say what the
        user last saw reported: this recorder's next flush reports the rest.
        """
        ob = old._base
        self._base = _Totals(
            ob.written + old.spans_written,
            ob.dropped + old.spans_dropped,
            ob.failed + old.spans_failed,
            ob.replaced + old.values_replaced,
        )
        failed_at, dropped_at, replaced_at, problems_at = marks if marks is not None else old.marks()
        self._failed_at_last_result = failed_at
        self._dropped_at_last_result = dropped_at
        self._replaced_at_last_result = replaced_at
        carried = collections.Counter(old.problems.counts)
        self._problems_at_last_result = self._problems_at_last_result + problems_at
        self.problems.counts.update(carried)
        for kind, detail in old.problems.last.items():
            self.problems.last.setdefault(kind, detail)
        if self.problems.first_exception is None:
            self.problems.first_exception = old.problems.first_exception

    def shutdown(self, timeout: float | None = 30.0) -> FlushResult:
        """Flush, stop the writer thread, close the file.

        Spans that finish later (calls in flight during a re-init) go to the
        recorder active then, with their ids; with none active they are
        counted as dropped.
        """
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
        if self._drivers:
            from tracer.exporters.bounded import shutdown_drivers

            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            for line in shutdown_drivers(self._drivers, left):
                self.problems.report("exporter shutdown failed", line)
        buf = self.buffer
        while buf:  # appended after the writer's last cycle
            self._forward(buf.popleft())
        late = self.result(True)
        if not late.ok or late.message:
            message = "; ".join(m for m in (result.message, late.message) if m)
            result = dataclasses.replace(late, ok=result.ok and late.ok, message=message)
        return result


class _Totals:
    """Counts carried over from the recorders a re-init replaced."""

    __slots__ = ("written", "dropped", "failed", "replaced")

    def __init__(self, written: int = 0, dropped: int = 0, failed: int = 0, replaced: int = 0) -> None:
        self.written, self.dropped, self.failed, self.replaced = written, dropped, failed, replaced


def _try_array(values: list[Any], typ: pa.DataType) -> pa.Array | None:
    try:
        arr = pa.array(values, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
        return None
    # Over 2 GiB of text comes back chunked: not one batch column.
    return arr if isinstance(arr, pa.Array) else None


def _fit_column(name: str, values: list[Any], typ: pa.DataType, notes: dict[int, dict[str, str]]) -> list[Any]:
    """``values`` with each one the column refuses replaced; note why per row."""
    out = list(values)
    is_text = pa.types.is_string(typ)
    for i, v in enumerate(values):
        if v is None:
            continue
        if is_text and type(v) is str:
            if len(v) * 4 > MAX_VALUE_BYTES and len(v.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
                out[i] = f"<not recorded: {len(v)} characters, more than a column holds ({MAX_VALUE_BYTES} bytes)>"
                notes.setdefault(i, {})[name] = f"{len(v)} characters, over {MAX_VALUE_BYTES} bytes"
                continue
            try:
                v.encode("utf-8")
                continue
            except UnicodeEncodeError:
                # Lone surrogates: written as \udXXX escapes (JSON columns never hold them).
                out[i] = v.encode("utf-8", "backslashreplace").decode("utf-8")
                notes.setdefault(i, {})[name] = "lone surrogates written as \\u escapes"
                continue
        if _try_array([v], typ) is not None:
            continue
        text = _describe(v)
        out[i] = f"<{text}>" if is_text else None
        notes.setdefault(i, {})[name] = text
    return out


def _describe(value: Any) -> str:
    try:
        text = repr(value) if type(value) in (int, float, bool, str, bytes) else f"a {type(value).__name__}"
    except Exception:
        text = f"a {type(value).__name__}"
    if isinstance(value, int):
        text = f"int {text[:40]} beyond int64"
    return f"not storable here: {text[:200]}".encode("utf-8", "backslashreplace").decode("utf-8")


_JSON_COLUMNS = frozenset({S.INPUTS, S.OUTPUTS, S.ATTRIBUTES, S.ERROR})


def _byte_bounded_slices(cols: dict[str, list[Any]], n: int) -> tuple[list[tuple[int, int]], bool]:
    """Row ranges whose JSON text stays under :data:`BATCH_CHARS` (a lone big row: its own batch).

    Also says whether some row may hold a value over :data:`MAX_VALUE_BYTES`.
    """
    text_cols = [cols[name] for name in (S.INPUTS, S.OUTPUTS, S.ATTRIBUTES, S.ERROR)]
    total = sum(sum(map(len, filter(None, c))) for c in text_cols)  # in C: the common case, one batch
    if total <= BATCH_CHARS:
        return [(0, n)], total * 4 > MAX_VALUE_BYTES
    sizes = [sum(len(c[i]) for c in text_cols if c[i] is not None) for i in range(n)]
    big = bool(sizes) and max(sizes) * 4 > MAX_VALUE_BYTES
    if sum(sizes) <= BATCH_CHARS:
        return [(0, n)], big
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and acc + size > BATCH_CHARS:
            out.append((lo, i))
            lo, acc = i, 0
        acc += size
    out.append((lo, n))
    return out, big


def _verl_texts(inputs: Any, outputs: Any) -> None:
    """Put token2text's texts in the outputs where verl puts them (``prompt_text``, ``response_text``)."""
    if not isinstance(outputs, dict):
        return
    if "prompt_text" not in outputs and isinstance(inputs, dict) and isinstance(inputs.get("prompt_text"), str):
        outputs["prompt_text"] = inputs["prompt_text"]
    if "response_text" not in outputs and isinstance(outputs.get("token_text"), str):
        outputs["response_text"] = outputs.pop("token_text")


def _is_cancel(exc: BaseException) -> bool:
    import asyncio
    import concurrent.futures

    return isinstance(exc, (asyncio.CancelledError, concurrent.futures.CancelledError))


def _as_reward(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    try:
        import numbers

        if isinstance(value, numbers.Real):
            return float(value)
    except (TypeError, ValueError):
        return None
    return None


def set_active(rec: Recorder | None) -> FlushResult | None:
    """Install ``rec`` as this process's recorder, shutting the previous one down.

    ``rec`` takes over the previous recorder's counts, and spans it writes
    after the switch, so its next flush reports what the old one lost.
    Returns the previous recorder's shutdown result (None without one).
    """
    global ACTIVE
    old, ACTIVE = ACTIVE, rec
    if rec is not None:
        # SIGTERM, SIGHUP, ray.shutdown() skip atexit: drain on those too, bounded.
        lifecycle.install(_drain_active, rec.config.shutdown_timeout_s)
    if old is None or old is rec:
        return None
    marks = old.marks()
    result = old.shutdown()
    if rec is not None:
        rec.adopt(old, marks)
    return result


_FORK_HELD: list[Recorder] = []
# Imported now, not by the writer's first batch (pandas imports it) during a
# fork's wait below: its fork hooks would be registered between "before"
# and "after" and its after-hook would release a lock it never took.
import concurrent.futures.thread  # noqa: E402,F401


def _before_fork() -> None:
    # A fork while the writer thread holds a lock (an import: its first batch
    # imports pandas through pa.array; a tokenizer load) leaves that lock held
    # forever in the child, whose own writer then hangs and loses every span.
    # Wait (bounded) for the writer to finish its cycle.
    rec = ACTIVE
    if rec is not None and rec._fork_lock.acquire(timeout=30.0):
        _FORK_HELD.append(rec)


def _after_fork_in_parent() -> None:
    while _FORK_HELD:
        _FORK_HELD.pop()._fork_lock.release()


def _after_fork_in_child() -> None:
    # The writer thread does not survive fork(); give the child a recorder
    # of its own (own file name, own ids). Spans buffered in the parent stay
    # the parent's.
    global ACTIVE
    _after_fork_in_parent()
    if ACTIVE is not None:
        ACTIVE = Recorder(ACTIVE.config)  # fresh ids: the parent's continue in the parent
        # A multiprocessing child ends with os._exit(), which skips atexit:
        # flush through multiprocessing's own exit hook instead. Its registry
        # is cleared after this hook runs, so register from its after-fork list.
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            mp_util.register_after_fork(ACTIVE, _flush_at_multiprocessing_exit)


def _flush_at_multiprocessing_exit(rec: Recorder) -> None:
    # No object: runs once, at the child's exit, on whatever recorder is active then.
    sys.modules["multiprocessing.util"].Finalize(None, _at_exit, exitpriority=100)


def _shutdown_at_exit(rec: Recorder) -> None:
    # The uploading writer's exit hook: flush and close the recorder that owns it,
    # and make sure the module's own exit hook does not do it a second time.
    global ACTIVE
    if ACTIVE is not rec:
        rec.writer.close()  # shut down already (or replaced): upload what is left
        return
    ACTIVE = None
    rec.shutdown(timeout=30.0)


def _drain_active(timeout: float) -> None:
    # lifecycle's stop hooks: the files durable and live exporters drained; the
    # recorder stays open (a SIGINT the application catches goes on recording).
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

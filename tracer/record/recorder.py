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
from typing import Any

import pyarrow as pa

from tracer import schema as S
from tracer.config import ENV_STRICT, TraceConfig
from tracer.record.context import Trajectory
from tracer.record.encode import Encoder, error_json, to_json
from tracer.record.redact import Redactor
from tracer.record.sampling import IN, OUT, PENDING, StepSampler
from tracer.storage.writer import SpanWriter

logger = logging.getLogger("rollout_trace")

#: The configured recorder of this process, or None when tracing is off.
ACTIVE: Recorder | None = None

#: Rows per Arrow batch written.
BATCH_ROWS = 8192
#: Trajectories remembered for log_reward calls made after the rollout.
MAX_REMEMBERED_TRAJECTORIES = 200_000

# Positions in a span record tuple (built on the caller's path).
R_SPAN, R_PARENT, R_TRACE, R_SPEC, R_TRAJ, R_START, R_END, R_EXC, R_ARGS, R_KWARGS, R_OUT, R_SELF = range(12)


class OpSpec:
    """What the decorator knows about a traced function, computed once."""

    __slots__ = ("name", "kind", "params", "varargs", "has_self", "special")

    def __init__(
        self, fn: Callable[..., Any] | None, name: str | None, kind: str | None, special: str | None = None
    ) -> None:
        self.name: str = name or str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "span"))
        self.kind = kind or S.KIND_SPAN
        self.special = special
        self.params: tuple[str, ...] = ()
        self.varargs: str | None = None
        self.has_self = False
        if fn is None:
            return
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        if params and params[0].name in ("self", "cls"):
            self.has_self = True
            params = params[1:]
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.params = tuple(p.name for p in params if p.kind in positional)
        self.varargs = next((p.name for p in params if p.kind == inspect.Parameter.VAR_POSITIONAL), None)

    def bind(self, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """Name the captured arguments."""
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
        message: Empty when ok, else what went wrong and where.
    """

    ok: bool
    spans_written: int = 0
    spans_dropped: int = 0
    spans_failed: int = 0
    internal_errors: int = 0
    message: str = ""

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

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self.limit = config.max_buffered_spans
        #: Below this many buffered spans, decorators append directly; at or
        #: above it they go through append() (wake the writer, enforce limit).
        self.fast_limit = min(BATCH_ROWS, self.limit)
        self.block_when_full = config.on_buffer_full == "block"
        self.strict = os.environ.get(ENV_STRICT, "") not in ("", "0")
        self.span_ids = itertools.count(1)
        self.trace_ids = itertools.count(1)
        self.span_prefix = secrets.token_hex(4)
        self.trace_prefix = secrets.token_hex(8)
        self.sampler = (
            StepSampler(config.max_samples_per_step_per_worker, config.seed, config.flush_interval_s)
            if config.max_samples_per_step_per_worker
            else None
        )
        self.problems = _ProblemLog()
        self.redactor = Redactor(config.redact_patterns) if config.redact else None
        self._trajectories: collections.OrderedDict[tuple[Any, ...], Trajectory] = collections.OrderedDict()
        self._traj_lock = threading.Lock()
        self._held: list[tuple[Any, ...]] = []
        self._listeners: list[Callable[[pa.RecordBatch], None]] = []
        self._closers: list[Callable[[float | None], object]] = []
        self._flushers: list[Callable[[float | None], object]] = []
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._flush_requested = 0
        self._flush_done = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        #: Held by the writer during a cycle; fork() waits for it (see _before_fork).
        self._fork_lock = threading.RLock()
        self.spans_written = 0
        self.spans_dropped = 0
        self.spans_failed = 0
        self._failed_at_last_result = 0
        self._dropped_at_last_result = 0
        self.spans_sampled_out = 0
        self._tokenizer: Any = None
        self._tokenizer_loaded = False
        from tracer.storage import remote as _remote

        if _remote.is_remote(config.output_dir):
            # Stage locally, upload each closed file (tracer/storage/remote.py).
            self.writer: SpanWriter = _remote.UploadingSpanWriter(
                _remote.join_uri(config.output_dir, config.project_name, config.experiment_name),
                self._file_metadata(),
                compression_level=config.compression_level,
                max_file_bytes=config.max_file_bytes,
                upload_interval_s=config.upload_interval_s,
                report=self.problems.report,
            )
        else:
            self.writer = SpanWriter(
                config.run_dir,
                self._file_metadata(),
                compression_level=config.compression_level,
                max_file_bytes=config.max_file_bytes,
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
        buf = self.buffer
        if len(buf) >= self.limit and not self._make_room():
            self.spans_dropped += 1
            return
        buf.append(record)
        if len(buf) >= self.fast_limit and not self._wake.is_set():
            self._wake.set()

    def _make_room(self) -> bool:
        """The buffer is full: wait for the writer (block mode) or give up (drop)."""
        if not self.block_when_full or self._stopping:
            return False
        self._start_thread()
        self._wake.set()
        with self._cond:
            while len(self.buffer) >= self.limit:
                thread = self._thread
                if thread is None or not thread.is_alive():
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
            sample = self.sampler.admit(step, validate, sample_index)
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

    def add_listener(self, fn: Callable[[pa.RecordBatch], None]) -> None:
        """Call ``fn(batch)`` on the writer thread after each durable batch (exporters)."""
        self._listeners.append(fn)

    def add_flusher(self, fn: Callable[[float | None], object]) -> None:
        """Call ``fn(timeout)`` at the end of flush() (exporters ship what they hold)."""
        self._flushers.append(fn)

    def add_closer(self, fn: Callable[[float | None], object]) -> None:
        """Call ``fn(timeout)`` at shutdown, after the last batch (exporters drain)."""
        self._closers.append(fn)

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
            self.sampler.decide(force)
            records = self._apply_sampling(records)
        for i in range(0, len(records), BATCH_ROWS):
            self._write(records[i : i + BATCH_ROWS])

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
        batch = self.encode(records)
        try:
            self.writer.write(batch, self._batch_metadata(len(records)))
        except Exception as exc:
            self.spans_failed += len(records)
            self.problems.report(
                "write failed",
                f"{len(records)} spans not written to {self.writer.run_dir}: {type(exc).__name__}: {exc}",
                exc,
            )
            return
        self.spans_written += len(records)
        for fn in self._listeners:
            try:
                fn(batch)
            except Exception as exc:
                self.problems.report("listener error", f"{getattr(fn, '__qualname__', fn)}: {exc}", exc)

    def _batch_metadata(self, n: int) -> dict[str, str]:
        return {
            S.BATCH_META_SPANS_WRITTEN: str(self.spans_written + n),
            S.BATCH_META_SPANS_DROPPED: str(self.spans_dropped),
            S.BATCH_META_INTERNAL_ERRORS: str(sum(self.problems.counts.values())),
        }

    def encode(self, records: list[tuple[Any, ...]]) -> pa.RecordBatch:
        """Turn span records into one Arrow batch (writer thread)."""
        cfg = self.config
        enc = Encoder(cfg.token_fields, cfg.token2text, cfg.max_tokens, cfg.store_full_token, cfg.redact)
        n = len(records)
        rewards: list[float | None] = [None] * n
        statuses: list[str] = [S.STATUS_OK] * n
        errors: list[str | None] = [None] * n
        names: list[str] = [None] * n  # type: ignore[list-item]
        steps: list[int | None] = [None] * n
        samples: list[str | None] = [None] * n
        rollouts: list[int | None] = [None] * n
        validates: list[bool | None] = [None] * n
        prepared: list[tuple[Any, Any, dict[str, Any], bool]] = []
        tokenizer_for = self._tokenizer_for
        prepare = enc.prepare
        for i, rec in enumerate(records):
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
                enc.opaque.add(i)
            prepared.append((inputs, outputs, attrs, special is None and exc is None))
            names[i] = traj.name if special == "root" and traj is not None else spec.name
            if exc is not None:
                if _is_cancel(exc):
                    statuses[i] = S.STATUS_CANCELLED
                else:
                    statuses[i] = S.STATUS_ERROR
                    errors[i] = error_json(exc)
            if traj is not None:
                steps[i] = traj.step
                samples[i] = traj.sample_index
                rollouts[i] = traj.rollout_n
                validates[i] = traj.validate
        failed = enc.decode_pending()
        if failed:
            self.problems.report("token2text", f"{failed} batch_decode call(s) failed; decoded one by one")
        inputs_col = [None if p[0] is None else to_json(p[0]) for p in prepared]
        outputs_col = [to_json(p[1]) if p[3] else None for p in prepared]
        attrs_col = [to_json(p[2]) if p[2] else None for p in prepared]
        if self.redactor is not None:
            flags = self.redactor.records_to_scan(enc.strings, enc.opaque)
            if flags is not None:
                text = self.redactor.text
                inputs_col = [text(v) if f and v is not None else v for v, f in zip(inputs_col, flags)]
                outputs_col = [text(v) if f and v is not None else v for v, f in zip(outputs_col, flags)]
                attrs_col = [text(v) if f and v is not None else v for v, f in zip(attrs_col, flags)]
            errors = self.redactor.texts(errors)
        sp, tp = self.span_prefix, self.trace_prefix
        cols: dict[str, Any] = {
            S.TRACE_ID: [f"{tp}{r[R_TRACE]:016x}" if r[R_TRACE] else "" for r in records],
            S.SPAN_ID: [f"{sp}{r[R_SPAN]:08x}" for r in records],
            S.PARENT_SPAN_ID: [None if r[R_PARENT] is None else f"{sp}{r[R_PARENT]:08x}" for r in records],
            S.NAME: names,
            S.KIND: [r[R_SPEC].kind for r in records],
            S.START_NS: [r[R_START] for r in records],
            S.END_NS: [r[R_END] for r in records],
            S.STATUS: statuses,
            S.ERROR: errors,
            S.STEP: steps,
            S.SAMPLE_INDEX: samples,
            S.ROLLOUT_N: rollouts,
            S.VALIDATE: validates,
            S.REWARD: rewards,
            S.INPUTS: inputs_col,
            S.OUTPUTS: outputs_col,
            S.ATTRIBUTES: attrs_col,
        }
        arrays = [pa.array(cols[name], type=typ) for name, typ, _, _ in S.SPAN_FIELDS]
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
        self._wake.set()
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
        for fn in self._flushers:
            try:
                fn(timeout)
            except Exception as exc:
                self.problems.report("exporter flush failed", f"{getattr(fn, '__qualname__', fn)}: {exc}", exc)
        first = self.problems.first_exception
        if self.strict and first is not None:
            self.problems.first_exception = None
            raise first
        return self.result(self._flush_done >= target)

    def result(self, done: bool, message: str = "") -> FlushResult:
        """The flush result: ok when nothing failed or was dropped since the previous result.

        The counts in it are running totals of this process; ``ok`` looks only
        at what happened since the last flush, so recording is reported healthy
        again once a storage failure is over.
        """
        failed = self.spans_failed
        problems = sum(self.problems.counts.values())
        new_failed = failed - self._failed_at_last_result
        new_dropped = self.spans_dropped - self._dropped_at_last_result
        self._failed_at_last_result, self._dropped_at_last_result = failed, self.spans_dropped
        ok = done and new_failed == 0 and new_dropped == 0
        if not message and not ok:
            message = "; ".join(f"{k} x{v}: {self.problems.last.get(k, '')}" for k, v in self.problems.counts.items())
            if new_failed:
                message = f"{new_failed} spans not written since the last flush; " + message
            if new_dropped:
                message = f"{new_dropped} spans dropped since the last flush (buffer full); " + message
        return FlushResult(ok, self.spans_written, self.spans_dropped, failed, problems, message)

    def shutdown(self, timeout: float | None = 30.0) -> FlushResult:
        """Flush, stop the writer thread, close the file."""
        result = self.flush(timeout)
        with self._cond:
            self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        try:
            self.writer.close()
        except Exception as exc:
            self.problems.report("close failed", str(exc), exc)
        for fn in self._closers:
            try:
                fn(timeout)
            except Exception as exc:
                self.problems.report("exporter shutdown failed", f"{getattr(fn, '__qualname__', fn)}: {exc}", exc)
        return result


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


def set_active(rec: Recorder | None) -> None:
    """Install ``rec`` as this process's recorder, shutting the previous one down."""
    global ACTIVE
    old, ACTIVE = ACTIVE, rec
    if old is not None and old is not rec:
        old.shutdown()


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
        ACTIVE = Recorder(ACTIVE.config)
        # A multiprocessing child ends with os._exit(), which skips atexit:
        # flush through multiprocessing's own exit hook instead. Its registry
        # is cleared after this hook runs, so register from its after-fork list.
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            mp_util.register_after_fork(ACTIVE, _flush_at_multiprocessing_exit)


def _flush_at_multiprocessing_exit(rec: Recorder) -> None:
    # No object: runs once, at the child's exit, on whatever recorder is active then.
    sys.modules["multiprocessing.util"].Finalize(None, _at_exit, exitpriority=100)


def _at_exit() -> None:
    rec = ACTIVE
    if rec is not None:
        rec.shutdown(timeout=10.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(_at_exit)

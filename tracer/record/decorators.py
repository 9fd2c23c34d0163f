"""Public recording API: rollout_trace_op, rollout_trace_attr, log_reward, propagate."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from tracer import schema as S
from tracer.record import recorder as _recorder
from tracer.record.capture import IMMUTABLE_TYPES as _IMMUTABLE
from tracer.record.capture import Placeholder, capture, capture_args
from tracer.record.context import CURRENT_SPAN, Trajectory, named_trajectory
from tracer.record.recorder import REWARD_SPEC, OpSpec

F = TypeVar("F", bound=Callable[..., Any])

_get = CURRENT_SPAN.get
_set = CURRENT_SPAN.set
_reset = CURRENT_SPAN.reset
_time_ns = time.time_ns


def _capture_args(rec: _recorder.Recorder, args: Any) -> Any:
    try:
        return capture_args(args) if type(args) is tuple else capture(args)
    except Exception as exc:
        _internal_error(rec, "capturing arguments", exc)
        return (Placeholder(f"<arguments not captured: {type(exc).__name__}>"),)


def _capture_out(rec: _recorder.Recorder, out: Any) -> Any:
    try:
        return capture(out)
    except Exception as exc:
        _internal_error(rec, "capturing a return value", exc)
        return Placeholder(f"<return value not captured: {type(exc).__name__}>")


def _open(rec: _recorder.Recorder, spec: OpSpec, parent: Any) -> Any:
    try:
        return rec.open_span(spec, parent)
    except Exception as exc:
        _internal_error(rec, "opening a span", exc)
        return None


def _record(rec: _recorder.Recorder, record: tuple[Any, ...]) -> None:
    try:
        rec.append(record)
    except Exception as exc:
        _internal_error(rec, "recording a span", exc)


def _internal_error(rec: _recorder.Recorder, what: str, exc: BaseException) -> None:
    """Count a tracer failure; never let it reach the user's code (except strict mode, in flush)."""
    rec.problems.report("internal error", f"{what}: {type(exc).__name__}: {exc}", exc)


@overload
def rollout_trace_op(func: F) -> F: ...
@overload
def rollout_trace_op(func: None = None, *, name: str | None = None, kind: str | None = None) -> Callable[[F], F]: ...


def rollout_trace_op(func: Any = None, *, name: str | None = None, kind: str | None = None) -> Any:
    """Record each call of the decorated function as a span.

    Works bare (``@rollout_trace_op``) or with options
    (``@rollout_trace_op(name="generate", kind="llm")``), on sync and async
    functions and methods; ``self``/``cls`` are not recorded. Inputs are
    captured as they are at call time, outputs at return. Exceptions pass
    through unchanged (the span records them); the tracer's own failures
    never reach the caller.

    Args:
        func: The function (when used bare).
        name: Span name; default the function's qualified name.
        kind: ``"rollout"`` (a trajectory's root), ``"llm"``, ``"tool"``,
            ``"reward"``, or None for a generic span.
    """
    if kind is not None and kind not in S.KINDS:
        raise ValueError(f"rollout_trace_op: kind {kind!r} is not one of {', '.join(repr(k) for k in S.KINDS)} or None")

    def decorate(fn: F) -> F:
        if isinstance(fn, (classmethod, staticmethod)):
            # @rollout_trace_op above @classmethod: wrap the function, keep the binding.
            return type(fn)(decorate(fn.__func__))
        spec = OpSpec(fn, name, kind)
        if inspect.isgeneratorfunction(fn):
            return _trace_generator(fn, spec)  # type: ignore[return-value]
        if inspect.isasyncgenfunction(fn):
            return _trace_async_generator(fn, spec)  # type: ignore[return-value]
        has_self = spec.has_self
        # Spans that never start a trajectory take the short path below: no
        # method calls besides the ones the record needs.
        plain = spec.kind != S.KIND_ROLLOUT

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                rec = _recorder.ACTIVE
                if rec is None:
                    return await fn(*args, **kwargs)
                parent = _get()
                if plain and parent is not None and (parent[2] is None or parent[2].recording):
                    traj = parent[2]
                    if traj is not None:
                        traj.spans += 1
                    frame = (next(rec.span_ids), parent[1], traj)
                    parent_sid: int | None = parent[0]
                else:
                    opened = _open(rec, spec, parent)
                    if opened is None:
                        return await fn(*args, **kwargs)
                    frame, parent_sid = opened
                a = args[1:] if has_self else args
                if a and not _IMMUTABLE.issuperset(map(type, a)):
                    a = _capture_args(rec, a)
                k = _capture_args(rec, kwargs) if kwargs else None
                token = _set(frame)
                start = _time_ns()
                try:
                    out = await fn(*args, **kwargs)
                except BaseException as exc:
                    _reset(token)
                    _record(
                        rec,
                        (
                            frame[0],
                            parent_sid,
                            frame[1],
                            spec,
                            frame[2],
                            start,
                            _time_ns(),
                            exc,
                            a,
                            k,
                            None,
                            args[0] if has_self else None,
                        ),
                    )
                    raise
                _reset(token)
                end = _time_ns()
                o = out if type(out) in _IMMUTABLE else _capture_out(rec, out)
                buf = rec.buffer
                record = (
                    frame[0],
                    parent_sid,
                    frame[1],
                    spec,
                    frame[2],
                    start,
                    end,
                    None,
                    a,
                    k,
                    o,
                    args[0] if has_self else None,
                )
                if len(buf) < rec.fast_limit:
                    buf.append(record)
                else:
                    _record(rec, record)
                return out

            return traced_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            rec = _recorder.ACTIVE
            if rec is None:
                return fn(*args, **kwargs)
            parent = _get()
            if plain and parent is not None and (parent[2] is None or parent[2].recording):
                traj = parent[2]
                if traj is not None:
                    traj.spans += 1
                frame = (next(rec.span_ids), parent[1], traj)
                parent_sid: int | None = parent[0]
            else:
                opened = _open(rec, spec, parent)
                if opened is None:
                    return fn(*args, **kwargs)
                frame, parent_sid = opened
            a = args[1:] if has_self else args
            if a and not _IMMUTABLE.issuperset(map(type, a)):
                a = _capture_args(rec, a)
            k = _capture_args(rec, kwargs) if kwargs else None
            token = _set(frame)
            start = _time_ns()
            try:
                out = fn(*args, **kwargs)
            except BaseException as exc:
                _reset(token)
                _record(
                    rec,
                    (
                        frame[0],
                        parent_sid,
                        frame[1],
                        spec,
                        frame[2],
                        start,
                        _time_ns(),
                        exc,
                        a,
                        k,
                        None,
                        args[0] if has_self else None,
                    ),
                )
                raise
            _reset(token)
            end = _time_ns()
            o = out if type(out) in _IMMUTABLE else _capture_out(rec, out)
            buf = rec.buffer
            record = (
                frame[0],
                parent_sid,
                frame[1],
                spec,
                frame[2],
                start,
                end,
                None,
                a,
                k,
                o,
                args[0] if has_self else None,
            )
            if len(buf) < rec.fast_limit:
                buf.append(record)
            else:
                _record(rec, record)
            return out

        return traced  # type: ignore[return-value]

    if func is not None:
        if not callable(func) and not isinstance(func, (classmethod, staticmethod)):
            raise TypeError(
                f"rollout_trace_op: {func!r} is not a function; use @rollout_trace_op or "
                f"@rollout_trace_op(name=..., kind=...)"
            )
        return decorate(func)
    return decorate


class rollout_trace_attr:  # noqa: N801 - verl's name; used as a context manager
    """Set the trajectory attributes of everything recorded inside the block.

    Mirrors verl's ``rollout_trace_attr``: a sync context manager that also
    works as ``async with``. The block is one trajectory: a
    ``kind="rollout"`` op called directly inside becomes its root span;
    otherwise a root span named ``name`` covering the block is written when
    anything was recorded in it.

    Args:
        sample_index: The prompt's id (int or str, e.g. a uuid).
        step: Training step.
        rollout_n: Index of this rollout in the prompt's group.
        name: Name of the root span when no rollout op is the root.
        validate: A validation rollout.
        trace: False turns recording off inside the block.
        **extra: More attributes, written on the trajectory's root span;
            ``weight_version=`` is the policy version that generated it
            (its staleness: ``tracer.integrations.staleness``).
    """

    __slots__ = (
        "sample_index",
        "step",
        "rollout_n",
        "name",
        "validate",
        "trace",
        "extra",
        "_token",
        "_traj",
        "_start",
        "_rec",
    )

    def __init__(
        self,
        sample_index: int | str | None,
        step: int | None,
        rollout_n: int = 0,
        name: str = "rollout_trace",
        validate: bool = False,
        trace: bool = True,
        **extra: Any,
    ) -> None:
        # capture() never raises; the conversions below are guarded so that a
        # value of the user's that misbehaves never reaches the user's code.
        self.sample_index = None if sample_index is None else _as_text(sample_index)
        self.step = None if step is None else _as_int(step)
        self.rollout_n = None if rollout_n is None else _as_int(rollout_n)
        self.name = name if type(name) is str else _as_text(name)
        self.validate = as_bool(validate)
        self.trace = as_bool(trace, True)
        self.extra = capture(extra) if extra else None
        self._token: Any = None
        self._traj: Trajectory | None = None
        self._rec: _recorder.Recorder | None = None
        self._start = 0

    def __enter__(self) -> rollout_trace_attr:
        rec = _recorder.ACTIVE
        if rec is None:
            return self
        try:
            traj = rec.new_trajectory(
                self.step, self.sample_index, self.rollout_n, self.validate, self.name, self.extra, self.trace
            )
        except Exception as exc:
            rec.internal_error("starting a trajectory", exc)
            return self
        self._rec, self._traj = rec, traj
        self._token = _set((traj.root_span_id, traj.trace_id, traj))
        self._start = _time_ns()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._token is None:
            return
        _reset(self._token)
        self._token = None
        rec, traj = self._rec, self._traj
        assert rec is not None and traj is not None
        try:
            rec.end_trajectory(traj, self._start, exc)
        except Exception as err:
            rec.internal_error("ending a trajectory", err)

    async def __aenter__(self) -> rollout_trace_attr:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    @property
    def trace_id(self) -> str | None:
        """The trajectory's id as written in the files (None when not recording)."""
        rec, traj = self._rec, self._traj
        if rec is None or traj is None or not traj.recording:
            return None
        return f"{rec.trace_prefix}{traj.trace_id:016x}"


def _as_text(value: Any) -> str:
    try:
        return str(value)
    except Exception as exc:
        return f"<{type(value).__name__}: str() failed: {type(exc).__name__}>"


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except Exception:
        return None


def as_bool(value: Any, default: bool = False) -> bool:
    try:
        return bool(value)
    except Exception:
        return default


#: Yielded items of a traced generator kept as its outputs (the count is always kept).
MAX_YIELDED_RECORDED = 1000


def _open_frame(rec: _recorder.Recorder, spec: OpSpec) -> Any:
    opened = _open(rec, spec, _get())
    return opened


def _trace_generator(fn: Callable[..., Any], spec: OpSpec) -> Callable[..., Any]:
    """A generator's span covers its whole iteration: first ``next`` to exhaustion, error or close."""
    has_self = spec.has_self

    @functools.wraps(fn)
    def traced_gen(*args: Any, **kwargs: Any) -> Any:
        rec = _recorder.ACTIVE
        gen = fn(*args, **kwargs)
        if rec is None:
            return (yield from gen)
        opened = _open_frame(rec, spec)
        if opened is None:
            return (yield from gen)
        frame, parent_sid = opened
        a = _capture_args(rec, args[1:] if has_self else args)
        k = _capture_args(rec, kwargs) if kwargs else None
        items: list[Any] = []
        count = 0
        start = _time_ns()
        method: Any = gen.send
        arg: Any = None
        while True:
            token = _set(frame)
            try:
                item = method(arg)
            except StopIteration as stop:
                _reset(token)
                out = _generator_output(rec, items, count, stop.value)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), None, a, k, out, None))
                return stop.value
            except BaseException as exc:
                _reset(token)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), exc, a, k, None, None))
                raise
            _reset(token)
            count += 1
            if count <= MAX_YIELDED_RECORDED:
                items.append(_capture_out(rec, item))
            try:
                arg = yield item
                method = gen.send
            except GeneratorExit:
                gen.close()
                out = _generator_output(rec, items, count, None)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), None, a, k, out, None))
                raise
            except BaseException as exc:
                method, arg = gen.throw, exc

    return traced_gen


def _trace_async_generator(fn: Callable[..., Any], spec: OpSpec) -> Callable[..., Any]:
    """An async generator's span covers its whole iteration, as for generators."""
    has_self = spec.has_self

    @functools.wraps(fn)
    async def traced_agen(*args: Any, **kwargs: Any) -> Any:
        rec = _recorder.ACTIVE
        agen = fn(*args, **kwargs)
        opened = None if rec is None else _open_frame(rec, spec)
        if rec is None or opened is None:
            async for item in agen:
                yield item
            return
        frame, parent_sid = opened
        a = _capture_args(rec, args[1:] if has_self else args)
        k = _capture_args(rec, kwargs) if kwargs else None
        items: list[Any] = []
        count = 0
        start = _time_ns()
        method: Any = agen.asend
        arg: Any = None
        while True:
            token = _set(frame)
            try:
                item = await method(arg)
            except StopAsyncIteration:
                _reset(token)
                out = _generator_output(rec, items, count, None)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), None, a, k, out, None))
                return
            except BaseException as exc:
                _reset(token)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), exc, a, k, None, None))
                raise
            _reset(token)
            count += 1
            if count <= MAX_YIELDED_RECORDED:
                items.append(_capture_out(rec, item))
            try:
                arg = yield item
                method = agen.asend
            except GeneratorExit:
                await agen.aclose()
                out = _generator_output(rec, items, count, None)
                _record(rec, (frame[0], parent_sid, frame[1], spec, frame[2], start, _time_ns(), None, a, k, out, None))
                raise
            except BaseException as exc:
                method, arg = agen.athrow, exc

    return traced_agen


def _generator_output(rec: _recorder.Recorder, items: list[Any], count: int, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"yielded": items, "count": count}
    if count > len(items):
        out["yielded"] = [*items, Placeholder(f"<{count - len(items)} more items not recorded>")]
    if value is not None:
        out["returned"] = _capture_out(rec, value)
    return out


def log_reward(
    reward: float,
    *,
    step: int | None = None,
    sample_index: int | str | None = None,
    rollout_n: int | None = None,
    validate: bool | None = None,
    **extra: Any,
) -> None:
    """Attach a reward (and extras: advantage, ground truth, ...) to a trajectory.

    Inside a trajectory (a ``rollout_trace_attr`` block or a rollout op) it
    applies to that trajectory. Outside, ``step``, ``sample_index``,
    ``rollout_n`` and ``validate`` name it, as a trainer computing rewards
    after the rollout knows them; readers join such rewards to their
    trajectory by those keys even when they come from another process.

    Raises:
        TypeError: ``reward`` is not a real number.
    """
    import numbers

    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise TypeError(f"log_reward: reward must be a real number, got {type(reward).__name__} {reward!r}")
    rec = _recorder.ACTIVE
    if rec is None:
        return
    try:
        traj = named_trajectory(rec, "log_reward", step, sample_index, rollout_n, validate)
        if not traj.recording:
            return
        traj.spans += 1
        now = _time_ns()
        parent = traj.root_span_id or None
        rec.append(
            (
                next(rec.span_ids),
                parent,
                traj.trace_id,
                REWARD_SPEC,
                traj,
                now,
                now,
                None,
                (float(reward),),
                capture(extra),
                None,
                None,
            )
        )
    except ValueError:
        raise
    except Exception as exc:
        rec.internal_error("logging a reward", exc)


def propagate(fn: F) -> F:
    """Carry the current span into ``fn`` when it runs on another thread.

    ``asyncio.to_thread`` and ``create_task`` carry it already; thread pools
    (``executor.submit``, ``loop.run_in_executor``) do not::

        pool.submit(tracer.propagate(call_tool), args)
    """
    frame = _get()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _set(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            _reset(token)

    return run  # type: ignore[return-value]

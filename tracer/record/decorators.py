"""Public recording API: rollout_trace_op, rollout_trace_attr, log_reward, propagate.

Every traced call goes through one span opener and one closer; the wrappers only differ in how they call.
"""

from __future__ import annotations

import decimal
import functools
import inspect
import math
import numbers
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from tracer import schema as S
from tracer.record import recorder as _recorder
from tracer.record.accounting import ATTR_REPLACED
from tracer.record.capture import IMMUTABLE_TYPES as _IMMUTABLE
from tracer.record.capture import Placeholder, as_text, capture, capture_args, capture_error, convert, plain_number
from tracer.record.context import CURRENT_SPAN, Trajectory, append_instant, named_trajectory
from tracer.record.spec import REWARD_SPEC, OpSpec

F = TypeVar("F", bound=Callable[..., Any])

_get = CURRENT_SPAN.get
_set = CURRENT_SPAN.set
_reset = CURRENT_SPAN.reset
_time_ns = time.time_ns
_ROLLOUT = S.KIND_ROLLOUT

#: An open span: (frame, parent span id, spec, captured args, captured kwargs, self, context token, start ns).
Span = tuple[Any, ...]

# The opener and closer are compiled inline into the plain and async wrappers (a call each would cost ~7% of
# the per-span time) and into _open_call/_close, which the generator wrappers call.

#: Opens the span of one call of ``spec``: sets ``frame`` (None: not recorded), ``parent_sid``, the captured
#: inputs ``a`` and ``k``, ``self_obj``, the context ``token`` and ``start``.
_OPEN = """
parent = _get()
if plain and parent is not None and (parent[2] is None or parent[2].recording):
    traj = parent[2]  # the short path: no trajectory to start, no method call
    if traj is not None:
        traj.spans += 1
    frame, parent_sid = (next(rec.span_ids), parent[1], traj), parent[0]
else:
    frame, parent_sid = _open_slow(rec, spec, parent)
if frame is not None:
    self_obj = args[0] if has_self else None
    a = args[1:] if has_self else args
    if a and not _IMMUTABLE.issuperset(map(type, a)):
        a = _guarded(rec, capture_args, a, "arguments")
    k = _guarded(rec, capture, kwargs, "arguments") if kwargs else None
    token = _set(frame)
    start = _time_ns()
"""

#: Closes it: restores the context, snapshots ``out`` (or ``exc``) and appends SpanRecord's fields as a tuple.
_CLOSE = """
if token is not None:
    _reset(token)
end = _time_ns()
if exc is None:
    o = out if type(out) in _IMMUTABLE else _guarded(rec, capture, out, "return value")
else:
    o, exc = None, _guarded(rec, capture_error, exc, "exception")
record = (frame[0], parent_sid, frame[1], spec, frame[2], start, end, exc, a, k, o, self_obj)
buf = rec.buffer
if len(buf) < rec.fast_limit:
    buf.append(record)
else:
    _append(rec, record)
"""

_WRAPPER = """
def wrap(fn, spec):
    plain, has_self = spec.kind != _ROLLOUT, spec.has_self
    @functools.wraps(fn)
    {async_}def traced(*args, **kwargs):
        rec = _recorder.ACTIVE
        if rec is None:
            return {await_}fn(*args, **kwargs)
{open}
        if frame is None:
            return {await_}fn(*args, **kwargs)
        try:
            out = {await_}fn(*args, **kwargs)
        except BaseException as exc:
            out = None
{close_on_error}
            raise
        exc = None
{close}
        return out

    return traced
"""

#: A generator's span covers its whole iteration: first ``next`` to exhaustion, error or close.
_GENERATOR = """
def wrap(fn, spec):
    @functools.wraps(fn)
    {async_}def traced(*args, **kwargs):
        rec = _recorder.ACTIVE
        gen = fn(*args, **kwargs)
        span = None if rec is None else _open_call(rec, spec, args, kwargs)
        if span is None:
            {passthrough}
        run = _Yields(rec, span)
        method, arg = gen.{send}, None
        while True:
            token = _set(run.frame)
            try:
                item = {await_}method(arg)
            except {stop} as stop:
                run.close(None, {value})
                return {value}
            except BaseException as exc:
                run.close(exc)
                raise
            finally:
                _reset(token)
            try:
                arg, method = (yield run.add(item)), gen.{send}
            except GeneratorExit:
                {await_}gen.{close}()
                run.close(None)
                raise
            except BaseException as exc:
                method, arg = gen.{throw}, exc

    return traced
"""

#: What differs between the generator and the async generator wrapper: placeholder -> (generator, async generator).
_GENERATOR_FORMS = {
    "async_": ("", "async "),
    "await_": ("", "await "),
    "passthrough": (
        "return (yield from gen)",
        "async for item in gen:\n                yield item\n            return",
    ),
    "send": ("send", "asend"),
    "stop": ("StopIteration", "StopAsyncIteration"),
    "value": ("stop.value", ""),
    "close": ("close", "aclose"),
    "throw": ("throw", "athrow"),
}

_FUNCTIONS = """
def _open_call(rec, spec, args, kwargs):
    plain, has_self = spec.kind != _ROLLOUT, spec.has_self
{open}
    if frame is None:
        return None
    return (frame, parent_sid, spec, a, k, self_obj, token, start)


def _close(rec, span, exc, out):
    frame, parent_sid, spec, a, k, self_obj, token, start = span
{close}
    return out
"""


def _indent(block: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" if line else "\n" for line in block.strip("\n").split("\n"))


def _compile(source: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(globals())
    exec(compile(source, f"<rollout-trace {name}>", "exec"), namespace)  # noqa: S102 - our own templates
    return namespace


def _open_slow(rec: _recorder.Recorder, spec: OpSpec, parent: Any) -> tuple[Any, int | None]:
    """The opener's general path (a trajectory may start); (None, None) when the call is not recorded."""
    try:
        opened = rec.open_span(spec, parent)
    except Exception as exc:
        rec.problems.report("internal error", f"opening a span: {type(exc).__name__}: {exc}", exc)
        return None, None
    return (None, None) if opened is None else opened


def _append(rec: _recorder.Recorder, record: tuple[Any, ...]) -> None:
    try:
        rec.append(record)
    except Exception as err:
        rec.problems.report("internal error", f"recording a span: {type(err).__name__}: {err}", err)


def _guarded(rec: _recorder.Recorder, fn: Callable[[Any], Any], value: Any, what: str) -> Any:
    """``fn(value)`` (a capture); a failure of the tracer's is counted and ``what`` is written as a placeholder."""
    try:
        return fn(value)
    except Exception as exc:
        rec.problems.report("internal error", f"capturing {what}: {type(exc).__name__}: {exc}", exc)
        return _NOT_CAPTURED[fn](f"<{what} not captured: {type(exc).__name__}>")


#: What stands for a value :func:`_guarded` could not capture, by the capture that failed.
_NOT_CAPTURED: dict[Callable[[Any], Any], Callable[[str], Any]] = {
    capture_args: lambda text: (Placeholder(text),),
    capture: Placeholder,
    capture_error: RuntimeError,
}


@overload
def rollout_trace_op(func: F) -> F: ...
@overload
def rollout_trace_op(func: None = None, *, name: str | None = None, kind: str | None = None) -> Callable[[F], F]: ...


def rollout_trace_op(func: Any = None, *, name: str | None = None, kind: str | None = None) -> Any:
    """Record each call of the decorated function (sync, async, generator, method) as a span.

    Bare or with options (``@rollout_trace_op(name="generate", kind="llm")``); ``self``/``cls`` are not
    recorded; inputs are captured at call time, outputs at return; exceptions pass through unchanged.
    ``name`` defaults to the qualified name; ``kind``: ``"rollout"`` (a trajectory's root), ``"llm"``,
    ``"tool"``, ``"reward"`` or None.
    """
    if kind is not None and kind not in S.KINDS:
        raise ValueError(f"rollout_trace_op: kind {kind!r} is not one of {', '.join(repr(k) for k in S.KINDS)} or None")

    def decorate(fn: F) -> F:
        if isinstance(fn, (classmethod, staticmethod)):
            # @rollout_trace_op above @classmethod: wrap the function, keep the binding.
            return type(fn)(decorate(fn.__func__))
        spec = OpSpec(fn, name, kind)
        if inspect.isgeneratorfunction(fn):
            return _trace_generator(fn, spec)
        if inspect.isasyncgenfunction(fn):
            return _trace_async_generator(fn, spec)
        if inspect.iscoroutinefunction(fn):
            return _trace_async(fn, spec)
        return _trace_plain(fn, spec)

    if func is not None:
        if not callable(func) and not isinstance(func, (classmethod, staticmethod)):
            raise TypeError(
                f"rollout_trace_op: {func!r} is not a function; use @rollout_trace_op or "
                f"@rollout_trace_op(name=..., kind=...)"
            )
        return decorate(func)
    return decorate


class rollout_trace_attr:  # noqa: N801 - verl's name; used as a context manager
    """Set the trajectory attributes of everything recorded inside the block (``with`` or ``async with``).

    The block is one trajectory: a ``kind="rollout"`` op called directly inside is its root span, else a root
    named ``name`` is written when anything was recorded. ``trace=False`` turns recording off inside;
    ``**extra`` goes on the root span (``weight_version=``: the policy version, see
    ``tracer.integrations.staleness``).
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
        # Guarded conversions: a misbehaving value of the user's never reaches the user's code.
        self.sample_index = None if sample_index is None else as_text(sample_index)
        self.step = None if step is None else convert(int, step)
        self.rollout_n = None if rollout_n is None else convert(int, rollout_n)
        self.name = name if type(name) is str else as_text(name)
        self.validate = convert(bool, validate) or False
        self.trace = convert(bool, trace) is not False
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
            traj = rec.trajectories.new_trajectory(
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
            rec.trajectories.end_trajectory(traj, self._start, exc)
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


#: Yielded items of a traced generator kept as its outputs (the count is always kept).
MAX_YIELDED_RECORDED = 1000


class _Yields:
    """A traced generator's span while it runs: its items kept (see :data:`MAX_YIELDED_RECORDED`), then closed."""

    __slots__ = ("rec", "span", "frame", "items", "count")

    def __init__(self, rec: _recorder.Recorder, span: Span) -> None:
        _reset(span[6])  # the frame is current only while the generator's own code runs
        self.rec, self.span, self.frame = rec, (*span[:6], None, span[7]), span[0]
        self.items: list[Any] = []
        self.count = 0

    def add(self, item: Any) -> Any:
        self.count += 1
        if self.count <= MAX_YIELDED_RECORDED:
            self.items.append(_guarded(self.rec, capture, item, "return value"))
        return item

    def close(self, exc: BaseException | None, value: Any = None) -> None:
        out: dict[str, Any] | None = None
        if exc is None:
            items, count = self.items, self.count
            if count > len(items):
                items = [*items, Placeholder(f"<{count - len(items)} more items not recorded>")]
            out = {"yielded": items, "count": count}
            if value is not None:
                out["returned"] = value
        _close(self.rec, self.span, exc, out)


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

    Inside a trajectory, to that one; outside, to the one ``step``, ``sample_index``, ``rollout_n`` and
    ``validate`` name (readers join it by those keys, from any process). TypeError: not a real number.
    """
    value, why = _reward_value(reward)
    rec = _recorder.ACTIVE
    if rec is None:
        return
    try:
        validate = validate if validate is None else convert(bool, validate)
        step, rollout_n = convert(int, step), convert(int, rollout_n)  # None stays None
        traj = named_trajectory(rec, "log_reward", step, sample_index, rollout_n, validate)
        if not traj.recording:
            return
        attrs = capture(extra)
        if why is not None:
            attrs[ATTR_REPLACED] = {"reward": why}
            rec.account.replaced += 1
            rec.problems.report("value replaced", f"reward: {why}")
        append_instant(rec, traj, REWARD_SPEC, (value,), attrs)
    except ValueError:
        raise
    except Exception as exc:
        rec.internal_error("logging a reward", exc)


def _reward_value(reward: Any) -> tuple[float, str | None]:
    """``reward`` as a float (clamped past the float range, NaN where refused) and why it is not its value, or None.

    TypeError: no real number (a bool, a complex, a string, ...).
    """
    cls = type(reward)
    if cls is float:
        return reward, None
    numpy_bool = cls.__module__ == "numpy" and cls.__name__ == "bool_"
    if cls is bool or numpy_bool or not issubclass(cls, (numbers.Real, decimal.Decimal)):
        shown = repr(reward) if cls in _IMMUTABLE else f"a {cls.__name__}"
        raise TypeError(
            f"log_reward: reward must be a real number (int, float, Decimal, Fraction, numpy scalar), got {cls.__name__} {shown}"
        )
    plain = plain_number(reward)
    try:
        value = float(reward) if plain else convert(float, reward)
    except OverflowError:  # a plain number past the float range: clamped below
        value = math.inf if reward > 0 else -math.inf
    except (ValueError, ArithmeticError) as exc:
        return math.nan, f"{_reward_text(reward)} has no float value ({type(exc).__name__}): written as NaN"
    if value is None:
        return math.nan, f"float() of a {cls.__name__} failed or did not return: written as NaN"
    if math.isinf(value) and plain and reward * 2 != reward:  # finite, but past the float range
        big = math.copysign(sys.float_info.max, value)
        return big, f"{_reward_text(reward)} is beyond the float range: clamped to {big!r}"
    return value, None


def _reward_text(reward: Any) -> str:
    if type(reward) is int:
        return f"{'-' if reward < 0 else ''}an int of {reward.bit_length()} bits"
    return as_text(reward)[:60]


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


# Compiled last: a template's namespace is a copy of this module's names as they are then.
_BLOCKS = {"open": _indent(_OPEN, 8), "close": _indent(_CLOSE, 8), "close_on_error": _indent(_CLOSE, 12)}
_trace_plain = _compile(_WRAPPER.format(async_="", await_="", **_BLOCKS), "plain wrapper")["wrap"]
_trace_async = _compile(_WRAPPER.format(async_="async ", await_="await ", **_BLOCKS), "async wrapper")["wrap"]
#: The generators' opener (None: not recorded) and closer (returns ``out``): see _OPEN and _CLOSE.
_FUNCS = _compile(_FUNCTIONS.format(open=_indent(_OPEN, 4), close=_indent(_CLOSE, 4)), "span opener")
_open_call, _close = _FUNCS["_open_call"], _FUNCS["_close"]
_trace_generator, _trace_async_generator = (
    _compile(_GENERATOR.format(**{k: pair[i] for k, pair in _GENERATOR_FORMS.items()}), "generator")["wrap"]
    for i in (0, 1)
)

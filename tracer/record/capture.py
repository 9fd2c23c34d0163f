"""Call-time snapshots of arguments and return values, and the one guard on user objects.

A snapshot copies builtin containers, arrays, tensors and plain attributes: no user code runs on the caller's
or the writer's thread. Anything else becomes a :class:`Deferred`, computed by one daemon worker and waited for
at most :data:`USER_CALL_TIMEOUT_S` (then abandoned, counted, written as a placeholder; past
:data:`MAX_STUCK_CALLS` abandoned calls still running, no new one starts until one returns).
"""

from __future__ import annotations

import array
import asyncio
import collections
import concurrent.futures
import dataclasses
import enum
import gc
import os
import queue
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

#: Types whose values cannot change after the call: kept by reference.
IMMUTABLE_TYPES = frozenset({str, int, float, bool, type(None), bytes, complex, range})

#: Containers nested deeper than this are replaced by a placeholder.
MAX_DEPTH = 32

#: Objects with at most this many instance attributes have them copied; larger ones are written as their repr.
MAX_SNAPSHOT_ATTRS = 64

#: Longest a user's method (``__repr__``, ...) may run for the tracer before a placeholder is written, seconds.
USER_CALL_TIMEOUT_S = 2.0
#: Abandoned user calls (still running) past which no new one is started.
MAX_STUCK_CALLS = 4
#: Longest text kept of a user object's repr or str.
MAX_TEXT_CHARS = 2000
#: Problem kind under which placeholders for user objects are counted.
PROBLEM_KIND = "user object not formatted"


#: What :func:`int_kind` says of a sequence.
NOT_INTS, INTS, NON_NEGATIVE_INTS = 0, 1, 2
#: What orjson writes for a flat list of non-negative ints, besides its brackets.
_DIGITS = b"0123456789,"
#: orjson raises on int subclasses, dataclasses and datetimes: such a list is not one of ints.
_INT_CHECK_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def int_kind(value: list[Any] | tuple[Any, ...]) -> int:
    """:data:`NON_NEGATIVE_INTS` (empty too), :data:`INTS` or :data:`NOT_INTS`: whether ``value`` (a list or tuple)
    holds only ints of at most 64 bits (int enum members count), and their sign; one C pass of orjson's text.
    """
    if not value:
        return NON_NEGATIVE_INTS
    first = value[0]
    if type(first) is not int and not issubclass(type(first), enum.Enum):
        return NOT_INTS  # most lists that are not ids fail here, before any writing
    try:
        text = orjson.dumps(value, option=_INT_CHECK_OPTS)
    except TypeError:  # orjson.JSONEncodeError: an object it does not write, an int beyond 64 bits
        return NOT_INTS
    rest = text.translate(None, _DIGITS)
    if rest == b"[]":
        return NON_NEGATIVE_INTS
    return INTS if rest.translate(None, b"-") == b"[]" else NOT_INTS


def _gc_untrack() -> Callable[[Any], None] | None:
    """CPython's ``PyObject_GC_UnTrack``, checked on a fresh tuple; None where it is not there.

    A flat capture of scalars is in no cycle: untracking it spares the collector reading it while it waits in
    the buffer (~3.7 us a span of 512 ids, against ~0.2 us for this call).
    """
    if sys.implementation.name != "cpython":
        return None
    try:
        import ctypes

        fn = ctypes.pythonapi.PyObject_GC_UnTrack
        fn.argtypes = [ctypes.py_object]
        fn.restype = None
        probe = tuple([1 << 40, 2 << 40])
        fn(probe)
        if gc.is_tracked(probe):
            return None
    except Exception:  # no ctypes, no such symbol: the collector untracks them itself
        return None
    return fn


#: See :func:`_gc_untrack`; None: flat captures are left to the collector.
GC_UNTRACK = _gc_untrack()

_Flat = TypeVar("_Flat", list[Any], tuple[Any, ...])


def _untracked(flat: _Flat) -> _Flat:
    """``flat`` (a captured sequence of immutable scalars, the tracer's own copy) untracked by the collector."""
    if GC_UNTRACK is not None:
        GC_UNTRACK(flat)
    return flat


class Placeholder:
    """Stands for a value the tracer could not or would not copy."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


class Deferred(Placeholder):
    """A user object's text, computed by the guard's worker; reading :attr:`text` waits a bounded time."""

    __slots__ = ("_fn", "_value", "_result", "_started")

    def __init__(self, fn: Callable[[Any], str], value: Any) -> None:
        self._fn: Callable[[Any], str] | None = fn
        self._value: Any = value
        self._result: str | None = None
        self._started = 0.0

    @property
    def text(self) -> str:  # type: ignore[override]  # computed, where Placeholder holds one
        result = self._result
        return result if result is not None else _GUARD.wait(self)

    def run(self) -> str:
        """The text, computed on the calling thread (the worker's)."""
        fn, value = self._fn, self._value
        assert fn is not None
        try:
            text = fn(value)
        except BaseException as exc:  # the user's method raised: say so in the text
            text = f"<{_what(fn, value)} failed: {type(exc).__name__}>"
        if type(text) is not str:
            text = f"<{_what(fn, value)} returned a {type(text).__name__}>"
        elif len(text) > MAX_TEXT_CHARS:
            text = text[:MAX_TEXT_CHARS] + f"... <{len(text) - MAX_TEXT_CHARS} more chars>"
        return text


def _what(fn: Callable[[Any], Any] | None, value: Any) -> str:
    return f"{type(value).__name__}: {getattr(fn, '__name__', 'call')}"


class _Guard:
    """One daemon worker running user code for the tracer, each call bounded (see the module docstring)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Deferred] = queue.SimpleQueue()
        # Reentrant: a signal handler that records may interrupt a wait on this very thread.
        self.cond = threading.Condition(threading.RLock())
        self.worker: threading.Thread | None = None
        #: The call the worker runs now, or None.
        self.current: Deferred | None = None
        #: Workers abandoned inside a user call that has not returned yet.
        self.stuck: list[threading.Thread] = []
        self.start_lock = threading.Lock()

    def submit(self, d: Deferred) -> Deferred:
        """Queue ``d`` (any thread, a signal handler included: a put never blocks)."""
        self.queue.put(d)
        if self.worker is None:
            self._start_worker()
        return d

    def _start_worker(self) -> None:
        if not self.start_lock.acquire(blocking=False):
            return  # another thread is starting it
        try:
            self.stuck = [t for t in self.stuck if t.is_alive()]
            if self.worker is None and len(self.stuck) < MAX_STUCK_CALLS:
                worker = threading.Thread(target=self._work, name="rollout-trace-user-objects", daemon=True)
                self.worker = worker
                worker.start()
        finally:
            self.start_lock.release()

    def _work(self) -> None:
        me = threading.current_thread()
        get = self.queue.get
        while self.worker is me:
            d = get()
            with self.cond:
                if d._result is not None:
                    continue
                d._started = time.monotonic()
                self.current = d
            text = d.run()
            with self.cond:
                if self.worker is not me:
                    return  # abandoned meanwhile: d has its placeholder; a fresh worker took over
                d._result, d._fn, d._value = text, None, None
                self.current = None
                self.cond.notify_all()

    def wait(self, d: Deferred) -> str:
        """``d``'s text, waiting for the worker a bounded time; a placeholder (counted) past it."""
        with self.cond:
            while d._result is None:
                if self.worker is None:
                    self.cond.release()
                    try:
                        self._start_worker()
                    finally:
                        self.cond.acquire()
                    if self.worker is None:
                        if len(self.stuck) >= MAX_STUCK_CALLS:
                            self._give_up(d, f"{len(self.stuck)} earlier calls never returned")
                        else:
                            self.cond.wait(0.01)  # another thread is starting the worker
                        continue
                cur = self.current
                left = USER_CALL_TIMEOUT_S + (0.0 if cur is None else cur._started - time.monotonic())
                if cur is None or left > 0:
                    self.cond.wait(left)
                    continue
                # The call running now is past its bound: abandon it (and its thread).
                self._give_up(cur, f"did not return within {USER_CALL_TIMEOUT_S} s")
                if self.worker is not None:
                    self.stuck.append(self.worker)
                self.worker, self.current = None, None
            result = d._result
        assert result is not None
        return result

    def _give_up(self, d: Deferred, why: str) -> None:
        what = _what(d._fn, d._value)
        d._result, d._fn, d._value = f"<{what} not recorded: {why}>", None, None
        rec = getattr(sys.modules.get("tracer.record.recorder"), "ACTIVE", None)
        if rec is not None:  # counted where tracer.flush() and the warnings report it
            rec.problems.report(PROBLEM_KIND, f"{what} {why}; written as a placeholder")


_GUARD = _Guard()
if hasattr(os, "register_at_fork"):
    # A fresh worker and queue in the child: threads do not survive a fork.
    os.register_at_fork(after_in_child=_GUARD.__init__)  # type: ignore[misc]


def deferred(fn: Callable[[Any], str], value: Any) -> Deferred:
    """``fn(value)`` (a user's method: repr, str, ...) as a :class:`Deferred`: computed off this thread."""
    return _GUARD.submit(Deferred(fn, value))


def call_bounded(fn: Callable[[Any], str], value: Any) -> str:
    """``fn(value)`` run on the guard's worker; waits at most :data:`USER_CALL_TIMEOUT_S` (placeholder past it)."""
    return deferred(fn, value).text


@dataclasses.dataclass(slots=True, eq=False)
class ObjectSnapshot:
    """An object's attributes as they were at call time (written as a dict with ``"__type__"``)."""

    type_name: str
    attrs: dict[str, Any]


def capture_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A call's positional arguments captured one by one (the tuple itself is never written as a value)."""
    return tuple([capture(v, 1) for v in args])


def capture(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that later mutation cannot change; never runs the user's code, never raises.

    What cannot be copied becomes a :class:`Deferred` repr or a :class:`Placeholder`. An exact ``tuple`` in a
    capture is a checked id sequence (:data:`NON_NEGATIVE_INTS`): ``Encoder.prepare_captured`` trusts it.
    """
    cls = type(value)
    if cls in IMMUTABLE_TYPES:
        return value
    if depth >= MAX_DEPTH:
        return Placeholder(f"<nested deeper than {MAX_DEPTH} levels>")
    if cls is list or cls is tuple:
        # Token id lists: checked and copied in C, untracked at once; only a checked id sequence is a tuple.
        if not value:
            return value if cls is tuple else _untracked([])
        kind = int_kind(value)
        if kind == NON_NEGATIVE_INTS:
            return _untracked(value if cls is tuple else tuple(value))
        if kind == INTS or IMMUTABLE_TYPES.issuperset(map(type, value)):
            return _untracked(list(value))  # logprobs, texts: flat, and no one else holds the copy
        return [capture(v, depth + 1) for v in value]
    if cls is dict:
        return _capture_dict(value, depth)
    try:
        kind, extra = _KINDS.get(cls) or _remember(_KINDS, cls, _classify(cls))
        if kind == _KEEP:
            return value
        if kind == _SEQUENCE:
            return [capture(v, depth + 1) for v in extra[0](value)]
        if kind == _DICT:
            return _capture_dict(value, depth)
        if kind == _NUMPY:
            if getattr(value, "dtype", None) is not None and value.dtype.hasobject:
                return capture(value.tolist(), depth)  # the user's objects inside: each one guarded
            copy = getattr(value, "copy", None)
            return copy() if copy is not None else value
        if kind == _TORCH:
            return value.detach().to("cpu", copy=True)
        if kind == _BYTES:
            return memoryview(value).tobytes()  # the buffer itself: a subclass's __bytes__ is never called
        if kind == _ARRAY:
            return array.array.__getitem__(value, slice(None))  # a copy in C; the writer converts it in bulk
        if kind == _OBJECT:
            attrs = _read_attributes(value, extra[0], extra[1])
            if attrs and len(attrs) <= MAX_SNAPSHOT_ATTRS:
                return ObjectSnapshot(cls.__name__, {k: capture(v, depth + 1) for k, v in attrs.items()})
        return deferred(repr, value)
    except Exception as exc:  # a torch or numpy copy that fails (out of memory, ...)
        return Placeholder(f"<{cls.__name__}: not captured: {type(exc).__name__}>")


def _capture_dict(value: dict[Any, Any], depth: int) -> dict[Any, Any]:
    items = dict.items(value)  # the builtin's own: a subclass's items() is never called
    if IMMUTABLE_TYPES.issuperset(map(type, dict.keys(value))):
        return {k: capture(v, depth + 1) for k, v in items}
    # A key of the user's type would run its __hash__: its text is computed off this thread instead.
    return {(k if type(k) in IMMUTABLE_TYPES else deferred(str, k)): capture(v, depth + 1) for k, v in items}


# What capture() does with instances of a class, decided once per class.
_SEQUENCE, _DICT, _NUMPY, _TORCH, _BYTES, _ARRAY, _OBJECT, _REPR, _KEEP = range(9)
_KINDS: dict[type, tuple[int, tuple[Any, ...]]] = {}
#: Classes remembered by a cache by class (classes made at run time would otherwise grow it).
MAX_REMEMBERED_CLASSES = 4096
#: Builtin sequences: a subclass's items are read through the builtin's own ``__iter__``.
_SEQUENCES: tuple[type, ...] = (list, tuple, set, frozenset, collections.deque)


def _remember(cache: dict[type, Any], cls: type, value: Any) -> Any:
    """``cache[cls] = value`` (a cache by class, emptied past :data:`MAX_REMEMBERED_CLASSES`); returns ``value``."""
    if len(cache) >= MAX_REMEMBERED_CLASSES:
        cache.clear()
    cache[cls] = value
    return value


def _classify(cls: type) -> tuple[int, tuple[Any, ...]]:
    """How to snapshot instances of ``cls`` without running its code (see :func:`capture`), kept in _KINDS."""
    if issubclass(cls, (Placeholder, ObjectSnapshot)):
        return _KEEP, ()  # captured already
    try:
        module = str(type.__dict__["__module__"].__get__(cls))
    except Exception:  # a class without a module name
        module = ""
    if module == "numpy" or module.startswith("numpy."):
        return _NUMPY, ()
    if module == "torch" and cls.__name__ in ("Tensor", "Parameter"):
        return _TORCH, ()
    for base in _SEQUENCES:
        if issubclass(cls, base):
            return _SEQUENCE, (vars(base)["__iter__"],)
    if issubclass(cls, dict):
        return _DICT, ()
    if issubclass(cls, (bytearray, memoryview)):
        return _BYTES, ()
    if issubclass(cls, array.array):
        return _ARRAY, ()
    if issubclass(cls, (type, BaseException)) or not _builtin_getattribute(cls):
        return _REPR, ()
    # Instances whose __dict__ and slot descriptors are the builtin ones: no user code reads them.
    has_dict = False
    slots: list[tuple[str, Any]] = []
    for klass in cls.__mro__:
        own = klass.__dict__
        if "__dict__" in own and not has_dict:
            if type(own["__dict__"]) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
                return _REPR, ()
            has_dict = True
        names = own.get("__slots__", ()) if klass is not object else ()
        for name in (names,) if type(names) is str else names:
            name = name if type(name) is str else ""
            descr = own.get(name)
            if name.startswith("__") or type(descr) is not types.MemberDescriptorType:
                continue  # private machinery (pydantic's __pydantic_*__), or not a plain slot
            slots.append((name, descr))
    if not has_dict and not slots:
        return _REPR, ()
    return _OBJECT, (has_dict, tuple(slots))


def _builtin_getattribute(cls: type) -> bool:
    """Attribute lookup on instances of ``cls`` is a builtin's (no ``__getattribute__`` of the user's)."""
    return type(cls.__getattribute__) is types.WrapperDescriptorType


def instance_attribute(value: Any, name: str) -> Any:
    """``value``'s own attribute ``name`` (its ``__dict__`` or a slot), else a plain value its class holds
    under that name (verl's agent loops keep their tokenizer on the class), else None; never runs the
    user's code: properties, other descriptors and ``__getattr__`` are not called."""
    kind, extra = _KINDS.get(type(value)) or _remember(_KINDS, type(value), _classify(type(value)))
    if kind != _OBJECT:
        return None
    try:
        found = _read_attributes(value, extra[0], extra[1]).get(name)
    except Exception:  # an instance dict of an unusual kind
        return None
    if found is not None:
        return found
    for klass in type.__getattribute__(type(value), "__mro__"):
        held = type.__getattribute__(klass, "__dict__").get(name)
        if held is not None:
            return None if hasattr(type(held), "__get__") else held
    return None


def _read_attributes(value: Any, has_dict: bool, slots: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if has_dict:
        own = object.__getattribute__(value, "__dict__")
        if type(own) is dict and IMMUTABLE_TYPES.issuperset(map(type, own)):
            attrs.update(own)
    for name, descr in slots:
        try:
            attrs[name] = descr.__get__(value)
        except AttributeError:
            continue  # a slot never set
    return attrs


#: Exception classes whose ``str()`` and traceback formatting run no code of the user's (by class).
_PLAIN_ERRORS: dict[type, bool] = {}
#: Stand-in classes of exception classes that do (by class): see :func:`capture_error`.
_STAND_INS: dict[type, type] = {}
#: Causes and contexts followed from one exception.
MAX_ERROR_CHAIN = 8

#: BaseException's own descriptors: reading through them runs no ``__getattribute__`` of the user's.
_ARGS, _TRACEBACK, _CAUSE, _CONTEXT, _SUPPRESS, _DICT_OF = map(
    BaseException.__dict__.__getitem__,
    ("args", "__traceback__", "__cause__", "__context__", "__suppress_context__", "__dict__"),
)
#: The two cancellation errors (recorded as ``cancelled``, not ``error``).
CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


class CapturedError(Exception):
    """Stands for an exception whose formatting would run the user's code (see :func:`capture_error`)."""


def capture_error(exc: BaseException, depth: int = 0) -> BaseException:
    """``exc`` when it is builtin-like (plain scalar args, a chain of the same sort), else a :class:`CapturedError`
    of the same class name, module, traceback and chain, its message a :class:`Deferred`: never the user's code."""
    if depth < MAX_ERROR_CHAIN and _plain_error(exc, depth):
        return exc
    cls = type(exc)
    stand_in = _STAND_INS.get(cls)
    if stand_in is None:
        bases = (CapturedError, *(c for c in CANCELLED if issubclass(cls, c)))
        attrs = {"__module__": _class_text(cls, "__module__"), "__qualname__": _class_text(cls, "__qualname__")}
        stand_in = _remember(_STAND_INS, cls, type(_class_text(cls, "__name__"), bases, attrs))
    out = stand_in(deferred(str, exc))
    out.__traceback__ = _TRACEBACK.__get__(exc)
    if depth < MAX_ERROR_CHAIN:
        cause, context = _CAUSE.__get__(exc), _CONTEXT.__get__(exc)
        out.__cause__ = None if cause is None else capture_error(cause, depth + 1)
        out.__context__ = None if context is None else capture_error(context, depth + 1)
        out.__suppress_context__ = _SUPPRESS.__get__(exc)
    return out


def _class_text(cls: type, name: str) -> str:
    try:
        text = type.__dict__[name].__get__(cls)
    except Exception:  # a class without one
        text = None
    return text if type(text) is str else "builtins" if name == "__module__" else "Exception"


def _plain_error(exc: BaseException, depth: int) -> bool:
    cls = type(exc)
    plain = _PLAIN_ERRORS.get(cls)
    if plain is None:
        plain = not isinstance(getattr(cls, "__str__", None), types.FunctionType) and _builtin_getattribute(cls)
        plain = _remember(_PLAIN_ERRORS, cls, plain and getattr(cls, "__getattr__", None) is None)
    if not plain or not IMMUTABLE_TYPES.issuperset(map(type, _ARGS.__get__(exc))):
        return False
    notes = _DICT_OF.__get__(exc).get("__notes__")
    if notes is not None and not (type(notes) is list and all(type(n) is str for n in notes)):
        return False  # traceback formatting would str() them
    chain = [e for e in (_CAUSE.__get__(exc), _CONTEXT.__get__(exc)) if e is not None]
    return all(depth + 1 < MAX_ERROR_CHAIN and _plain_error(e, depth + 1) for e in chain)


#: Modules of the numbers :func:`as_text`, :func:`convert` and ``log_reward`` convert directly: no user code.
_PLAIN_NUMBER_MODULES = ("builtins", "numpy", "decimal", "fractions")


def plain_number(value: Any) -> bool:
    cls = type(value)
    if cls in IMMUTABLE_TYPES:
        return True
    module = _class_text(cls, "__module__")
    return module in _PLAIN_NUMBER_MODULES or module.startswith("numpy.")


def as_text(value: Any) -> str:
    """``str(value)``, guarded: a user's ``__str__`` runs on the worker, bounded (a placeholder past it)."""
    if type(value) is str:
        return value
    return str(value) if plain_number(value) else call_bounded(str, value)


def safe_repr(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_TEXT_CHARS`; a user's ``__repr__`` runs on the worker, bounded."""
    if isinstance(getattr(type(value), "__repr__", None), types.FunctionType):
        return call_bounded(repr, value)
    return Deferred(repr, value).run()


def convert(to: type, value: Any) -> Any:
    """``to(value)`` for ``to`` in int, bool, float, guarded like :func:`as_text`; None when it fails or blocks."""
    try:
        if plain_number(value):
            return to(value)
        # The worker's text is the result's repr (a bool's as 0 or 1): a placeholder's text is no number.
        text = call_bounded(lambda v: repr(int(to(v)) if to is bool else to(v)), value)
        return bool(int(text)) if to is bool else to(text)
    except Exception:  # the user's method raised, or blocked
        return None

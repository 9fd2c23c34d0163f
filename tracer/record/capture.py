"""Call-time snapshots of arguments and return values.

A traced call's inputs are recorded as they were when the call started, and
its output as it was at return, even if the caller mutates them later. Taking
that snapshot is the only per-value work on the rollout's path, so it copies
containers and arrays and leaves everything else (encoding, token decoding)
to the background writer.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import enum
import gc
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

#: Types whose values cannot change after the call: kept by reference.
IMMUTABLE_TYPES = frozenset({str, int, float, bool, type(None), bytes, complex, range})

#: Containers nested deeper than this are replaced by a placeholder.
MAX_DEPTH = 32

#: Objects with at most this many instance attributes are snapshotted at call
#: time (their attributes copied); larger ones (engines, tokenizers) are kept
#: by reference and written as their repr, which keeps the caller's path cheap.
MAX_SNAPSHOT_ATTRS = 64


#: What :func:`int_kind` says of a sequence.
NOT_INTS, INTS, NON_NEGATIVE_INTS = 0, 1, 2
#: What orjson writes for a flat list of non-negative ints, besides its brackets.
_DIGITS = b"0123456789,"
#: No subclass of int (bool is written as true/false), no dataclass or
#: datetime is written by orjson itself: they raise, and the list is not one of ints.
_INT_CHECK_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def int_kind(value: list[Any] | tuple[Any, ...]) -> int:
    """Whether ``value`` (a list or tuple) holds only plain ints of at most 64 bits (token ids), and their sign.

    Returns :data:`NON_NEGATIVE_INTS` (an empty sequence too), :data:`INTS`
    (some are negative) or :data:`NOT_INTS`. One pass in C and no user code:
    orjson writes the sequence, and the text must hold nothing but digits,
    commas and minus signs. That rules out bools, floats, None, strings, int
    subclasses, numpy scalars, nested containers, ints beyond 64 bits
    (orjson refuses them) and every other object, except enum members
    whose value is such an int: orjson writes their value, and so they
    count as that int (and are written as it).
    """
    if not value:
        return NON_NEGATIVE_INTS
    first = value[0]
    if type(first) is not int and not isinstance(first, enum.Enum):
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
    """CPython's ``PyObject_GC_UnTrack``, checked to work on a fresh tuple; None where it is not there.

    A tuple holding only ints can never be part of a reference cycle, and
    CPython's collector stops tracking it at the first collection that meets
    it, after reading each of its items three times. A captured id tuple
    (512 items a span in ``bench/bench_write.py``) costs that while it waits
    in the buffer: ~3.7 us a span of the caller's time (the collector on
    against off, writer idle), against ~0.2 us for this call. Untracking it
    at once is what the collector would do, done before it pays for it.
    ``ctypes.pythonapi`` calls hold the GIL, as the C API requires.
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
    """``flat`` (a captured sequence of immutable scalars) untracked by the collector (see :func:`_gc_untrack`).

    It holds only values that hold nothing, so it can be in no cycle. A
    tuple of them the collector would untrack itself, after reading it; a
    list, never: it reads every item at each collection of its generation
    while the span waits (a logprob list of every llm span, in verl's agent
    loop). Nothing adds to a captured list: the copy is the tracer's own,
    and the writer reads it and builds new values from it.
    """
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


class ObjectSnapshot:
    """An object's attributes as they were at call time (written as a dict with ``"__type__"``)."""

    __slots__ = ("type_name", "attrs")

    def __init__(self, type_name: str, attrs: dict[str, Any]) -> None:
        self.type_name = type_name
        self.attrs = attrs


def capture_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A call's positional arguments captured one by one (the tuple itself is never written as a value)."""
    return tuple([capture(v, 1) for v in args])


def capture(value: Any, depth: int = 0) -> Any:
    """Return a copy of ``value`` that later mutation of ``value`` cannot change.

    Lists, tuples, dicts and sets are copied recursively (a list or tuple of
    non-negative ids becomes a tuple, every other sequence a list: see
    :func:`int_kind` and the last paragraph); numpy arrays and
    torch tensors are copied; dataclasses and pydantic models become dicts
    (with their type name under ``"__type__"``); bytearrays, deques and
    arrays are copied; small objects of other classes have their attributes
    copied (:class:`ObjectSnapshot`); other objects are kept by reference and
    serialised when written. Never raises: what cannot be copied becomes a
    :class:`Placeholder` naming why.

    The writer relies on this: in a captured value, an object whose type is
    exactly ``tuple`` is an id sequence :func:`int_kind` found
    :data:`NON_NEGATIVE_INTS` at call time, so it takes such tuples as
    checked token ids without reading their items again
    (:meth:`tracer.record.encode.Encoder.prepare_captured`).
    """
    cls = type(value)
    if cls in IMMUTABLE_TYPES:
        return value
    if depth >= MAX_DEPTH:
        return Placeholder(f"<nested deeper than {MAX_DEPTH} levels>")
    if cls is list:
        # Token id lists are long and flat: checked and copied in C, as a
        # tuple, untracked at once (_untracked): the collector never walks
        # its items, and the buffered spans cost no full collection.
        if value:
            kind = int_kind(value)
            if kind == NON_NEGATIVE_INTS:
                return _untracked(tuple(value))
            if kind == INTS:
                return _untracked(value.copy())
        if IMMUTABLE_TYPES.issuperset(map(type, value)):
            return _untracked(value.copy())  # logprobs, texts: flat, and no one else holds the copy
        return [capture(v, depth + 1) for v in value]
    if cls is tuple:
        # Only a checked id sequence stays a tuple (the writer counts on it,
        # see the docstring); JSON writes both as arrays, so it reads back the same.
        if not value:
            return value
        kind = int_kind(value)
        if kind == NON_NEGATIVE_INTS:
            return _untracked(value)  # ints only: what the collector would do to it, sooner
        if kind == INTS or IMMUTABLE_TYPES.issuperset(map(type, value)):
            return _untracked(list(value))
        return [capture(v, depth + 1) for v in value]
    if cls is dict:
        return {k: capture(v, depth + 1) for k, v in value.items()}
    try:
        return _capture_other(value, cls, depth)
    except Exception as exc:  # a property or __iter__ of the user's that raises
        return Placeholder(f"<{cls.__name__}: not captured: {type(exc).__name__}>")


def _capture_other(value: Any, cls: type, depth: int) -> Any:
    module = cls.__module__
    if module == "numpy" or module.startswith("numpy."):
        copy = getattr(value, "copy", None)
        return copy() if copy is not None else value
    if module == "torch" and cls.__name__ in ("Tensor", "Parameter"):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (list, tuple)):
        return [capture(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: capture(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (set, frozenset, collections.deque)):
        return [capture(v, depth + 1) for v in value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, array.array):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__type__": cls.__name__}
        for f in dataclasses.fields(value):
            out[f.name] = capture(getattr(value, f.name, None), depth + 1)
        return out
    dump = getattr(value, "model_dump", None)
    if dump is not None and callable(dump) and not isinstance(value, type):
        try:
            out = {"__type__": cls.__name__}
            out.update(capture(dump(), depth + 1))
            return out
        except Exception:  # a broken model_dump is the user's; record what we can
            return Placeholder(f"<{cls.__name__}: model_dump failed>")
    attrs = getattr(value, "__dict__", None)
    if (
        type(attrs) is dict
        and attrs
        and len(attrs) <= MAX_SNAPSHOT_ATTRS
        and not isinstance(value, (type, BaseException))
    ):
        return ObjectSnapshot(cls.__name__, {k: capture(v, depth + 1) for k, v in list(attrs.items())})
    return value

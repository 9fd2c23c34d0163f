"""Call-time snapshots of arguments and return values.

A traced call's inputs are recorded as they were when the call started, and
its output as it was at return, even if the caller mutates them later. Taking
that snapshot is the only per-value work on the rollout's path, so it copies
containers and arrays and leaves everything else (encoding, token decoding)
to the background writer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Types whose values cannot change after the call: kept by reference.
IMMUTABLE_TYPES = frozenset({str, int, float, bool, type(None), bytes, complex, range})

#: Containers nested deeper than this are replaced by a placeholder.
MAX_DEPTH = 32


class Placeholder:
    """Stands for a value the tracer could not or would not copy."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def capture(value: Any, depth: int = 0) -> Any:
    """Return a copy of ``value`` that later mutation of ``value`` cannot change.

    Lists, tuples, dicts and sets are copied recursively; numpy arrays and
    torch tensors are copied; dataclasses and pydantic models become dicts
    (with their type name under ``"__type__"``); other objects are kept by
    reference and serialised when written.
    """
    cls = type(value)
    if cls in IMMUTABLE_TYPES:
        return value
    if depth >= MAX_DEPTH:
        return Placeholder(f"<nested deeper than {MAX_DEPTH} levels>")
    if cls is list:
        # Token id lists are long and flat: copy them in C when they hold
        # only immutable values.
        if IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value.copy()
        return [capture(v, depth + 1) for v in value]
    if cls is tuple:
        if IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value
        return tuple(capture(v, depth + 1) for v in value)
    if cls is dict:
        return {k: capture(v, depth + 1) for k, v in value.items()}
    return _capture_other(value, cls, depth)


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
    if isinstance(value, (set, frozenset)):
        return [capture(v, depth + 1) for v in value]
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
    return value

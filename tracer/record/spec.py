"""What the decorator knows about a traced function (:class:`OpSpec`), computed once per function."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tracer import schema as S
from tracer.record.capture import capture

#: Function attribute asking for another inputs/outputs layout (the verl drop-in sets :data:`LAYOUT_VERL`).
LAYOUT_ATTR = "__rollout_trace_layout__"
#: verl's layout: inputs bound with defaults, ``**kwargs`` as one entry, ``prompt_text``/``response_text`` in outputs.
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
        try:
            sig = None if fn is None else inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        #: Set for the verl layout: calls are bound to it as verl binds them.
        self.signature = sig if sig is not None and getattr(fn, LAYOUT_ATTR, None) == LAYOUT_VERL else None
        params = [] if sig is None else list(sig.parameters.values())
        self.has_self = bool(params) and params[0].name in ("self", "cls")
        if self.has_self:
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
        out: dict[str, Any] = dict(zip(self.params, args or ()))
        if args and len(args) > len(self.params):
            out[self.varargs or "args"] = list(args[len(self.params) :])
        if kwargs:
            out.update(kwargs)
        return out


ROOT_SPEC = OpSpec(None, "rollout_trace", S.KIND_ROLLOUT, special="root")
REWARD_SPEC = OpSpec(None, S.REWARD_SPAN_NAME, S.KIND_REWARD, special="reward")

"""The tracer's only ContextVar and the per-trajectory state it carries.

``CURRENT_SPAN`` holds a ``(span_id, trace_id, trajectory)`` tuple for the span
(or trajectory context) the running code is inside. A tuple, not an object:
the decorator builds one per call, and that cost is on the rollout's path.
Copies of the context made by ``asyncio.create_task``, ``asyncio.to_thread``
and :func:`tracer.wrap_context` carry it to children.
"""

from __future__ import annotations

import contextvars
from typing import Any, NamedTuple

from tracer.record.capture import as_text

#: ``(span_id, trace_id, Trajectory | None)`` of the innermost open span or
#: trajectory context, or None outside any.
CURRENT_SPAN: contextvars.ContextVar[tuple[int, int, Trajectory | None] | None] = contextvars.ContextVar(
    "rollout_trace_current_span", default=None
)


class SpanRecord(NamedTuple):
    """One finished span as the decorators hand it to the recorder's buffer.

    The one layout of a span record: the decorators build it, the recorder
    and the encoder read it (by these names, or by position: it is a tuple).
    On the rollout's path the decorators build it as a plain tuple of these
    fields in this order (the NamedTuple's own constructor, a Python
    function, costs about 5x a tuple); ``SpanRecord._make(record)`` names one.
    """

    #: The span's id (an int; the writer prefixes it per process).
    span_id: int
    #: The parent span's id, None for a root.
    parent_id: int | None
    #: The trajectory's trace id (0 for a detached reward).
    trace_id: int
    #: The ``OpSpec`` of the traced function (name, kind, parameter names).
    spec: Any
    #: The trajectory the span belongs to, or None outside one.
    trajectory: Trajectory | None
    #: Wall-clock start and end, ns since the epoch.
    start_ns: int
    end_ns: int
    #: The exception that ended the call (or its stand-in: ``capture.capture_error``), or None.
    error: BaseException | None
    #: Captured positional arguments (``self`` left out; a reward: ``(value,)``).
    args: Any
    #: Captured keyword arguments, or None.
    kwargs: Any
    #: The captured return value (None when the call raised).
    output: Any
    #: The bound object of a method (``self``), or None; the writer reads its ``tokenizer``.
    self_obj: Any


class Trajectory:
    """Attributes shared by every span of one trajectory (one rollout).

    Created by :func:`tracer.rollout_trace_attr` or by a ``kind="rollout"``
    op outside one. Spans hold a reference; the background writer turns it
    into columns.
    """

    __slots__ = (
        "step",
        "sample_index",
        "rollout_n",
        "validate",
        "name",
        "extra",
        "recording",
        "root_span_id",
        "trace_id",
        "root_claimed",
        "spans",
        "sample",
    )

    def __init__(
        self,
        step: int | None,
        sample_index: str | None,
        rollout_n: int | None,
        validate: bool | None,
        name: str,
        extra: dict[str, Any] | None,
        recording: bool,
        root_span_id: int,
        trace_id: int,
    ) -> None:
        self.step = step
        self.sample_index = sample_index
        self.rollout_n = rollout_n
        self.validate = validate
        self.name = name
        self.extra = extra
        #: False when tracing is off for this trajectory (trace=False, or the
        #: sampler left it out): decorators call straight through.
        self.recording = recording
        self.root_span_id = root_span_id
        self.trace_id = trace_id
        #: True once a kind="rollout" op became the root span.
        self.root_claimed = False
        #: Spans recorded so far (the context's synthetic root is written
        #: only when something was recorded inside it).
        self.spans = 0
        #: The sampler's record of this trajectory's sample, or None.
        self.sample: Any = None


def named_trajectory(
    rec: Any, who: str, step: int | None, sample_index: int | str | None, rollout_n: int | None, validate: bool | None
) -> Trajectory:
    """The trajectory a ``log_reward``-style call applies to.

    Inside a trajectory with no ``step``/``sample_index`` given: that one.
    Otherwise the open trajectory the recorder ``rec`` knows by those keys,
    or, for one that has ended (a trainer scoring after the rollout), a
    detached record that readers join to it by the same keys.

    Raises:
        ValueError: called outside a trajectory without naming one; the
            message starts with ``who``, the public function's name.
    """
    frame = CURRENT_SPAN.get()
    if frame is not None and frame[2] is not None and step is None and sample_index is None:
        return frame[2]
    key_index = None if sample_index is None else as_text(sample_index)
    traj: Trajectory | None = rec.find_trajectory(step, key_index, rollout_n, validate)
    if traj is not None:
        return traj
    if key_index is None:
        raise ValueError(
            f"{who}: called outside a trajectory without step and sample_index; "
            "call it inside rollout_trace_attr(...) or pass step=, sample_index=, rollout_n="
        )
    return Trajectory(step, key_index, rollout_n, validate, "", None, True, 0, 0)

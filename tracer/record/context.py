"""The tracer's only ContextVar, ``CURRENT_SPAN`` (a ``(span_id, trace_id, trajectory)`` tuple: cheaper than an object
on the rollout's path), carried to children by context copies (``create_task``, ``to_thread``, ``wrap_context``).
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tracer.record.capture import as_text

#: ``(span_id, trace_id, Trajectory | None)`` of the innermost open span or trajectory context, or None outside any.
CURRENT_SPAN: contextvars.ContextVar[tuple[int, int, Trajectory | None] | None] = contextvars.ContextVar(
    "rollout_trace_current_span", default=None
)


class SpanRecord(NamedTuple):
    """One finished span as the decorators hand it to the recorder's buffer (the one layout of a span record): on the
    rollout's path a plain tuple of these fields in this order (the NamedTuple costs 5x); ``_make`` names one."""

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


@dataclass(slots=True, eq=False)
class Trajectory:
    """Attributes shared by every span of one trajectory (one rollout); the writer turns them into columns."""

    step: int | None
    sample_index: str | None
    rollout_n: int | None
    validate: bool | None
    name: str
    extra: dict[str, Any] | None
    #: False when tracing is off for this trajectory (trace=False, or the sampler left it out).
    recording: bool
    root_span_id: int
    trace_id: int
    #: True once a kind="rollout" op became the root span.
    root_claimed: bool = field(default=False, init=False)
    #: Spans recorded so far (the context's synthetic root is written only when there are some).
    spans: int = field(default=0, init=False)
    #: The sampler's record of this trajectory's sample, or None.
    sample: Any = field(default=None, init=False)


def named_trajectory(
    rec: Any, who: str, step: int | None, sample_index: int | str | None, rollout_n: int | None, validate: bool | None
) -> Trajectory:
    """The trajectory a ``log_reward``-style call applies to: the current one, else the one the keys name (an ended
    one: a detached record readers join by the keys). ValueError (from ``who``): outside one, naming none."""
    frame = CURRENT_SPAN.get()
    if frame is not None and frame[2] is not None and step is None and sample_index is None:
        return frame[2]
    key_index = None if sample_index is None else as_text(sample_index)
    traj: Trajectory | None = rec.trajectories.find_trajectory(step, key_index, rollout_n, validate)
    if traj is not None:
        return traj
    if key_index is None:
        raise ValueError(
            f"{who}: called outside a trajectory without step and sample_index; "
            "call it inside rollout_trace_attr(...) or pass step=, sample_index=, rollout_n="
        )
    return Trajectory(step, key_index, rollout_n, validate, "", None, True, 0, 0)


def append_instant(rec: Any, traj: Trajectory, spec: Any, args: Any, kwargs: Any) -> None:
    """Append a zero-length span of ``spec`` under ``traj``'s root (a logged reward, token stats) to ``rec``."""
    traj.spans += 1
    sid, parent, now = next(rec.span_ids), traj.root_span_id or None, time.time_ns()
    rec.append(SpanRecord(sid, parent, traj.trace_id, spec, traj, now, now, None, args, kwargs, None, None))

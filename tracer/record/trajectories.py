"""Trajectory bookkeeping on the caller's path: ids, the sampling decision, and log_reward's lookup."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from tracer import schema as S
from tracer.record.capture import capture_error
from tracer.record.context import Trajectory
from tracer.record.sampling import OUT, StepSampler
from tracer.record.spec import ROOT_SPEC, OpSpec

#: Trajectories remembered for log_reward calls made after the rollout.
MAX_REMEMBERED_TRAJECTORIES = 200_000

#: Per thread: ``busy`` while the caller holds a lock the writer also takes or waits for room; a signal
#: handler recording on that thread then never waits for the writer (a full buffer drops and counts).
CALLER = threading.local()


class Trajectories:
    """Span and trace ids, sampling admission (``sampler`` None: all) and the remembered trajectories."""

    def __init__(
        self,
        span_ids: itertools.count[int],
        trace_ids: itertools.count[int],
        sampler: StepSampler | None,
        append: Callable[[tuple[Any, ...]], None],
    ) -> None:
        self.span_ids = span_ids
        self.trace_ids = trace_ids
        self.sampler = sampler
        self.append = append
        self._remembered: collections.OrderedDict[tuple[Any, ...], Trajectory] = collections.OrderedDict()
        # Reentrant: a signal handler that records runs on the thread it interrupts, maybe while it holds it.
        self._lock = threading.RLock()

    def open_span(
        self, spec: OpSpec, parent: tuple[int, int, Trajectory | None] | None
    ) -> tuple[tuple[int, int, Trajectory | None], int | None] | None:
        """Return (frame, parent span id) for a new span, or None to not record."""
        traj = None if parent is None else parent[2]
        if traj is not None:
            if not traj.recording:
                return None
            traj.spans += 1
        if spec.kind != S.KIND_ROLLOUT or (parent is not None and traj is None):
            if parent is None:
                return (next(self.span_ids), next(self.trace_ids), None), None
            return (next(self.span_ids), parent[1], traj), parent[0]
        if traj is not None and parent is not None and parent[0] == traj.root_span_id and not traj.root_claimed:
            traj.root_claimed = True
            return (traj.root_span_id, traj.trace_id, traj), None
        # A rollout op starts a trajectory; inside one, a child with its keys and sample (not remembered).
        t = traj
        if t is None:
            child = self.new_trajectory(None, None, None, None, spec.name, None, True)
        else:
            child = self.new_trajectory(
                t.step, t.sample_index, t.rollout_n, t.validate, spec.name, t.extra, True, False
            )
            child.sample = t.sample
        child.root_claimed, child.spans = True, 1
        return (child.root_span_id, child.trace_id, child), None

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
            busy = getattr(CALLER, "busy", False)
            CALLER.busy = True
            try:
                sample = self.sampler.admit(step, validate, sample_index)
            finally:
                CALLER.busy = busy
            if sample is not None:
                traj.sample = sample
                sample.trajectories.append(traj)
            traj.recording = sample is not None and sample.state != OUT
        if remember and sample_index is not None:
            key = (step, sample_index, rollout_n, bool(validate))
            with self._lock:
                self._remembered[key] = traj
                if len(self._remembered) > MAX_REMEMBERED_TRAJECTORIES:
                    self._remembered.popitem(last=False)
        return traj

    def end_trajectory(self, traj: Trajectory, start: int, exc: BaseException | None) -> None:
        """Close a rollout_trace_attr block: write its root unless an op was the root."""
        if traj.recording and not traj.root_claimed and traj.spans > 0:
            error = None if exc is None else capture_error(exc)
            head = (traj.root_span_id, None, traj.trace_id, ROOT_SPEC, traj, start, time.time_ns(), error)
            self.append(head + (None, None, None, None))

    def find_trajectory(self, step: Any, sample_index: str | None, rollout_n: Any, validate: Any) -> Trajectory | None:
        with self._lock:
            return self._remembered.get((step, sample_index, rollout_n, bool(validate)))

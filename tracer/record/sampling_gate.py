"""The writer's sampling gate: which finished spans are written now, held, or left out (writer thread only)."""

from __future__ import annotations

import itertools
from typing import Any

from tracer import schema as S
from tracer.record.sampling import IN, PENDING, StepSampler
from tracer.record.span_encoder import R_ARGS, R_EXC, R_OUT, R_SPAN, R_SPEC, R_TRAJ, as_reward
from tracer.record.spec import OpSpec


class SamplingGate:
    """Holds the spans of undecided groups between writer cycles."""

    def __init__(self, sampler: StepSampler) -> None:
        self.sampler = sampler
        #: Spans of groups not decided yet, in arrival order.
        self.held: list[tuple[Any, ...]] = []

    def admit(self, records: list[tuple[Any, ...]], force: bool) -> list[tuple[Any, ...]]:
        """The spans to write now, of the held ones and ``records`` (``force``: decide every group now)."""
        if self.sampler.watches:
            self._observe(records)
        self.sampler.decide(force)
        ready: list[tuple[Any, ...]] = []
        held: list[tuple[Any, ...]] = []
        for rec in itertools.chain(self.held, records):
            traj = rec[R_TRAJ]
            sample = traj.sample if traj is not None else None
            state = sample.state if sample is not None else IN
            if state == IN:
                ready.append(rec)
            elif state == PENDING:
                held.append(rec)
        self.held = held
        return ready

    def _observe(self, records: list[tuple[Any, ...]]) -> None:
        """Show extremes/variance the rewards, lengths and ends of the held groups' spans."""
        observe = self.sampler.observe
        for rec in records:
            traj = rec[R_TRAJ]
            if traj is None or traj.sample is None or traj.sample.state != PENDING:
                continue
            spec: OpSpec = rec[R_SPEC]
            op = spec.special is None and rec[R_EXC] is None
            observe(
                traj,
                rec[R_SPAN] == traj.root_span_id,
                rec[R_ARGS][0] if spec.special == "reward" else None,
                as_reward(rec[R_OUT]) if op and spec.kind == S.KIND_REWARD else None,
                rec[R_OUT] if op and spec.kind == S.KIND_LLM else None,
            )

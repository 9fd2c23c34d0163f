"""Console backend: one summary line per complete step (validation on its own line) on the log (logger
``rollout_trace``, INFO) and on stderr (option ``print``; live ``backend_options={"console_print": False}``)::

    rollout-trace step 3: reward 0.625 ± 0.484 [0, 1] | turns 2.0 | tool calls 1.0, errors 25.0% | 8 trajectories, 0 failed | latency p50 1.20s p95 3.41s
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from typing import ClassVar

from tracer.exporters.base import NEW, SinkBase, StepBatch, Written

logger = logging.getLogger("rollout_trace")


def _num(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def format_step_line(step: int | None, metrics: Mapping[str, float], validate: bool = False) -> str:
    """The summary line of one step (``metrics`` as from :func:`tracer.step_metrics`)."""
    label = (f"step {step}" if step is not None else "no step") + (" validation" if validate else "")
    return (
        f"rollout-trace {label}: reward {_num(metrics['reward/mean'])} ± {_num(metrics['reward/std'])} "
        f"[{_num(metrics['reward/min'])}, {_num(metrics['reward/max'])}] | "
        f"turns {metrics['turns/mean']:.1f} | "
        f"tool calls {metrics['tool_calls/mean']:.1f}, errors {100 * metrics['tool_error_rate']:.1f}% | "
        f"{int(metrics['trajectories'])} trajectories, {int(metrics['errors'])} failed | "
        f"latency p50 {metrics['latency_s/p50']:.2f}s p95 {metrics['latency_s/p95']:.2f}s"
    )


class ConsoleSink(SinkBase):
    """One summary line per complete step (training, and validation when present)."""

    span_columns: ClassVar[tuple[str, ...]] = ()  # the lines need only the summaries

    def write(self, batch: StepBatch) -> Written:
        """Write the step's lines."""
        for validate, values in sorted((batch.metrics or {}).items()):
            line = format_step_line(batch.step, values, validate)
            logger.info(line)
            if self.options["print"]:
                print(line, file=sys.stderr, flush=True)
        return Written(sent=sum(1 for t in batch.trajectories if t.state == NEW))

"""Console exporter: one readable summary line per step on the log.

Like verl's ``trainer.logger=console``: each line goes to the logger
``rollout_trace`` at INFO and is printed to stderr. A step's line is written
once the step is complete (a trajectory of a later step arrived), or on
``flush()``/``shutdown()``; validation trajectories get their own line.
Example::

    rollout-trace step 3: reward 0.625 ± 0.484 [0, 1] | turns 2.0 | tool calls 1.0, errors 25.0% | 8 trajectories, 0 failed | latency p50 1.20s p95 3.41s
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from tracer.config import TraceConfig
from tracer.exporters import ExportReport
from tracer.exporters.steps import StepShipper
from tracer.exporters.tables import StepData, open_run
from tracer.summary import step_metrics

logger = logging.getLogger("rollout_trace")


def _num(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}g}"


def format_step_line(step: int | None, metrics: Mapping[str, float], validate: bool = False) -> str:
    """The summary line of one step (``metrics`` as from :func:`tracer.step_metrics`)."""
    label = f"step {step}" if step is not None else "no step"
    if validate:
        label += " validation"
    return (
        f"rollout-trace {label}: reward {_num(metrics['reward/mean'])} ± {_num(metrics['reward/std'])} "
        f"[{_num(metrics['reward/min'])}, {_num(metrics['reward/max'])}] | "
        f"turns {metrics['turns/mean']:.1f} | "
        f"tool calls {metrics['tool_calls/mean']:.1f}, errors {100 * metrics['tool_error_rate']:.1f}% | "
        f"{int(metrics['trajectories'])} trajectories, {int(metrics['errors'])} failed | "
        f"latency p50 {metrics['latency_s/p50']:.2f}s p95 {metrics['latency_s/p95']:.2f}s"
    )


#: ``TraceConfig.backend_options`` key: set it to False to only log, not print
#: (when your logging already writes INFO to stderr).
OPTION_PRINT = "console_print"


def emit(line: str, print_too: bool = True) -> None:
    """Write ``line`` to the ``rollout_trace`` logger (INFO) and, unless told not to, to stderr."""
    logger.info(line)
    if print_too:
        print(line, file=sys.stderr, flush=True)


def _lines(data: StepData) -> list[str]:
    return [format_step_line(data.step, data.raw_metrics[v], v) for v in (False, True) if v in data.raw_metrics]


class ConsoleExporter(StepShipper):
    """Live exporter: one summary line per step (training, and validation when present)."""

    def __init__(self, config: TraceConfig) -> None:
        super().__init__(config, "console")

    def publish(self, data: StepData) -> None:
        """Write the step's lines."""
        print_too = bool(self.config.backend_options.get(OPTION_PRINT, True))
        for line in _lines(data):
            emit(line, print_too)


def export_files(
    path: str | os.PathLike[str],
    *,
    steps: Iterable[int] | None = None,
    since_step: int | None = None,
    progress: bool = False,
    verify: bool = False,
    **_ignored: Any,
) -> ExportReport:
    """Write the summary line of every step in the trace files."""
    run = open_run(path, steps, since_step)
    report = ExportReport("console")
    for (step, validate), metrics in step_metrics(run.trajectories).items():
        emit(format_step_line(step, metrics, validate))
    report.trajectories_sent = run.trajectories.num_rows
    report.trajectories_skipped = run.not_selected
    return report

"""SwanLab exporter: per-step trajectory tables, conversations and rollout metrics.

Every step logs, at that step: a ``swanlab.echarts.Table`` of its training
trajectories under ``rollout_trace/table`` and of its validation trajectories
(at most ``log_val_generations``) under ``rollout_trace_val/table``, the first
:data:`MAX_TEXTS` conversations as ``swanlab.Text`` under
``rollout_trace/conversations``, and the step's metrics
(``rollout_trace/reward/mean``, ...; ``rollout_trace_val/...``).

Modes: ``local`` (files under ``log_dir``, browsed with ``swanlab watch``; it
needs the ``swanboard`` package, and without it the run is written in
``offline`` mode instead, which keeps the same files), ``offline`` (files, upload
later with ``swanlab sync``), ``online``. ``swanlab`` is imported only when an
exporter is built or an export runs.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tracer.config import TraceConfig
from tracer.exporters import ExportReport
from tracer.exporters.steps import StepShipper
from tracer.exporters.tables import (
    COL,
    TABLE_COLUMNS,
    TABLE_KEY,
    VAL_TABLE_KEY,
    StepData,
    compare_metrics,
    compare_rows,
    import_backend,
    open_run,
    read_leveldb_log,
    require_backend,
    send_steps,
)

#: Modes ``export_files`` accepts.
MODES = ("local", "offline", "online")
#: Key of the per-step conversation texts.
TEXT_KEY = "rollout_trace/conversations"
#: Conversations logged as ``swanlab.Text`` per step (all are in the table).
MAX_TEXTS = 8
#: ``TraceConfig.backend_options`` keys this exporter reads.
OPTION_MODE = "swanlab_mode"
OPTION_LOG_DIR = "swanlab_log_dir"
OPTION_PROJECT = "swanlab_project"
#: Header of a ``.swanlab`` run file.
SWANLAB_FILE_IDENT = b":SWL"
#: Seconds before a live exporter whose run failed to start tries again.
INIT_RETRY_S = 30.0


def _swanlab() -> Any:
    return import_backend("swanlab", "swanlab")


def effective_mode(mode: str) -> tuple[str, str | None]:
    """The mode to run in and a note when ``local`` falls back to ``offline`` (no swanboard)."""
    if mode == "local" and importlib.util.find_spec("swanboard") is None:
        return "offline", (
            "swanlab local mode needs the swanboard package (pip install swanboard); wrote an offline run "
            "instead, with the same files"
        )
    return mode, None


class SwanlabRun:
    """A SwanLab run receiving per-step tables and metrics.

    If this process already has a SwanLab run (``swanlab.get_run()``), it is
    used and left running at :meth:`finish`.
    """

    def __init__(
        self,
        project: str,
        name: str | None,
        mode: str | None,
        log_dir: str | None,
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
        use_current: bool = True,
    ) -> None:
        swanlab = _swanlab()
        self._swanlab = swanlab
        self.note: str | None = None
        self.owned = not (use_current and swanlab.has_run())
        if self.owned:
            if mode is not None:
                mode, self.note = effective_mode(mode)
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
            self.run = swanlab.init(
                project=project,
                name=name,
                group=group,
                mode=mode,
                log_dir=log_dir,
                config=dict(config or {}),
            )
        else:
            self.run = swanlab.get_run()
        self.mode = mode
        #: The run's directory (its ``.swanlab`` file and ``media/``).
        self.directory = os.fspath(self.run.dir)
        self._last_swanlab_step = -1
        self._last_step: int | None = None

    def log_step(self, data: StepData) -> list[str]:
        """Log one step's tables, conversation texts and metrics at that step; return notes (none)."""
        swanlab = self._swanlab
        if data.step is not None and data.step == self._last_step:
            # A step published again (late trajectories): SwanLab keeps one value per step and key.
            sl_step = self._last_swanlab_step + 1
        elif data.step is not None and data.step > self._last_swanlab_step:
            sl_step = data.step
        else:
            sl_step = self._last_swanlab_step + 1
        payload: dict[str, Any] = dict(data.metrics)
        for key, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)):
            if rows:
                table = swanlab.echarts.Table()
                table.add(list(TABLE_COLUMNS), [list(r) for r in rows])
                payload[key] = table
        texts = [
            swanlab.Text(
                r[COL["conversation"]],
                caption=f"sample {r[COL['sample_index']]} rollout {r[COL['rollout_n']]} reward {r[COL['reward']]}",
            )
            for r in data.rows[:MAX_TEXTS]
        ]
        if texts:
            payload[TEXT_KEY] = texts
        if data.step is not None:
            payload["rollout_trace/step"] = data.step
        self.run.log(payload, step=sl_step)
        self._last_swanlab_step = sl_step
        self._last_step = data.step
        return []

    def finish(self) -> None:
        """Finish the run if this object started it."""
        if self.owned:
            self.run.finish()


def read_back(directory: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics a finished SwanLab run's files hold."""
    from swanlab.proto.swanlab.record.v1 import record_pb2

    rows: dict[str, float | None] = {}
    scalars: dict[tuple[int, str], float] = {}
    files = glob.glob(os.path.join(directory, "*.swanlab"))
    if not files:
        return rows, {}
    for raw in read_leveldb_log(files[0], SWANLAB_FILE_IDENT):
        record = record_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "media" and record.media.key in (TABLE_KEY, VAL_TABLE_KEY):
            for item in record.media.value.items:
                with open(os.path.join(directory, "media", "echarts", item.filename), encoding="utf-8") as f:
                    table = json.load(f)
                for row in table.get("rowData", []):
                    rows[row["trace_id"]] = row["reward"]
        elif kind == "scalar":
            scalars[(record.scalar.step, record.scalar.key)] = record.scalar.value.number
    # Metrics are keyed by the rollout step each logged step carries.
    step_of = {s: int(v) for (s, k), v in scalars.items() if k == "rollout_trace/step"}
    metrics = {(step_of.get(s, s), k): v for (s, k), v in scalars.items() if k != "rollout_trace/step"}
    return rows, metrics


def verify_run(
    directory: str, expected_rows: Mapping[str, float | None], expected_metrics: Mapping[tuple[Any, str], float]
) -> list[str]:
    """Compare a finished run's files with what was sent.

    Args:
        directory: The run's directory.
        expected_rows: ``trace_id -> reward`` of every row sent.
        expected_metrics: ``(step, metric key) -> value`` of every metric sent.

    Returns:
        Two ``verify swanlab: OK|FAILED: ...`` lines (rows and rewards; metrics).
    """
    found_rows, found_metrics = read_back(directory)
    return [
        *compare_rows("swanlab", expected_rows, found_rows),
        compare_metrics("swanlab", expected_metrics, found_metrics),
    ]


def export_files(
    path: str | os.PathLike[str],
    *,
    project: str | None = None,
    experiment: str | None = None,
    mode: str = "local",
    log_dir: str | None = None,
    steps: Iterable[int] | None = None,
    since_step: int | None = None,
    progress: bool = True,
    verify: bool = False,
    log_val_generations: int | None = None,
    **_ignored: Any,
) -> ExportReport:
    """Export trace files to one SwanLab run: per-step tables, conversations and metrics.

    Args:
        path: A trace file or directory.
        project: SwanLab project (default: the recorded project name).
        experiment: Run name (default: the recorded experiment name).
        mode: ``"local"``, ``"offline"`` or ``"online"``.
        log_dir: Where the run's directory goes (default SwanLab's, ``./swanlog``).
        steps: Export only these steps.
        since_step: Export only steps >= this.
        progress: Draw a progress bar on stderr.
        verify: Read the run's files back and compare rows, rewards and metrics.
        log_val_generations: Validation rows per step (default: the recorded config's).

    Raises:
        FileNotFoundError: ``path`` holds no trace files.
        ValueError: ``mode`` is not one of :data:`MODES`.
        ImportError: swanlab is not installed (the message has the pip line).
    """
    if mode not in MODES:
        raise ValueError(f"swanlab mode {mode!r} is not one of {', '.join(MODES)}")
    run_files = open_run(path, steps, since_step)
    cap = run_files.log_val_generations if log_val_generations is None else log_val_generations
    report = ExportReport("swanlab")
    sl = SwanlabRun(
        project=project or run_files.project or "rollout_trace",
        name=experiment or run_files.experiment,
        mode=mode,
        log_dir=log_dir,
        group=run_files.experiment,
        config={"rollout_trace_source": os.path.abspath(os.fspath(path))},
        use_current=False,
    )
    if sl.note:
        report.details.append(sl.note)
    try:
        sent = send_steps(run_files, cap, sl.log_step, report, progress)
    finally:
        sl.finish()
    report.details.append(f"swanlab run files: {sl.directory}")
    if sl.mode == "offline":
        report.details.append(f"upload it with: swanlab sync {sl.directory}")
    elif sl.mode == "local":
        report.details.append(f"browse it with: swanlab watch {os.path.dirname(sl.directory)}")
    if verify:
        report.details.extend(verify_run(sl.directory, sent.rows, sent.metrics))
    return report


class SwanlabExporter(StepShipper):
    """Live exporter: finished trajectories into a SwanLab run, one step at a time.

    Uses the process's SwanLab run when one is active, else starts one named
    after the experiment (on the exporter's own thread, at the first step).
    ``backend_options``: ``swanlab_mode`` (default SwanLab's), ``swanlab_log_dir``,
    ``swanlab_project`` (default ``project_name``).
    """

    def __init__(self, config: TraceConfig) -> None:
        require_backend("swanlab", "swanlab")
        self._sl: SwanlabRun | None = None
        self._init_error: Exception | None = None
        self._init_failed_at = 0.0
        super().__init__(config, "swanlab")

    def _run_for(self) -> SwanlabRun:
        if self._sl is None:
            if self._init_error is not None and time.monotonic() - self._init_failed_at < INIT_RETRY_S:
                raise self._init_error
            opts = self.config.backend_options
            try:
                self._sl = SwanlabRun(
                    project=opts.get(OPTION_PROJECT) or self.config.project_name,
                    name=self.config.experiment_name,
                    mode=opts.get(OPTION_MODE),
                    log_dir=opts.get(OPTION_LOG_DIR),
                    group=self.config.experiment_name,
                    config={"rollout_trace": self.config.to_dict()},
                )
            except Exception as exc:
                self._init_error, self._init_failed_at = exc, time.monotonic()
                raise
        return self._sl

    def publish(self, data: StepData) -> None:
        """Log the step's new rows and metrics."""
        self._run_for().log_step(data)

    def close_backend(self) -> None:
        """Finish the run if this exporter started it."""
        if self._sl is not None:
            self._sl.finish()

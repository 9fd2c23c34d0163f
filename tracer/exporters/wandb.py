"""WandB exporter: per-step trajectory tables and rollout metrics.

Every step logs, at that step, new rows of an incremental table
(``wandb.Table(log_mode="INCREMENTAL")``: each log holds only the step's rows
and the table's history is kept) under ``rollout_trace/table``
(training) and ``rollout_trace_val/table`` (validation, at most
``log_val_generations`` per step, verl's key), plus the step's metrics
(``rollout_trace/reward/mean``, ...; ``rollout_trace_val/...`` for validation)
plotted against ``rollout_trace/step``.

Row limits: a logged table keeps at most ``wandb.Table.MAX_ROWS`` (10,000)
rows in its media file and ``MAX_ARTIFACT_ROWS`` (200,000) in its artifact;
rows past that would be silently cut by wandb. A step with more rows is split
into several increments of at most ``MAX_ROWS`` rows, logged at the same
step, and the export report says so.

``wandb`` is imported only when an exporter is built or an export runs.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tracer.config import TraceConfig
from tracer.exporters import ExportReport
from tracer.exporters.steps import StepShipper
from tracer.exporters.tables import (
    METRIC_PREFIX,
    TABLE_COLUMNS,
    TABLE_KEY,
    VAL_METRIC_PREFIX,
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

logger = logging.getLogger("rollout_trace")

#: Metric that every logged step carries; charts of our metrics use it as x-axis.
STEP_METRIC = "rollout_trace/step"
#: Modes ``export_files`` accepts.
MODES = ("offline", "online")
#: ``TraceConfig.backend_options`` keys this exporter reads.
OPTION_PROXY = "wandb_proxy"
OPTION_MODE = "wandb_mode"
OPTION_DIR = "wandb_dir"
OPTION_PROJECT = "wandb_project"
#: Seconds before a live exporter whose run failed to start tries again.
INIT_RETRY_S = 30.0
#: Header of a ``.wandb`` run file.
WANDB_FILE_IDENT = b":W&B"


def _wandb() -> Any:
    return import_backend("wandb", "wandb")


class WandbRun:
    """One wandb run receiving per-step tables and metrics.

    Args:
        project: wandb project.
        name: Run name.
        mode: ``"offline"`` or ``"online"`` (None: wandb's own default / ``WANDB_MODE``).
        run_dir: Parent directory of the run's files (wandb's ``dir``).
        group: Run group.
        config: Run config to record.
        proxy: HTTPS/HTTP proxy for wandb's traffic (verl's ``wandb_proxy``).
        max_rows: Rows per table increment (default ``wandb.Table.MAX_ROWS``).
    """

    def __init__(
        self,
        project: str,
        name: str | None,
        mode: str | None = None,
        run_dir: str | None = None,
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
        proxy: str | None = None,
        max_rows: int | None = None,
        job_type: str = "rollout_trace",
    ) -> None:
        wandb = _wandb()
        self._wandb = wandb
        settings = wandb.Settings(https_proxy=proxy, http_proxy=proxy) if proxy else None
        if run_dir is not None:
            os.makedirs(run_dir, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            group=group,
            job_type=job_type,
            dir=run_dir,
            mode=mode,
            config=dict(config or {}),
            settings=settings,
            reinit="create_new",
        )
        self.run.define_metric(STEP_METRIC)
        for prefix in (METRIC_PREFIX, VAL_METRIC_PREFIX):
            self.run.define_metric(prefix + "*", step_metric=STEP_METRIC)
        self.max_rows = min(max_rows or wandb.Table.MAX_ROWS, wandb.Table.MAX_ROWS)
        self.tables = {
            key: wandb.Table(columns=list(TABLE_COLUMNS), log_mode="INCREMENTAL") for key in (TABLE_KEY, VAL_TABLE_KEY)
        }
        self._last_wandb_step = -1
        self._last_step: int | None = None
        #: Where the run's files are (``.../offline-run-*`` or ``.../run-*``).
        self.directory = os.path.dirname(self.run.dir)

    def log_step(self, data: StepData) -> list[str]:
        """Log one step's rows (split at ``max_rows``) and metrics; return notes on splits."""
        if data.step is not None and data.step == self._last_step:
            wandb_step = self._last_wandb_step
        elif data.step is not None and data.step > self._last_wandb_step:
            wandb_step = data.step
        else:
            wandb_step = self._last_wandb_step + 1
        notes = []
        parts: dict[str, list[list[list[Any]]]] = {}
        for key, rows in ((TABLE_KEY, data.rows), (VAL_TABLE_KEY, data.val_rows)):
            parts[key] = [rows[i : i + self.max_rows] for i in range(0, len(rows), self.max_rows)]
            if len(parts[key]) > 1:
                notes.append(
                    f"step {data.step}: {len(rows)} rows of {key} split into {len(parts[key])} table increments "
                    f"of at most {self.max_rows} rows (a logged wandb table keeps at most wandb.Table.MAX_ROWS = "
                    f"{self._wandb.Table.MAX_ROWS}), all logged at that step"
                )
        payload: dict[str, Any] = dict(data.metrics)
        if data.step is not None:
            payload[STEP_METRIC] = data.step
        for i in range(max((len(p) for p in parts.values()), default=0) or 1):
            for key, chunks in parts.items():
                if i < len(chunks):
                    table = self.tables[key]
                    for row in chunks[i]:
                        table.add_data(*row)
                    payload[key] = table
            if payload:
                self.run.log(payload, step=wandb_step)
            payload = {}
        self._last_wandb_step = wandb_step
        self._last_step = data.step
        return notes

    def finish(self) -> None:
        """Finish the run (its files are complete afterwards)."""
        self.run.finish()


def read_back(directory: str) -> tuple[dict[str, float | None], dict[tuple[Any, str], float]]:
    """Rows (``trace_id -> reward``) and step metrics a finished wandb run holds.

    Reads the table increments under ``files/media/table`` and the history
    records of the ``.wandb`` file.
    """
    rows: dict[str, float | None] = {}
    for key in (TABLE_KEY, VAL_TABLE_KEY):
        pattern = os.path.join(
            directory, "files", "media", "table", *key.split("/")[:-1], key.split("/")[-1] + "_*.table.json"
        )
        for file in sorted(glob.glob(pattern)):
            with open(file, encoding="utf-8") as f:
                table = json.load(f)
            cols = table["columns"]
            t, r = cols.index("trace_id"), cols.index("reward")
            for row in table["data"]:
                rows[row[t]] = row[r]
    metrics: dict[tuple[Any, str], float] = {}
    files = glob.glob(os.path.join(directory, "*.wandb"))
    if files:
        from wandb.proto import wandb_internal_pb2 as pb

        for raw in read_leveldb_log(files[0], WANDB_FILE_IDENT):
            record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module, no stubs
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {(i.key or "/".join(i.nested_key)): i.value_json for i in record.history.item}
            step = json.loads(items[STEP_METRIC]) if STEP_METRIC in items else None
            for key, value in items.items():
                if (
                    key.startswith((METRIC_PREFIX, VAL_METRIC_PREFIX))
                    and key != STEP_METRIC
                    and not key.startswith((TABLE_KEY + "/", VAL_TABLE_KEY + "/"))
                ):
                    metrics[(step, key)] = float(json.loads(value))
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
        Two ``verify wandb: OK|FAILED: ...`` lines (rows and rewards; metrics).
    """
    found_rows, found_metrics = read_back(directory)
    return [
        *compare_rows("wandb", expected_rows, found_rows),
        compare_metrics("wandb", expected_metrics, found_metrics),
    ]


def export_files(
    path: str | os.PathLike[str],
    *,
    project: str | None = None,
    experiment: str | None = None,
    mode: str = "offline",
    run_dir: str | None = None,
    steps: Iterable[int] | None = None,
    since_step: int | None = None,
    progress: bool = True,
    verify: bool = False,
    max_rows: int | None = None,
    log_val_generations: int | None = None,
    proxy: str | None = None,
    **_ignored: Any,
) -> ExportReport:
    """Export trace files to one wandb run: per-step tables and metrics.

    Args:
        path: A trace file or directory.
        project: wandb project (default: the recorded project name).
        experiment: Run name (default: the recorded experiment name).
        mode: ``"offline"`` (files only; upload later with ``wandb sync``) or ``"online"``.
        run_dir: Where wandb puts the run directory (default: wandb's, ``WANDB_DIR``).
        steps: Export only these steps.
        since_step: Export only steps >= this.
        progress: Draw a progress bar on stderr.
        verify: Read the run's files back and compare rows, rewards and metrics.
        max_rows: Rows per table increment (<= ``wandb.Table.MAX_ROWS``).
        log_val_generations: Validation rows per step (default: the recorded config's).
        proxy: HTTP(S) proxy for wandb (verl's ``wandb_proxy``).

    Raises:
        FileNotFoundError: ``path`` holds no trace files.
        ValueError: ``mode`` is not one of :data:`MODES`.
        ImportError: wandb is not installed (the message has the pip line).
    """
    if mode not in MODES:
        raise ValueError(f"wandb mode {mode!r} is not one of {', '.join(MODES)}")
    run_files = open_run(path, steps, since_step)
    cap = run_files.log_val_generations if log_val_generations is None else log_val_generations
    report = ExportReport("wandb")
    wb = WandbRun(
        project=project or run_files.project or "rollout_trace",
        name=experiment or run_files.experiment,
        mode=mode,
        run_dir=run_dir,
        group=run_files.experiment,
        config={"rollout_trace_source": os.path.abspath(os.fspath(path))},
        proxy=proxy,
        max_rows=max_rows,
    )
    try:
        sent = send_steps(run_files, cap, wb.log_step, report, progress)
    finally:
        wb.finish()
        wandb = _wandb()
        if wandb.run is None:
            wandb.teardown()
    report.details.append(f"wandb run files: {wb.directory}")
    if mode == "offline":
        report.details.append(f"upload it with: wandb sync {wb.directory}")
    if verify:
        report.details.extend(verify_run(wb.directory, sent.rows, sent.metrics))
    return report


class WandbExporter(StepShipper):
    """Live exporter: finished trajectories into a wandb run, one step at a time.

    The run is named after the experiment, grouped by it, and started on the
    exporter's own thread at the first step (never on the rollout's path).
    ``backend_options``: ``wandb_mode`` (default ``WANDB_MODE``/wandb's),
    ``wandb_dir``, ``wandb_project`` (default ``project_name``),
    ``wandb_proxy`` (verl's key: the proxy wandb's traffic goes through).
    """

    def __init__(self, config: TraceConfig) -> None:
        require_backend("wandb", "wandb")
        self._wb: WandbRun | None = None
        self._init_error: Exception | None = None
        self._init_failed_at = 0.0
        super().__init__(config, "wandb")

    def _run_for(self) -> WandbRun:
        if self._wb is None:
            # A backend that failed to start is not retried for a while, so a
            # flush does not wait on it again and again.
            if self._init_error is not None and time.monotonic() - self._init_failed_at < INIT_RETRY_S:
                raise self._init_error
            opts = self.config.backend_options
            try:
                self._wb = self._start(opts)
            except Exception as exc:
                self._init_error, self._init_failed_at = exc, time.monotonic()
                raise
        return self._wb

    def _start(self, opts: Mapping[str, Any]) -> WandbRun:
        return WandbRun(
            project=opts.get(OPTION_PROJECT) or self.config.project_name,
            name=self.config.experiment_name,
            mode=opts.get(OPTION_MODE),
            run_dir=opts.get(OPTION_DIR),
            group=self.config.experiment_name,
            config={"rollout_trace": self.config.to_dict()},
            proxy=opts.get(OPTION_PROXY),
        )

    def publish(self, data: StepData) -> None:
        """Log the step's new rows and metrics."""
        for note in self._run_for().log_step(data):
            logger.info("rollout-trace wandb exporter: %s", note)

    def close_backend(self) -> None:
        """Finish the run."""
        if self._wb is not None:
            self._wb.finish()

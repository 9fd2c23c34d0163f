"""rollout-trace's recorder: ``init``, decorate rollout code with ``rollout_trace_op``, group a rollout with
``rollout_trace_attr``, ``log_reward``, ``flush``; get zstd Arrow trace files (README.md's quickstart).

Importing this package imports none of mlflow, wandb, swanlab, torch, transformers, vllm, streamlit or ray.
"""

from __future__ import annotations

from typing import Any

from tracer import schema as schema
from tracer.backends import available_backends
from tracer.compare import compare_runs, read_run_config
from tracer.config import ENV_BACKEND, ENV_CONFIG, ENV_TRACE_DIR, TraceConfig, TraceConfigError
from tracer.data.dataset import to_dataset
from tracer.data.rescore import read_rewards
from tracer.data.token_stats_reader import read_token_stats
from tracer.exporters.attach import attach_exporters
from tracer.index.readers import read_trajectories
from tracer.read import (
    TraceFileWarning,
    dataset,
    iter_batches,
    list_trace_files,
    parse_json,
    read_file_metadata,
    read_spans,
)
from tracer.record import recorder as _recorder
from tracer.record.decorators import log_reward, propagate, rollout_trace_attr, rollout_trace_op
from tracer.record.recorder import FlushResult
from tracer.record.token_stats import log_token_stats
from tracer.summary import step_metrics, trajectory_messages

__version__ = "0.1.0"

__all__ = [
    "ENV_BACKEND",
    "ENV_CONFIG",
    "ENV_TRACE_DIR",
    "FlushResult",
    "TraceConfig",
    "TraceConfigError",
    "TraceFileWarning",
    "available_backends",
    "compare_runs",
    "dataset",
    "flush",
    "get_config",
    "init",
    "iter_batches",
    "list_trace_files",
    "log_reward",
    "log_token_stats",
    "parse_json",
    "propagate",
    "read_file_metadata",
    "read_run_config",
    "read_rewards",
    "read_spans",
    "read_token_stats",
    "read_trajectories",
    "rollout_trace_attr",
    "rollout_trace_op",
    "shutdown",
    "step_metrics",
    "to_dataset",
    "trajectory_messages",
]

_config: TraceConfig | None = None


def init(config: TraceConfig | None = None, **fields: Any) -> TraceConfig:
    """Configure tracing for this process and return the config in force: ``fields`` over ``config`` over the
    environment over defaults (TraceConfigError: an unknown field or a bad value). Calling it again flushes and
    closes the previous recorder; calls still running are written by the new one, whose first :func:`flush`
    reports what the old one lost."""
    global _config
    cfg = TraceConfig.resolve(config, **fields)
    cfg.check_resources()  # output_dir, tokenizer: fail here, not at the first flush
    # One id space per process: spans in flight across the switch keep their links.
    rec = _recorder.Recorder(cfg, ids_from=_recorder.ACTIVE) if cfg.enabled else None
    if rec is not None:
        try:
            attach_exporters(rec)
        except BaseException:
            rec.shutdown()  # a backend that cannot start must not leave a writer thread behind
            raise
    _recorder.set_active(rec)
    _config = cfg
    return cfg


def get_config() -> TraceConfig | None:
    """The config of the last :func:`init`, or None if it was never called."""
    return _config


def flush(timeout: float | None = 30.0) -> FlushResult:
    """Return when everything recorded so far is durable on disk. Never raises for a storage failure:
    ``result.ok`` is False when spans failed or were dropped since the previous flush, ``result.message`` says
    why; the counts are totals."""
    rec = _recorder.ACTIVE
    return FlushResult(True) if rec is None else rec.flush(timeout)


def shutdown(timeout: float | None = 30.0) -> FlushResult:
    """Flush, close the files and turn tracing off until the next :func:`init`."""
    global _config
    rec = _recorder.ACTIVE
    _recorder.ACTIVE = None
    _config = None
    return FlushResult(True) if rec is None else rec.shutdown(timeout)

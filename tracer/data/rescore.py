"""Re-score a recorded run with another reward function (``rollout-trace rescore RUN --reward module:function``).

Each new reward is a ``log_reward`` row in a new file, its source under :data:`tracer.summary.REWARD_SOURCE_KEY`,
the recorded info (but the advantage) carried over; readers report the latest, :func:`read_rewards` all. The function::

    def score(messages: list[dict], response: str, info: dict) -> float | dict | None

returns the reward, a dict with ``"reward"`` and extras, or None (leave the trajectory as it is).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
import pyarrow as pa

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.base import same_value
from tracer.exporters.tables import iter_step_chunks, open_run
from tracer.index.closed import shard_closed
from tracer.read import list_trace_files, read_file_metadata, read_spans
from tracer.storage.writer import SpanWriter
from tracer.summary import (
    REWARD_SOURCE_KEY,
    ROLE_ASSISTANT,
    TURN_SPAN_COLUMNS,
    log_reward_row,
    root_span,
    trajectory_rewards,
    trajectory_turns,
)

#: File metadata key of a rescore's file: the reward function it ran.
META_RESCORE = "rollout_trace.rescore"
#: Attribute of a rescored reward row: the reward it replaced.
PREVIOUS_REWARD_KEY = "previous_reward"
#: Attribute not carried over to a rescored row (it was computed from the old reward).
ADVANTAGE_KEY = "advantage"

#: Columns of :func:`read_rewards`.
REWARD_SOURCE = "source"
REWARD_LATEST = "latest"
REWARDS_SCHEMA = pa.schema(
    [
        pa.field(S.TRACE_ID, pa.string()),
        pa.field(S.REWARD, pa.float64()),
        pa.field(REWARD_SOURCE, pa.string()),
        pa.field(S.END_NS, pa.int64()),
        pa.field(REWARD_LATEST, pa.bool_()),
        pa.field(S.REWARD_INFO, pa.string()),
    ]
)

RewardFunction = Callable[[list[dict[str, Any]], str, dict[str, Any]], Any]


class RescoreError(ValueError):
    """A reward function that cannot be found, or returned something that is not a reward."""


@dataclasses.dataclass
class RescoreReport:
    """What a rescore did: trajectories scored, changed, left (None), mean reward before and after (NaN: none)."""

    source: str  # module:function
    trajectories: int = 0
    changed: int = 0
    unscored: int = 0
    mean_before: float = math.nan
    mean_after: float = math.nan
    path: str | None = None  # the trace file written


def load_reward_function(spec: str) -> RewardFunction:
    """Import ``module:function`` (a module on ``sys.path``, or ``path/to/file.py:function``), else RescoreError."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RescoreError(f"--reward {spec!r} is not module:function; e.g. --reward my_rewards:exact_match")
    try:
        if module_name.endswith(".py") and os.path.exists(module_name):
            spec_ = importlib.util.spec_from_file_location(f"_rescore_{secrets.token_hex(4)}", module_name)
            if spec_ is None or spec_.loader is None:
                raise ImportError(f"{module_name} is not a Python file")
            module = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RescoreError(
            f"cannot import {module_name!r} ({exc}); put it on PYTHONPATH or give path/to/file.py:function"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RescoreError(f"{module_name!r} has no function {attr!r}; give module:function")
    return fn


def _reward_of(result: Any, spec: str) -> tuple[float | None, dict[str, Any]]:
    if result is None:
        return None, {}
    extras: dict[str, Any] = {}
    if isinstance(result, Mapping):
        extras = {str(k): v for k, v in result.items() if k != S.REWARD}
        result = result.get(S.REWARD)
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise RescoreError(f"{spec} returned {result!r}; return a number, {{'reward': number, ...}} or None")
    return float(result), extras


def _mean(values: Iterable[float | None]) -> float:
    got = [v for v in values if v is not None and not math.isnan(v)]
    return sum(got) / len(got) if got else math.nan


def rescore(
    path: str | os.PathLike[str],
    reward: str | RewardFunction,
    *,
    steps: int | Iterable[int] | None = None,
    source: str | None = None,
) -> RescoreReport:
    """Recompute every trajectory's reward of the run folder ``path`` with ``reward`` (``"module:function"`` or the
    function) and record the new ones there, ``source`` (default ``module:function``) as their source. Raises
    RescoreError when the function does not load or returns no reward, FileNotFoundError when ``path`` has no traces.
    """
    fn = load_reward_function(reward) if isinstance(reward, str) else reward
    name = source or (reward if isinstance(reward, str) else f"{fn.__module__}:{getattr(fn, '__qualname__', fn)}")
    folder = os.fspath(path)
    if os.path.isfile(folder):
        folder = os.path.dirname(folder) or "."
    run = open_run(folder, [steps] if isinstance(steps, int) else steps)
    report = RescoreReport(name)
    rows: list[dict[str, Any]] = []
    before: list[float | None] = []
    after: list[float | None] = []
    now = time.time_ns()
    columns = tuple(dict.fromkeys((*TURN_SPAN_COLUMNS, S.STEP)))
    for trajs, spans in iter_step_chunks(run, columns):
        for summary in trajs.to_pylist():
            tid = summary[S.TRACE_ID]
            own = spans.get(tid, [])
            turns = trajectory_turns(own).get(tid, [])
            info = orjson.loads(summary[S.REWARD_INFO]) if summary[S.REWARD_INFO] else {}
            info = {k: v for k, v in info.items() if k != REWARD_SOURCE_KEY} if isinstance(info, dict) else {}
            response = next((t.text or "" for t in reversed(turns) if t.role == ROLE_ASSISTANT), "")
            new, extras = _reward_of(fn([t.as_message() for t in turns], response, info), name)
            old = summary[S.REWARD]
            before.append(old)
            after.append(old if new is None else new)
            if new is None:
                report.unscored += 1
                continue
            report.trajectories += 1
            report.changed += 0 if same_value(old, new) else 1
            # The recorded info goes forward, but not an advantage computed from the old reward.
            kept = {k: v for k, v in info.items() if k not in (ADVANTAGE_KEY, PREVIOUS_REWARD_KEY)}
            attrs = {**kept, **extras, REWARD_SOURCE_KEY: name, PREVIOUS_REWARD_KEY: old}
            parent = None if (root := root_span(own)) is None else root[S.SPAN_ID]
            attributes = json.dumps(attrs, default=str, ensure_ascii=False)
            rows.append(log_reward_row(summary, secrets.token_hex(8), parent, now, new, attributes))
    report.mean_before, report.mean_after = _mean(before), _mean(after)
    if rows:
        report.path = _write(folder, rows, name)
    return report


def _write(folder: str, rows: list[dict[str, Any]], name: str) -> str:
    """Append ``rows`` as one new trace file of the run (the run's own metadata, plus the rescore's)."""
    meta: dict[str, str] = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}
    for f in list_trace_files(folder):
        try:
            meta = {**read_file_metadata(f), **meta}
            break
        except (OSError, pa.ArrowException):
            continue
    meta |= {META_RESCORE: name, S.META_CREATED_NS: str(time.time_ns())}
    writer = SpanWriter(folder, meta, on_close=shard_closed)
    try:
        for i in range(0, len(rows), 4096):
            writer.write(pa.RecordBatch.from_pylist(rows[i : i + 4096], schema=S.SPAN_SCHEMA))
    finally:
        writer.close()
    return writer.paths[0]


def read_rewards(path: str | os.PathLike[str], *, latest_only: bool = False) -> pa.Table:
    """Every reward (or only each trajectory's latest) under ``path``, with its source, oldest first.

    Columns (:data:`REWARDS_SCHEMA`): ``source`` is ``recorded``, ``reward_op`` or a rescore's
    ``module:function``; ``latest`` marks the reward :func:`tracer.read_trajectories` reports.
    """
    spans = read_spans(path, columns=[S.TRACE_ID, S.NAME, S.KIND, S.END_NS, S.REWARD, S.ATTRIBUTES])
    out: list[dict[str, Any]] = []
    for tid, records in trajectory_rewards(spans).items():
        for i, rec in enumerate(records):
            if latest_only and i < len(records) - 1:
                continue
            out.append(
                {
                    S.TRACE_ID: tid,
                    S.REWARD: rec.reward,
                    REWARD_SOURCE: rec.source,
                    S.END_NS: rec.end_ns,
                    REWARD_LATEST: i == len(records) - 1,
                    S.REWARD_INFO: json.dumps(dict(rec.info), default=str, ensure_ascii=False) if rec.info else None,
                }
            )
    return pa.Table.from_pylist(out, schema=REWARDS_SCHEMA)

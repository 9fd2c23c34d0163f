"""Per-token stats read back (:func:`read_token_stats`): the arrays :func:`tracer.log_token_stats` wrote."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as elsewhere
from tracer.index.readers import read_trajectories
from tracer.read import TracePaths, read_spans
from tracer.record.token_stats import (
    TOKEN_STATS_ARRAYS_KEY,
    TOKEN_STATS_SOURCE_KEY,
    TOKEN_STATS_SPAN_NAME,
    TOKEN_STATS_TURN_KEY,
)
from tracer.summary import (
    ROLE_ASSISTANT,
    ROLLOUT_LOGPROBS,
    TOKEN_STATS_KEY_COLUMNS,
    TOKEN_STATS_SOURCE,
    TURN_SPAN_COLUMNS,
    trajectory_turns,
)

#: Types of :data:`tracer.summary.TOKEN_STATS_KEY_COLUMNS`, in order.
_KEY_TYPES = (pa.string(), pa.int64(), pa.string(), pa.int64(), pa.bool_(), pa.int64(), pa.string())
_ROW_COLUMNS = [S.TRACE_ID, S.NAME, S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE, S.END_NS, S.INPUTS]


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x) if math.isfinite(x) else None
    return None


def read_token_stats(
    path: TracePaths,
    trace_ids: str | Iterable[str] | None = None,
    steps: int | Iterable[int] | None = None,
    rollout_logprobs: bool = True,
) -> pa.Table:
    """The per-token arrays logged with :func:`tracer.log_token_stats`, one row per (trajectory, turn): columns
    :data:`tracer.summary.TOKEN_STATS_KEY_COLUMNS` (null when not given) and a ``list<double>`` per array name (null
    where a row lacks it); a later call for a turn overrides, array by array. Rows logged without a trace id get
    the one their keys name (null when none was recorded). With ``rollout_logprobs``, ``rollout_logprobs`` the
    trainer did not log are the turns' recorded logprobs."""
    spans = read_spans(path, columns=_ROW_COLUMNS, steps=steps, trace_ids=trace_ids)
    spans = spans.filter(pc.fill_null(pc.equal(spans.column(S.NAME), TOKEN_STATS_SPAN_NAME), False))
    spans = spans.sort_by([(S.END_NS, "ascending")])
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    names: dict[str, None] = {}
    for r in spans.to_pylist():
        body = S.parse_json_or_text(r[S.INPUTS])
        turn = body.get(TOKEN_STATS_TURN_KEY) if isinstance(body, Mapping) else None
        if not isinstance(turn, int) or not isinstance(body.get(TOKEN_STATS_ARRAYS_KEY), Mapping):
            continue
        key = (r[S.TRACE_ID], r[S.STEP], r[S.SAMPLE_INDEX], r[S.ROLLOUT_N], bool(r[S.VALIDATE]), turn)
        row = merged.setdefault(key, dict(zip(TOKEN_STATS_KEY_COLUMNS, key, strict=False)))
        if isinstance(body.get(TOKEN_STATS_SOURCE_KEY), str):
            row[TOKEN_STATS_SOURCE] = body[TOKEN_STATS_SOURCE_KEY]
        for name, value in body[TOKEN_STATS_ARRAYS_KEY].items():
            if isinstance(value, list):
                row[str(name)] = [_number(x) for x in value]
                names[str(name)] = None
    if any(k[0] is None for k in merged):
        merged = _join_by_key(path, merged)
    if rollout_logprobs and merged:
        _fill_rollout_logprobs(path, merged, steps)
        names[ROLLOUT_LOGPROBS] = None
    fields = [pa.field(n, t) for n, t in zip(TOKEN_STATS_KEY_COLUMNS, _KEY_TYPES, strict=True)] + [
        pa.field(n, pa.list_(pa.float64())) for n in names
    ]
    return pa.Table.from_pylist(list(merged.values()), schema=pa.schema(fields))


def _join_by_key(
    path: TracePaths, merged: dict[tuple[Any, ...], dict[str, Any]]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows without a trace id get the one ``(step, sample_index, rollout_n, validate)`` names, as rewards do;
    rows of the same turn merge, the trace id's own arrays winning."""
    steps = sorted({k[1] for k in merged if k[0] is None and k[1] is not None})
    by_key: dict[tuple[Any, ...], str] = {}
    for r in read_trajectories(path, steps=steps).to_pylist() if steps else []:
        by_key.setdefault((r[S.STEP], r[S.SAMPLE_INDEX], r[S.ROLLOUT_N], bool(r[S.VALIDATE])), r[S.TRACE_ID])
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, row in sorted(merged.items(), key=lambda kv: kv[0][0] is not None):
        row[S.TRACE_ID] = tid = key[0] if key[0] is not None else by_key.get(key[1:5])
        out.setdefault((tid, *key[1:]), {}).update({k: v for k, v in row.items() if v is not None})
    return out


def _fill_rollout_logprobs(
    path: TracePaths, merged: dict[tuple[Any, ...], dict[str, Any]], steps: int | Iterable[int] | None
) -> None:
    want = sorted({k[0] for k, row in merged.items() if k[0] and row.get(ROLLOUT_LOGPROBS) is None})
    if not want:
        return
    spans = read_spans(path, columns=TURN_SPAN_COLUMNS, steps=steps, trace_ids=want)
    spans = spans.filter(pc.equal(spans.column(S.KIND), S.KIND_LLM))
    by_trace = trajectory_turns(spans)
    for key, row in merged.items():
        if row.get(ROLLOUT_LOGPROBS) is not None or not key[0]:
            continue
        llm = [t for t in by_trace.get(key[0], []) if t.role == ROLE_ASSISTANT]
        if key[-1] < len(llm) and llm[key[-1]].logprobs is not None:
            row[ROLLOUT_LOGPROBS] = [_number(x) for x in llm[key[-1]].logprobs]

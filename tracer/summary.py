"""Shared views of recorded data: a trajectory's conversation and per-step metrics.

Exporters and the viewer all show the same things; they compute them here.

Conversation convention (what rollout code records, see rollout/): the
trajectory's root span returns a dict with ``"messages"``, a list of
OpenAI-style chat messages (``role``, ``content``, optional ``tool_calls`` on
assistant messages, ``tool_call_id``/``name`` on tool messages). When the root
has none, the conversation is rebuilt from the llm spans' decoded
``prompt_text``/``response_text`` and the tool spans' inputs and outputs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.read import read_spans


def _loads(text: Any) -> Any:
    if text is None or not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def trajectory_messages(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of one trajectory, from its spans (table or row dicts).

    Returns:
        OpenAI-style messages: ``{"role", "content", ...}``.
    """
    rows = spans.to_pylist() if isinstance(spans, pa.Table) else list(spans)
    rows.sort(key=lambda r: r.get(S.START_NS) or 0)
    for row in rows:
        if row.get(S.PARENT_SPAN_ID) is None and row.get(S.KIND) == S.KIND_ROLLOUT:
            out = _loads(row.get(S.OUTPUTS))
            if isinstance(out, Mapping) and isinstance(out.get("messages"), list):
                return [dict(m) for m in out["messages"] if isinstance(m, Mapping)]
    messages: list[dict[str, Any]] = []
    for row in rows:
        kind = row.get(S.KIND)
        if kind == S.KIND_LLM:
            inputs = _loads(row.get(S.INPUTS)) or {}
            outputs = _loads(row.get(S.OUTPUTS)) or {}
            if not messages and isinstance(inputs, Mapping):
                prompt = inputs.get("prompt_text") or inputs.get("messages") or inputs.get("prompt")
                if prompt is not None:
                    messages.append(
                        {"role": "user", "content": prompt if isinstance(prompt, str) else json.dumps(prompt)}
                    )
            text = outputs.get("response_text") if isinstance(outputs, Mapping) else outputs
            messages.append({"role": "assistant", "content": text if isinstance(text, str) else json.dumps(text)})
        elif kind == S.KIND_TOOL:
            outputs = _loads(row.get(S.OUTPUTS))
            content = outputs if isinstance(outputs, str) else json.dumps(outputs)
            if row.get(S.STATUS) != S.STATUS_OK:
                content = (_loads(row.get(S.ERROR)) or {}).get("message", "error")
            messages.append({"role": "tool", "name": row.get(S.NAME), "content": content})
    return messages


def _percentile(ordered: list[float], q: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default)."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_metrics(trajectories: pa.Table) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) rollout metrics from :func:`tracer.read_trajectories`.

    Keys of each dict: ``trajectories``, ``reward/mean|std|min|max`` (NaN
    when no trajectory of the group has a reward; std is the population
    std), ``turns/mean`` (llm calls), ``tool_calls/mean``, ``tool_error_rate``
    (tool errors / tool calls), ``errors`` (trajectories whose status is not
    ok), ``latency_s/p50|p95``. Grouped in Arrow: only the groups are looped
    over in Python (125k trajectories in ~0.08 s, against ~1.1 s row by row).
    """
    t = trajectories
    if t.num_rows == 0:
        return {}
    lat = pc.divide(pc.cast(pc.subtract(t.column(S.END_NS), t.column(S.START_NS)), pa.float64()), 1e9)
    work = pa.table(
        {
            "k_step": t.column(S.STEP),
            "k_val": pc.fill_null(t.column(S.VALIDATE), False),
            "reward": t.column(S.REWARD),
            "turns": t.column("num_llm_calls"),
            "tools": t.column("num_tool_calls"),
            "tool_errors": t.column("num_tool_errors"),
            "not_ok": pc.cast(pc.fill_null(pc.not_equal(t.column(S.STATUS), S.STATUS_OK), True), pa.int64()),
            "lat": lat,
        }
    )
    grouped = work.group_by(["k_step", "k_val"], use_threads=False).aggregate(
        [
            ("lat", "count"),
            ("reward", "mean"),
            ("reward", "stddev", pc.VarianceOptions(ddof=0)),
            ("reward", "min"),
            ("reward", "max"),
            ("turns", "mean"),
            ("tools", "sum"),
            ("tool_errors", "sum"),
            ("not_ok", "sum"),
            ("lat", "list"),
        ]
    )
    out: dict[tuple[int | None, bool], dict[str, float]] = {}
    for r in grouped.to_pylist():
        n = r["lat_count"]
        calls = r["tools_sum"] or 0
        lats = sorted(x for x in r["lat_list"] if x is not None)

        def num(value: float | None) -> float:
            return math.nan if value is None else float(value)

        out[(r["k_step"], bool(r["k_val"]))] = {
            "trajectories": float(n),
            "reward/mean": num(r["reward_mean"]),
            "reward/std": num(r["reward_stddev"]),
            "reward/min": num(r["reward_min"]),
            "reward/max": num(r["reward_max"]),
            "turns/mean": float(r["turns_mean"]),
            "tool_calls/mean": calls / n,
            "tool_error_rate": (r["tool_errors_sum"] / calls) if calls else 0.0,
            "errors": float(r["not_ok_sum"]),
            "latency_s/p50": _percentile(lats, 0.5),
            "latency_s/p95": _percentile(lats, 0.95),
        }
    return {k: out[k] for k in sorted(out, key=lambda k: (k[0] is None, k[0] or 0, k[1]))}


_TRAJ_READ = (
    S.TRACE_ID,
    S.PARENT_SPAN_ID,
    S.NAME,
    S.KIND,
    S.STATUS,
    S.START_NS,
    S.END_NS,
    S.STEP,
    S.SAMPLE_INDEX,
    S.ROLLOUT_N,
    S.VALIDATE,
    S.REWARD,
    S.ATTRIBUTES,  # kept for reward rows only (advantage and other extras)
)


def read_trajectories(
    path: str | os.PathLike[str],
    steps: int | Iterable[int] | None = None,
    validate: bool | None = None,
) -> pa.Table:
    """One row per trajectory, with its reward, status, timing and call counts.

    A trajectory whose root span was never written (its writer was killed
    mid-rollout) is listed with status ``"incomplete"``. Rewards logged from
    another process are joined by ``(step, sample_index, rollout_n, validate)``.

    Returns:
        A table of :data:`tracer.TRAJECTORY_SCHEMA`.
    """
    spans = read_spans(path, columns=_TRAJ_READ, steps=steps, validate=validate)
    is_reward_row = pc.and_(pc.equal(spans[S.KIND], S.KIND_REWARD), pc.equal(spans[S.NAME], S.REWARD_SPAN_NAME))
    rewards = spans.filter(is_reward_row)
    body = spans.filter(pc.invert(is_reward_row)).drop_columns([S.ATTRIBUTES])
    if body.num_rows == 0:
        return S.TRAJECTORY_SCHEMA.empty_table()

    def flag(mask: Any) -> Any:
        return pc.cast(pc.fill_null(mask, False), pa.int64())

    kind, status = body[S.KIND], body[S.STATUS]
    body = body.append_column("is_llm", flag(pc.equal(kind, S.KIND_LLM)))
    body = body.append_column("is_tool", flag(pc.equal(kind, S.KIND_TOOL)))
    body = body.append_column(
        "is_tool_err", flag(pc.and_(pc.equal(kind, S.KIND_TOOL), pc.not_equal(status, S.STATUS_OK)))
    )
    body = body.append_column("is_err", flag(pc.equal(status, S.STATUS_ERROR)))
    grouped = body.group_by(S.TRACE_ID, use_threads=False).aggregate(
        [
            (S.START_NS, "min"),
            (S.END_NS, "max"),
            (S.KIND, "count"),
            ("is_llm", "sum"),
            ("is_tool", "sum"),
            ("is_tool_err", "sum"),
            ("is_err", "sum"),
            (S.STEP, "first"),
            (S.SAMPLE_INDEX, "first"),
            (S.ROLLOUT_N, "first"),
            (S.VALIDATE, "first"),
        ]
    )
    roots = body.filter(pc.is_null(body[S.PARENT_SPAN_ID])).select([S.TRACE_ID, S.NAME, S.STATUS])
    root_by_trace = {t: (n, s) for t, n, s in zip(*(roots[c].to_pylist() for c in roots.column_names))}
    # Rewards returned by kind="reward" ops count when no log_reward names one.
    scored = body.filter(pc.is_valid(body[S.REWARD])).sort_by(S.END_NS)
    op_reward = dict(zip(scored[S.TRACE_ID].to_pylist(), scored[S.REWARD].to_pylist()))
    reward_by_trace, reward_by_key = _collect_rewards(rewards)

    trace_ids = grouped[S.TRACE_ID].to_pylist()
    steps_l = grouped[f"{S.STEP}_first"].to_pylist()
    samples = grouped[f"{S.SAMPLE_INDEX}_first"].to_pylist()
    rollouts = grouped[f"{S.ROLLOUT_N}_first"].to_pylist()
    validates = grouped[f"{S.VALIDATE}_first"].to_pylist()
    names: list[str | None] = []
    statuses: list[str] = []
    reward_col: list[float | None] = []
    info_col: list[str | None] = []
    for i, tid in enumerate(trace_ids):
        name, status_v = root_by_trace.get(tid, (None, S.STATUS_INCOMPLETE))
        names.append(name)
        statuses.append(status_v)
        found = reward_by_trace.get(tid) or reward_by_key.get((steps_l[i], samples[i], rollouts[i], bool(validates[i])))
        if found is not None:
            reward_col.append(found[1])
            info_col.append(found[2])
        else:
            reward_col.append(op_reward.get(tid))
            info_col.append(None)
    columns = {
        S.TRACE_ID: trace_ids,
        S.NAME: names,
        S.STEP: steps_l,
        S.SAMPLE_INDEX: samples,
        S.ROLLOUT_N: rollouts,
        S.VALIDATE: validates,
        S.REWARD: reward_col,
        "reward_info": info_col,
        S.STATUS: statuses,
        S.START_NS: grouped[f"{S.START_NS}_min"],
        S.END_NS: grouped[f"{S.END_NS}_max"],
        "num_spans": grouped[f"{S.KIND}_count"],
        "num_llm_calls": grouped["is_llm_sum"],
        "num_tool_calls": grouped["is_tool_sum"],
        "num_tool_errors": grouped["is_tool_err_sum"],
        "num_errors": grouped["is_err_sum"],
    }
    table = pa.table({k: columns[k] for k in S.TRAJECTORY_COLUMNS}, schema=S.TRAJECTORY_SCHEMA)
    return table.sort_by(
        [(S.STEP, "ascending"), (S.SAMPLE_INDEX, "ascending"), (S.ROLLOUT_N, "ascending"), (S.START_NS, "ascending")]
    )


def _collect_rewards(
    rewards: pa.Table,
) -> tuple[dict[str, tuple[int, float, str | None]], dict[tuple[Any, ...], tuple[int, float, str | None]]]:
    """Last reward (end time, value, extras JSON) per trace id, and per (step, sample, rollout, validate) key."""
    by_trace: dict[str, tuple[int, float, str | None]] = {}
    by_key: dict[tuple[Any, ...], tuple[int, float, str | None]] = {}
    cols = [
        rewards[c].to_pylist()
        for c in (S.TRACE_ID, S.END_NS, S.REWARD, S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE, S.ATTRIBUTES)
    ]
    for tid, end, reward, step, sample, rollout, val, info in zip(*cols):
        entry = (end, reward, info)
        if tid:
            if tid not in by_trace or by_trace[tid][0] <= end:
                by_trace[tid] = entry
        else:
            key = (step, sample, rollout, bool(val))
            if key not in by_key or by_key[key][0] <= end:
                by_key[key] = entry
    return by_trace, by_key

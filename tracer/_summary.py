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
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import _schema as S


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

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


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_metrics(trajectories: pa.Table) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) rollout metrics from :func:`tracer.read_trajectories`.

    Keys of each dict: ``trajectories``, ``reward/mean|std|min|max``,
    ``turns/mean`` (llm calls), ``tool_calls/mean``, ``tool_error_rate``,
    ``errors``, ``latency_s/p50|p95``.
    """
    rows = trajectories.to_pylist()
    groups: dict[tuple[int | None, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r[S.STEP], bool(r[S.VALIDATE])), []).append(r)
    out: dict[tuple[int | None, bool], dict[str, float]] = {}
    for key in sorted(groups, key=lambda k: (k[0] is None, k[0] or 0, k[1])):
        g = groups[key]
        rewards = [r[S.REWARD] for r in g if r[S.REWARD] is not None]
        lat = [(r[S.END_NS] - r[S.START_NS]) / 1e9 for r in g]
        tool_calls = sum(r["num_tool_calls"] for r in g)
        mean = sum(rewards) / len(rewards) if rewards else math.nan
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)) if rewards else math.nan
        out[key] = {
            "trajectories": float(len(g)),
            "reward/mean": mean,
            "reward/std": std,
            "reward/min": min(rewards) if rewards else math.nan,
            "reward/max": max(rewards) if rewards else math.nan,
            "turns/mean": sum(r["num_llm_calls"] for r in g) / len(g),
            "tool_calls/mean": tool_calls / len(g),
            "tool_error_rate": (sum(r["num_tool_errors"] for r in g) / tool_calls) if tool_calls else 0.0,
            "errors": float(sum(1 for r in g if r[S.STATUS] not in (S.STATUS_OK,))),
            "latency_s/p50": _percentile(lat, 0.5),
            "latency_s/p95": _percentile(lat, 0.95),
        }
    return out

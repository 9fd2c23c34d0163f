"""Reward sources: where each of a trajectory's rewards came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.schema import parse_json_or_text as _loads
from tracer.summary.turns import KEY_COLUMNS, is_log_reward

#: log_reward attribute naming where a reward came from (``rollout-trace rescore`` sets it).
REWARD_SOURCE_KEY = "reward_source"
#: Source of a reward recorded during the run (a log_reward row without :data:`REWARD_SOURCE_KEY`).
SOURCE_RECORDED = "recorded"
#: Source of a reward taken from a ``kind="reward"`` op's span.
SOURCE_OP = "reward_op"


@dataclasses.dataclass(frozen=True)
class RewardRecord:
    """One reward a trajectory received, logged at ``end_ns``, with the row's other attributes as ``info``;
    ``source``: :data:`SOURCE_RECORDED`, :data:`SOURCE_OP`, or the ``module:function`` a rescore ran."""

    reward: float | None
    source: str
    end_ns: int
    info: Mapping[str, Any]


def reward_source(attributes: Any) -> str:
    """The source a log_reward row's attributes (JSON text or dict) name."""
    attrs = _loads(attributes)
    src = attrs.get(REWARD_SOURCE_KEY) if isinstance(attrs, Mapping) else None
    return src if isinstance(src, str) and src else SOURCE_RECORDED


def trajectory_rewards(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, list[RewardRecord]]:
    """Every reward of every trajectory in ``spans`` by trace id: reward ops, then log_reward rows by time (the last
    is :func:`summarize`'s reward); rows without the trace id (joined by key) are left out."""
    rows = spans.to_pylist() if isinstance(spans, pa.Table) else list(spans)
    out: dict[str, list[tuple[int, int, int, RewardRecord]]] = {}
    for i, r in enumerate(rows):
        tid = r.get(S.TRACE_ID)
        if not tid or r.get(S.KIND) != S.KIND_REWARD:
            continue
        end = r.get(S.END_NS) or 0
        if is_log_reward(r):
            attrs = _loads(r.get(S.ATTRIBUTES))
            info = {k: v for k, v in attrs.items() if k != REWARD_SOURCE_KEY} if isinstance(attrs, Mapping) else {}
            out.setdefault(tid, []).append((1, end, i, RewardRecord(r.get(S.REWARD), reward_source(attrs), end, info)))
        elif r.get(S.REWARD) is not None:
            out.setdefault(tid, []).append((0, end, i, RewardRecord(r[S.REWARD], SOURCE_OP, end, {})))
    return {tid: [rec for *_, rec in sorted(recs, key=lambda x: x[:3])] for tid, recs in out.items()}


def log_reward_row(
    keys: Mapping[str, Any],
    span_id: str,
    parent_span_id: str | None,
    end_ns: int,
    reward: float | None,
    attributes: str | None,
) -> dict[str, Any]:
    """A ``log_reward`` row of :data:`tracer.schema.SPAN_SCHEMA` ending at ``end_ns``, with ``keys``' trace id,
    step, sample, rollout and validate (``attributes``: JSON text)."""
    return {
        **dict.fromkeys(S.SPAN_COLUMNS),
        **{k: keys[k] for k in (S.TRACE_ID, *KEY_COLUMNS)},
        S.SPAN_ID: span_id,
        S.PARENT_SPAN_ID: parent_span_id,
        S.NAME: S.REWARD_SPAN_NAME,
        S.KIND: S.KIND_REWARD,
        S.START_NS: end_ns,
        S.END_NS: end_ns,
        S.STATUS: S.STATUS_OK,
        S.REWARD: reward,
        S.ATTRIBUTES: attributes,
    }

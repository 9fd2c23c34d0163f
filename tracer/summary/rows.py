"""One summary row per trajectory (:data:`tracer.schema.TRAJECTORY_SCHEMA`): Arrow for many spans, Python for few."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.summary.turns import KEY_COLUMNS, is_log_reward

#: Span columns :func:`summarize` needs: all but span ids, errors and payloads.
SUMMARY_SPAN_COLUMNS: tuple[str, ...] = tuple(
    c for c in S.SPAN_COLUMNS if c not in (S.SPAN_ID, S.ERROR, S.INPUTS, S.OUTPUTS)
)

#: A trajectory's counts, in :data:`tracer.schema.TRAJECTORY_SCHEMA`'s order.
_COUNTS = (S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS, S.NUM_ERRORS)
#: Span tables up to this many rows are summarised in Python: Arrow's per-call cost dominates there.
SMALL_SUMMARY_SPANS = 64


def _flag(mask: Any) -> Any:
    return pc.cast(pc.fill_null(mask, False), pa.int64())


def _positions(n: int) -> pa.Array:
    return pa.array(range(n), pa.int64())


def _key(t: pa.Table) -> Any:
    """One string per row of ``t`` naming (step, sample_index, rollout_n, validate), nulls equal nulls; the sample
    comes last with a prefix, so no sample text can make two keys collide."""
    null = "\x00"
    parts = [
        pc.fill_null(pc.cast(t[S.STEP], pa.string()), null),
        pc.fill_null(pc.cast(t[S.ROLLOUT_N], pa.string()), null),
        pc.cast(pc.fill_null(t[S.VALIDATE], False), pa.string()),
        pc.fill_null(pc.binary_join_element_wise("s", t[S.SAMPLE_INDEX], ""), null),
    ]
    return pc.binary_join_element_wise(*parts, "\x1f")


def _latest(rows: pa.Table, by: Any, value_pos: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Per distinct ``by`` value, the largest position (rows come sorted by end time): (keys, positions)."""
    grouped = pa.table({"k": by, "p": value_pos}).group_by("k", use_threads=False).aggregate([("p", "max")])
    return grouped.column("k").combine_chunks(), grouped.column("p_max").combine_chunks()


def _summarize_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """:func:`summarize` of a few span rows in Python: Arrow's kernels cost ~5 ms a call for one trajectory
    (bench/bench_summary.py), and live exporters summarise trajectories one at a time as they finish."""
    by_trace: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r[S.TRACE_ID]:
            by_trace.setdefault(r[S.TRACE_ID], []).append(i)
    logs = [i for i, r in enumerate(rows) if is_log_reward(r)]

    def latest(idx: list[int]) -> dict[str, Any] | None:
        return rows[max(idx, key=lambda i: (rows[i][S.END_NS], i))] if idx else None

    def rank(i: int) -> tuple[int, int, int]:  # rollout roots, other roots, other spans, log_reward rows
        r = rows[i]
        tier = 3 if is_log_reward(r) else 2 if r[S.PARENT_SPAN_ID] is not None else int(r[S.KIND] != S.KIND_ROLLOUT)
        return (tier, r[S.START_NS], i)

    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return (r[S.STEP], r[S.SAMPLE_INDEX], r[S.ROLLOUT_N], bool(r[S.VALIDATE]))

    out: list[dict[str, Any]] = []
    for tid, idx in by_trace.items():
        first_i = min(idx, key=rank)
        first = rows[first_i]
        root = rank(first_i)[0] <= 1
        body = [rows[i] for i in idx if not is_log_reward(rows[i])]
        chosen = latest([i for i in logs if rows[i][S.TRACE_ID] == tid])
        if chosen is None:
            chosen = latest([i for i in logs if not rows[i][S.TRACE_ID] and key(rows[i]) == key(first)])
        if chosen is None:  # the last reward op with a reward
            ops = [i for i in idx if rows[i][S.KIND] == S.KIND_REWARD and rows[i][S.REWARD] is not None]
            chosen = latest([i for i in ops if not is_log_reward(rows[i])])
            reward, info = (None if chosen is None else chosen[S.REWARD]), None
        else:
            reward, info = chosen[S.REWARD], chosen[S.ATTRIBUTES]
        timed = body or [rows[i] for i in idx]
        tools = [r for r in body if r[S.KIND] == S.KIND_TOOL]
        out.append(
            {
                S.TRACE_ID: tid,
                S.NAME: first[S.NAME] if root else None,
                **{c: first[c] for c in KEY_COLUMNS},
                S.REWARD: reward,
                S.REWARD_INFO: info,
                S.STATUS: first[S.STATUS] if root else S.STATUS_INCOMPLETE,
                S.START_NS: min(r[S.START_NS] for r in timed),
                S.END_NS: max(r[S.END_NS] for r in timed),
                S.NUM_SPANS: len(body),
                S.NUM_LLM_CALLS: sum(1 for r in body if r[S.KIND] == S.KIND_LLM),
                S.NUM_TOOL_CALLS: len(tools),
                S.NUM_TOOL_ERRORS: sum(1 for r in tools if r[S.STATUS] != S.STATUS_OK),
                S.NUM_ERRORS: sum(1 for r in body if r[S.STATUS] == S.STATUS_ERROR),
            }
        )
    return _in_order(pa.Table.from_pylist(out, schema=S.TRAJECTORY_SCHEMA))


def summarize(spans: pa.Table) -> pa.Table:
    """One :data:`tracer.schema.TRAJECTORY_SCHEMA` row per trajectory of ``spans`` (definitions: :mod:`tracer.summary`),
    by step, sample, rollout, start time and trace id. ``spans`` needs :data:`SUMMARY_SPAN_COLUMNS` (else
    ValueError naming them); spans without a trace id (keyed rewards) join by key and get no row of their own."""
    missing = [c for c in SUMMARY_SPAN_COLUMNS if c not in spans.schema.names]
    if missing:
        raise ValueError(
            f"summarize: the span table lacks the column(s) {', '.join(missing)}; "
            f"read them too (tracer.read_spans(path, columns=tracer.summary.SUMMARY_SPAN_COLUMNS))"
        )
    if spans.num_rows <= SMALL_SUMMARY_SPANS:
        return _summarize_rows(spans.select(list(SUMMARY_SPAN_COLUMNS)).to_pylist())
    t = spans.select(list(SUMMARY_SPAN_COLUMNS))
    t = t.append_column("_pos", _positions(t.num_rows))
    is_log = pc.fill_null(pc.and_(pc.equal(t[S.KIND], S.KIND_REWARD), pc.equal(t[S.NAME], S.REWARD_SPAN_NAME)), False)
    logs = t.filter(is_log)
    # Every span with a trace id belongs to a trajectory (log_reward rows too).
    own = t.append_column("_body", pc.invert(is_log)).filter(pc.fill_null(pc.not_equal(t[S.TRACE_ID], ""), False))
    if own.num_rows == 0:
        return S.TRAJECTORY_SCHEMA.empty_table()
    own, grouped = _by_trajectory(own)
    first = own.take(grouped["_spos_min"])
    has_root = pc.less_equal(first["_rank"], 1)
    reward, info = _rewards(logs, own, first)

    columns = {
        S.TRACE_ID: first[S.TRACE_ID],
        S.NAME: pc.if_else(has_root, first[S.NAME], pa.scalar(None, pa.string())),
        **{c: first[c] for c in KEY_COLUMNS},
        S.REWARD: reward,
        S.REWARD_INFO: info,
        S.STATUS: pc.if_else(has_root, first[S.STATUS], S.STATUS_INCOMPLETE),
        S.START_NS: pc.coalesce(grouped["_bstart_min"], grouped[f"{S.START_NS}_min"]),
        S.END_NS: pc.coalesce(grouped["_bend_max"], grouped[f"{S.END_NS}_max"]),
        **{c: grouped[f"{c}_sum"] for c in _COUNTS},
    }
    return _in_order(pa.table([columns[c] for c in S.TRAJECTORY_COLUMNS], schema=S.TRAJECTORY_SCHEMA))


def _by_trajectory(own: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``own`` (spans with a trace id) with each trajectory's first row first, and its per-trajectory aggregates."""
    # The first row: the root (rollout roots first), else the earliest span, else the earliest reward.
    is_body = own["_body"]
    is_root = pc.and_(pc.is_null(own[S.PARENT_SPAN_ID]), is_body)
    rank = pc.if_else(is_root, pc.if_else(pc.equal(own[S.KIND], S.KIND_ROLLOUT), 0, 1), pc.if_else(is_body, 2, 3))
    own = own.append_column("_rank", pc.cast(rank, pa.int8()))
    order = pc.sort_indices(
        own,
        sort_keys=[(S.TRACE_ID, "ascending"), ("_rank", "ascending"), (S.START_NS, "ascending"), ("_pos", "ascending")],
    )
    own = own.take(order)
    own = own.append_column("_spos", _positions(own.num_rows))
    kind, status, body = own[S.KIND], own[S.STATUS], own["_body"]
    no_int = pa.scalar(None, pa.int64())
    tool = pc.and_(body, pc.equal(kind, S.KIND_TOOL))
    derived = {
        "_bstart": pc.if_else(body, own[S.START_NS], no_int),
        "_bend": pc.if_else(body, own[S.END_NS], no_int),
        # Per span, what it adds to each count column (summed per trajectory under the count's own name).
        S.NUM_SPANS: _flag(body),
        S.NUM_LLM_CALLS: _flag(pc.and_(body, pc.equal(kind, S.KIND_LLM))),
        S.NUM_TOOL_CALLS: _flag(tool),
        S.NUM_TOOL_ERRORS: _flag(pc.and_(tool, pc.not_equal(status, S.STATUS_OK))),
        S.NUM_ERRORS: _flag(pc.and_(body, pc.equal(status, S.STATUS_ERROR))),
    }
    for name, col in derived.items():
        own = own.append_column(name, col)
    aggregates = [(c, "min") for c in ("_spos", "_bstart", S.START_NS)] + [(c, "max") for c in ("_bend", S.END_NS)]
    grouped = own.group_by(S.TRACE_ID, use_threads=False).aggregate([*aggregates, *((c, "sum") for c in _COUNTS)])
    return own, grouped


def _rewards(logs: pa.Table, own: pa.Table, first: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Each trajectory's reward and reward info (``first``: its first rows, in trace id order)."""
    trace_ids = first[S.TRACE_ID]
    # log_reward by trace id, else by key; else the last reward op.
    logs = logs.take(pc.sort_indices(logs, sort_keys=[(S.END_NS, "ascending"), ("_pos", "ascending")]))
    lpos = _positions(logs.num_rows)
    log_tid = pc.fill_null(pc.not_equal(logs[S.TRACE_ID], ""), False)
    tid_keys, tid_pos = _latest(logs.filter(log_tid), pc.filter(logs[S.TRACE_ID], log_tid), pc.filter(lpos, log_tid))
    chosen = pc.take(tid_pos, pc.index_in(trace_ids, value_set=tid_keys))
    no_tid = pc.invert(log_tid)
    if pc.any(no_tid).as_py():
        keyed = logs.filter(no_tid)
        k_keys, k_pos = _latest(keyed, _key(keyed), pc.filter(lpos, no_tid))
        chosen = pc.coalesce(chosen, pc.take(k_pos, pc.index_in(_key(first), value_set=k_keys)))
    log_reward = pc.take(logs[S.REWARD], chosen)
    log_info = pc.take(logs[S.ATTRIBUTES], chosen)
    ops = own.filter(pc.and_(own["_body"], pc.and_(pc.equal(own[S.KIND], S.KIND_REWARD), pc.is_valid(own[S.REWARD]))))
    ops = ops.take(pc.sort_indices(ops, sort_keys=[(S.END_NS, "ascending"), ("_pos", "ascending")]))
    op_keys, op_pos = _latest(ops, ops[S.TRACE_ID], _positions(ops.num_rows))
    op_reward = pc.take(ops[S.REWARD], pc.take(op_pos, pc.index_in(trace_ids, value_set=op_keys)))
    found = pc.is_valid(chosen)
    return pc.if_else(found, log_reward, op_reward), pc.if_else(found, log_info, pa.scalar(None, pa.string()))


def _in_order(trajectories: pa.Table) -> pa.Table:
    """Trajectory rows by step, sample, rollout, start time and trace id (nulls last): :func:`summarize`'s order."""
    return trajectories.sort_by(
        [(c, "ascending") for c in (S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.START_NS, S.TRACE_ID)]
    )

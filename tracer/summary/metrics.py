"""Step metrics: per-(step, validate) rollout metrics, and the partials that merge into them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.summary.turns import KEY_COLUMNS


def _percentile(ordered: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default)."""
    if len(ordered) == 0:
        return math.nan
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


#: Per-token arrays a trainer logs with :func:`tracer.log_token_stats` (verl's names, ``logprobs`` in one word).
TRAINER_LOGPROBS = "old_logprobs"
ROLLOUT_LOGPROBS = "rollout_logprobs"
REF_LOGPROBS = "ref_logprobs"
ENTROPY = "entropy"
ADVANTAGES = "advantages"
LOSS_MASK = "loss_mask"
#: Column of :func:`tracer.read_token_stats`' table: the turn (0-based index of the llm call).
TURN = "turn"
#: Column of that table: where the arrays came from (``log_token_stats(source=...)``, e.g. ``"synthetic"``).
TOKEN_STATS_SOURCE = "source"
#: Columns of that table that are not arrays.
TOKEN_STATS_KEY_COLUMNS: tuple[str, ...] = (S.TRACE_ID, *KEY_COLUMNS, TURN, TOKEN_STATS_SOURCE)


def token_stat_metrics(token_stats: pa.Table) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) train/inference mismatch from :func:`tracer.read_token_stats`.

    ``logprob_mismatch`` (mean ``|rollout_logprobs - old_logprobs|``), ``logprob_ratio/max`` (largest
    ``exp(old_logprobs - rollout_logprobs)``), ``mismatch_tokens``: over tokens with both logprobs and a non-zero
    ``loss_mask`` where one was logged; groups without such tokens are left out.
    """
    names = set(token_stats.column_names)
    if TRAINER_LOGPROBS not in names or ROLLOUT_LOGPROBS not in names:
        return {}
    sums: dict[tuple[int | None, bool], list[float]] = {}
    cols = [S.STEP, S.VALIDATE, TRAINER_LOGPROBS, ROLLOUT_LOGPROBS] + ([LOSS_MASK] if LOSS_MASK in names else [])
    for r in token_stats.select(cols).to_pylist():
        old, new, mask = r[TRAINER_LOGPROBS], r[ROLLOUT_LOGPROBS], r.get(LOSS_MASK)
        if old is None or new is None:
            continue
        acc = sums.setdefault((r[S.STEP], bool(r[S.VALIDATE])), [0.0, 0.0, -math.inf])
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a is None or b is None or (mask is not None and (i >= len(mask) or not mask[i])):
                continue
            acc[0] += abs(b - a)
            acc[1] += 1
            acc[2] = max(acc[2], a - b)
    return {
        k: {
            "logprob_mismatch": v[0] / v[1],
            "logprob_ratio/max": math.exp(min(v[2], _MAX_LOG_RATIO)),
            "mismatch_tokens": v[1],
        }
        for k, v in sums.items()
        if v[1]
    }


#: exp() of a log ratio above this overflows a float; the ratio is clamped there.
_MAX_LOG_RATIO = 700.0


#: Metrics that need each prompt's group whole: :func:`step_metrics` gives them, step partials cannot
#: (a group's rollouts may lie in several shards).
GROUP_METRICS = ("reward/zero_std_frac",)


def zero_std_groups(trajectories: pa.Table) -> pa.Table:
    """Per (step, validate, sample_index) group with rewards: ``rollouts`` (how many) and ``zero_std`` (at least
    two and all equal: no GRPO learning signal)."""
    keys = [S.STEP, S.VALIDATE, S.SAMPLE_INDEX]
    t = trajectories.select([*keys, S.REWARD])
    t = t.filter(pc.is_valid(t.column(S.REWARD)))
    t = t.set_column(1, S.VALIDATE, pc.fill_null(t.column(S.VALIDATE), False))
    g = t.group_by(keys, use_threads=False).aggregate([(S.REWARD, "min"), (S.REWARD, "max"), (S.REWARD, "count")])
    count = g.column(f"{S.REWARD}_count")
    same = pc.and_(pc.greater_equal(count, 2), pc.equal(g.column(f"{S.REWARD}_min"), g.column(f"{S.REWARD}_max")))
    g = g.select([*keys, f"{S.REWARD}_count"]).rename_columns([*keys, "rollouts"])
    return g.append_column("zero_std", same)


def zero_std_fractions(trajectories: pa.Table) -> dict[tuple[int | None, bool], float]:
    """Per (step, validate): the fraction of groups of two or more rewards whose rewards are all equal."""
    g = zero_std_groups(trajectories)
    g = g.filter(pc.greater_equal(g.column("rollouts"), 2))
    g = g.append_column("same", pc.cast(g.column("zero_std"), pa.float64()))
    means = g.group_by([S.STEP, S.VALIDATE], use_threads=False).aggregate([("same", "mean")]).to_pylist()
    return {(r[S.STEP], bool(r[S.VALIDATE])): r["same_mean"] for r in means}


def step_metrics(
    trajectories: pa.Table, token_stats: pa.Table | None = None
) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) rollout metrics from :func:`tracer.read_trajectories`.

    Keys: ``trajectories``, ``reward/mean|std|min|max`` (NaN without rewards; population std), ``turns/mean``
    (llm calls), ``tool_calls/mean``, ``tool_error_rate`` (errors / calls), ``errors`` (status not ok),
    ``latency_s/p50|p95``, ``reward/zero_std_frac`` (:func:`zero_std_fractions`, NaN when no group); with
    ``token_stats``, :func:`token_stat_metrics`' keys too (NaN, NaN, 0 without tokens).
    """
    out = partial_metrics(step_partials(trajectories), token_stats)
    zero_std = zero_std_fractions(trajectories)
    for key, metrics in out.items():
        metrics["reward/zero_std_frac"] = zero_std.get(key, math.nan)
    return out


#: Count columns of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, summed when partials merge.
_PART_SUMS = (S.PART_TRAJECTORIES, S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS, S.PART_NOT_OK)
#: Value columns of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, concatenated and sorted when partials merge.
_PART_LISTS = (S.PART_REWARDS, S.PART_LATENCIES)


def step_partials(trajectories: pa.Table) -> pa.Table:
    """Per-(step, validate) aggregates of trajectory rows (:data:`tracer.schema.STEP_PARTIALS_SCHEMA`): counts, sums
    and the sorted rewards and latencies :func:`step_metrics` is computed from; parts merge into their union's."""
    return _merge_parts([_rows_part(trajectories, counts=True, values=True)])


def step_counts(trajectories: pa.Table) -> pa.Table:
    """:func:`step_partials` without the values (empty ``rewards`` and ``latencies_s``): what shard indexes store."""
    return _merge_parts([_rows_part(trajectories, counts=True, values=False)])


def step_values(trajectories: pa.Table) -> pa.Table:
    """:func:`step_partials` without the counts (zero): the values of rows with step, validate, reward and times."""
    return _merge_parts([_rows_part(trajectories, counts=False, values=True)])


def merge_step_partials(parts: Sequence[pa.Table]) -> pa.Table:
    """The aggregates of the union of ``parts`` (:data:`tracer.schema.STEP_PARTIALS_SCHEMA` tables): a row per group
    by step (nulls last) then validate, counts summed, values sorted, whatever the split or order."""
    return _merge_parts([_partials_part(p) for p in parts])


@dataclasses.dataclass
class _Part:
    """Rows to merge into per-step aggregates, as numpy arrays. ``step`` holds 0 where ``null`` is set; ``sums`` a row
    per :data:`_PART_SUMS` column (None: zeros); ``values`` per :data:`_PART_LISTS` column the values and the row
    of each (None: one per row, in order), or None for no values."""

    step: np.ndarray
    null: np.ndarray
    validate: np.ndarray
    sums: np.ndarray | None
    values: tuple[tuple[np.ndarray, np.ndarray | None], ...] | None


def _column(t: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    col = t.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _ints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """An integer column as int64 (0 where null) and where it is null (None: nowhere)."""
    if arr.null_count == 0:
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64), None
    null = np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
    return np.asarray(pc.fill_null(arr, 0).to_numpy(), dtype=np.int64), null


def _keys(t: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    step, null = _ints(_column(t, S.STEP))
    validate = np.asarray(pc.fill_null(_column(t, S.VALIDATE), False).to_numpy(zero_copy_only=False), dtype=bool)
    return step, (np.zeros(len(step), dtype=bool) if null is None else null), validate


def _rows_part(t: pa.Table | pa.RecordBatch, *, counts: bool, values: bool) -> _Part:
    """One aggregate row per trajectory row; the latency of a row is ``(end_ns - start_ns) / 1e9`` seconds."""
    step, null, validate = _keys(t)
    sums = None
    if counts:
        status = _column(t, S.STATUS)
        not_ok = pc.fill_null(pc.not_equal(status, S.STATUS_OK), True).to_numpy(zero_copy_only=False)
        sums = np.vstack(
            [np.ones(len(step), dtype=np.int64)]
            + [_ints(_column(t, c))[0] for c in (S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS)]
            + [np.asarray(not_ok, dtype=np.int64)]
        )
    vals = None
    if values:
        reward = _column(t, S.REWARD).cast(pa.float64())
        r = np.asarray(pc.fill_null(reward, 0.0).to_numpy(), dtype=np.float64)
        r_ok = None if reward.null_count == 0 else ~np.asarray(reward.is_null().to_numpy(zero_copy_only=False))
        start, s_null = _ints(_column(t, S.START_NS))
        end, e_null = _ints(_column(t, S.END_NS))
        lat = (end - start).astype(np.float64) / 1e9  # int64 wraps as Arrow's subtract does
        nulls = [n for n in (s_null, e_null) if n is not None]
        l_ok = ~np.logical_or.reduce(nulls) if nulls else None
        vals = tuple((v, None) if ok is None else (v[ok], np.flatnonzero(ok)) for v, ok in ((r, r_ok), (lat, l_ok)))
    return _Part(step, null, validate, sums, vals)


def _partials_part(p: pa.Table) -> _Part:
    """The rows of a table of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, merged or not."""
    if p.schema != S.STEP_PARTIALS_SCHEMA:
        p = p.select(S.STEP_PARTIALS_SCHEMA.names).cast(S.STEP_PARTIALS_SCHEMA)
    step, null, validate = _keys(p)
    sums = np.vstack([_ints(_column(p, c))[0] for c in _PART_SUMS]) if p.num_rows else None
    vals = []
    for c in _PART_LISTS:
        lists = _column(p, c)
        parents = np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)
        vals.append((np.asarray(_values(lists)[0], dtype=np.float64), parents))
    return _Part(step, null, validate, sums, tuple(vals))


def _values(lists: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values, flat, and where each row's list starts among them (one more: the end)."""
    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    return flat, np.asarray(lists.offsets.to_numpy()) - lists.offsets[0].as_py()


def _groups(parts: Sequence[_Part]) -> tuple[np.ndarray, dict[str, Any], int]:
    """The group of each row of ``parts`` (in turn; by step, nulls last, then validate), the groups' key columns
    and how many there are."""
    step = np.concatenate([p.step for p in parts])
    null = np.concatenate([p.null for p in parts])
    validate = np.concatenate([p.validate for p in parts])
    distinct, inverse = np.unique(step[~null], return_inverse=True)
    at = np.full(len(step), len(distinct), dtype=np.int64)
    at[~null] = inverse
    slot = at * 2 + validate  # by step (nulls last), then validate
    used = np.bincount(slot, minlength=2 * (len(distinct) + 1)) > 0
    group = (np.cumsum(used) - 1)[slot]
    slots = np.flatnonzero(used)
    key_step = slots // 2
    out: dict[str, Any] = {
        S.STEP: pa.array(np.append(distinct, 0)[key_step], pa.int64(), mask=key_step == len(distinct)),
        S.VALIDATE: pa.array(slots % 2 == 1, pa.bool_()),
    }
    return group, out, len(slots)


def _merge_parts(parts: Sequence[_Part]) -> pa.Table:
    """One row per (step, validate) of the rows of ``parts`` (see :func:`merge_step_partials`)."""
    if not parts or not sum(len(p.step) for p in parts):
        return S.STEP_PARTIALS_SCHEMA.empty_table()
    group, out, groups = _groups(parts)
    starts = np.cumsum([0] + [len(p.step) for p in parts])
    sums = np.zeros((len(_PART_SUMS), groups), dtype=np.int64)
    for p, at0 in zip(parts, starts[:-1], strict=False):
        if p.sums is not None and len(p.step):
            g = group[at0 : at0 + len(p.step)]
            for i in range(len(_PART_SUMS)):  # float weights: exact while a sum stays below 2**53
                sums[i] += np.bincount(g, weights=p.sums[i], minlength=groups).astype(np.int64)
    out.update({c: pa.array(sums[i], pa.int64()) for i, c in enumerate(_PART_SUMS)})
    by_group: tuple[np.ndarray, np.ndarray] | None = None  # (groups, their stable order), shared by equal groups
    for k, c in enumerate(_PART_LISTS):
        chunks = [
            (v, group[at0 : at0 + len(p.step)] if rows is None else group[at0 + rows])
            for p, at0 in zip(parts, starts[:-1], strict=False)
            if p.values is not None
            for v, rows in [p.values[k]]
        ]
        values = np.concatenate([v for v, _ in chunks]) if chunks else np.zeros(0)
        of = np.concatenate([g for _, g in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        if by_group is None or not np.array_equal(by_group[0], of):
            by_group = (of, np.argsort(of.astype(np.uint16) if groups <= 1 << 16 else of, kind="stable"))
        out[c] = _sorted_lists(values[by_group[1]], of, groups)
    return pa.table([out[f.name] for f in S.STEP_PARTIALS_SCHEMA], schema=S.STEP_PARTIALS_SCHEMA)


def _sorted_lists(ordered: np.ndarray, group: np.ndarray, groups: int) -> pa.ListArray:
    """One list per group, each sorted ascending (NaN last): ``ordered`` holds the values in group order (a copy,
    sorted in place), ``group`` the group of each value in its original order."""
    offsets = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=groups), out=offsets[1:])
    for i in np.flatnonzero(np.diff(offsets) > 1).tolist():
        ordered[offsets[i] : offsets[i + 1]].sort()
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), pa.array(ordered, pa.float64()))


def _merged(partials: pa.Table) -> bool:
    """Whether ``partials`` already has one row per (step, validate) and its values sorted within each row."""
    keys = list(zip(partials.column(S.STEP).to_pylist(), partials.column(S.VALIDATE).to_pylist(), strict=True))
    if len(set(keys)) != len(keys):
        return False
    for c in _PART_LISTS:
        values, starts = _values(partials.column(c).combine_chunks())
        falls = np.flatnonzero(values[1:] < values[:-1]) + 1  # positions where a value is below the one before
        if not np.isin(falls, starts).all():  # ... anywhere but at the start of a row's list
            return False
    return True


def _moments(flat: np.ndarray, at: np.ndarray) -> tuple[list[float], list[float], list[float], list[float]]:
    """``np.mean``, ``np.std``, ``np.min``, ``np.max`` of each run ``flat[at[i]:at[i + 1]]`` (NaN for an empty one)."""
    out: tuple[list[float], list[float], list[float], list[float]] = ([], [], [], [])
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as np.std gives
        for lo, hi in zip(at[:-1].tolist(), at[1:].tolist(), strict=True):
            run = flat[lo:hi]
            got = (np.mean(run), np.std(run), np.min(run), np.max(run)) if hi > lo else (math.nan,) * 4
            for column, v in zip(out, got, strict=True):
                column.append(float(v))
    return out


def _stored_metrics(partials: pa.Table) -> bool:
    """Whether ``partials`` has :data:`tracer.schema.VALUE_METRICS` (a rollup's table: :func:`with_value_metrics`)."""
    return all(m in partials.schema.names for m in S.VALUE_METRICS)


def _value_metrics(partials: pa.Table) -> dict[str, list[float]]:
    """:data:`tracer.schema.VALUE_METRICS` of each row of merged aggregates: stored (a run rollup's) or computed."""
    if _stored_metrics(partials):
        return {m: partials.column(m).to_pylist() for m in S.VALUE_METRICS}

    rewards, r_at = _values(partials.column(S.PART_REWARDS).combine_chunks())
    lats, l_at = _values(partials.column(S.PART_LATENCIES).combine_chunks())
    moments = _moments(np.asarray(rewards, dtype=np.float64), r_at)  # reward mean, std, min, max
    rows = range(partials.num_rows)
    quantiles = [[_percentile(lats[l_at[i] : l_at[i + 1]], q) for i in rows] for q in (0.5, 0.95)]
    return dict(zip(S.VALUE_METRICS, [*moments, *quantiles], strict=True))


def with_value_metrics(partials: pa.Table) -> pa.Table:
    """Merged aggregates (:func:`merge_step_partials`) with a float64 column per :data:`tracer.schema.VALUE_METRICS`,
    which :func:`partial_metrics` then takes as they are: what a run rollup stores."""
    if not _merged(partials):
        raise ValueError("value metrics are stored only beside merged aggregates")
    got = _value_metrics(partials.select(S.STEP_PARTIALS_SCHEMA.names))
    for m in S.VALUE_METRICS:
        partials = partials.append_column(pa.field(m, pa.float64()), pa.array(got[m], pa.float64()))
    return partials


def partial_metrics(
    partials: pa.Table, token_stats: pa.Table | None = None
) -> dict[tuple[int | None, bool], dict[str, float]]:
    """:func:`step_metrics` from per-step aggregates (:func:`step_partials`, merged or not); a table with the
    :data:`tracer.schema.VALUE_METRICS` columns (a run rollup's, rows filtered or not) gives those as they are."""
    if not _stored_metrics(partials) and not _merged(partials):
        partials = merge_step_partials([partials])
    if partials.num_rows == 0:
        return {}
    by_value = _value_metrics(partials)
    sums = {c: partials.column(c).to_pylist() for c in _PART_SUMS}
    out: dict[tuple[int | None, bool], dict[str, float]] = {}
    for i, (step, val) in enumerate(zip(partials.column(S.STEP).to_pylist(), partials.column(S.VALIDATE).to_pylist())):
        n = sums[S.PART_TRAJECTORIES][i]
        calls = sums[S.NUM_TOOL_CALLS][i]
        out[(step, bool(val))] = {
            "trajectories": float(n),
            **{m: by_value[m][i] for m in S.VALUE_METRICS[:4]},
            "turns/mean": sums[S.NUM_LLM_CALLS][i] / n,
            "tool_calls/mean": calls / n,
            "tool_error_rate": (sums[S.NUM_TOOL_ERRORS][i] / calls) if calls else 0.0,
            "errors": float(sums[S.PART_NOT_OK][i]),
            **{m: by_value[m][i] for m in S.VALUE_METRICS[4:]},
        }
    if token_stats is not None:
        mismatch = token_stat_metrics(token_stats)
        empty = {"logprob_mismatch": math.nan, "logprob_ratio/max": math.nan, "mismatch_tokens": 0.0}
        for k, metrics in out.items():
            metrics.update(mismatch.get(k, empty))
    return {k: out[k] for k in sorted(out, key=lambda k: (k[0] is None, k[0] or 0, k[1]))}

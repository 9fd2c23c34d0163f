"""tracer.summary.summarize against a plain-Python reading of its definitions, over random span sets."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer import summary
from tracer.summary import summarize

TRACES = ("a", "b", "c", "")  # "": a reward logged by another process


def _is_log(r: dict[str, Any]) -> bool:
    return r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r[S.STEP], r[S.SAMPLE_INDEX], r[S.ROLLOUT_N], bool(r[S.VALIDATE]))


def reference(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The summary rows by trace id, computed row by row from the module's stated definitions."""
    items = list(enumerate(rows))
    logs = [(i, r) for i, r in items if _is_log(r)]
    latest = lambda group: max(group, key=lambda ir: (ir[1][S.END_NS], ir[0]))[1]  # noqa: E731
    out = {}
    for tid in {r[S.TRACE_ID] for r in rows if r[S.TRACE_ID]}:
        mine = [(i, r) for i, r in items if r[S.TRACE_ID] == tid]
        body = [(i, r) for i, r in mine if not _is_log(r)]

        def rank(ir: tuple[int, dict[str, Any]]) -> tuple[int, int, int]:
            i, r = ir
            if not _is_log(r) and r[S.PARENT_SPAN_ID] is None:
                return (0 if r[S.KIND] == S.KIND_ROLLOUT else 1, r[S.START_NS], i)
            return (3 if _is_log(r) else 2, r[S.START_NS], i)

        first = min(mine, key=rank)[1]
        root = not _is_log(first) and first[S.PARENT_SPAN_ID] is None
        own = [(i, r) for i, r in logs if r[S.TRACE_ID] == tid]
        keyed = [(i, r) for i, r in logs if not r[S.TRACE_ID] and _key(r) == _key(first)]
        chosen = latest(own) if own else (latest(keyed) if keyed else None)
        ops = [(i, r) for i, r in body if r[S.KIND] == S.KIND_REWARD and r[S.REWARD] is not None]
        timed = [r for _, r in body] or [r for _, r in mine]
        spans = [r for _, r in body]
        out[tid] = {
            S.TRACE_ID: tid,
            S.NAME: first[S.NAME] if root else None,
            S.STEP: first[S.STEP],
            S.SAMPLE_INDEX: first[S.SAMPLE_INDEX],
            S.ROLLOUT_N: first[S.ROLLOUT_N],
            S.VALIDATE: first[S.VALIDATE],
            S.REWARD: chosen[S.REWARD] if chosen else (latest(ops)[S.REWARD] if ops else None),
            S.REWARD_INFO: chosen[S.ATTRIBUTES] if chosen else None,
            S.STATUS: first[S.STATUS] if root else S.STATUS_INCOMPLETE,
            S.START_NS: min(r[S.START_NS] for r in timed),
            S.END_NS: max(r[S.END_NS] for r in timed),
            S.NUM_SPANS: len(spans),
            S.NUM_LLM_CALLS: sum(r[S.KIND] == S.KIND_LLM for r in spans),
            S.NUM_TOOL_CALLS: sum(r[S.KIND] == S.KIND_TOOL for r in spans),
            S.NUM_TOOL_ERRORS: sum(r[S.KIND] == S.KIND_TOOL and r[S.STATUS] != S.STATUS_OK for r in spans),
            S.NUM_ERRORS: sum(r[S.STATUS] == S.STATUS_ERROR for r in spans),
        }
    return out


@st.composite
def span_rows(draw: st.DrawFn) -> dict[str, Any]:
    tid = draw(st.sampled_from(TRACES))
    log = draw(st.booleans())
    start = draw(st.integers(0, 5))
    return {
        S.TRACE_ID: tid,
        S.SPAN_ID: draw(st.text("0123456789abcdef", min_size=1, max_size=3)),
        S.PARENT_SPAN_ID: draw(st.sampled_from([None, "p"])),
        S.NAME: S.REWARD_SPAN_NAME if log else draw(st.sampled_from(["agent_loop", "generate", S.REWARD_SPAN_NAME])),
        S.KIND: S.KIND_REWARD if log else draw(st.sampled_from(S.KINDS)),
        S.START_NS: start,
        S.END_NS: start + draw(st.integers(0, 3)),
        S.STATUS: draw(st.sampled_from([S.STATUS_OK, S.STATUS_ERROR, S.STATUS_CANCELLED])),
        S.ERROR: None,
        S.STEP: draw(st.sampled_from([None, 1, 2])),
        S.SAMPLE_INDEX: draw(st.sampled_from([None, "0", "1", "\x00", "s"])),
        S.ROLLOUT_N: draw(st.sampled_from([None, 0, 1])),
        S.VALIDATE: draw(st.sampled_from([None, False, True])),
        S.REWARD: draw(st.one_of(st.none(), st.floats(-2, 2, allow_nan=False))),
        S.INPUTS: None,
        S.OUTPUTS: None,
        S.ATTRIBUTES: draw(st.sampled_from([None, '{"advantage":0.5}', '{"advantage":-1}'])),
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(span_rows(), max_size=14), st.integers(0, 14), st.sampled_from([-1, 10_000]))
def test_summarize_equals_the_reference(rows: list[dict[str, Any]], cut: int, small: int) -> None:
    """Any span set (roots missing, rewards with and without trace id, several rewards, mixed validate, null steps) summarises as the definitions say, in Arrow and in the small-table Python path."""
    table = pa.Table.from_pylist(rows, schema=tracer.schema.SPAN_SCHEMA)
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])  # several chunks, as files give
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(summary.rows, "SMALL_SUMMARY_SPANS", small)  # where summarize reads it
        got = summarize(chunked)
    assert got.schema == tracer.schema.TRAJECTORY_SCHEMA
    assert {r[S.TRACE_ID]: r for r in got.to_pylist()} == reference(rows)
    order = [
        (r[S.STEP] is None, r[S.STEP] or 0, r[S.SAMPLE_INDEX] is None, r[S.SAMPLE_INDEX] or "") for r in got.to_pylist()
    ]
    assert order == sorted(order)


def test_summarize_names_missing_columns() -> None:
    """A span table without the needed columns is refused with their names and how to read them."""
    table = pa.table({S.TRACE_ID: ["t"]})
    try:
        summarize(table)
    except ValueError as exc:
        assert "parent_span_id" in str(exc) and "SUMMARY_SPAN_COLUMNS" in str(exc)
    else:
        raise AssertionError("summarize accepted a table without its columns")


def test_summary_rows_are_ordered_by_step_sample_rollout() -> None:
    """Rows come by step, sample, rollout (nulls last), whatever the span order."""
    base = {c: None for c in tracer.schema.SPAN_COLUMNS}
    rows = [
        {**base, S.TRACE_ID: t, S.SPAN_ID: "r", S.NAME: "x", S.KIND: S.KIND_ROLLOUT, S.START_NS: 0, S.END_NS: 1}
        | {S.STATUS: "ok", S.STEP: step, S.SAMPLE_INDEX: "0", S.ROLLOUT_N: n}
        for t, step, n in [("c", None, 0), ("b", 2, 0), ("a", 1, 1), ("d", 1, 0)]
    ]
    got = summarize(pa.Table.from_pylist(rows, schema=tracer.schema.SPAN_SCHEMA))
    assert got[S.TRACE_ID].to_pylist() == ["d", "a", "b", "c"]

"""The MLflow span mapping both ways: any trajectory comes back from MLflow's span entities as the rows it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("mlflow")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mlflow.entities import Trace, TraceData, TraceInfo, TraceLocation, TraceState  # noqa: E402

from tracer import schema as S  # noqa: E402, N812
from tracer.exporters.mlflow import _mlflow_spans  # noqa: E402
from tracer.exporters.mlflow.importer import trace_rows  # noqa: E402
from tracer.exporters.mlflow.spans import trajectory_data  # noqa: E402

HEX = "0123456789abcdef"
_texts = st.text(min_size=1, max_size=12)
_json = st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "prompt", "text", "n"]), _texts, max_size=3))


@st.composite
def trajectories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Span rows of one trajectory: a root, children under earlier spans (some orphaned), mixed kinds,
    statuses, per-span context, hex and non-hex span ids."""
    n = draw(st.integers(1, 6))
    hex_id = st.text(HEX, min_size=16, max_size=16).filter(lambda s: int(s, 16) != 0)
    ids = draw(
        st.lists(st.one_of(hex_id, st.text("ghijk:-", min_size=3, max_size=8)), min_size=n, max_size=n, unique=True)
    )
    trace_id = draw(st.text(HEX, min_size=32, max_size=32))
    step, sample = draw(st.integers(0, 5)), draw(st.sampled_from(["0", "7", "q-1"]))
    rows = []
    for i, span_id in enumerate(ids):
        kind = (
            S.KIND_ROLLOUT if i == 0 else draw(st.sampled_from([S.KIND_LLM, S.KIND_TOOL, S.KIND_SPAN, S.KIND_REWARD]))
        )
        parent = None if i == 0 else draw(st.one_of(st.sampled_from(ids[:i]), st.just("gone-parent")))
        status = draw(st.sampled_from([S.STATUS_OK, S.STATUS_ERROR, S.STATUS_CANCELLED]))
        error = (
            json.dumps({"type": "E", "message": draw(_texts), "traceback": "tb"}) if status == S.STATUS_ERROR else None
        )
        start = draw(st.integers(1, 10**12))
        rows.append(
            {
                S.TRACE_ID: trace_id,
                S.SPAN_ID: span_id,
                S.PARENT_SPAN_ID: parent,
                S.NAME: draw(_texts),
                S.KIND: kind,
                S.START_NS: start,
                S.END_NS: start + draw(st.integers(0, 10**9)),
                S.STATUS: status,
                S.ERROR: error,
                S.STEP: draw(st.sampled_from([step, step + 1])),
                S.SAMPLE_INDEX: sample,
                S.ROLLOUT_N: draw(st.integers(0, 2)),
                S.VALIDATE: draw(st.booleans()),
                S.REWARD: draw(st.floats(-10, 10)) if kind == S.KIND_REWARD else None,
                S.INPUTS: json.dumps(draw(_json)),
                S.OUTPUTS: json.dumps(draw(_json)),
                S.ATTRIBUTES: json.dumps(draw(_json)),
            }
        )
    return rows


def _as_mlflow_trace(rows: list[dict[str, Any]]) -> Trace:
    data = trajectory_data(rows, "project", "experiment")
    location = TraceLocation.from_experiment_id("0")
    info = TraceInfo(data.mlflow_trace_id, location, request_time=0, state=TraceState.OK, tags=data.tags)
    return Trace(info=info, data=TraceData(spans=_mlflow_spans(data)))


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = dict(row)
        for column in (S.INPUTS, S.OUTPUTS, S.ATTRIBUTES, S.ERROR):
            row[column] = json.loads(row[column]) if row[column] is not None else None
        out.append(row)
    return sorted(out, key=lambda r: r[S.SPAN_ID])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=trajectories())
def test_any_trajectory_comes_back_from_mlflow_spans_as_its_rows(rows: list[dict[str, Any]]) -> None:
    """Ids, tree (orphans too), kinds, statuses, errors, context, rewards and payloads survive the mapping."""
    assert _comparable(trace_rows(_as_mlflow_trace(rows))) == _comparable(rows)

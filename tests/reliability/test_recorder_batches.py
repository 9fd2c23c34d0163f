"""No batch is lost for one bad value, and a re-init loses no span in flight (issue 12, items 1-2).

A value a column cannot hold (a span name that is not a string, a lone
surrogate in a name or sample id, an int beyond int64, a value over the
column limit) becomes a marked placeholder in its own span; every span is
written; ``flush()`` says what was replaced. Figures: spans recorded and
read back, values replaced.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_fixtures import FIGURES

import tracer
from tracer.record import recorder as _recorder
from tracer.record import span_encoder

pytestmark = pytest.mark.usefixtures("figures_report")

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TALLY = {"runs": 0, "spans recorded": 0, "spans read back": 0, "values replaced": 0}

#: Values a string column cannot hold as they are, or ints beyond int64.
bad_names = (
    st.integers()
    | st.none()
    | st.floats()
    | st.binary(max_size=8)
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=4)
    | st.builds(object)
    | st.text(max_size=20)
)
huge_ints = st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1)
surrogate_text = st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), min_size=1, max_size=8)


@tracer.rollout_trace_op(kind="tool")
def plain(x: Any) -> Any:
    return x


def _rows(cfg: tracer.TraceConfig) -> list[dict[str, Any]]:
    return tracer.read_spans(cfg.run_dir).to_pylist()


@SETTINGS
@given(name=bad_names, sample=surrogate_text, step=st.one_of(huge_ints, st.integers(0, 10)), n_good=st.integers(0, 5))
def test_one_bad_value_never_loses_the_batch(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    name: Any,
    sample: str,
    step: int,
    n_good: int,
) -> None:
    """A span with a non-string name, a surrogate sample id and a step beyond int64 beside good spans: all are written."""
    monkeypatch.setenv(tracer.config.ENV_STRICT, "0")
    out = str(tmp_path_factory.mktemp("bad"))
    cfg = tracer.init(output_dir=out, flush_interval_s=60.0)
    bad = tracer.rollout_trace_op(name=name)(lambda x: x) if not isinstance(name, str) else plain
    with tracer.rollout_trace_attr(sample_index=sample, step=step, name=name):
        for i in range(n_good):
            plain(i)
        bad("v")
    result = tracer.flush()
    rows = _rows(cfg)
    recorded = n_good + 2  # the good ones, the bad one, the trajectory's root
    assert result.ok, result
    assert len(rows) == recorded, (result, rows)
    assert result.spans_written == recorded
    for row in rows:
        assert isinstance(row["name"], str)
        assert row["sample_index"] is None or isinstance(row["sample_index"], str)
    if step >= 2**63:
        assert all(r["step"] is None for r in rows)
        replaced = [json.loads(r["attributes"])["rollout_trace.replaced"] for r in rows]
        assert all("step" in note for note in replaced)
    if result.values_replaced:
        assert "placeholders" in result.message
    TALLY["runs"] += 1
    TALLY["spans recorded"] += recorded
    TALLY["spans read back"] += len(rows)
    TALLY["values replaced"] += result.values_replaced
    FIGURES["one bad value never loses the batch"] = dict(TALLY)
    tracer.shutdown()


def test_batches_are_bounded_in_bytes(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows holding more text than one batch takes are split over several batches; every span reads back."""
    monkeypatch.setattr(span_encoder, "BATCH_CHARS", 10_000)
    cfg = tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    with tracer.rollout_trace_attr(sample_index="0", step=1):
        for i in range(40):
            plain("x" * 3000 + str(i))
    result = tracer.flush()
    assert result.ok, result
    batches = [batch for _, batch in tracer.iter_batches(cfg.run_dir)]
    assert len(batches) >= 12
    assert sum(b.num_rows for b in batches) == 41


def test_a_value_over_the_column_limit_becomes_a_placeholder(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One input larger than a string column holds: a marked placeholder in that span, the others intact."""
    monkeypatch.setenv(tracer.config.ENV_STRICT, "0")
    monkeypatch.setattr(span_encoder, "MAX_VALUE_BYTES", 4000)
    cfg = tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    with tracer.rollout_trace_attr(sample_index="0", step=1):
        plain("small")
        plain("é" * 5000)
    result = tracer.flush()
    rows = {r["inputs"][:40]: r for r in _rows(cfg) if r["kind"] == "tool"}
    assert len(rows) == 2
    assert result.values_replaced == 2 and "placeholders" in result.message  # its inputs and its output
    (big,) = [r for r in rows.values() if r["inputs"].startswith("<not recorded")]
    assert json.loads(big["attributes"])["rollout_trace.replaced"]["inputs"]


def test_reinit_mid_run_writes_the_spans_in_flight(tmp_path: os.PathLike[str]) -> None:
    """init() again while calls run: the calls that end afterwards are written (by the new recorder) with their links."""
    first = tracer.init(output_dir=str(tmp_path), experiment_name="a", flush_interval_s=60.0)
    started, release = threading.Event(), threading.Event()

    @tracer.rollout_trace_op(kind="tool")
    def slow(x: int) -> int:
        started.set()
        release.wait(10)
        return x

    def rollout() -> None:
        with tracer.rollout_trace_attr(sample_index="s", step=1):
            plain(0)
            slow(1)

    t = threading.Thread(target=rollout)
    t.start()
    assert started.wait(10)
    second = tracer.init(output_dir=str(tmp_path), experiment_name="b", flush_interval_s=60.0)
    release.set()
    t.join(10)
    result = tracer.flush()
    assert result.ok, result
    rows = _rows(first) + _rows(second)
    assert len(rows) == 3, rows
    ids = {r["span_id"] for r in rows}
    assert len({r["trace_id"] for r in rows}) == 1
    assert all(r["parent_span_id"] is None or r["parent_span_id"] in ids for r in rows)
    FIGURES["re-init mid-run"] = {"spans recorded": 3, "spans read back": len(rows)}


def test_reinit_reports_what_the_old_recorder_lost(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans dropped by the old recorder and not yet reported: the new recorder's first flush is not ok and says so."""
    monkeypatch.setenv(tracer.config.ENV_STRICT, "0")
    tracer.init(
        output_dir=str(tmp_path),
        experiment_name="a",
        max_buffered_spans=5,
        on_buffer_full="drop",
        flush_interval_s=60.0,
    )
    rec = _recorder.ACTIVE
    assert rec is not None
    with rec._fork_lock:  # the writer cannot drain while we hold its cycle lock
        for i in range(50):
            plain(i)
    tracer.init(output_dir=str(tmp_path), experiment_name="b", flush_interval_s=60.0)
    result = tracer.flush()
    assert not result.ok and result.spans_dropped > 0 and "dropped" in result.message

"""SpanEncoder: span records in, Arrow batches and counts out, with no recorder, thread or file."""

from __future__ import annotations

import json
import time
from typing import Any

from tracer import schema as S
from tracer.config import TraceConfig
from tracer.record.accounting import ATTR_REPLACED, ProblemLog
from tracer.record.capture import capture
from tracer.record.context import SpanRecord, Trajectory
from tracer.record.redact import Redactor
from tracer.record.span_encoder import SpanEncoder
from tracer.record.spec import OpSpec


def generate(prompt_ids: list[int], api_key: str) -> dict:
    return {}


def encoder(**config: Any) -> SpanEncoder:
    cfg = TraceConfig(**config)
    return SpanEncoder(cfg, ProblemLog(), "abcd", "0123456789abcdef", Redactor() if cfg.redact else None)


def span(span_id: int, args: tuple[Any, ...], out: Any, exc: BaseException | None = None) -> tuple[Any, ...]:
    traj = Trajectory(3, "q7", 1, False, "rollout", None, True, 1, 5)
    now = time.time_ns()
    spec = OpSpec(generate, None, S.KIND_LLM)
    return tuple(SpanRecord(span_id, 1, 5, spec, traj, now, now + 1, exc, capture(args), None, capture(out), None))


def test_records_become_one_batch_of_the_span_schema() -> None:
    """Arguments are named, outputs and trajectory fields land in their columns, ids get the prefixes."""
    encoded = encoder().encode([span(2, ([1, 2, 3], "k"), {"text": "hi"}), span(3, ([4], "k"), None)])
    assert encoded.replaced == 0 and encoded.failed == 0 and len(encoded.batches) == 1
    rows = encoded.batches[0].to_pylist()
    assert encoded.batches[0].schema == S.SPAN_SCHEMA
    assert [r[S.SPAN_ID] for r in rows] == ["abcd00000002", "abcd00000003"]
    assert rows[0][S.TRACE_ID] == "0123456789abcdef" + f"{5:016x}" and rows[0][S.PARENT_SPAN_ID] == "abcd00000001"
    assert json.loads(rows[0][S.INPUTS])["prompt_ids"] == [1, 2, 3]
    assert json.loads(rows[0][S.OUTPUTS]) == {"text": "hi"}
    assert (rows[0][S.STEP], rows[0][S.SAMPLE_INDEX], rows[0][S.ROLLOUT_N]) == (3, "q7", 1)


def test_secrets_are_redacted_by_the_encoder_itself() -> None:
    """A secret-named argument and a key in a text are gone from the batch the encoder returns."""
    secret = "sk-" + "Zq9" * 8
    encoded = encoder().encode([span(2, ([1], "plain"), {"text": f"my key {secret}"})])
    row = encoded.batches[0].to_pylist()[0]
    assert secret not in row[S.OUTPUTS] and "<redacted>" in json.loads(row[S.INPUTS])["api_key"]


def test_a_value_a_column_cannot_hold_is_replaced_and_counted() -> None:
    """A lone surrogate in a span name is written escaped, named in rollout_trace.replaced, and counted."""
    record = list(span(2, ([1], "k"), None))
    record[3] = OpSpec(generate, "bad\ud800name", S.KIND_LLM)
    encoded = encoder().encode([tuple(record)])
    row = encoded.batches[0].to_pylist()[0]
    assert encoded.replaced == 1 and encoded.failed == 0
    assert S.NAME in json.loads(row[S.ATTRIBUTES])[ATTR_REPLACED]


def test_an_error_is_recorded_with_its_type_and_message() -> None:
    """A span whose call raised gets status error and the exception's type and message."""
    encoded = encoder().encode([span(2, ([1], "k"), None, ValueError("boom"))])
    row = encoded.batches[0].to_pylist()[0]
    assert row[S.STATUS] == S.STATUS_ERROR and json.loads(row[S.ERROR])["message"] == "boom"

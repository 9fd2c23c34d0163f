"""Helpers of the storage tests: span rows whose ids say where they came from."""

from __future__ import annotations

from tracer import schema as S


def span_rows(batch: int, n: int, tag: str = "") -> list[dict[str, object]]:
    """``n`` spans of one trajectory per batch, with ids that say where they came from."""
    return [
        {
            S.TRACE_ID: f"{tag}t{batch:04d}",
            S.SPAN_ID: f"{tag}b{batch:04d}s{i:04d}",
            S.PARENT_SPAN_ID: None if i == 0 else f"{tag}b{batch:04d}s0000",
            S.NAME: "tool",
            S.KIND: "tool",
            S.START_NS: 1_000 + i,
            S.END_NS: 2_000 + i,
            S.STATUS: "ok",
            S.STEP: batch,
            S.SAMPLE_INDEX: str(batch),
            S.ROLLOUT_N: 0,
            S.INPUTS: f'{{"x": {i}}}',
        }
        for i in range(n)
    ]

"""The span record has one layout, SpanRecord's: what every wrapper appends and what the recorder reads."""

from __future__ import annotations

import asyncio
from typing import Any

import tracer
from tracer.record import recorder, span_encoder
from tracer.record.context import SpanRecord


def test_the_recorder_reads_the_fields_where_span_record_puts_them() -> None:
    """The encoder's positions name the same fields as SpanRecord (a tripwire for either changing alone)."""
    fields = ("span_id", "parent_id", "trace_id", "spec", "trajectory", "start_ns", "end_ns", "error", "args")
    positions = (
        span_encoder.R_SPAN,
        span_encoder.R_PARENT,
        span_encoder.R_TRACE,
        span_encoder.R_SPEC,
        span_encoder.R_TRAJ,
    )
    positions += (span_encoder.R_START, span_encoder.R_END, span_encoder.R_EXC, span_encoder.R_ARGS)
    assert [SpanRecord._fields.index(f) for f in fields] == list(positions)
    rest = ("kwargs", "output", "self_obj")
    assert [SpanRecord._fields.index(f) for f in rest] == [
        span_encoder.R_KWARGS,
        span_encoder.R_OUT,
        span_encoder.R_SELF,
    ]


def test_every_wrapper_appends_a_record_in_span_record_layout(trace_dir: str) -> None:
    """Plain, async, generator and async-generator calls, and log_reward, append SpanRecord-shaped tuples."""
    tracer.init(output_dir=trace_dir, flush_interval_s=3600)
    rec = recorder.ACTIVE
    assert rec is not None
    rec.fast_limit = 1 << 40  # the writer never wakes: the records stay in the buffer

    class Tool:
        @tracer.rollout_trace_op(kind="tool")
        def plain(self, x: int, *, y: int) -> dict[str, int]:
            return {"sum": x + y}

        @tracer.rollout_trace_op(kind="tool")
        async def later(self, x: int) -> int:
            return x

        @tracer.rollout_trace_op(kind="tool")
        def gen(self, n: int) -> Any:
            yield from range(n)

        @tracer.rollout_trace_op(kind="tool")
        async def agen(self, n: int) -> Any:
            for i in range(n):
                yield i

    tool = Tool()

    async def run_async() -> None:
        await tool.later(3)
        assert [i async for i in tool.agen(2)] == [0, 1]

    with tracer.rollout_trace_attr(sample_index="s", step=1):
        tool.plain(1, y=2)
        asyncio.run(run_async())
        assert list(tool.gen(2)) == [0, 1]
        tracer.log_reward(1.5)
    records = [SpanRecord._make(r) for r in rec.buffer]
    by_name = {r.spec.name.rsplit(".", 1)[-1]: r for r in records}
    plain = by_name["plain"]
    assert plain.args == (1,) and plain.kwargs == {"y": 2} and plain.output == {"sum": 3} and plain.self_obj is tool
    assert by_name["later"].output == 3
    for name in ("gen", "agen"):  # the yielded ints are captured as an id tuple: written as a JSON array
        assert list(by_name[name].output["yielded"]) == [0, 1] and by_name[name].output["count"] == 2
    assert by_name["log_reward"].args == (1.5,)
    root = by_name["rollout_trace"]
    for r in records:
        assert r.error is None and r.start_ns <= r.end_ns and r.trajectory is root.trajectory
        assert r.parent_id == (None if r is root else root.span_id) or r.spec.name == "log_reward"
    rec.fast_limit = 1

"""Hot-path overhead per span: tracer vs a minimal decorator, OpenTelemetry and @mlflow.trace.

Workload (issue 2): one rollout span with 15 nested async tool calls taking
short string arguments, repeated. Each recorder decorates the same functions;
the per-span overhead is (time with the recorder - time undecorated) / spans.
All recorders run in this one process, interleaved over several rounds; the
median round is reported.

    python bench/bench_overhead.py [--rollouts 2000] [--rounds 5] [--mlflow-rollouts 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOOLS_PER_ROLLOUT = 15
SPANS_PER_ROLLOUT = TOOLS_PER_ROLLOUT + 1


def build(decorate_rollout: Callable[[Any], Any], decorate_tool: Callable[[Any], Any]) -> Callable[[int], Any]:
    @decorate_tool
    async def call_tool(name: str, arguments: str) -> str:
        return "ok"

    @decorate_rollout
    async def rollout(prompt: str) -> str:
        for _ in range(TOOLS_PER_ROLLOUT):
            await call_tool("calculator", "1 + 2")
        return "done"

    async def run(n: int) -> None:
        for _ in range(n):
            await rollout("What is 1 + 2?")

    return run


def identity(fn: Any) -> Any:
    return fn


# -- the floor: ContextVar parent + append a dict to a list -----------------
_PARENT: contextvars.ContextVar[int | None] = contextvars.ContextVar("parent", default=None)
MINIMAL_SPANS: list[dict[str, Any]] = []
_next_id = iter(range(1, 1 << 62)).__next__


def minimal(fn: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        sid = _next_id()
        parent = _PARENT.get()
        token = _PARENT.set(sid)
        start = time.time_ns()
        try:
            return await fn(*args, **kwargs)
        finally:
            _PARENT.reset(token)
            MINIMAL_SPANS.append(
                {"id": sid, "parent": parent, "name": fn.__name__, "start": start, "end": time.time_ns(), "args": args}
            )

    return wrapper


def otel_decorator() -> Callable[[Any], Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class NullExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    otracer = provider.get_tracer("bench")

    def deco(fn: Any) -> Any:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            with otracer.start_as_current_span(fn.__name__) as span:
                span.set_attribute("args", repr(args))
                return await fn(*args, **kwargs)

        return wrapper

    return deco


def time_run(run: Callable[[int], Any], n: int) -> float:
    t0 = time.perf_counter()
    asyncio.run(run(n))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mlflow-rollouts", type=int, default=30, help="0 skips @mlflow.trace (slow: ~0.3 ms/span)")
    args = ap.parse_args()

    import tracer

    tmp = tempfile.mkdtemp(prefix="bench-overhead-")
    tracer.init(output_dir=tmp, project_name="bench", experiment_name="overhead")
    from tracer.record import recorder as _recorder

    ours = build(tracer.rollout_trace_op(kind="rollout"), tracer.rollout_trace_op(kind="tool"))

    def ours_writer_idle(n: int) -> Any:
        # The same calls with the writer held off until they return: the cost
        # in the call alone, without the writer thread's share of the GIL.
        async def run() -> None:
            rec = _recorder.ACTIVE
            assert rec is not None
            saved, rec.fast_limit = rec.fast_limit, 1 << 40
            try:
                await ours(n)
            finally:
                rec.fast_limit = saved

        return run()

    runs: dict[str, Callable[[int], Any]] = {
        "undecorated": build(identity, identity),
        "minimal (ContextVar + dict append)": build(minimal, minimal),
        "rollout-trace": ours,
        "rollout-trace, writer idle during the calls": ours_writer_idle,
    }
    try:
        otel = otel_decorator()
        runs["OpenTelemetry SDK (BatchSpanProcessor)"] = build(otel, otel)
    except ImportError:
        print("opentelemetry-sdk not installed; skipped")

    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            MINIMAL_SPANS.clear()
            times[name].append(time_run(run, args.rollouts))
            if name.startswith("rollout-trace"):
                tracer.flush()
    per_span = {}
    base = statistics.median(times["undecorated"]) / (args.rollouts * SPANS_PER_ROLLOUT)
    for name, ts in times.items():
        per_span[name] = statistics.median(ts) / (args.rollouts * SPANS_PER_ROLLOUT) - base

    if args.mlflow_rollouts:
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment("bench")
        run = build(mlflow.trace(span_type="AGENT"), mlflow.trace(span_type="TOOL"))
        time_run(run, 2)  # warm-up: creates tables
        t = time_run(run, args.mlflow_rollouts)
        per_span["@mlflow.trace (SQLite)"] = t / (args.mlflow_rollouts * SPANS_PER_ROLLOUT) - base
        mlflow.flush_trace_async_logging()

    result = tracer.shutdown()
    written = sum(1 for _ in tracer.iter_batches(tmp, ["span_id"]))
    spans = tracer.read_spans(tmp, columns=["span_id"]).num_rows
    ours = per_span["rollout-trace"]
    floor = per_span["minimal (ContextVar + dict append)"]
    print(
        f"\n{args.rollouts} rollouts x {SPANS_PER_ROLLOUT} spans, median of {args.rounds} rounds; undecorated {base * 1e6:.2f} us/span"
    )
    print(f"{'recorder':42s} {'us/span':>9s} {'vs rollout-trace':>17s}")
    for name, v in per_span.items():
        if name == "undecorated":
            continue
        print(f"{name:42s} {v * 1e6:9.2f} {v / ours:16.1f}x")
    idle = per_span["rollout-trace, writer idle during the calls"]
    print(
        f"\nrollout-trace / minimal = {ours / floor:.2f}x with the writer running, {idle / floor:.2f}x in the call alone (target <= 2x)"
    )
    print(f"rollout-trace wrote {spans} spans in {written} batches; flush ok={result.ok}")
    expected = 2 * args.rounds * args.rollouts * SPANS_PER_ROLLOUT
    print(f"spans expected {expected}, read back {spans}")


if __name__ == "__main__":
    main()

"""Record as fast as possible from many asyncio tasks and a few threads; report memory and counts as JSON.

Usage: ``python load.py OUTPUT_DIR SECONDS MAX_BUFFERED_SPANS block|drop PAYLOAD_BYTES [TASKS] [THREADS] [noflush]``.
With ``noflush`` the process reports memory right after the load and exits
without writing its backlog (for a benchmark of an unbounded buffer).

Prints one JSON line: spans recorded by the callers, the final FlushResult,
resident memory (RSS) before and at peak during the load (sampled every
5 ms from /proc), and the spans_dropped figure in the last batch's metadata.
The writer is the bottleneck (encoding costs ~10x what recording does), so
the buffer fills without any artificial slowness.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import tracer

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.005)


def main() -> None:
    out, seconds, limit, mode, payload = (
        sys.argv[1],
        float(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        int(sys.argv[5]),
    )
    tasks = int(sys.argv[6]) if len(sys.argv) > 6 else 64
    threads = int(sys.argv[7]) if len(sys.argv) > 7 else 2
    noflush = len(sys.argv) > 8 and sys.argv[8] == "noflush"
    tracer.init(output_dir=out, max_buffered_spans=limit, on_buffer_full=mode, flush_interval_s=0.05)
    # Each span carries its own text (different per call: compression cannot hide it).
    base = os.urandom(payload // 2).hex()

    @tracer.rollout_trace_op(kind="llm")
    def generate(i: int, text: str) -> dict[str, object]:
        return {"response_text": text, "i": i}

    @tracer.rollout_trace_op(kind="llm")
    async def agenerate(i: int, text: str) -> dict[str, object]:
        return {"response_text": text, "i": i}

    # Warm up: the first batch loads pyarrow's lazy imports; measure from after it.
    generate(-1, base)
    assert tracer.flush().ok
    counts = {"calls": 1}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def thread_work() -> None:
        n = 0
        while time.monotonic() < deadline:
            for _ in range(100):
                generate(n, base[n % 64 :] + str(n))
                n += 1
        with lock:
            counts["calls"] += n

    async def task_work() -> int:
        n = 0
        while time.monotonic() < deadline:
            for _ in range(100):
                await agenerate(n, base[n % 64 :] + str(n))
                n += 1
            await asyncio.sleep(0)
        return n

    async def all_tasks() -> int:
        return sum(await asyncio.gather(*(task_work() for _ in range(tasks))))

    baseline = rss()
    sampler = PeakSampler()
    sampler.start()
    workers = [threading.Thread(target=thread_work) for _ in range(threads)]
    for w in workers:
        w.start()
    n_async = asyncio.run(all_tasks())
    for w in workers:
        w.join()
    load_s = time.monotonic() - deadline + seconds
    if noflush:
        sampler.stop.set()
        sampler.join()
        result = tracer.FlushResult(False, message="not flushed")
    else:
        result = tracer.flush(timeout=1800)
        sampler.stop.set()
        sampler.join()
        tracer.shutdown()
    counts["calls"] += n_async
    print(
        json.dumps(
            {
                "recorded": counts["calls"],
                "load_s": round(load_s, 2),
                "ok": result.ok,
                "spans_written": result.spans_written,
                "spans_dropped": result.spans_dropped,
                "rss_baseline": baseline,
                "rss_peak": sampler.peak,
                "seconds": seconds,
                "max_buffered_spans": limit,
                "payload_bytes": payload,
                "mode": mode,
            }
        ),
        flush=True,
    )
    if noflush:
        os._exit(0)  # leave the backlog unwritten


if __name__ == "__main__":
    main()

"""Memory of an open shard's index: what a writer holds per span while its shard is open, and its close.

Writes ``--spans`` spans (8-span trajectories, a small JSON attribute, 200-byte inputs and outputs) in
batches of 10,000 to one shard, two ways side by side in this process:

1. ``from file`` (the writer as it is): nothing kept while the shard is open; at close,
   ``tracer.index.shard.write_index`` reads the summary columns back and builds the index;
2. ``in memory`` (the rejected design): a ``ShardIndexBuilder`` fed each batch as it is written
   (bounded at ``MAX_BUILD_BYTES``), the index built from what it kept at close.

Reports the peak Arrow memory held (``pyarrow.total_allocated_bytes``, sampled after each batch) per span,
the close's time, and whether the shard got its index. Target: the documented bound, 128 MiB, at 1M+ spans.

    python bench/bench_open_shard.py [--spans 1200000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
from report import write_result  # noqa: E402

from tracer import schema as S  # noqa: E402
from tracer.index import shard as _si  # noqa: E402
from tracer.index.closed import shard_closed  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402

BATCH = 10_000
META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}
RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "open_shard.json")
MIB = 2**20


def template() -> pa.RecordBatch:
    rows = []
    for i in range(BATCH):
        root = i - i % 8
        rows.append(
            {
                S.TRACE_ID: f"t{i // 8}",
                S.SPAN_ID: f"s{i}",
                S.PARENT_SPAN_ID: None if i == root else f"s{root}",
                S.NAME: "agent_loop" if i == root else "generate",
                S.KIND: S.KIND_ROLLOUT if i == root else S.KIND_LLM,
                S.START_NS: i,
                S.END_NS: i + 5,
                S.STATUS: S.STATUS_OK,
                S.STEP: 0,
                S.SAMPLE_INDEX: str(i // 8),
                S.ROLLOUT_N: 0,
                S.VALIDATE: False,
                S.ATTRIBUTES: json.dumps({"model": "m", "tokens": i, "temperature": 0.7}),
                S.INPUTS: "x" * 200,
                S.OUTPUTS: "y" * 200,
            }
        )
    return pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA)


def run(spans: int, in_memory: bool) -> dict[str, Any]:
    base = template()
    run_dir = tempfile.mkdtemp(prefix="rt-bench-open-")
    try:
        writer = SpanWriter(run_dir, META, max_file_bytes=1 << 40, on_close=None if in_memory else shard_closed)
        builder = _si.builder() if in_memory else None
        gc.collect()
        start = pa.total_allocated_bytes()
        peak = 0
        for k in range(spans // BATCH):
            cols = [pa.concat_arrays([c]) for c in base.columns]
            cols[0] = pa.array([f"b{k}t{i // 8}" for i in range(BATCH)])
            batch = pa.RecordBatch.from_arrays(cols, schema=base.schema)
            writer.write(batch)
            if builder is not None:
                try:
                    builder.add(batch)
                except MemoryError:  # past its bound: the shard goes without an index
                    builder = None
            del cols, batch
            peak = max(peak, pa.total_allocated_bytes() - start)
        t0 = time.perf_counter()
        writer.close()
        if builder is not None and writer.path is not None:
            try:
                _si.write_shard_index(writer.path, builder)
            except Exception:
                pass
        took = time.perf_counter() - t0
        indexed = writer.path is not None and os.path.exists(_si.shard_index_path(writer.path))
        return {"peak_mib": peak / MIB, "bytes_per_span": peak / spans, "close_s": took, "indexed": indexed}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_200_000)
    args = parser.parse_args()
    out = {"from file": run(args.spans, False), "in memory": run(args.spans, True)}
    for name, r in out.items():
        print(
            f"{name:>9}: peak {r['peak_mib']:.1f} MiB held ({r['bytes_per_span']:.1f} B/span), "
            f"close {r['close_s']:.2f} s, indexed {r['indexed']}"
        )
    a, b = out["from file"], out["in memory"]
    entry = {
        "bench": "open_shard",
        "what": f"Arrow memory a writer holds while its shard of {args.spans / 1e6:g}M spans is open, for the index: "
        "built from the closed file, against kept in memory (the rejected design)",
        "command": "python bench/bench_open_shard.py",
        "figure": f"{a['peak_mib']:.1f} MiB ({a['bytes_per_span']:.1f} B/span) against {b['peak_mib']:.1f} MiB "
        f"({b['bytes_per_span']:.1f} B/span); close {a['close_s']:.2f} s against {b['close_s']:.2f} s; "
        f"indexed: {a['indexed']} against {b['indexed']}",
        "target": "<= 128 MiB at 1M+ spans",
        "met": a["peak_mib"] <= 128,
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    write_result(RESULT, [entry])
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()

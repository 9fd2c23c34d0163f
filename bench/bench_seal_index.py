"""What indexing costs where it was added (issue 13): at the seal of a dead writer's shard, and in compaction.

Writes ``--shards`` shards of ``--spans`` spans each through ``SpanWriter``
(the batches of ``bench_scale.chunk``: trajectories of 8 spans over 10 steps)
and leaves them as a killed writer does (every batch durable, no footer).
Then, in this one process, taking turns each repetition on fresh copies:

1. sealing every shard with its index (``seal_if_abandoned``) against sealing
   it alone (``on_sealed=None``), and a second seal of the now closed files (what
   every read pays);
2. ``rollout-trace compact`` of the run, each output file indexed, against the
   same compaction with the summary unregistered (no index written).

    python bench/bench_seal_index.py [--shards 8] [--spans 50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scale import chunk  # noqa: E402

from tracer import schema as S  # noqa: E402
from tracer.index import shard as shard_index  # noqa: E402
from tracer.index.closed import shard_closed  # noqa: E402
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, write_index  # noqa: E402
from tracer.storage.compact import compact  # noqa: E402
from tracer.storage.seal import ALREADY_CLOSED, SEALED, seal_if_abandoned  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402

BATCH_ROWS = 8192
STEPS = 10


def killed_run(run: str, shards: int, spans: int) -> None:
    """``shards`` shards of ``spans`` spans, each left by a writer that died after its last flush."""
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}
    now = time.time_ns()
    start = 0
    for _ in range(shards):
        writer = SpanWriter(run, meta, max_file_bytes=1 << 40, on_close=shard_closed)
        per_step = spans // STEPS
        for step in range(STEPS):
            for off in range(0, per_step, BATCH_ROWS):
                n = min(BATCH_ROWS, per_step - off)
                writer.write(chunk(start, n, step, now))
                start += n
        writer._let_go()  # no footer, lock released: what os._exit leaves


def shards_of(run: str) -> list[str]:
    return sorted(os.path.join(run, n) for n in os.listdir(run) if n.endswith(S.FILE_SUFFIX))


def seal_all(run: str, index: bool) -> float:
    t0 = time.perf_counter()
    for shard in shards_of(run):
        assert seal_if_abandoned(shard, on_sealed=write_index if index else None).action == SEALED
    return time.perf_counter() - t0


def reseal_all(run: str) -> float:
    t0 = time.perf_counter()
    for shard in shards_of(run):
        assert seal_if_abandoned(shard).action == ALREADY_CLOSED
    return time.perf_counter() - t0


def compact_run(run: str, index: bool) -> float:
    saved = shard_index.builder
    if not index:  # a builder past its memory bound at the first batch: compaction writes no index
        shard_index.builder = lambda bounded=True: saved(bounded=True)
        shard_index.MAX_BUILD_BYTES, bound = 0, shard_index.MAX_BUILD_BYTES
    try:
        t0 = time.perf_counter()
        report = compact(run, target_bytes=64 * 1024 * 1024)
        took = time.perf_counter() - t0
    finally:
        shard_index.builder = saved
        if not index:
            shard_index.MAX_BUILD_BYTES = bound
    indexed = [n for n in os.listdir(run) if n.endswith(INDEX_SUFFIX)]
    assert report.files_out and (len(indexed) == report.files_out if index else not indexed), (report, indexed)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--spans", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-seal-index-", dir=args.dir)
    try:
        source = os.path.join(root, "source")
        killed_run(source, args.shards, args.spans)
        size = sum(os.path.getsize(s) for s in shards_of(source))
        print(
            f"{args.shards} shards x {args.spans:,} spans ({size / 1e6:.1f} MB), killed writers; load {os.getloadavg()}"
        )
        times: dict[str, list[float]] = {k: [] for k in ("seal", "seal+index", "reseal", "compact", "compact+index")}
        for r in range(args.repeat):
            order = [False, True] if r % 2 == 0 else [True, False]
            for index in order:
                run = os.path.join(root, f"seal-{r}-{index}")
                shutil.copytree(source, run)
                times["seal+index" if index else "seal"].append(seal_all(run, index))
                if index:
                    assert all(load_shard_index(s) is not None for s in shards_of(run))
                    times["reseal"].append(reseal_all(run))
            for index in order:
                run = os.path.join(root, f"compact-{r}-{index}")
                shutil.copytree(source, run)
                times["compact+index" if index else "compact"].append(compact_run(run, index))
                shutil.rmtree(run)
        med = {k: statistics.median(v) for k, v in times.items()}
        n = args.shards
        print(f"seal, no index:      {med['seal']:.3f} s ({med['seal'] / n * 1e3:.1f} ms/shard)")
        print(
            f"seal + index:        {med['seal+index']:.3f} s ({med['seal+index'] / n * 1e3:.1f} ms/shard)"
            f" -> {med['seal+index'] / med['seal']:.2f}x"
        )
        print(f"seal of closed files: {med['reseal'] / n * 1e6:.1f} us/shard (every read pays this)")
        print(f"compact, no index:   {med['compact']:.3f} s")
        print(f"compact + index:     {med['compact+index']:.3f} s -> {med['compact+index'] / med['compact']:.2f}x")
        print(f"(medians of {args.repeat}, alternating which goes first; load {os.getloadavg()})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

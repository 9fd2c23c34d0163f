"""Sustained LLM-span recording and file size, against straight-line code in the same process.

Workload (issue 2): LLM spans carrying 512 token ids each (384 prompt + 128
response), token2text on with a real Hugging Face tokenizer built locally.

1. rollout-trace: decorated async ``generate(prompt_ids, sampling_params)``
   calls returning ``{"response_ids", "finish_reason"}``, timed from the
   first call until ``tracer.flush()`` returns (everything durable on disk).
   The spans hold what the straight line writes. ``--response-as-argument``
   also passes the response in as a third argument (recorded in the inputs:
   128 more ids per span to capture, check and write, which the straight
   line never writes).
2. straight-line: the same spans as Python data, then decode (the id ->
   bytes table, the fastest exact decode; and again with the Rust
   ``decode_batch``, as before the table) + per-token texts + JSON +
   building the Arrow table + zstd IPC write + fsync, one pass, no tracer.
   It writes the llm rows only; the tracer writes two rows per call here (the
   llm span and the root span of the ``rollout_trace_attr`` block around
   it). It also runs writing the same rows as the
   tracer, and the program alone is timed (the same loop with no recorder:
   the tracer's time includes it, the straight line's did not); the ratio
   "tracer / (program alone + straight line, same rows)" compares two runs of
   the same program writing the same rows.

Every timed run starts after an untimed ``gc.collect()``, so that a full collection one run made due does not land on the
next one; a run that fills the old generation itself still pays for it.
An untimed warm-up of 200 spans (tracer and
straight line) comes first: the first tracer run in a process paid one-off
imports (pyarrow's first array imports pandas, ~0.5 s) in round 0 only; and
the CPU line is split into the writer thread's own CPU seconds (its thread
clock, read after the flush) and the rest of the process.

File size: our files against (a) the same Arrow data as one uncompressed IPC
stream compressed whole with zstd at the same level, and (b) plain JSONL.

    python bench/bench_write.py [--spans 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_history import writer_cpu as thread_cpu  # noqa: E402

import tracer  # noqa: E402
from tracer.record.pieces import batch_decode, piece_table  # noqa: E402

PROMPT, RESPONSE = 384, 128
LEVEL = 3


def make_ids(tok, n_spans: int) -> list[tuple[list[int], list[int]]]:
    from tracer_fixtures import CORPUS

    text_ids = tok.encode(" ".join(CORPUS * 10))
    rng = random.Random(0)
    out = []
    for _ in range(n_spans):
        a = rng.randrange(0, len(text_ids) - PROMPT - RESPONSE)
        out.append((text_ids[a : a + PROMPT], text_ids[a + PROMPT : a + PROMPT + RESPONSE]))
    return out


class Engine:
    """Answers each call with the next response of the data (calls come in order)."""

    def __init__(self, tokenizer, responses: list[list[int]]) -> None:
        self.tokenizer = tokenizer
        self.responses = iter(responses)

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling_params: dict) -> dict:
        return {"response_ids": next(self.responses), "finish_reason": "stop"}


class ArgumentEngine:
    """The response comes in as an argument too (``--response-as-argument``)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling_params: dict, response: list[int]) -> dict:
        return {"response_ids": response, "finish_reason": "stop"}


async def program(tok, data, response_argument: bool = False) -> None:
    """The measured program: one ``rollout_trace_attr`` block and one generate call per span of the data."""
    engine = ArgumentEngine(tok) if response_argument else Engine(tok, [r for _, r in data])
    for i, (p, r) in enumerate(data):
        with tracer.rollout_trace_attr(sample_index=i // 8, step=0, rollout_n=i % 8):
            if response_argument:
                await engine.generate(p, {"temperature": 1.0}, r)
            else:
                await engine.generate(p, {"temperature": 1.0})


def run_tracer(
    tok, data, out_dir: str, redact: bool = True, response_argument: bool = False, writer_cpu: list | None = None
) -> float:
    tracer.init(output_dir=out_dir, token2text=True, tokenizer=tok, compression_level=LEVEL, redact=redact)
    t0 = time.perf_counter()
    asyncio.run(program(tok, data, response_argument))
    result = tracer.flush()
    elapsed = time.perf_counter() - t0
    if writer_cpu is not None:
        writer_cpu.append(thread_cpu())
    tracer.shutdown()
    assert result.ok, result.message
    return elapsed


def run_untraced(tok, data) -> float:
    """The program alone: the same loop, rollout_trace_attr blocks and calls with no recorder active."""
    t0 = time.perf_counter()
    asyncio.run(program(tok, data))
    return time.perf_counter() - t0


def run_straight(tok, data, path: str, table_decode: bool = True, roots: bool = False) -> float:
    """Straight-line code writing the llm spans' rows; with ``roots``, each trajectory's root row too.

    The tracer writes two rows per call of this workload: the llm span and
    the root span of the ``rollout_trace_attr`` block around it (``name``
    ``rollout_trace``, kind ``rollout``, no inputs or outputs).
    """
    t0 = time.perf_counter()
    now = time.time_ns()
    ids = [x for p, r in data for x in (p, r)]
    table = piece_table(tok)  # one text per response token, as the recorder keeps them (issue 17)
    # The fastest exact decode: the same id -> bytes table (4.7x decode_batch here; same text, see bench_pieces).
    if table_decode and table.exact_text:
        texts = [table.decode(x) for x in ids]
    else:  # the Rust decode_batch, as the straight line did before the table (issue 2's figures)
        texts = tok.backend_tokenizer.decode_batch(ids, skip_special_tokens=False)
    pieces = [table.pieces(r, tok) for _, r in data]
    n = len(data)
    inputs = [
        orjson.dumps({"prompt_ids": p, "prompt_text": texts[2 * i], "sampling_params": {"temperature": 1.0}}).decode()
        for i, (p, _) in enumerate(data)
    ]
    outputs = [
        orjson.dumps(
            {
                "response_ids": r,
                "response_text": texts[2 * i + 1],
                "response_token_texts": pieces[i],
                "finish_reason": "stop",
            }
        ).decode()
        for i, (_, r) in enumerate(data)
    ]
    cols = {
        "trace_id": [f"{i:032x}" for i in range(n)],
        "span_id": [f"{i:016x}" for i in range(n)],
        "parent_span_id": [f"{i:016x}" for i in range(n)],
        "name": ["Engine.generate"] * n,
        "kind": ["llm"] * n,
        "start_ns": [now + i for i in range(n)],
        "end_ns": [now + i + 1 for i in range(n)],
        "status": ["ok"] * n,
        "error": [None] * n,
        "step": [0] * n,
        "sample_index": [str(i // 8) for i in range(n)],
        "rollout_n": [i % 8 for i in range(n)],
        "validate": [False] * n,
        "reward": [None] * n,
        "inputs": inputs,
        "outputs": outputs,
        "attributes": ['{"tokens":{"prompt_ids":384,"response_ids":128}}'] * n,
    }
    if roots:  # each llm row followed by its trajectory's root row, as the tracer writes them
        root = {
            "span_id": [f"{i:016x}" for i in range(n, 2 * n)],
            "parent_span_id": [None] * n,
            "name": ["rollout_trace"] * n,
            "kind": ["rollout"] * n,
            "start_ns": [now + i - 1 for i in range(n)],
            "end_ns": [now + i + 2 for i in range(n)],
            "inputs": [None] * n,
            "outputs": [None] * n,
            "attributes": [None] * n,
        }
        cols["parent_span_id"] = root["span_id"]
        cols = {k: [x for pair in zip(v, root.get(k, v)) for x in pair] for k, v in cols.items()}
    table = pa.table(cols, schema=tracer.schema.SPAN_SCHEMA)
    with open(path, "wb") as f:
        with pa.ipc.new_stream(
            f, table.schema, options=pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", LEVEL))
        ) as w:
            w.write_table(table, max_chunksize=8192)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def bench_pieces(tok, data) -> None:
    """Per-token text (issue 17): the recorder's table against decoding each id alone, and whole texts."""
    responses = [r for _, r in data]
    backend = tok.backend_tokenizer
    t0 = time.perf_counter()
    table = piece_table(tok)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in responses:
        table.pieces(r, tok)
    t_table = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in responses:
        backend.decode_batch([[i] for i in r], skip_special_tokens=False)
    t_each = time.perf_counter() - t0
    seqs = [x for p, r in data for x in (p, r)]
    t0 = time.perf_counter()
    batch_decode(tok, seqs)
    t_whole = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in seqs:
        table.decode(s)
    t_table_whole = time.perf_counter() - t0
    n_resp = sum(map(len, responses))
    n_all = sum(map(len, seqs))
    print(f"per-token text, {len(responses)} responses x {RESPONSE} ids (table built in {t_build * 1e3:.0f} ms):")
    print(
        f"  table lookup {n_resp / t_table / 1e6:.1f} M tokens/s; decode_batch of each id alone "
        f"{n_resp / t_each / 1e6:.1f} M tokens/s ({t_each / t_table:.1f}x slower)"
    )
    print(
        f"  whole texts ({n_all:,} ids): decode_batch {n_all / t_whole / 1e6:.1f} M tokens/s, "
        f"table join+decode {n_all / t_table_whole / 1e6:.1f} M tokens/s ({t_whole / t_table_whole:.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--response-as-argument",
        action="store_true",
        help="pass each response to generate() as well, recorded in the inputs too",
    )
    args = ap.parse_args()
    from tracer_fixtures import hf_tokenizer

    tok = hf_tokenizer()
    data = make_ids(tok, args.spans)
    bench_pieces(tok, data)
    tmp = tempfile.mkdtemp(prefix="bench-write-")
    ours, plain, straight, straight_rust = [], [], [], []
    # The straight line writing the same rows as the tracer (the root
    # rows too), and the program alone (its loop with no recorder), so that both sides run it.
    straight_rows, untraced = [], []
    # CPU seconds of the process (both of the tracer's threads), beside the wall clock: on a
    # machine shared with other work the wall clock of two threads swings far more than this.
    cpu_ours, cpu_straight = [], []
    # The writer thread's own CPU seconds, and the caller's (the main thread's, less the straight line's none).
    cpu_writer = []
    # Untimed warm-up: the first tracer run in a process paid
    # one-off imports (pyarrow's first array imports pandas on the writer thread, ~0.5 s).
    run_tracer(tok, data[:200], os.path.join(tmp, "warm-up"), response_argument=args.response_as_argument)
    run_straight(tok, data[:200], os.path.join(tmp, "warm-up.arrow"))
    for r in range(args.rounds):
        d = os.path.join(tmp, f"run{r}")
        # Each timed run starts with the collector's old generation settled (gc.collect() before
        # it, untimed): otherwise the one full collection that the runs before it made due lands
        # on whichever run comes next, tracer or straight line, and swings its time by 0.2-0.4 s.
        gc.collect()
        c0 = time.process_time()
        ours.append(run_tracer(tok, data, d, response_argument=args.response_as_argument, writer_cpu=cpu_writer))
        cpu_ours.append(time.process_time() - c0)
        gc.collect()
        plain.append(
            run_tracer(
                tok, data, os.path.join(tmp, f"plain{r}"), redact=False, response_argument=args.response_as_argument
            )
        )
        gc.collect()
        c0 = time.process_time()
        straight.append(run_straight(tok, data, os.path.join(tmp, f"straight{r}.arrow")))
        cpu_straight.append(time.process_time() - c0)
        gc.collect()
        straight_rust.append(run_straight(tok, data, os.path.join(tmp, f"rust{r}.arrow"), table_decode=False))
        gc.collect()
        straight_rows.append(run_straight(tok, data, os.path.join(tmp, f"rows{r}.arrow"), roots=True))
        gc.collect()
        untraced.append(run_untraced(tok, data))
    t_ours, t_plain, t_straight = statistics.median(ours), statistics.median(plain), statistics.median(straight)
    t_rust = statistics.median(straight_rust)
    print(
        f"{args.spans} llm spans x {PROMPT + RESPONSE} token ids, token2text on, zstd level {LEVEL}, median of {args.rounds}"
        + (" (response also passed as an argument)" if args.response_as_argument else "")
    )
    print(f"  rollout-trace, call -> durable on disk: {t_ours:.2f} s ({args.spans / t_ours:,.0f} spans/s)")
    print(f"  rollout-trace, redact=False:            {t_plain:.2f} s ({args.spans / t_plain:,.0f} spans/s)")
    print(f"  straight-line decode+JSON+Arrow+zstd:   {t_straight:.2f} s ({args.spans / t_straight:,.0f} spans/s)")
    print(f"  straight line with decode_batch:        {t_rust:.2f} s ({args.spans / t_rust:,.0f} spans/s)")
    print(
        f"  ratio against it (the straight line of issue 2's figures): {t_ours / t_rust:.2f}x with redaction, "
        f"{t_plain / t_rust:.2f}x without"
    )
    print(
        f"  ratio rollout-trace / straight-line = {t_ours / t_straight:.2f}x with secret redaction (default), "
        f"{t_plain / t_straight:.2f}x without (the straight line does none) (target <= 1.5x)"
    )
    t_rows, t_loop = statistics.median(straight_rows), statistics.median(untraced)
    print(
        f"  straight line writing the same rows (each trajectory's root row too): {t_rows:.2f} s; "
        f"the program alone (no recorder): {t_loop:.3f} s"
    )
    print(
        f"  ratio rollout-trace / (program alone + straight line, same rows) = {t_ours / (t_loop + t_rows):.2f}x "
        f"with redaction, {t_plain / (t_loop + t_rows):.2f}x without (both sides run the program and write "
        f"{2 * args.spans:,} rows; target <= 1.5x)"
    )
    # Each round's runs come seconds apart: the ratio within a round is less swayed by the
    # machine's drift than the ratio of medians (the rounds of one process swing +-20% here).
    paired = sorted(o / s for o, s in zip(ours, straight, strict=True))
    paired_rows = sorted(o / (u + w) for o, u, w in zip(ours, untraced, straight_rows, strict=True))
    print(
        f"  per round (runs seconds apart), median [min-max]: {statistics.median(paired):.2f}x "
        f"[{paired[0]:.2f}-{paired[-1]:.2f}] against the straight line, {statistics.median(paired_rows):.2f}x "
        f"[{paired_rows[0]:.2f}-{paired_rows[-1]:.2f}] against program alone + straight line, same rows"
    )
    c_ours, c_straight = statistics.median(cpu_ours), statistics.median(cpu_straight)
    print(
        f"  CPU time, not wall: rollout-trace {c_ours:.2f} s, straight line {c_straight:.2f} s "
        f"(ratio {c_ours / c_straight:.2f}x with redaction)"
    )
    c_writer = statistics.median(cpu_writer)
    print(
        f"  of which the writer thread {c_writer:.2f} s ({c_writer / c_straight:.2f}x the straight line), "
        f"the rest (the caller's call-time capture, the loop, the close) {c_ours - c_writer:.2f} s"
    )

    import zstandard

    files = glob.glob(os.path.join(tmp, "run0", "**", "*.arrow"), recursive=True)
    ours_bytes = sum(os.path.getsize(f) for f in files)
    table = tracer.read_spans(os.path.join(tmp, "run0"))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    whole = len(zstandard.ZstdCompressor(level=LEVEL).compress(sink.getvalue().to_pybytes()))
    jsonl = sum(len(orjson.dumps(row)) + 1 for row in table.to_pylist())
    print(
        f"file size: rollout-trace {ours_bytes / 1e6:.2f} MB in {len(files)} file(s); "
        f"whole-file zstd {whole / 1e6:.2f} MB (ratio {ours_bytes / whole:.3f}, target <= 1.1); "
        f"JSONL {jsonl / 1e6:.2f} MB (ratio {ours_bytes / jsonl:.3f}, target <= 0.333)"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

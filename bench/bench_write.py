"""Sustained LLM-span recording and file size, against straight-line code in the same process.

Workload (issue 2): LLM spans carrying 512 token ids each (384 prompt + 128
response), token2text on with a real Hugging Face tokenizer built locally.

1. rollout-trace: decorated async ``generate`` calls, timed from the first
   call until ``tracer.flush()`` returns (everything durable on disk).
2. straight-line: the same spans as Python data, then batch_decode + JSON +
   building the Arrow table + zstd IPC write + fsync, one pass, no tracer.

File size: our files against (a) the same Arrow data as one uncompressed IPC
stream compressed whole with zstd at the same level, and (b) plain JSONL.

    python bench/bench_write.py [--spans 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
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

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402

import tracer  # noqa: E402

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
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling_params: dict, response: list[int]) -> dict:
        return {"response_ids": response, "finish_reason": "stop"}


def run_tracer(tok, data, out_dir: str, redact: bool = True) -> float:
    tracer.init(output_dir=out_dir, token2text=True, tokenizer=tok, compression_level=LEVEL, redact=redact)
    engine = Engine(tok)

    async def main() -> None:
        for i, (p, r) in enumerate(data):
            with tracer.rollout_trace_attr(sample_index=i // 8, step=0, rollout_n=i % 8):
                await engine.generate(p, {"temperature": 1.0}, r)

    t0 = time.perf_counter()
    asyncio.run(main())
    result = tracer.flush()
    elapsed = time.perf_counter() - t0
    tracer.shutdown()
    assert result.ok, result.message
    return elapsed


def run_straight(tok, data, path: str) -> float:
    t0 = time.perf_counter()
    now = time.time_ns()
    ids = [x for p, r in data for x in (p, r)]
    texts = tok.backend_tokenizer.decode_batch(ids, skip_special_tokens=False)  # the fastest exact decode
    n = len(data)
    inputs = [
        orjson.dumps({"prompt_ids": p, "prompt_text": texts[2 * i], "sampling_params": {"temperature": 1.0}}).decode()
        for i, (p, _) in enumerate(data)
    ]
    outputs = [
        orjson.dumps({"response_ids": r, "response_text": texts[2 * i + 1], "finish_reason": "stop"}).decode()
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
    table = pa.table(cols, schema=tracer.schema.SPAN_SCHEMA)
    with open(path, "wb") as f:
        with pa.ipc.new_stream(
            f, table.schema, options=pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", LEVEL))
        ) as w:
            w.write_table(table, max_chunksize=8192)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from tracer_fixtures import hf_tokenizer

    tok = hf_tokenizer()
    data = make_ids(tok, args.spans)
    tmp = tempfile.mkdtemp(prefix="bench-write-")
    ours, plain, straight = [], [], []
    for r in range(args.rounds):
        d = os.path.join(tmp, f"run{r}")
        ours.append(run_tracer(tok, data, d))
        plain.append(run_tracer(tok, data, os.path.join(tmp, f"plain{r}"), redact=False))
        straight.append(run_straight(tok, data, os.path.join(tmp, f"straight{r}.arrow")))
    t_ours, t_plain, t_straight = statistics.median(ours), statistics.median(plain), statistics.median(straight)
    print(
        f"{args.spans} llm spans x {PROMPT + RESPONSE} token ids, token2text on, zstd level {LEVEL}, median of {args.rounds}"
    )
    print(f"  rollout-trace, call -> durable on disk: {t_ours:.2f} s ({args.spans / t_ours:,.0f} spans/s)")
    print(f"  rollout-trace, redact=False:            {t_plain:.2f} s ({args.spans / t_plain:,.0f} spans/s)")
    print(f"  straight-line decode+JSON+Arrow+zstd:   {t_straight:.2f} s ({args.spans / t_straight:,.0f} spans/s)")
    print(
        f"  ratio rollout-trace / straight-line = {t_ours / t_straight:.2f}x with secret redaction (default), "
        f"{t_plain / t_straight:.2f}x without (the straight line does none) (target <= 2x)"
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

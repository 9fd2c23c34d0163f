"""token2text at GPU-sized turns: tokens made durable per second, ours against ids only and a floor.

Workload: llm spans of 512 prompt ids and 2,048 response ids with one logprob
each, distinct per span, ids that decode to text (windows of this repository's
docs and code encoded with the Qwen vocabulary, built locally). The traced
call receives Python lists, as verl's agent loop hands them over.

1. ours, token2text: ``tracer.init(token2text=True)``, decorated calls timed
   from the first call until ``tracer.flush()`` returns (everything durable).
2. ours, ids only: the same with ``token2text=False``.
3. floor: the same ids and logprobs (numpy arrays, built before timing) plus
   both decoded texts (the tokenizer's Rust ``decode_batch``) as list and
   string columns of one zstd Arrow IPC stream, written and fsynced; no
   per-token text, no JSON, no redaction.

The three run alternating in one process; the figure is the median of the
rounds. ``--random-ids`` draws ids uniformly from the vocabulary instead
(they decode to odd bytes and split characters: the slow path of per-token
text).

GIL (issue 27, item 4): a Python-heavy foreground loop counts its own
iterations per second alone, while the writer thread encodes token2text
spans, and while a writer process does (the foreground then pays only for
handing the records over a pipe). The figure decides thread or process.

    python bench/bench_tokens.py [--spans 200] [--rounds 5] [--json bench/results/bench_tokens.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import tracer  # noqa: E402

PROMPT, RESPONSE = 512, 2048
LEVEL = 1


def load_tokenizer() -> Any:
    from rollout.tokenizer import load_qwen_tokenizer

    return load_qwen_tokenizer()


def make_data(tok: Any, n_spans: int, random_ids: bool) -> list[tuple[list[int], list[int], list[float]]]:
    """Distinct (prompt ids, response ids, logprobs) per span."""
    rng = random.Random(0)
    if random_ids:
        vocab = 151643
        text_ids = [rng.randrange(vocab) for _ in range(n_spans * (PROMPT + RESPONSE))]
    else:
        paths = sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) + sorted(
            glob.glob(os.path.join(REPO, "tracer", "**", "*.py"), recursive=True)
        )
        parts = []
        for path in paths:
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
        corpus = "\n".join(parts)
        text_ids = tok.encode(corpus)
    out = []
    for _ in range(n_spans):
        a = rng.randrange(0, len(text_ids) - PROMPT - RESPONSE)
        lps = [-rng.random() * 3 for _ in range(RESPONSE)]
        out.append((text_ids[a : a + PROMPT], text_ids[a + PROMPT : a + PROMPT + RESPONSE], lps))
    return out


class Engine:
    """Answers each call with the next response of the data (calls come in order)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.responses: Any = iter(())

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling_params: dict) -> dict:
        ids, logprobs = next(self.responses)
        return {"response_ids": ids, "logprobs": logprobs, "finish_reason": "stop"}


async def program(engine: Engine, data: list[tuple[list[int], list[int], list[float]]]) -> None:
    engine.responses = iter([(r, lp) for _, r, lp in data])
    for i, (p, _, _) in enumerate(data):
        with tracer.rollout_trace_attr(sample_index=i // 8, step=0, rollout_n=i % 8):
            await engine.generate(p, {"temperature": 1.0})


def run_ours(tok: Any, data: list[Any], out_dir: str, token2text: bool) -> float:
    tracer.init(output_dir=out_dir, token2text=token2text, tokenizer=tok)
    engine = Engine(tok)
    t0 = time.perf_counter()
    asyncio.run(program(engine, data))
    result = tracer.flush()
    elapsed = time.perf_counter() - t0
    tracer.shutdown()
    assert result.ok, result.message
    return elapsed


def run_floor(tok: Any, arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]], path: str) -> float:
    """The same ids, logprobs and decoded texts as one zstd Arrow stream: nothing else."""
    backend = tok.backend_tokenizer
    t0 = time.perf_counter()
    prompts = [p for p, _, _ in arrays]
    responses = [r for _, r, _ in arrays]
    lps = [lp for _, _, lp in arrays]
    prompt_text = backend.decode_batch([p.tolist() for p in prompts], skip_special_tokens=False)
    response_text = backend.decode_batch([r.tolist() for r in responses], skip_special_tokens=False)

    def lists(parts: list[np.ndarray], typ: pa.DataType) -> pa.Array:
        offsets = np.zeros(len(parts) + 1, dtype=np.int32)
        np.cumsum([len(x) for x in parts], out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(parts), type=typ))

    table = pa.table(
        {
            "prompt_ids": lists(prompts, pa.int32()),
            "prompt_text": pa.array(prompt_text, pa.string()),
            "response_ids": lists(responses, pa.int32()),
            "response_text": pa.array(response_text, pa.string()),
            "logprobs": lists(lps, pa.float32()),
        }
    )
    with open(path, "wb") as f:
        opts = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", LEVEL))
        with pa.ipc.new_stream(f, table.schema, options=opts) as w:
            w.write_table(table, max_chunksize=8192)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def check_token_texts(out_dir: str) -> int:
    """Every llm turn read back has one text per token, joined = its text; returns how many turns."""
    from tracer.summary import span_turns

    turns = 0
    for turn in span_turns(tracer.read_spans(out_dir)):
        if turn.token_ids:
            assert turn.token_texts is not None and len(turn.token_texts) == len(turn.token_ids)
            assert "".join(turn.token_texts) == turn.text
            turns += 1
    return turns


# -- GIL: the foreground's own throughput beside the writer --------------------


def foreground(seconds: float) -> float:
    """A Python-heavy loop (dicts, strings, small ints): iterations per second over ``seconds``."""
    n = 0
    acc: dict[int, str] = {}
    end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while True:
        for i in range(200):
            acc[i] = str(i * 7 + n)
        n += 1
        if time.perf_counter() >= end:
            break
    return n / (time.perf_counter() - t0)


def _child(conn: Any, out_dir: str) -> None:
    sys.path.insert(0, REPO)
    tok = load_tokenizer()
    tracer.init(output_dir=out_dir, token2text=True, tokenizer=tok)
    engine = Engine(tok)
    conn.send("ready")
    while True:
        data = conn.recv()
        if data is None:
            break
        asyncio.run(program(engine, data))
        conn.send(bool(tracer.flush().ok))
    tracer.shutdown()


def gil_figures(tok: Any, data: list[Any], tmp: str, seconds: float) -> dict[str, float]:
    """Foreground iterations/s alone, beside the writer thread, beside a writer process."""
    out: dict[str, float] = {}
    out["alone"] = foreground(seconds)
    # Thread: the spans are recorded first (buffered), then the foreground runs while the writer drains them.
    d = os.path.join(tmp, "gil-thread")
    tracer.init(output_dir=d, token2text=True, tokenizer=tok, flush_interval_s=3600, max_buffered_spans=10**6)
    engine = Engine(tok)
    asyncio.run(program(engine, data))
    done: list[float] = []
    t = threading.Thread(target=lambda: done.append(float(bool(tracer.flush().ok))))
    t0 = time.perf_counter()
    t.start()
    out["writer_thread"] = foreground(seconds)
    t.join()
    out["thread_writer_s"] = time.perf_counter() - t0
    tracer.shutdown()
    # Process: the foreground hands the records over a pipe; a child encodes and writes them.
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, os.path.join(tmp, "gil-process")))
    proc.start()
    assert parent.recv() == "ready"
    t0 = time.perf_counter()
    sender = threading.Thread(target=parent.send, args=(data,))
    sender.start()
    out["writer_process"] = foreground(seconds)
    sender.join()
    assert parent.recv() is True
    out["process_writer_s"] = time.perf_counter() - t0
    parent.send(None)
    proc.join(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--random-ids", action="store_true", help="ids drawn uniformly from the vocabulary")
    ap.add_argument("--gil-seconds", type=float, default=2.0, help="foreground run per GIL case (0: skip)")
    ap.add_argument("--json", help="write the figures here (bench/results/bench_tokens.json)")
    args = ap.parse_args()

    tok = load_tokenizer()
    data = make_data(tok, args.spans, args.random_ids)
    arrays = [(np.asarray(p, np.int32), np.asarray(r, np.int32), np.asarray(lp, np.float32)) for p, r, lp in data]
    tokens = args.spans * (PROMPT + RESPONSE)
    tmp = tempfile.mkdtemp(prefix="bench-tokens-")
    try:
        # Untimed warm-up: imports, the tokenizer's piece table, pyarrow's first arrays.
        run_ours(tok, data[:8], os.path.join(tmp, "warm-t"), True)
        run_ours(tok, data[:8], os.path.join(tmp, "warm-i"), False)
        run_floor(tok, arrays[:8], os.path.join(tmp, "warm.arrow"))
        times: dict[str, list[float]] = {"token2text": [], "ids_only": [], "floor": []}
        for r in range(args.rounds):
            for name in times:
                gc.collect()
                path = os.path.join(tmp, f"{name}-{r}")
                if name == "floor":
                    times[name].append(run_floor(tok, arrays, path + ".arrow"))
                else:
                    times[name].append(run_ours(tok, data, path, name == "token2text"))
            turns = check_token_texts(os.path.join(tmp, f"token2text-{r}"))
            assert turns == args.spans, turns
            print(
                f"round {r}: " + ", ".join(f"{k} {tokens / v[-1] / 1e6:.2f} M tokens/s" for k, v in times.items()),
                flush=True,
            )
        med = {k: statistics.median(v) for k, v in times.items()}
        rate = {k: tokens / v / 1e6 for k, v in med.items()}
        vs_ids = med["token2text"] / med["ids_only"]
        vs_floor = med["token2text"] / med["floor"]
        print(
            f"median of {args.rounds}: token2text {rate['token2text']:.2f}, ids only {rate['ids_only']:.2f}, "
            f"floor {rate['floor']:.2f} M tokens/s; token2text / ids only {vs_ids:.2f}x, / floor {vs_floor:.2f}x"
        )
        gil: dict[str, float] = {}
        if args.gil_seconds > 0:
            gil = gil_figures(tok, data, tmp, args.gil_seconds)
            print(
                f"foreground loop: alone {gil['alone']:.0f}/s; beside the writer thread "
                f"{gil['writer_thread']:.0f}/s ({gil['alone'] / gil['writer_thread']:.2f}x slower; writer done "
                f"in {gil['thread_writer_s']:.1f} s); beside a writer process {gil['writer_process']:.0f}/s "
                f"({gil['alone'] / gil['writer_process']:.2f}x slower; done in {gil['process_writer_s']:.1f} s)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        ids_kind = (
            "uniformly random ids (odd bytes, split characters)" if args.random_ids else "ids that decode to text"
        )
        gil_text = ""
        if gil:
            gil_text = (
                f"; a Python foreground loop beside the writer thread ran {gil['alone'] / gil['writer_thread']:.2f}x "
                f"slower than alone, beside a writer process {gil['alone'] / gil['writer_process']:.2f}x"
            )
        row = {
            "bench": "bench_tokens",
            "what": (
                f"token2text on llm spans of {PROMPT} prompt + {RESPONSE} response ids with logprobs, distinct per "
                f"span, {ids_kind}: ours with token2text vs ours ids only vs a floor (same ids, logprobs and "
                "decode_batch text as zstd Arrow from numpy), one process, alternating" + gil_text
            ),
            "command": "python bench/bench_tokens.py" + (" --random-ids" if args.random_ids else ""),
            "figure": (
                f"{vs_ids:.2f}x ids only, {vs_floor:.2f}x floor (token2text {rate['token2text']:.2f}, ids only "
                f"{rate['ids_only']:.2f}, floor {rate['floor']:.2f} M tokens/s)"
            ),
            "target": "token2text <= 2x ids only and <= 4x the floor",
            "met": bool(vs_ids <= 2 and vs_floor <= 4),
            "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(row, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

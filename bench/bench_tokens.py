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
rounds (wall clock), with the ratios of the process's CPU seconds beside it
(all threads: less moved by other work on a shared machine). ``--random-ids`` also measures ids drawn uniformly from the
vocabulary (they decode to odd bytes and split characters: the slow path of
per-token text).

GIL (issue 27, item 4): a Python-heavy foreground loop counts its own
iterations per second alone, while the writer thread encodes token2text
spans, and while a writer process does (the foreground then pays only for
handing the records over a pipe). The figure decides thread or process.

    python bench/bench_tokens.py [--spans 200] [--rounds 5] [--random-ids] [--json bench/results/bench_tokens.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import write_result  # noqa: E402

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


def run_ours(tok: Any, data: list[Any], out_dir: str, token2text: bool) -> tuple[float, float]:
    """Wall and process CPU seconds from the first call until everything is durable."""
    tracer.init(output_dir=out_dir, token2text=token2text, tokenizer=tok)
    engine = Engine(tok)
    t0, c0 = time.perf_counter(), time.process_time()
    asyncio.run(program(engine, data))
    result = tracer.flush()
    elapsed = time.perf_counter() - t0, time.process_time() - c0
    tracer.shutdown()
    assert result.ok, result.message
    return elapsed


def run_floor(tok: Any, arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]], path: str) -> tuple[float, float]:
    """The same ids, logprobs and decoded texts as one zstd Arrow stream: nothing else (wall, CPU seconds)."""
    backend = tok.backend_tokenizer
    t0, c0 = time.perf_counter(), time.process_time()
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
    return time.perf_counter() - t0, time.process_time() - c0


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


def foreground(until: threading.Event | float) -> float:
    """A Python-heavy loop (dicts, strings, small ints): iterations per second until ``until`` (an event or seconds)."""
    n = 0
    acc: dict[int, str] = {}
    end = time.perf_counter() + until if isinstance(until, float) else None
    t0 = time.perf_counter()
    while True:
        for i in range(200):
            acc[i] = str(i * 7 + n)
        n += 1
        if (time.perf_counter() >= end) if end is not None else until.is_set():  # type: ignore[union-attr]
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


def _flush_then(ok: list[bool], done: threading.Event) -> None:
    ok.append(bool(tracer.flush().ok))
    done.set()


def _hand_over(conn: Any, data: list[Any], ok: list[bool], done: threading.Event) -> None:
    conn.send(data)
    ok.append(conn.recv())
    done.set()


def gil_figures(tok: Any, data: list[Any], tmp: str, seconds: float, rounds: int) -> dict[str, float]:
    """Foreground iterations/s alone, and while a writer thread or a writer process encodes ``data``: medians."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, os.path.join(tmp, "gil-process")))
    proc.start()
    assert parent.recv() == "ready"
    runs: dict[str, list[float]] = {k: [] for k in ("alone", "writer_thread", "writer_process")}
    for r in range(rounds):
        runs["alone"].append(foreground(seconds))
        # Thread: the spans are recorded first (buffered); the foreground runs while the writer drains them.
        tracer.init(
            output_dir=os.path.join(tmp, f"gil-thread-{r}"),
            token2text=True,
            tokenizer=tok,
            flush_interval_s=3600,
            max_buffered_spans=10**6,
        )
        asyncio.run(program(Engine(tok), data))
        done = threading.Event()
        ok: list[bool] = []
        t = threading.Thread(target=_flush_then, args=(ok, done))
        t.start()
        runs["writer_thread"].append(foreground(done))
        t.join()
        tracer.shutdown()
        # Process: the records go over a pipe (a helper thread sends them); a child records, encodes, writes.
        done = threading.Event()
        t = threading.Thread(target=_hand_over, args=(parent, data, ok, done))
        t.start()
        runs["writer_process"].append(foreground(done))
        t.join()
        assert ok == [True, True]
    parent.send(None)
    proc.join(60)
    return {k: statistics.median(v) for k, v in runs.items()}


def measure(tok: Any, data: list[Any], tmp: str, rounds: int, label: str) -> dict[str, float]:
    """Median seconds of ours with token2text, ours ids only and the floor, alternating, on ``data``."""
    arrays = [(np.asarray(p, np.int32), np.asarray(r, np.int32), np.asarray(lp, np.float32)) for p, r, lp in data]
    tokens = len(data) * (PROMPT + RESPONSE)
    # Untimed warm-up: imports, the tokenizer's piece table, pyarrow's first arrays.
    run_ours(tok, data[:8], os.path.join(tmp, f"{label}-warm-t"), True)
    run_ours(tok, data[:8], os.path.join(tmp, f"{label}-warm-i"), False)
    run_floor(tok, arrays[:8], os.path.join(tmp, f"{label}-warm.arrow"))
    times: dict[str, list[float]] = {"token2text": [], "ids_only": [], "floor": []}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    for r in range(rounds):
        for name in times:
            gc.collect()
            path = os.path.join(tmp, f"{label}-{name}-{r}")
            if name == "floor":
                wall, used = run_floor(tok, arrays, path + ".arrow")
            else:
                wall, used = run_ours(tok, data, path, name == "token2text")
            times[name].append(wall)
            cpu[name].append(used)
        assert check_token_texts(os.path.join(tmp, f"{label}-token2text-{r}")) == len(data)
        print(
            f"{label} round {r}: " + ", ".join(f"{k} {tokens / v[-1] / 1e6:.2f} M tokens/s" for k, v in times.items()),
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: tokens / v / 1e6 for k, v in med.items()}
    out = {**{f"{k}_mtok_s": v for k, v in rate.items()}}
    out["vs_ids"] = med["token2text"] / med["ids_only"]
    out["vs_floor"] = med["token2text"] / med["floor"]
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    out["cpu_vs_ids"] = med_cpu["token2text"] / med_cpu["ids_only"]
    out["cpu_vs_floor"] = med_cpu["token2text"] / med_cpu["floor"]
    out["load"] = os.getloadavg()[0]
    print(
        f"{label}, median of {rounds}: token2text {rate['token2text']:.2f}, ids only {rate['ids_only']:.2f}, "
        f"floor {rate['floor']:.2f} M tokens/s; token2text / ids only {out['vs_ids']:.2f}x, "
        f"/ floor {out['vs_floor']:.2f}x; CPU seconds: {out['cpu_vs_ids']:.2f}x ids only, "
        f"{out['cpu_vs_floor']:.2f}x floor; load {out['load']:.1f}"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--random-ids", action="store_true", help="also measure ids drawn uniformly from the vocabulary")
    ap.add_argument("--gil-seconds", type=float, default=2.0, help="foreground run per GIL case (0: skip)")
    ap.add_argument("--json", help="write the figures here (bench/results/bench_tokens.json)")
    args = ap.parse_args()

    tok = load_tokenizer()
    data = make_data(tok, args.spans, False)
    tmp = tempfile.mkdtemp(prefix="bench-tokens-")
    gil: dict[str, float] = {}
    rnd: dict[str, float] = {}
    try:
        txt = measure(tok, data, tmp, args.rounds, "text ids")
        if args.random_ids:
            rnd = measure(tok, make_data(tok, args.spans, True), tmp, args.rounds, "random ids")
        if args.gil_seconds > 0:
            gil = gil_figures(tok, data, tmp, args.gil_seconds, args.rounds)
            print(
                f"foreground loop, median of {args.rounds}: alone {gil['alone']:.0f}/s; while the writer thread "
                f"works {gil['writer_thread']:.0f}/s ({gil['alone'] / gil['writer_thread']:.2f}x slower); while a "
                f"writer process works {gil['writer_process']:.0f}/s ({gil['alone'] / gil['writer_process']:.2f}x)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.json:
        return
    what = (
        f"token2text on llm spans of {PROMPT} prompt + {RESPONSE} response ids with logprobs, distinct per span, "
        "ids that decode to text (this repository's docs and code): ours with token2text vs ours ids only vs a "
        "floor (same ids, logprobs and decode_batch text as zstd Arrow from numpy), one process, alternating"
    )
    if rnd:
        what += (
            f". Uniformly random ids (odd bytes, split characters: the slow path) are slower: "
            f"{rnd['vs_ids']:.2f}x ids only, {rnd['vs_floor']:.2f}x floor"
        )
    if gil:
        thread, process = gil["alone"] / gil["writer_thread"], gil["alone"] / gil["writer_process"]
        what += (
            f". GIL: a Python foreground loop ran {thread:.2f}x slower than alone while the writer thread "
            f"encoded token2text spans, {process:.2f}x while a writer process did (records sent over a pipe): "
            + (
                "a writer process would be cheaper to the caller"
                if process < thread * 0.8
                else "the writer stays a thread (a process is not clearly cheaper to the caller)"
            )
        )
    row = {
        "bench": "bench_tokens",
        "what": what,
        "command": "python bench/bench_tokens.py --random-ids --json bench/results/bench_tokens.json",
        "figure": (
            f"{txt['vs_ids']:.2f}x ids only, {txt['vs_floor']:.2f}x floor (token2text {txt['token2text_mtok_s']:.2f}, "
            f"ids only {txt['ids_only_mtok_s']:.2f}, floor {txt['floor_mtok_s']:.2f} M tokens/s; CPU seconds "
            f"{txt['cpu_vs_ids']:.2f}x ids only, {txt['cpu_vs_floor']:.2f}x floor; load {txt['load']:.1f} on "
            f"{os.cpu_count()} cores)"
        ),
        "target": "token2text <= 2x ids only and <= 4x the floor",
        "met": bool(txt["vs_ids"] <= 2 and txt["vs_floor"] <= 4),
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    write_result(args.json, row)


if __name__ == "__main__":
    main()

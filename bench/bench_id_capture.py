"""Token id lists captured as tuples (what the recorder does) against kept as the orjson text its id check
already writes, then written through ``orjson.Fragment`` (issue 13: a lead for the recording target).

Per span: a 384-id prompt and a 128-id response checked and captured on the caller's side, 1,000 spans
buffered (as the recorder buffers them), then the writer's JSON of the inputs and outputs; a third
variant also parses the ids back into ints, which token2text's decode (and the history's prefix
check) need. Process CPU per span, median of 5, the variants taking turns in one process.

    python bench/bench_id_capture.py
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orjson  # noqa: E402

from tracer.record.capture import _DIGITS, _INT_CHECK_OPTS, int_kind  # noqa: E402

rng = random.Random(0)
N, BUF = 10000, 1000
data = [([rng.randrange(50000) for _ in range(384)], [rng.randrange(50000) for _ in range(128)]) for _ in range(N)]


def tuples() -> int:
    out = []
    t = 0
    for p, r in data:
        if int_kind(p) and int_kind(r):
            out.append(
                (
                    {"prompt_ids": tuple(p), "sampling_params": {"temperature": 1.0}},
                    {"response_ids": tuple(r), "finish_reason": "stop"},
                )
            )
        if len(out) == BUF:
            for i, o in out:
                t += len(orjson.dumps(i)) + len(orjson.dumps(o))
            out = []
    return t


def frag(text: bytes) -> bool:
    rest = text.translate(None, _DIGITS)
    return rest == b"[]"


def fragments() -> int:
    out = []
    t = 0
    for p, r in data:
        a = orjson.dumps(p, option=_INT_CHECK_OPTS)
        b = orjson.dumps(r, option=_INT_CHECK_OPTS)
        if frag(a) and frag(b):
            out.append(
                (
                    {"prompt_ids": a, "sampling_params": {"temperature": 1.0}},
                    {"response_ids": b, "finish_reason": "stop"},
                )
            )
        if len(out) == BUF:
            for i, o in out:
                t += len(orjson.dumps({**i, "prompt_ids": orjson.Fragment(i["prompt_ids"])})) + len(
                    orjson.dumps({**o, "response_ids": orjson.Fragment(o["response_ids"])})
                )
            out = []
    return t


def fragments_parse() -> int:
    """Also the ids parsed back into ints (token2text's decode needs them)."""
    out = []
    t = 0
    for p, r in data:
        a = orjson.dumps(p, option=_INT_CHECK_OPTS)
        b = orjson.dumps(r, option=_INT_CHECK_OPTS)
        if frag(a) and frag(b):
            out.append((a, b))
        if len(out) == BUF:
            for a, b in out:
                ids = orjson.loads(a)
                rids = orjson.loads(b)
                t += len(ids) + len(rids) + len(orjson.dumps({"prompt_ids": orjson.Fragment(a)}))
            out = []
    return t


def main() -> None:
    res: dict[str, list[float]] = {f.__name__: [] for f in (tuples, fragments, fragments_parse)}
    for _ in range(5):
        for f in (tuples, fragments, fragments_parse):
            gc.collect()
            c = time.process_time()
            f()
            res[f.__name__].append(time.process_time() - c)
    for k, v in res.items():
        print(f"{k:16s} {statistics.median(v) * 1e6 / N:6.1f} us/span (median of 5, process CPU)")
    assert tuples() and fragments()


if __name__ == "__main__":
    main()

"""Token id lists captured as tuples (what the recorder does) against kept as the orjson text its id check
already writes, then written through ``orjson.Fragment`` (issue 13: a lead for the recording target).

Per span: a 384-id prompt and a 128-id response checked and captured on the caller's side, 1,000 spans
buffered (as the recorder buffers them), then the writer's JSON of the inputs and outputs; a third
variant does the same and also parses the ids back into ints, which token2text's decode (and the history's prefix
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
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orjson  # noqa: E402

from tracer.record.capture import _DIGITS, _INT_CHECK_OPTS, int_kind  # noqa: E402

rng = random.Random(0)
N, BUF = 10000, 1000
data = [([rng.randrange(50000) for _ in range(384)], [rng.randrange(50000) for _ in range(128)]) for _ in range(N)]


def _record(p: Any, r: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The inputs and outputs of one llm span holding ``p`` and ``r`` as captured."""
    return {"prompt_ids": p, "sampling_params": {"temperature": 1.0}}, {"response_ids": r, "finish_reason": "stop"}


def _checked_text(ids: list[int]) -> bytes | None:
    """``ids`` as the JSON text int_kind's check writes, when that text holds only non-negative ints."""
    text = orjson.dumps(ids, option=_INT_CHECK_OPTS)
    return text if text.translate(None, _DIGITS) == b"[]" else None


def _run(capture: Callable[[list[int]], Any], write: Callable[[dict[str, Any], dict[str, Any]], int]) -> int:
    """Each span's ids captured on the caller's side, BUF spans buffered, then written: what the recorder does."""
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    t = 0
    for p, r in data:
        a, b = capture(p), capture(r)
        if a is not None and b is not None:
            out.append(_record(a, b))
        if len(out) == BUF:
            t += sum(write(i, o) for i, o in out)
            out = []
    return t


def _as_tuple(ids: list[int]) -> tuple[int, ...] | None:
    return tuple(ids) if int_kind(ids) else None


def _write_tuples(i: dict[str, Any], o: dict[str, Any]) -> int:
    return len(orjson.dumps(i)) + len(orjson.dumps(o))


def _write_fragments(i: dict[str, Any], o: dict[str, Any]) -> int:
    return len(orjson.dumps({**i, "prompt_ids": orjson.Fragment(i["prompt_ids"])})) + len(
        orjson.dumps({**o, "response_ids": orjson.Fragment(o["response_ids"])})
    )


def _write_fragments_parsed(i: dict[str, Any], o: dict[str, Any]) -> int:
    """As _write_fragments, and the ids parsed back into ints (token2text's decode needs them)."""
    ids, rids = orjson.loads(i["prompt_ids"]), orjson.loads(o["response_ids"])
    return len(ids) + len(rids) + _write_fragments(i, o)


def tuples() -> int:
    return _run(_as_tuple, _write_tuples)


def fragments() -> int:
    return _run(_checked_text, _write_fragments)


def fragments_parse() -> int:
    return _run(_checked_text, _write_fragments_parsed)


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

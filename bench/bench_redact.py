"""Secret redaction of text with no secret: today's redactor against the one before key=value scanning.

Both run in one process on the same texts (a 2 KB reply in prose, an OpenAI
tool call's JSON, Python code, and one reply split into 512 per-token texts
through ``Redactor.pieces``): the earlier module is loaded from git
(``--base REV``: ``tracer/record/redact.py`` at a commit before key=value
scanning, default ``d8887ef``). Text with no secret is the common
case the pre-scan must keep cheap; the ratio is today's time over the base's.

    python bench/bench_redact.py [--base REV] [--rounds 20]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from report import write_result  # noqa: E402

from tracer.record import redact as today  # noqa: E402

PROSE = (
    "The model reads the question, plans two tool calls and answers. Each step is scored by the reward "
    "function; a group of rollouts shares one prompt. "
) * 14
TOOL_CALL = json.dumps(
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "search_web", "arguments": json.dumps({"query": "weather in Paris", "top_k": i})},
            }
            for i in range(16)
        ],
    }
)
CODE = (
    "def run_python(code: str, timeout_s: float = 5.0) -> dict:\n"
    "    result = sandbox.execute(code, max_tokens=512, user_id='u1')\n"
    "    return {'stdout': result.stdout, 'exit_code': result.code}\n"
) * 12
PIECES = [f" word{i % 50}" for i in range(512)]


def _load_base(rev: str) -> Any:
    source = subprocess.run(
        ["git", "-C", ROOT, "show", f"{rev}:tracer/record/redact.py"], check=True, capture_output=True, text=True
    ).stdout
    path = os.path.join(tempfile.mkdtemp(), "redact_base.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("redact_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(fn: Any, arg: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="d8887ef")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    base = _load_base(args.base)
    new, old = today.Redactor(environ={}), base.Redactor(environ={})
    cases = (
        ("prose 2 KB", "text", PROSE),
        ("tool-call JSON", "text", TOOL_CALL),
        ("code", "text", CODE),
        ("512 token texts", "pieces", PIECES),
    )
    for label, method, arg in cases:
        assert getattr(new, method)(arg) == arg, label
    # Rounds alternate today and base on every case; each keeps its best round (the least disturbed).
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for label, method, arg in cases:
            for side, redactor in (("today", new), ("base", old)):
                t = _time(getattr(redactor, method), arg, 500)
                best[label, side] = min(best.get((label, side), t), t)
    rows = []
    for label, _, _ in cases:
        rows.append((label, best[label, "today"], best[label, "base"]))
        print(
            f"{label:16s} today {rows[-1][1]:7.2f} us  base {rows[-1][2]:7.2f} us  ratio {rows[-1][1] / rows[-1][2]:5.2f}x"
        )
    worst = max(r[1] / r[2] for r in rows)
    figure = "; ".join(f"{label} {n:.1f} vs {o:.1f} us" for label, n, o in rows)
    result = {
        "bench": "redact",
        "what": "Redactor on text with no secret: today vs the redactor before key=value scanning, one process",
        "command": f"python bench/bench_redact.py --base {args.base} --rounds {args.rounds}",
        "figure": f"worst {worst:.2f}x base ({figure})",
        "target": "within 2x of the base on text with no secret",
        "met": worst <= 2.0,
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    write_result(os.path.join(ROOT, "bench", "results", "redact.json"), result)


if __name__ == "__main__":
    main()

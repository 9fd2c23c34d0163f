"""What the group page sends to the browser for 64 long-context rollouts of one prompt.

Records one step with one prompt and ``--rollouts`` rollouts (default 64),
each a conversation of ``--turns`` assistant/tool turn pairs of ``--chars``
characters each, then draws the group page through Streamlit's ``AppTest``
twice in one process and sums the serialized size of every element sent:

- the page as it opens (the first cards, no conversation sent);
- every card and every conversation opened (what an unbounded page sends).

Usage::

    python bench/bench_group_page.py                 # 64 rollouts x 12 turn pairs x 8,000 characters
    python bench/bench_group_page.py --rollouts 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tracer  # noqa: E402

RESULT = os.path.join(REPO, "bench", "results", "group_page.json")
APP = os.path.join(REPO, "viewer", "app.py")
#: The page may send at most this fraction of what the unbounded page sends.
TARGET_RATIO = 0.2


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(turn: int, text: str) -> dict[str, Any]:
    return {"response_text": text, "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="tool", name="search")
def _search(turn: int, text: str) -> str:
    return text


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _rollout(n: int, turns: int, chars: int) -> dict[str, Any]:
    body = ("The retrieved passage says the value is 42 and cites three sources. " * (chars // 60 + 1))[:chars]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a research agent."},
        {"role": "user", "content": "Which value do the sources agree on?"},
    ]
    for t in range(turns):
        reply = f"turn {t} of rollout {n}: " + body
        _generate(t, reply)
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "tool", "name": "search", "content": _search(t, body)})
    messages.append({"role": "assistant", "content": f"The sources agree on 42 (rollout {n})."})
    return {"messages": messages}


def record(out: str, rollouts: int, turns: int, chars: int) -> str:
    """Record one group of ``rollouts`` long conversations; the run's directory."""
    cfg = tracer.init(project_name="bench", experiment_name="group", backend="arrow", output_dir=out)
    for n in range(rollouts):
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=n):
            _rollout(n, turns, chars)
            tracer.log_reward(float(n % 2), advantage=float(n % 2) - 0.5, ground_truth="42")
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


def page_bytes(at: Any) -> int:
    """Serialized bytes of every element and block of the page AppTest drew."""
    total = 0
    stack = [at._tree]
    while stack:
        node = stack.pop()
        proto = getattr(node, "proto", None)
        if proto is not None:
            total += len(proto.SerializeToString())
        children = getattr(node, "children", None)
        if children:
            stack.extend(children.values())
    return total


def draw(run: str, open_everything: bool) -> int:
    """Bytes of the group page, as it opens or with every card and conversation opened."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=600)
    for k, v in {"path": run, "view": "group", "step": "1", "sample_index": "0"}.items():
        at.query_params[k] = v
    at.run()
    if open_everything:
        ids = [r["trace_id"] for r in tracer.read_trajectories(run).to_pylist()]
        at.session_state["cards_1_0"] = len(ids)
        for tid in ids:
            at.session_state[f"conv_{tid}"] = True
            at.session_state[f"msgs_{tid}"] = 10**6
        at.run()
    assert not at.exception, at.exception
    return page_bytes(at)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--chars", type=int, default=8000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ROLLOUT_TRACE_VIEW_ALLOW"] = tmp
        run = record(tmp, args.rollouts, args.turns, args.chars)
        bounded = draw(run, open_everything=False)
        unbounded = draw(run, open_everything=True)
    ratio = bounded / unbounded
    print(f"group page as it opens:            {bounded / 1e6:8.2f} MB")
    print(f"every card and conversation sent:  {unbounded / 1e6:8.2f} MB")
    print(f"ratio: {ratio:.3f} (target <= {TARGET_RATIO})")
    result = {
        "bench": "bench_group_page",
        "what": f"bytes the group page sends for {args.rollouts} rollouts x {args.turns} turn pairs x "
        f"{args.chars:,} characters, as it opens vs every card and conversation opened (same process)",
        "command": "python bench/bench_group_page.py",
        "figure": f"{bounded / 1e6:.2f} MB vs {unbounded / 1e6:.2f} MB ({ratio:.3f}x)",
        "target": f"<= {TARGET_RATIO}x the unbounded page",
        "met": ratio <= TARGET_RATIO,
        "measured": datetime.date.today().isoformat(),
    }
    with open(RESULT, "w", encoding="utf-8") as f:
        json.dump([result], f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

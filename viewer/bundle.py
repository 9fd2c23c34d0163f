"""``rollout-trace bundle RUN [--step K] [--trace-id ID ...] -o FILE.html``: what you are looking at, in one file.

One self-contained HTML page (inline style and script, no remote resource,
no server) with the run's config and, per chosen trajectory: its question
and final answer, its group's rewards and advantages, the conversation with
tool calls, and the token view of each llm turn. Every string from the trace
files is HTML-escaped. The file is bounded (:data:`DEFAULT_MAX_MB`): a
bundle that would be bigger is refused with a message naming the size and
how to choose fewer trajectories.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer
from tracer.cli.terminal import terminal_text
from tracer.questions import ground_truth, questions_and_answers
from viewer import data as D
from viewer.format import short

#: Size bound of a bundle, in MB (``--max-mb``).
DEFAULT_MAX_MB = 20.0
#: Trajectories a bundle holds at most (``--step`` picks the step's first ones).
MAX_TRAJECTORIES = 64
#: Characters of one message, tool argument or result written (the rest is named, not written).
MAX_TEXT_CHARS = 20_000
#: Tokens of one llm turn written in the token view.
MAX_TOKENS = 2048

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px;color:#111;background:#fff}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-top:2px solid #ddd;padding-top:12px}h3{font-size:15px}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:8px;border-radius:4px;margin:4px 0}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.q{font-size:16px;background:#eef4ff}.truth{background:#eefbea}.meta{color:#555}
.badge{background:#fff1d6;border:1px solid #e0a030;border-radius:4px;padding:1px 6px}
.tok{display:inline-block;font:13px monospace;margin:1px;padding:1px 3px;border-radius:3px;white-space:pre}
.role{font-weight:600;color:#334}
#filter{width:60%;padding:6px;font-size:14px}
"""
#: Hides trajectories whose text does not contain the filter's words (no data in the script).
SCRIPT = """
document.getElementById('filter').addEventListener('input', function (e) {
  var q = e.target.value.toLowerCase();
  document.querySelectorAll('section.trajectory').forEach(function (s) {
    s.style.display = s.innerText.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
  });
});
"""


class BundleTooBigError(ValueError):
    """The bundle would exceed its size bound; the message says by how much and what to do."""


def _e(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """``value`` as escaped HTML text, cut to ``limit`` characters with the cut named."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit:,} more characters not in the bundle)"
    return html.escape(text, quote=True)


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell(r.get(c)), 300)}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.4g}"
    return "—" if v is None else str(v)


def _conversation(spans: Any) -> str:
    parts = []
    for m in D.messages(spans):
        calls = "".join(
            f"<pre>→ {_e(c.get('function', {}).get('name'))}({_e(c.get('function', {}).get('arguments'))})</pre>"
            for c in m.get("tool_calls") or []
            if isinstance(c, dict)
        )
        text = D.content_text(m.get("content"))
        parts.append(
            f"<div><span class='role'>{_e(m.get('role'))}</span>"
            + (f" <span class='meta'>{_e(m.get('name'))}</span>" if m.get("name") else "")
            + (f"<pre>{_e(text)}</pre>" if text else "")
            + calls
            + "</div>"
        )
    return "".join(parts) or "<p class='meta'>(no conversation recorded)</p>"


def _decoder(path: str) -> Any:
    """The run's recorded tokenizer as a token decoder, or None (token ids then)."""
    tokenizer = D.run_tokenizer_path(path)
    try:
        return D.load_token_decoder(tokenizer) if tokenizer else None
    except Exception:  # a missing or broken tokenizer leaves token ids in the bundle
        return None


def _tokens(spans: Any, stats: dict[int, dict] | None, decoder: Any) -> str:
    out = []
    for turn in D.token_turns(spans, decoder, stats):
        cells = D.paint(turn.cells()[:MAX_TOKENS], D.COLOR_MISMATCH if turn.stats else D.COLOR_LOGPROB)
        mean, counted = turn.mismatch()
        note = "" if mean is None else f" · mean |rollout − trainer| over {counted} tokens in the loss mask: {mean:.4g}"
        if turn.synthetic:
            note += " <span class='badge'>synthetic trainer stats</span>"
        spans_html = "".join(
            f"<span class='tok' style='background:{c['bg']};color:{c['ink']}' "
            f"title='{_e(f'logprob {_cell(c.get(D.COLOR_LOGPROB))} · mismatch {_cell(c.get(D.MISMATCH))}', 200)}'>"
            f"{_e(c['token'], 200)}</span>"
            for c in cells
        )
        cut = f" (first {MAX_TOKENS:,} of {turn.kept:,})" if turn.kept > MAX_TOKENS else ""
        out.append(f"<h4>turn {turn.index + 1}: {_e(turn.name, 200)} — {turn.kept} tokens{cut}{note}</h4>{spans_html}")
    return "".join(out) or "<p class='meta'>(no llm spans)</p>"


def build_bundle(path: str, step: int | None = None, trace_ids: Sequence[str] = ()) -> str:
    """The bundle's HTML: ``trace_ids`` of the run at ``path``, else the first trajectories of ``step`` (default: the last)."""
    steps = D.list_steps(path).table.column(D.STEP).to_pylist()
    if trace_ids:
        chosen = D.load_trajectories(path).table
        chosen = chosen.filter(pc.is_in(chosen.column(D.TRACE_ID), value_set=pa.array(list(trace_ids))))
    else:
        step = step if step is not None else (steps[-1] if steps else None)
        chosen = D.load_trajectories(path, None if step is None else [step]).table
    rows = chosen.sort_by([(D.STEP, "ascending"), (D.SAMPLE_INDEX, "ascending"), (D.ROLLOUT_N, "ascending")])
    rows = rows.slice(0, MAX_TRAJECTORIES)
    ids = rows.column(D.TRACE_ID).to_pylist()
    spans = D.split_by_trace(D.load_group_spans(path, ids, None).table) if ids else {}
    qa = questions_and_answers(pa.concat_tables(list(spans.values()))) if spans else {}
    every = D.load_trajectories(path, sorted({s for s in rows.column(D.STEP).to_pylist() if s is not None})).table
    token_stats = tracer.read_token_stats(path) if D.has_token_stats(path) else None
    config = tracer.read_run_config(path)
    decoder = _decoder(path)
    sections = []
    for r in rows.to_pylist():
        tid = r[D.TRACE_ID]
        question, answer = qa.get(tid, (None, None))
        group = D.list_rows(D.group(every, r[D.STEP], r[D.SAMPLE_INDEX]) if r[D.STEP] is not None else rows.slice(0, 0))
        rewards = {g[D.REWARD] for g in group if g[D.REWARD] is not None}
        badge = " <span class='badge'>all rewards equal</span>" if len(group) > 1 and len(rewards) == 1 else ""
        key = (r[D.STEP], r[D.SAMPLE_INDEX], r[D.ROLLOUT_N], r[D.VALIDATE])
        stats = D.turn_stats(token_stats, tid, key) if token_stats is not None else None
        truth = ground_truth(r[D.REWARD_INFO])
        sections.append(
            f"<section class='trajectory' id='{_e(tid, 100)}'>"
            f"<h2>step {_e(r[D.STEP])} · sample {_e(r[D.SAMPLE_INDEX], 100)} · rollout {_e(r[D.ROLLOUT_N])} · "
            f"reward {_e(short(r[D.REWARD]))}</h2>"
            f"<p class='meta'>trace {_e(tid, 100)} · {_e(r[D.STATUS])} · {_e(r[D.NUM_LLM_CALLS])} turns · "
            f"{_e(r[D.NUM_TOOL_CALLS])} tool calls ({_e(r[D.NUM_TOOL_ERRORS])} failed)</p>"
            f"<h3>Question</h3><pre class='q'>{_e(question or '(none found)')}</pre>"
            + (f"<h3>Ground truth</h3><pre class='truth'>{_e(truth)}</pre>" if truth is not None else "")
            + f"<h3>Final answer</h3><pre>{_e(answer or '(none)')}</pre>"
            f"<h3>Group: rewards and advantages{badge}</h3>"
            + _table(group, [D.SHORT_ID_COL, "rollout", D.REWARD, "advantage", D.STATUS, D.ANSWER_COL])
            + f"<details><summary>Conversation and tool calls</summary>{_conversation(spans.get(tid))}</details>"
            f"<details><summary>Tokens of each llm turn</summary>{_tokens(spans.get(tid), stats, decoder)}</details>"
            "</section>"
        )
    what = f"{len(sections)} trajectories" + (f" of step {step}" if not trace_ids and step is not None else "")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>rollout-trace bundle: {_e(path, 200)}</title><style>{STYLE}</style></head><body>"
        f"<h1>rollout-trace bundle</h1><p class='meta'>{_e(path, 500)} · {_e(what)}</p>"
        "<input id='filter' placeholder='filter: text in a question, answer or conversation'>"
        f"<details><summary>Run config</summary><pre>{_e(json.dumps(config, indent=1, default=str))}</pre></details>"
        + "".join(sections)
        + f"<script>{SCRIPT}</script></body></html>"
    )


def write_bundle(html_text: str, out: str, max_mb: float = DEFAULT_MAX_MB) -> int:
    """Write the bundle to ``out``; its size in bytes.

    Raises:
        BundleTooBigError: it is over ``max_mb``.
    """
    data = html_text.encode("utf-8")
    if len(data) > max_mb * 1e6:
        raise BundleTooBigError(
            f"the bundle would be {len(data) / 1e6:.1f} MB, over the {max_mb:g} MB bound; choose fewer trajectories "
            f"(--trace-id ID ..., or another --step) or raise the bound with --max-mb"
        )
    with open(out, "wb") as f:
        f.write(data)
    return len(data)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bundle's flags."""
    p.add_argument("run", help="a run directory (or trace file)")
    p.add_argument("--step", type=int, help="the step whose trajectories to bundle (default: the last step)")
    p.add_argument("--trace-id", action="append", default=[], metavar="ID", help="a trajectory to bundle (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="the HTML file to write")
    p.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB, help=f"size bound (default {DEFAULT_MAX_MB:g} MB)")


def run_bundle(args: argparse.Namespace) -> int:
    """Write the bundle; 2 on a bad path, an empty choice or a bundle over its bound."""
    try:
        if not tracer.list_trace_files(args.run):
            raise FileNotFoundError(f"no trace files (*.arrow) under {args.run!r}")
        text = build_bundle(args.run, args.step, args.trace_id)
        if "class='trajectory'" not in text:
            raise ValueError("no trajectory matches: check --step or --trace-id (rollout-trace info RUN lists steps)")
        size = write_bundle(text, args.output, args.max_mb)
    except (OSError, ValueError) as exc:
        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return 2
    print(terminal_text(f"wrote {args.output} ({size / 1e6:.2f} MB); open it in a browser, no server needed"))
    return 0


def register_bundle(subparsers: Any) -> None:
    """Add ``rollout-trace bundle``."""
    p = subparsers.add_parser(
        "bundle",
        help="write chosen trajectories as one self-contained HTML file to share",
        description="One HTML file (no server, no network) with the run config and, per trajectory, its question, "
        "answer, group rewards and advantages, conversation, tool calls and tokens.",
    )
    add_arguments(p)
    p.set_defaults(func=run_bundle)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m viewer.bundle``: the same as ``rollout-trace bundle``."""
    parser = argparse.ArgumentParser(prog="python -m viewer.bundle", description=__doc__)
    add_arguments(parser)
    return run_bundle(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

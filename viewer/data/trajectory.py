"""One trajectory's data: its spans, summary row, turns, messages, timing, errors and tool calls."""

from __future__ import annotations

import datetime
import json
import string
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer
from tracer.data.rescore import REWARD_LATEST, REWARD_SOURCE
from tracer.read import parse_json_or_text

# Column names, kinds, statuses and attribute keys come from tracer's schema, never spelled here.
from tracer.schema import (
    END_NS,
    ERROR,
    KIND,
    NAME,
    PARENT_SPAN_ID,
    REWARD,
    REWARD_INFO,
    SPAN_ID,
    START_NS,
    STATUS,
    STATUS_ERROR,
    TRACE_ID,
)
from tracer.summary import Turn, span_turns, summarize, trajectory_rewards, trajectory_turns
from viewer.data.runs import ADVANTAGE, ADVANTAGE_COL, LATENCY_COL, LIGHT_SPAN_COLUMNS, Loaded, _json_number, _read_from


def load_trajectory(path: str, trace_id: str, step: int | None = None, files: Sequence[str] | None = None) -> Loaded:
    """Every span of one trajectory, all columns, in start order.

    Args:
        path: The run.
        trace_id: The trajectory.
        step: Its step, when known (a cheaper filter than the trace id).
        files: Read only these files (see :func:`trace_file_index`).
    """
    loaded = _read_from(path, files, trace_ids=[trace_id], steps=None if step is None else [step])
    return Loaded(loaded.table.sort_by([(START_NS, "ascending")]), loaded.warnings)


def trajectory_summary(spans: pa.Table) -> dict[str, Any] | None:
    """A trajectory-table row (see :func:`load_trajectories`) computed from the trajectory's own spans.

    Lets the replay open a deep link without reading the whole step: the
    row is :func:`tracer.summary.summarize` of these spans, so it agrees with
    :func:`tracer.read_trajectories`, except that a reward logged from
    another process without a trace id is not among them (the caller falls
    back to the step's table).
    """
    rows = summarize(spans).to_pylist() if spans.num_rows else []
    if not rows:
        return None
    row = rows[0]
    row[ADVANTAGE_COL] = _json_number(row[REWARD_INFO], ADVANTAGE)
    row[LATENCY_COL] = (row[END_NS] - row[START_NS]) / 1e9
    return row


def find_trajectory(trajectories: pa.Table, trace_id: str) -> dict[str, Any] | None:
    """The trajectory-table row of ``trace_id``, or None."""
    hit = trajectories.filter(pc.equal(trajectories.column(TRACE_ID), trace_id))
    return hit.slice(0, 1).to_pylist()[0] if hit.num_rows else None


#: Column of :func:`reward_sources`: when the reward was logged (UTC, ISO 8601).
REWARD_TIME = "logged at"


def reward_sources(spans: pa.Table) -> list[dict[str, Any]]:
    """Every reward the trajectory's spans hold, oldest first: source, value, time, and which one is its reward.

    The records are :func:`tracer.summary.trajectory_rewards` (what
    :func:`tracer.read_rewards` lists): recorded ``log_reward`` rows,
    ``kind="reward"`` ops and the rows ``rollout-trace rescore`` adds, each
    naming its source; the last is the reward the run's readers report. A
    reward logged from another process without a trace id is not among them.
    """
    records = [r for rs in trajectory_rewards(spans).values() for r in rs]
    out = []
    for i, rec in enumerate(records):
        when = None
        if rec.end_ns:
            try:
                when = datetime.datetime.fromtimestamp(rec.end_ns / 1e9, datetime.timezone.utc).isoformat(
                    timespec="seconds"
                )
            except (OverflowError, OSError, ValueError):  # a time outside the calendar: shown as nanoseconds
                when = f"{rec.end_ns} ns"
        out.append(
            {
                REWARD_SOURCE: rec.source,
                REWARD: rec.reward,
                REWARD_TIME: when,
                REWARD_LATEST: i == len(records) - 1,
            }
        )
    return out


def turns(spans: pa.Table) -> list[Turn]:
    """The trajectory's turns (see :func:`tracer.summary.trajectory_turns`)."""
    by_trace = trajectory_turns(spans)
    return next(iter(by_trace.values())) if len(by_trace) == 1 else [t for ts in by_trace.values() for t in ts]


def messages(spans: pa.Table) -> list[dict[str, Any]]:
    """The trajectory's chat messages (its :func:`turns` as OpenAI messages)."""
    return [t.as_message() for t in turns(spans)]


def content_text(content: Any) -> str:
    """A message's content as plain text (OpenAI content parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                parts.append(json.dumps(p, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, indent=2)


def pretty_json(text: Any) -> str:
    """Indent a JSON string (or object) for display; non-JSON text comes back unchanged."""
    value = parse_json_or_text(text)
    if value is text and isinstance(text, str):
        return text
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def waterfall(spans: pa.Table) -> list[dict[str, Any]]:
    """One row per span for the timing chart: offsets in ms from the trajectory's start, depth, kind, status."""
    rows = spans.select([c for c in LIGHT_SPAN_COLUMNS if c in spans.column_names]).to_pylist()
    if not rows:
        return []
    t0 = min(r[START_NS] for r in rows)
    parent = {r[SPAN_ID]: r[PARENT_SPAN_ID] for r in rows}

    def depth(sid: str) -> int:
        d, seen = 0, set()
        while parent.get(sid) is not None and sid not in seen:
            seen.add(sid)
            sid = parent[sid]
            d += 1
        return d

    out = []
    for i, r in enumerate(sorted(rows, key=lambda r: (r[START_NS], depth(r[SPAN_ID])))):
        d = depth(r[SPAN_ID])
        out.append(
            {
                "span": f"{i:03d} {'  ' * d}{r[NAME]}",
                NAME: r[NAME],
                KIND: r[KIND],
                STATUS: r[STATUS],
                "depth": d,
                "start_ms": (r[START_NS] - t0) / 1e6,
                "end_ms": (r[END_NS] - t0) / 1e6,
                "duration_ms": (r[END_NS] - r[START_NS]) / 1e6,
            }
        )
    return out


def span_errors(spans: pa.Table) -> list[dict[str, Any]]:
    """Spans whose status is error: name, kind, type, message, traceback."""
    out = []
    for r in spans.filter(pc.fill_null(pc.equal(spans.column(STATUS), STATUS_ERROR), False)).to_pylist():
        err = _safe_json(r[ERROR]) or {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        out.append(
            {
                SPAN_ID: r[SPAN_ID],
                NAME: r[NAME],
                KIND: r[KIND],
                "type": str(err.get("type", "")),
                "message": str(err.get("message", "")),
                "traceback": str(err.get("traceback", "")),
            }
        )
    return out


def _safe_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return tracer.parse_json(text)
    except ValueError:
        return text


def tool_spans(spans: pa.Table) -> list[dict[str, Any]]:
    """Tool calls in call order: name, status, arguments, result (as the conversation shows it) and error."""
    out = []
    for t in span_turns(spans):
        if t.role != "tool":
            continue
        err = dict(t.error) if t.error is not None else None
        out.append(
            {
                NAME: t.name,
                STATUS: t.status,
                "arguments": pretty_json(t.arguments) if t.arguments is not None else "",
                "result": "" if err is not None or t.text is None else t.text,
                ERROR: err,
                "duration_ms": ((t.end_ns or 0) - (t.start_ns or 0)) / 1e6,
            }
        )
    return out


def escape_markdown(text: str) -> str:
    """Backslash-escape every ASCII punctuation character so Markdown shows ``text`` literally.

    Streamlit's Markdown never renders raw HTML (no ``unsafe_allow_html``);
    escaping also keeps ``**``, links, autolinks (``www.x``, ``a@b.c``),
    headings, ``:emoji:`` and ``<tags>`` as typed. Control characters other
    than newline and tab are written as ``\\xNN``; a newline becomes a
    Markdown line break.
    """
    out = []
    for ch in text:
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("  \n")
        elif ch != "\t" and (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0):
            out.append(f"\\\\x{ord(ch):02x}")
        elif 0xD800 <= ord(ch) < 0xE000:
            out.append("\ufffd")  # a lone surrogate cannot be sent to the browser
        else:
            out.append(ch)
    return "".join(out)


_MD_SPECIAL = set(string.punctuation)

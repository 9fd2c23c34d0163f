"""The trajectory model: one summary row and one list of turns per trajectory.

Every consumer (the viewer, each exporter, the console) reads trajectories
through this module, so they cannot disagree:

* :func:`summarize` turns span rows of many trajectories into rows of
  :data:`tracer.schema.TRAJECTORY_SCHEMA`, in Arrow (no Python loop over spans);
  :func:`read_trajectories` is the same over trace files.
* :func:`trajectory_turns` turns span rows into each trajectory's
  :class:`Turn` list (system/user prompt, assistant turns with their tokens
  and logprobs, tool results and errors); :func:`trajectory_messages` is that
  list in OpenAI chat format, and :func:`prompt_and_response` its first
  prompt and final response as text.

The definitions, once:

* A **trajectory** is every trace id of the spans (log_reward rows with a
  trace id included; one with only those has no spans and no root).
* The **root** is a span without a parent (a ``kind="rollout"`` one first,
  then the earliest; never a ``log_reward`` row). The **first row** is the
  root, else the earliest span, else the earliest ``log_reward`` row (ties:
  the earlier row); step, sample, rollout and validate come from it.
* **Status** is the root's; ``"incomplete"`` when there is no root (spans
  are written when they end, so a root that never ended is absent).
* **Reward**: the latest ``log_reward`` row (by end time, ties: the later
  row) with the trajectory's trace id; else the latest ``log_reward`` row
  without a trace id whose ``(step, sample_index, rollout_n, validate)``
  equals the trajectory's (a reward logged by another process; nulls equal
  nulls, a null validate is False); else the last ``kind="reward"`` op with a
  reward. ``reward_info`` is the chosen ``log_reward`` row's attributes.
* Counts and times cover every span but ``log_reward`` rows (times: those
  rows' when there is nothing else).

The output shapes agent code returns are recognised in one place (the
``_reply``, ``_prompt`` and ``_tool_result`` functions below): this
project's rollout (a root returning ``{"messages": [...]}``, llm spans with
``response_ids``/``response_text``/``logprobs``), verl's ``TokenOutput``
(``token_ids``, ``log_probs``, ``stop_reason``, token2text's ``token_text``),
verl's ``AgentLoopOutput`` and its tool ``execute`` result
``(ToolResponse, reward, metrics)``, verl's ``extract_tool_calls`` span,
OpenAI chat completions (``choices[0].message``) and message lists, a vLLM
``RequestOutput`` as a dict (``outputs[0].text``/``token_ids``/``logprobs``),
and plain strings.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.schema import parse_json_or_text as _loads

#: Span columns :func:`summarize` needs.
SUMMARY_SPAN_COLUMNS: tuple[str, ...] = (
    S.TRACE_ID,
    S.PARENT_SPAN_ID,
    S.NAME,
    S.KIND,
    S.STATUS,
    S.START_NS,
    S.END_NS,
    S.STEP,
    S.SAMPLE_INDEX,
    S.ROLLOUT_N,
    S.VALIDATE,
    S.REWARD,
    S.ATTRIBUTES,
)

#: Span tables up to this many rows are summarised in Python (same definitions):
#: Arrow's per-call cost dominates for one trajectory (bench/bench_summary.py).
SMALL_SUMMARY_SPANS = 64

#: Span columns :func:`trajectory_turns` reads (missing ones count as null).
TURN_SPAN_COLUMNS: tuple[str, ...] = (
    S.TRACE_ID,
    S.SPAN_ID,
    S.PARENT_SPAN_ID,
    S.NAME,
    S.KIND,
    S.START_NS,
    S.END_NS,
    S.STATUS,
    S.ERROR,
    S.INPUTS,
    S.OUTPUTS,
    S.ATTRIBUTES,
)


def text_field_name(ids_field: str) -> str:
    """``prompt_ids`` -> ``prompt_text``: where token2text puts a token list's decoded text."""
    return ids_field[: -len("_ids")] + "_text" if ids_field.endswith("_ids") else ids_field + "_text"


def token_texts_field_name(ids_field: str) -> str:
    """``response_ids`` -> ``response_token_texts``, ``token_ids`` -> ``token_texts``: where per-token text goes."""
    stem = ids_field[: -len("_ids")] if ids_field.endswith("_ids") else ids_field
    return stem + "_texts" if stem == "token" or stem.endswith("_token") else stem + "_token_texts"


# Where the recognised shapes keep things (first match wins).
#: Keys of a turn's response token ids (ours, verl's TokenOutput, vLLM's).
RESPONSE_ID_KEYS = ("response_ids", "token_ids", "output_ids")
_RESPONSE_TEXT_KEYS = (*(text_field_name(k) for k in RESPONSE_ID_KEYS), "text", "content")
_LOGPROB_KEYS = ("logprobs", "log_probs", "response_logprobs")
_TOKEN_TEXT_KEYS = (*(token_texts_field_name(k) for k in RESPONSE_ID_KEYS), "response_tokens", "tokens")
_FINISH_KEYS = ("finish_reason", "stop_reason")
_PROMPT_ID_KEYS = ("prompt_ids", "input_ids", "prompt_token_ids")
_PROMPT_TEXT_KEYS = ("prompt_text", "input_text", "prompt")
#: Root input keys holding the chat the rollout started from (verl: raw_prompt).
_ROOT_PROMPT_KEYS = ("raw_prompt", "messages")
#: Fields of verl's ToolResponse.
_TOOL_RESPONSE_KEYS = frozenset({"__type__", "text", "image", "video"})
#: Name (last part) of verl's tool-call parser span, whose outputs are ``(content, calls)``.
_EXTRACT_TOOL_CALLS = "extract_tool_calls"

ROLE_SYSTEM = "system"
ROLE_USER = "user"
ROLE_ASSISTANT = "assistant"
ROLE_TOOL = "tool"


# -- the summary --------------------------------------------------------------


def _flag(mask: Any) -> Any:
    return pc.cast(pc.fill_null(mask, False), pa.int64())


def _positions(n: int) -> pa.Array:
    return pa.array(range(n), pa.int64())


def _key(step: Any, sample: Any, rollout: Any, validate: Any) -> Any:
    """One string per row naming (step, sample_index, rollout_n, validate); nulls equal nulls.

    Sample comes last with a prefix, so no sample text can make two keys collide.
    """
    null = "\x00"
    parts = [
        pc.fill_null(pc.cast(step, pa.string()), null),
        pc.fill_null(pc.cast(rollout, pa.string()), null),
        pc.cast(pc.fill_null(validate, False), pa.string()),
        pc.fill_null(pc.binary_join_element_wise("s", sample, ""), null),
    ]
    return pc.binary_join_element_wise(*parts, "\x1f")


def _latest(rows: pa.Table, by: Any, value_pos: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Per distinct ``by`` value, the largest position (rows come sorted by end time): (keys, positions)."""
    grouped = pa.table({"k": by, "p": value_pos}).group_by("k", use_threads=False).aggregate([("p", "max")])
    return grouped.column("k").combine_chunks(), grouped.column("p_max").combine_chunks()


def _is_log_row(r: Mapping[str, Any]) -> bool:
    return r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME


def _summarize_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """:func:`summarize` of a few span rows, evaluated in Python (the same definitions).

    Arrow's kernels cost ~5 ms a call for one trajectory (bench/bench_summary.py);
    live exporters summarise trajectories one at a time as they finish.
    """
    by_trace: dict[str, list[int]] = {}
    logs: list[int] = []
    for i, r in enumerate(rows):
        if r[S.TRACE_ID]:
            by_trace.setdefault(r[S.TRACE_ID], []).append(i)
        if _is_log_row(r):
            logs.append(i)

    def latest(idx: list[int]) -> dict[str, Any] | None:
        return rows[max(idx, key=lambda i: (rows[i][S.END_NS], i))] if idx else None

    def rank(i: int) -> tuple[int, int, int]:
        r = rows[i]
        if _is_log_row(r):
            return (3, r[S.START_NS], i)
        if r[S.PARENT_SPAN_ID] is None:
            return (0 if r[S.KIND] == S.KIND_ROLLOUT else 1, r[S.START_NS], i)
        return (2, r[S.START_NS], i)

    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return (r[S.STEP], r[S.SAMPLE_INDEX], r[S.ROLLOUT_N], bool(r[S.VALIDATE]))

    out: list[dict[str, Any]] = []
    for tid, idx in by_trace.items():
        first_i = min(idx, key=rank)
        first = rows[first_i]
        root = rank(first_i)[0] <= 1
        body = [rows[i] for i in idx if not _is_log_row(rows[i])]
        chosen = latest([i for i in logs if rows[i][S.TRACE_ID] == tid])
        if chosen is None:
            k = key(first)
            chosen = latest([i for i in logs if not rows[i][S.TRACE_ID] and key(rows[i]) == k])
        reward, info = (chosen[S.REWARD], chosen[S.ATTRIBUTES]) if chosen is not None else (None, None)
        if chosen is None:
            ops = [i for i in idx if rows[i][S.KIND] == S.KIND_REWARD and not _is_log_row(rows[i])]
            op = latest([i for i in ops if rows[i][S.REWARD] is not None])
            reward = op[S.REWARD] if op is not None else None
        timed = body or [rows[i] for i in idx]
        tools = [r for r in body if r[S.KIND] == S.KIND_TOOL]
        out.append(
            {
                S.TRACE_ID: tid,
                S.NAME: first[S.NAME] if root else None,
                S.STEP: first[S.STEP],
                S.SAMPLE_INDEX: first[S.SAMPLE_INDEX],
                S.ROLLOUT_N: first[S.ROLLOUT_N],
                S.VALIDATE: first[S.VALIDATE],
                S.REWARD: reward,
                S.REWARD_INFO: info,
                S.STATUS: first[S.STATUS] if root else S.STATUS_INCOMPLETE,
                S.START_NS: min(r[S.START_NS] for r in timed),
                S.END_NS: max(r[S.END_NS] for r in timed),
                S.NUM_SPANS: len(body),
                S.NUM_LLM_CALLS: sum(1 for r in body if r[S.KIND] == S.KIND_LLM),
                S.NUM_TOOL_CALLS: len(tools),
                S.NUM_TOOL_ERRORS: sum(1 for r in tools if r[S.STATUS] != S.STATUS_OK),
                S.NUM_ERRORS: sum(1 for r in body if r[S.STATUS] == S.STATUS_ERROR),
            }
        )
    out.sort(key=_order_key)
    return pa.Table.from_pylist(out, schema=S.TRAJECTORY_SCHEMA)


def _order_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """Step, sample, rollout, start, trace id; nulls last (as Arrow's sort_by)."""
    parts: list[Any] = []
    for c in (S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.START_NS, S.TRACE_ID):
        v = r[c]
        parts.extend((v is None, "" if v is None and c == S.SAMPLE_INDEX else (0 if v is None else v)))
    return tuple(parts)


def summarize(spans: pa.Table) -> pa.Table:
    """One summary row per trajectory of ``spans`` (any number of trajectories, any order).

    The definitions of root, first row, status and reward are in this
    module's docstring. Spans without a trace id (rewards logged by another
    process) are joined by key and get no row of their own.

    Args:
        spans: Rows of :data:`tracer.schema.SPAN_SCHEMA`; at least the columns
            :data:`SUMMARY_SPAN_COLUMNS`.

    Returns:
        A table of :data:`tracer.schema.TRAJECTORY_SCHEMA`, by step, sample, rollout,
        start time and trace id.

    Raises:
        ValueError: a needed column is missing (names them).
    """
    have = set(spans.schema.names)
    missing = [c for c in SUMMARY_SPAN_COLUMNS if c not in have]
    if missing:
        raise ValueError(
            f"summarize: the span table lacks the column(s) {', '.join(missing)}; "
            f"read them too (tracer.read_spans(path, columns=tracer.summary.SUMMARY_SPAN_COLUMNS))"
        )
    if spans.num_rows <= SMALL_SUMMARY_SPANS:
        return _summarize_rows(spans.select(list(SUMMARY_SPAN_COLUMNS)).to_pylist())
    t = spans.select(list(SUMMARY_SPAN_COLUMNS))
    t = t.append_column("_pos", _positions(t.num_rows))
    is_log = pc.fill_null(pc.and_(pc.equal(t[S.KIND], S.KIND_REWARD), pc.equal(t[S.NAME], S.REWARD_SPAN_NAME)), False)
    has_tid = pc.fill_null(pc.not_equal(t[S.TRACE_ID], ""), False)
    logs = t.filter(is_log)
    # Every span with a trace id belongs to a trajectory (log_reward rows too).
    own = t.filter(has_tid)
    if own.num_rows == 0:
        return S.TRAJECTORY_SCHEMA.empty_table()
    own_log = pc.fill_null(
        pc.and_(pc.equal(own[S.KIND], S.KIND_REWARD), pc.equal(own[S.NAME], S.REWARD_SPAN_NAME)), False
    )
    is_body = pc.invert(own_log)

    # The first row: the root (rollout roots first), else the earliest span, else the earliest reward.
    is_root = pc.and_(pc.is_null(own[S.PARENT_SPAN_ID]), is_body)
    rank = pc.if_else(is_root, pc.if_else(pc.equal(own[S.KIND], S.KIND_ROLLOUT), 0, 1), pc.if_else(is_body, 2, 3))
    own = own.append_column("_rank", pc.cast(rank, pa.int8()))
    own = own.append_column("_body", is_body)
    order = pc.sort_indices(
        own,
        sort_keys=[(S.TRACE_ID, "ascending"), ("_rank", "ascending"), (S.START_NS, "ascending"), ("_pos", "ascending")],
    )
    own = own.take(order)
    own = own.append_column("_spos", _positions(own.num_rows))
    kind, status, body = own[S.KIND], own[S.STATUS], own["_body"]
    no_int = pa.scalar(None, pa.int64())
    derived = {
        "_bstart": pc.if_else(body, own[S.START_NS], no_int),
        "_bend": pc.if_else(body, own[S.END_NS], no_int),
        "_n": _flag(body),
        "_llm": _flag(pc.and_(body, pc.equal(kind, S.KIND_LLM))),
        "_tool": _flag(pc.and_(body, pc.equal(kind, S.KIND_TOOL))),
        "_tool_err": _flag(pc.and_(body, pc.and_(pc.equal(kind, S.KIND_TOOL), pc.not_equal(status, S.STATUS_OK)))),
        "_err": _flag(pc.and_(body, pc.equal(status, S.STATUS_ERROR))),
    }
    for name, col in derived.items():
        own = own.append_column(name, col)
    sums = ("_n", "_llm", "_tool", "_tool_err", "_err")
    grouped = own.group_by(S.TRACE_ID, use_threads=False).aggregate(
        [
            ("_spos", "min"),
            ("_bstart", "min"),
            ("_bend", "max"),
            (S.START_NS, "min"),
            (S.END_NS, "max"),
            *((name, "sum") for name in sums),
        ]
    )
    first = own.take(grouped["_spos_min"])
    has_root = pc.less_equal(first["_rank"], 1)
    trace_ids = first[S.TRACE_ID]

    # Rewards: log_reward by trace id, else by key; else the last reward op.
    logs = logs.take(pc.sort_indices(logs, sort_keys=[(S.END_NS, "ascending"), ("_pos", "ascending")]))
    lpos = _positions(logs.num_rows)
    log_tid = pc.fill_null(pc.not_equal(logs[S.TRACE_ID], ""), False)
    tid_keys, tid_pos = _latest(logs.filter(log_tid), pc.filter(logs[S.TRACE_ID], log_tid), pc.filter(lpos, log_tid))
    chosen = pc.take(tid_pos, pc.index_in(trace_ids, value_set=tid_keys))
    no_tid = pc.invert(log_tid)
    if pc.any(no_tid).as_py():
        keyed = logs.filter(no_tid)
        k_keys, k_pos = _latest(
            keyed,
            _key(keyed[S.STEP], keyed[S.SAMPLE_INDEX], keyed[S.ROLLOUT_N], keyed[S.VALIDATE]),
            pc.filter(lpos, no_tid),
        )
        traj_keys = _key(first[S.STEP], first[S.SAMPLE_INDEX], first[S.ROLLOUT_N], first[S.VALIDATE])
        chosen = pc.coalesce(chosen, pc.take(k_pos, pc.index_in(traj_keys, value_set=k_keys)))
    log_reward = pc.take(logs[S.REWARD], chosen)
    log_info = pc.take(logs[S.ATTRIBUTES], chosen)
    ops = own.filter(pc.and_(body, pc.and_(pc.equal(kind, S.KIND_REWARD), pc.is_valid(own[S.REWARD]))))
    ops = ops.take(pc.sort_indices(ops, sort_keys=[(S.END_NS, "ascending"), ("_pos", "ascending")]))
    op_keys, op_pos = _latest(ops, ops[S.TRACE_ID], _positions(ops.num_rows))
    op_reward = pc.take(ops[S.REWARD], pc.take(op_pos, pc.index_in(trace_ids, value_set=op_keys)))
    found = pc.is_valid(chosen)

    columns = {
        S.TRACE_ID: trace_ids,
        S.NAME: pc.if_else(has_root, first[S.NAME], pa.scalar(None, pa.string())),
        S.STEP: first[S.STEP],
        S.SAMPLE_INDEX: first[S.SAMPLE_INDEX],
        S.ROLLOUT_N: first[S.ROLLOUT_N],
        S.VALIDATE: first[S.VALIDATE],
        S.REWARD: pc.if_else(found, log_reward, op_reward),
        S.REWARD_INFO: pc.if_else(found, log_info, pa.scalar(None, pa.string())),
        S.STATUS: pc.if_else(has_root, first[S.STATUS], S.STATUS_INCOMPLETE),
        S.START_NS: pc.coalesce(grouped["_bstart_min"], grouped[f"{S.START_NS}_min"]),
        S.END_NS: pc.coalesce(grouped["_bend_max"], grouped[f"{S.END_NS}_max"]),
        S.NUM_SPANS: grouped["_n_sum"],
        S.NUM_LLM_CALLS: grouped["_llm_sum"],
        S.NUM_TOOL_CALLS: grouped["_tool_sum"],
        S.NUM_TOOL_ERRORS: grouped["_tool_err_sum"],
        S.NUM_ERRORS: grouped["_err_sum"],
    }
    table = pa.table([columns[c] for c in S.TRAJECTORY_COLUMNS], schema=S.TRAJECTORY_SCHEMA)
    return _in_order(table)


def _in_order(trajectories: pa.Table) -> pa.Table:
    """Trajectory rows by step, sample, rollout, start time and trace id (nulls last), as :func:`summarize` returns them."""
    return trajectories.sort_by(
        [
            (S.STEP, "ascending"),
            (S.SAMPLE_INDEX, "ascending"),
            (S.ROLLOUT_N, "ascending"),
            (S.START_NS, "ascending"),
            (S.TRACE_ID, "ascending"),
        ]
    )


# -- turns ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A tool call an assistant turn asked for.

    Attributes:
        name: The tool's name.
        arguments: The arguments as JSON text (as OpenAI spells them).
        id: The call id (``tool_call_id`` of its result), None when not recorded.
    """

    name: str
    arguments: str
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class Turn:
    """One turn of a trajectory's conversation: a message, with what its span recorded.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        text: What the conversation shows (message content as text; for a
            failed tool, ``"error: <message>"``); None when nothing was recorded.
        content: The message's content as recorded (text, or OpenAI content parts).
        tool_calls: Calls an assistant turn asked for.
        tool_call_id: On a tool turn: the call it answers.
        tool_name: On a tool turn: the tool.
        arguments: On a tool turn: its arguments as JSON text.
        error: On a failed tool or llm span: ``{"type", "message", ...}``.
        status: The span's status (None for a turn with no span).
        span_id: The span that produced the turn (None for a turn with no span).
        name: The span's name.
        start_ns: The span's start.
        end_ns: The span's end.
        prompt_text: On an llm turn: the prompt as text (token2text or as given).
        prompt_ids: On an llm turn: the prompt's token ids.
        response_text: On an llm turn: the model's reply as recorded (before parsing).
        token_ids: On an llm turn: the reply's token ids (kept ones).
        token_texts: On an llm turn: one text per token, when recorded.
        logprobs: On an llm turn: one logprob per token (None where unknown).
        finish_reason: On an llm turn: why generation stopped.
        token_count: Reply tokens the engine produced (before truncation).
        truncated: The reply's token list was cut by the tracer's ``max_tokens``.
        prompt_token_count: Prompt tokens (before truncation).
        message: The original chat message, when the turn came from one.
    """

    role: str
    text: str | None = None
    content: Any = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: str | None = None
    error: Mapping[str, Any] | None = None
    status: str | None = None
    span_id: str | None = None
    name: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    prompt_text: str | None = None
    prompt_ids: Sequence[int] | None = None
    response_text: str | None = None
    token_ids: Sequence[int] | None = None
    token_texts: Sequence[str] | None = None
    logprobs: Sequence[float | None] | None = None
    finish_reason: str | None = None
    token_count: int | None = None
    truncated: bool = False
    prompt_token_count: int | None = None
    message: Mapping[str, Any] | None = None

    def as_message(self) -> dict[str, Any]:
        """The turn as an OpenAI chat message (the original message when it came from one)."""
        if self.message is not None:
            return dict(self.message)
        out: dict[str, Any] = {"role": self.role, "content": self.text if self.text is not None else ""}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    **({"id": c.id} if c.id is not None else {}),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.role == ROLE_TOOL:
            if self.tool_call_id is not None:
                out["tool_call_id"] = self.tool_call_id
            if self.tool_name is not None:
                out["name"] = self.tool_name
        return out


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def content_text(content: Any) -> str | None:
    """A message content as text: strings as they are, OpenAI content parts' texts joined, else JSON."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        return "".join(str(p.get("text", "")) for p in content if p.get("type", "text") == "text")
    return _dumps(content)


def _first(d: Mapping[str, Any], keys: Sequence[str], kind: type | tuple[type, ...]) -> tuple[str | None, Any]:
    for k in keys:
        v = d.get(k)
        if isinstance(v, kind):
            return k, v
    return None, None


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("role"), str)


def _messages(value: Any) -> list[Mapping[str, Any]] | None:
    """A chat message list, or None when ``value`` is not one."""
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        return value
    return None


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:
    """OpenAI ``tool_calls`` (``function.name/arguments``) or flat ``{name, arguments}`` (verl's FunctionCall)."""
    if not isinstance(value, list):
        return ()
    calls = []
    for c in value:
        if not isinstance(c, Mapping):
            continue
        inner = c.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else c
        args = fn.get("arguments", "")
        calls.append(
            ToolCall(
                name=str(fn.get("name", "?")),
                arguments=args if isinstance(args, str) else _dumps(args),
                id=c.get("id") if isinstance(c.get("id"), str) else None,
            )
        )
    return tuple(calls)


def _logprob(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, Mapping):
        # vLLM: {token_id: {"logprob": ..}}; OpenAI: {"token", "logprob"}.
        if isinstance(x.get("logprob"), (int, float)):
            return float(x["logprob"])
        for v in x.values():
            if isinstance(v, Mapping) and isinstance(v.get("logprob"), (int, float)):
                return float(v["logprob"])
    return None


def _logprobs(value: Any) -> list[float | None] | None:
    if isinstance(value, Mapping) and isinstance(value.get("content"), list):
        value = value["content"]  # OpenAI choices[0].logprobs
    if isinstance(value, list):
        return [_logprob(x) for x in value]
    return None


@dataclasses.dataclass
class _Reply:
    text: str | None = None
    token_ids: list[int] | None = None
    ids_key: str | None = None
    token_texts: list[str] | None = None
    logprobs: list[float | None] | None = None
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def _reply(out: Any) -> _Reply:
    """What an llm span returned, in any recognised shape."""
    if out is None:
        return _Reply()
    if isinstance(out, str):
        return _Reply(text=out)
    msgs = _messages(out)
    if msgs is not None:
        last = next((m for m in reversed(msgs) if m.get("role") == ROLE_ASSISTANT), msgs[-1])
        return _Reply(text=content_text(last.get("content")), tool_calls=_tool_calls(last.get("tool_calls")))
    if not isinstance(out, Mapping):
        return _Reply(text=_dumps(out))
    choices = out.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):  # OpenAI chat completion
        ch = choices[0]
        message = ch.get("message")
        msg: Mapping[str, Any] = message if isinstance(message, Mapping) else {}
        text = content_text(msg.get("content")) if msg else ch.get("text")
        lps = ch.get("logprobs")
        texts = None
        if isinstance(lps, Mapping) and isinstance(lps.get("content"), list):
            texts = [str(e.get("token", "")) for e in lps["content"] if isinstance(e, Mapping)]
        return _Reply(
            text=text if isinstance(text, str) else None,
            token_texts=texts,
            logprobs=_logprobs(lps),
            finish_reason=_str(ch.get("finish_reason")),
            tool_calls=_tool_calls(msg.get("tool_calls")),
        )
    outputs = out.get("outputs")
    if isinstance(outputs, list) and outputs and isinstance(outputs[0], Mapping):  # vLLM RequestOutput
        o = outputs[0]
        ids = o.get("token_ids")
        return _Reply(
            text=o.get("text") if isinstance(o.get("text"), str) else None,
            token_ids=ids if isinstance(ids, list) else None,
            ids_key="token_ids" if isinstance(ids, list) else None,
            logprobs=_logprobs(o.get("logprobs")),
            finish_reason=_str(o.get("finish_reason")),
        )
    # This project's rollout, verl's TokenOutput, a chat message, or {"text": ...}.
    ids_key, ids = _first(out, RESPONSE_ID_KEYS, list)
    _, text = _first(out, _RESPONSE_TEXT_KEYS, (str, list))
    _, lps = _first(out, _LOGPROB_KEYS, (list, Mapping))
    _, texts = _first(out, _TOKEN_TEXT_KEYS, list)
    _, finish = _first(out, _FINISH_KEYS, str)
    calls = _tool_calls(out.get("tool_calls"))
    if ids is None and text is None and lps is None and not calls:
        return _Reply(text=_dumps(out))
    return _Reply(
        text=content_text(text),
        token_ids=ids,
        ids_key=ids_key,
        token_texts=texts if texts is not None and all(isinstance(x, str) for x in texts) else None,
        logprobs=_logprobs(lps),
        finish_reason=finish,
        tool_calls=calls,
    )


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _prompt(inputs: Any) -> tuple[str | None, list[int] | None, list[Mapping[str, Any]] | None]:
    """An llm span's prompt: (text, token ids, chat messages)."""
    if isinstance(inputs, str):
        return inputs, None, None
    if not isinstance(inputs, Mapping):
        return None, None, _messages(inputs)
    _, ids = _first(inputs, _PROMPT_ID_KEYS, list)
    _, text = _first(inputs, _PROMPT_TEXT_KEYS, str)
    return text, ids, _messages(inputs.get("messages"))


def _tool_response(value: Any) -> bool:
    return isinstance(value, Mapping) and (
        value.get("__type__") == "ToolResponse" or (bool(value) and _TOOL_RESPONSE_KEYS.issuperset(value))
    )


def _tool_result(out: Any) -> str | None:
    """What a tool span returned, as the text its tool message shows."""
    if out is None or isinstance(out, str):
        return out
    if isinstance(out, list) and out and _tool_response(out[0]):
        out = out[0]  # verl's execute: (ToolResponse, reward, metrics)
    if _tool_response(out):
        text = out.get("text")
        media = [f"[{len(out[k])} {k}(s)]" for k in ("image", "video") if isinstance(out.get(k), list) and out[k]]
        return " ".join([text or "", *media]).strip() if media else (text or "")
    if isinstance(out, Mapping) and "content" in out:
        return content_text(out["content"])
    return _dumps(out)


def _tool_arguments(inputs: Any) -> str | None:
    if inputs is None:
        return None
    if isinstance(inputs, Mapping):
        for key in ("arguments", "parameters"):
            if key in inputs:
                v = inputs[key]
                return v if isinstance(v, str) else _dumps(v)
    return inputs if isinstance(inputs, str) else _dumps(inputs)


def _error(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if row.get(S.STATUS) in (None, S.STATUS_OK):
        return None
    err = _loads(row.get(S.ERROR))
    if isinstance(err, Mapping):
        return err
    return {"type": str(row.get(S.STATUS)), "message": "" if err is None else str(err)}


def _token_meta(attrs: Any, ids_key: str | None) -> tuple[int | None, bool, int | None]:
    """(reply tokens before truncation, whether they were cut, prompt tokens) from a span's attributes."""
    if not isinstance(attrs, Mapping):
        return None, False, None
    cut = attrs.get(S.ATTR_TRUNCATED)
    counts = attrs.get(S.ATTR_TOKENS)
    recorded, truncated = None, False
    if isinstance(cut, Mapping) and ids_key is not None:
        for k, v in cut.items():
            if str(k).split(".")[-1] == ids_key:
                truncated = True
                recorded = v if isinstance(v, int) else recorded
    prompt = None
    if isinstance(counts, Mapping):
        if recorded is None and ids_key is not None and isinstance(counts.get(ids_key), int):
            recorded = counts[ids_key]
        prompt = next((counts[k] for k in _PROMPT_ID_KEYS if isinstance(counts.get(k), int)), None)
    return recorded, truncated, prompt


def span_turn(row: Mapping[str, Any]) -> Turn | None:
    """The turn one llm or tool span recorded (None for other spans)."""
    kind = row.get(S.KIND)
    if kind == S.KIND_LLM:
        return _llm_turn(row)
    if kind == S.KIND_TOOL:
        err = _error(row)
        text = _tool_result(_loads(row.get(S.OUTPUTS)))
        if err is not None:
            text = f"error: {err.get('message') or err.get('type') or row.get(S.STATUS)}"
        return Turn(
            role=ROLE_TOOL,
            text=text,
            content=text,
            tool_name=row.get(S.NAME),
            arguments=_tool_arguments(_loads(row.get(S.INPUTS))),
            error=err,
            **_span_fields(row),
        )
    return None


def _span_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "status": row.get(S.STATUS),
        "span_id": row.get(S.SPAN_ID),
        "name": row.get(S.NAME),
        "start_ns": row.get(S.START_NS),
        "end_ns": row.get(S.END_NS),
    }


def _llm_turn(row: Mapping[str, Any]) -> Turn:
    """The assistant turn an llm span (or a root returning a reply) recorded."""
    reply = _reply(_loads(row.get(S.OUTPUTS)))
    prompt_text, prompt_ids, _ = _prompt(_loads(row.get(S.INPUTS)))
    recorded, truncated, prompt_count = _token_meta(_loads(row.get(S.ATTRIBUTES)), reply.ids_key)
    if prompt_count is None and prompt_ids is not None:
        prompt_count = len(prompt_ids)
    return Turn(
        role=ROLE_ASSISTANT,
        text=reply.text,
        content=reply.text,
        tool_calls=reply.tool_calls,
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        response_text=reply.text,
        token_ids=reply.token_ids,
        token_texts=reply.token_texts,
        logprobs=reply.logprobs,
        finish_reason=reply.finish_reason,
        token_count=recorded if recorded is not None else (len(reply.token_ids) if reply.token_ids else None),
        truncated=truncated,
        prompt_token_count=prompt_count,
        error=_error(row),
        **_span_fields(row),
    )


def _start(row: Mapping[str, Any]) -> int:
    v = row.get(S.START_NS)
    return v if isinstance(v, int) else 0


def root_span(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """A trajectory's root: a span without a parent, ``kind="rollout"`` first, then the earliest."""
    best: tuple[int, int, int] | None = None
    found = None
    for i, r in enumerate(rows):
        if r.get(S.PARENT_SPAN_ID) is not None or _is_log_reward(r):
            continue
        key = (0 if r.get(S.KIND) == S.KIND_ROLLOUT else 1, _start(r), i)
        if best is None or key < best:
            best, found = key, r
    return found


def _is_log_reward(row: Mapping[str, Any]) -> bool:
    return row.get(S.KIND) == S.KIND_REWARD and row.get(S.NAME) == S.REWARD_SPAN_NAME


def _message_turn(m: Mapping[str, Any]) -> Turn:
    content = m.get("content")
    return Turn(
        role=str(m.get("role")),
        text=content_text(content),
        content=content,
        tool_calls=_tool_calls(m.get("tool_calls")),
        tool_call_id=m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None,
        tool_name=m.get("name") if isinstance(m.get("name"), str) else None,
        message=m,
    )


def _with_span(turn: Turn, span: Turn) -> Turn:
    """A message turn with what its span recorded (tokens, timing, status, error)."""
    keep = {"role", "text", "content", "tool_calls", "tool_call_id", "tool_name", "message"}
    fields = {f.name: getattr(span, f.name) for f in dataclasses.fields(Turn) if f.name not in keep}
    if not turn.tool_calls and span.tool_calls:
        fields["tool_calls"] = span.tool_calls
    return dataclasses.replace(turn, **fields)


def _conversation(rows: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """The turns of one trajectory's span rows (any order)."""
    ordered = sorted(rows, key=_start)
    root = root_span(ordered)
    spans = [t for t in (span_turn(r) for r in ordered) if t is not None]
    root_out = _loads(root.get(S.OUTPUTS)) if root is not None else None
    msgs = _messages(root_out.get("messages")) if isinstance(root_out, Mapping) else _messages(root_out)
    if msgs is not None:
        return _merge(msgs, spans)
    turns: list[Turn] = []
    root_in = _loads(root.get(S.INPUTS)) if root is not None else None
    if isinstance(root_in, Mapping):
        start = next((m for m in (_messages(root_in.get(k)) for k in _ROOT_PROMPT_KEYS) if m is not None), None)
        turns.extend(_message_turn(m) for m in start or ())
    first_llm = next((r for r in ordered if r.get(S.KIND) == S.KIND_LLM), None)
    if not turns and first_llm is not None:
        prompt_text, _, prompt_msgs = _prompt(_loads(first_llm.get(S.INPUTS)))
        if prompt_msgs is not None:
            turns.extend(_message_turn(m) for m in prompt_msgs)
        elif prompt_text is not None:
            turns.append(Turn(role=ROLE_USER, text=prompt_text, content=prompt_text))
    it = iter(spans)
    for r in ordered:
        if r.get(S.KIND) in (S.KIND_LLM, S.KIND_TOOL):
            turns.append(next(it))
        elif str(r.get(S.NAME) or "").split(".")[-1] == _EXTRACT_TOOL_CALLS:
            _attach_parsed_calls(turns, _loads(r.get(S.OUTPUTS)))
    if first_llm is None and root is not None and isinstance(root_out, Mapping):
        # No llm span: the root's own reply (verl's AgentLoopOutput: response_ids, token2text's response_text).
        reply = _llm_turn(root)
        if reply.token_ids is not None or (reply.text is not None and not reply.text.startswith("{")):
            turns.append(reply)
    return turns


def _attach_parsed_calls(turns: list[Turn], out: Any) -> None:
    """verl's extract_tool_calls returned ``(content, calls)``: put the calls on the last assistant turn."""
    if not (isinstance(out, list) and len(out) == 2 and isinstance(out[1], list)):
        return
    calls = _tool_calls(out[1])
    for i in range(len(turns) - 1, -1, -1):
        if turns[i].role == ROLE_ASSISTANT:
            if not turns[i].tool_calls and calls:
                turns[i] = dataclasses.replace(turns[i], tool_calls=calls)
            return


def _merge(msgs: Sequence[Mapping[str, Any]], spans: list[Turn]) -> list[Turn]:
    """Root messages, each assistant/tool message joined to its llm/tool span.

    The i-th assistant message is the i-th llm span when their counts agree;
    a tool message takes the next unused tool span of its name (else the next
    unused tool span when the counts agree).
    """
    turns = [_message_turn(m) for m in msgs]
    llm = [s for s in spans if s.role == ROLE_ASSISTANT]
    assistant = [i for i, t in enumerate(turns) if t.role == ROLE_ASSISTANT]
    if len(llm) == len(assistant):
        for i, span in zip(assistant, llm, strict=True):
            turns[i] = _with_span(turns[i], span)
    tools = [s for s in spans if s.role == ROLE_TOOL]
    tool_msgs = [i for i, t in enumerate(turns) if t.role == ROLE_TOOL]
    used: set[int] = set()
    same_count = len(tools) == len(tool_msgs)
    for n, i in enumerate(tool_msgs):
        name = turns[i].tool_name
        pick = next((k for k, s in enumerate(tools) if k not in used and s.name == name), None)
        if pick is None and same_count and n not in used:
            pick = n
        if pick is not None:
            used.add(pick)
            turns[i] = _with_span(turns[i], tools[pick])
    return turns


def _rows_of(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(spans, pa.Table):
        return spans.select([c for c in TURN_SPAN_COLUMNS if c in spans.column_names]).to_pylist()
    return list(spans)


def trajectory_turns(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, list[Turn]]:
    """The turns of every trajectory in ``spans``, by trace id.

    When the root span returns chat messages (``{"messages": [...]}``), they
    are the conversation, each assistant and tool message joined to the llm
    or tool span that produced it. Otherwise the conversation is rebuilt from
    the spans: the chat the root started from (verl's ``raw_prompt``), else
    the first llm call's prompt, then one turn per llm and tool span in start
    order.

    Args:
        spans: Span rows (table or dicts) of one or many trajectories;
            :data:`TURN_SPAN_COLUMNS` are read.
    """
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    for r in _rows_of(spans):
        by_trace.setdefault(r.get(S.TRACE_ID), []).append(r)  # type: ignore[arg-type]
    return {tid: _conversation(rows) for tid, rows in by_trace.items()}


def span_turns(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[Turn]:
    """One turn per llm or tool span, in start order (every call, whether or not the conversation shows it)."""
    rows = sorted(_rows_of(spans), key=_start)
    return [t for t in (span_turn(r) for r in rows) if t is not None]


def trajectory_messages(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of one trajectory, from its spans (table or row dicts).

    The :func:`trajectory_turns` of the trajectory in OpenAI chat format.

    Returns:
        OpenAI-style messages: ``{"role", "content", ...}``.
    """
    return [t.as_message() for t in _conversation(_rows_of(spans))]


def render_turns(turns: Sequence[Turn]) -> str:
    """Turns as readable text: one ``[role]`` block per turn, tool calls spelled out."""
    blocks = []
    for t in turns:
        head = f"[{t.role}]"
        if t.role == ROLE_TOOL and (t.tool_name or t.tool_call_id):
            head = f"[tool {t.tool_name or ''}]".replace(" ]", "]")
        body = t.text or ""
        for call in t.tool_calls:
            body += ("\n" if body else "") + f"-> {call.name}({call.arguments})"
        blocks.append(f"{head}\n{body}")
    return "\n\n".join(blocks)


def prompt_and_response(turns: Sequence[Turn]) -> tuple[str, str]:
    """A trajectory's prompt and final response as text.

    The prompt is the first llm call's prompt text, else the turns before the
    first assistant turn, rendered. The response is the last llm call's reply
    as recorded, else the last assistant turn's text.
    """
    assistant = [t for t in turns if t.role == ROLE_ASSISTANT]
    prompt = assistant[0].prompt_text if assistant else None
    if prompt is None:
        head = []
        for t in turns:
            if t.role == ROLE_ASSISTANT:
                break
            head.append(t)
        prompt = render_turns(head)
    response = None
    if assistant:
        last = assistant[-1]
        response = last.response_text if last.response_text is not None else last.text
    return prompt, response or ""


# -- a trajectory's token sequence -------------------------------------------------


#: Response-mask value of a token the model produced.
MASK_MODEL = 1
#: Response-mask value of a token spliced in between model turns (tool results, chat template).
MASK_ENV = 0


@dataclasses.dataclass(frozen=True)
class TrajectoryTokens:
    """A multi-turn trajectory as one token sequence, as an RL trainer sees it.

    Attributes:
        prompt_ids: The first model call's prompt ids (None when not recorded).
        response_ids: Everything after the prompt: each model turn's tokens,
            with the tokens spliced in between turns (tool results, template)
            where the next call's prompt shows them.
        response_mask: One per response id: :data:`MASK_MODEL` for a model
            token, :data:`MASK_ENV` for a spliced-in one.
        logprobs: One per response id: the model's logprob (None where unknown
            and for spliced-in tokens).
        exact: False when the sequence is known to be incomplete: a token list
            was cut by the tracer's ``max_tokens``, or a call's prompt does not
            extend the previous call's prompt and reply (re-templated history:
            its spliced-in tokens are then left out). The tokens under mask 1
            are every recorded model token, in order, either way.
    """

    prompt_ids: list[int] | None
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float | None]
    exact: bool


def trajectory_tokens(turns: Sequence[Turn]) -> TrajectoryTokens:
    """The token sequence of a trajectory's assistant turns (those with token ids), in order.

    Turn ``k+1``'s prompt is expected to start with turn ``k``'s prompt and
    reply (how agent loops such as verl's and this project's build it); the
    rest of that prompt is the spliced-in part, masked 0.

    Args:
        turns: A trajectory's turns, e.g. :func:`span_turns` of its spans
            (every llm call) or its :func:`trajectory_turns`.
    """
    model = [t for t in turns if t.role == ROLE_ASSISTANT and t.token_ids is not None]
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float | None] = []
    if not model:
        return TrajectoryTokens(None, ids, mask, lps, True)
    first = model[0].prompt_ids
    prompt = list(first) if first is not None else None
    seq: list[int] | None = list(prompt) if prompt is not None else None
    exact = prompt is not None
    for k, turn in enumerate(model):
        if turn.truncated or (
            turn.prompt_token_count is not None
            and turn.prompt_ids is not None
            and len(turn.prompt_ids) < turn.prompt_token_count
        ):
            exact = False
        if k > 0:
            p = list(turn.prompt_ids) if turn.prompt_ids is not None else None
            if seq is not None and p is not None and p[: len(seq)] == seq:
                env = p[len(seq) :]
                ids.extend(env)
                mask.extend([MASK_ENV] * len(env))
                lps.extend([None] * len(env))
                seq = p
            else:
                exact = False
                seq = None
        own = [int(x) for x in turn.token_ids or ()]
        got = list(turn.logprobs) if turn.logprobs is not None else []
        ids.extend(own)
        mask.extend([MASK_MODEL] * len(own))
        lps.extend(got[: len(own)] + [None] * (len(own) - len(got)))
        if seq is not None:
            seq = seq + own
    return TrajectoryTokens(prompt, ids, mask, lps, exact)


# -- reward sources ---------------------------------------------------------------

#: log_reward attribute naming where a reward came from (``rollout-trace rescore`` sets it).
REWARD_SOURCE_KEY = "reward_source"
#: Source of a reward recorded during the run (a log_reward row without :data:`REWARD_SOURCE_KEY`).
SOURCE_RECORDED = "recorded"
#: Source of a reward taken from a ``kind="reward"`` op's span.
SOURCE_OP = "reward_op"


@dataclasses.dataclass(frozen=True)
class RewardRecord:
    """One reward a trajectory received.

    Attributes:
        reward: The value.
        source: :data:`SOURCE_RECORDED`, :data:`SOURCE_OP`, or the
            ``module:function`` a rescore ran.
        end_ns: When it was logged (the latest one is the trajectory's reward).
        info: The row's other attributes (``advantage``, ...).
    """

    reward: float | None
    source: str
    end_ns: int
    info: Mapping[str, Any]


def reward_source(attributes: Any) -> str:
    """The source a log_reward row's attributes (JSON text or dict) name."""
    attrs = _loads(attributes)
    src = attrs.get(REWARD_SOURCE_KEY) if isinstance(attrs, Mapping) else None
    return src if isinstance(src, str) and src else SOURCE_RECORDED


def trajectory_rewards(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, list[RewardRecord]]:
    """Every reward of every trajectory in ``spans``, oldest first, by trace id.

    Reward ops come first, then log_reward rows by time, so the last record
    is the reward :func:`summarize` reports. Only rows with the trajectory's
    trace id are listed (a reward logged by another process, joined by key,
    is in :func:`summarize`'s ``reward`` only).
    """
    rows = spans.to_pylist() if isinstance(spans, pa.Table) else list(spans)
    out: dict[str, list[tuple[int, int, int, RewardRecord]]] = {}
    for i, r in enumerate(rows):
        tid = r.get(S.TRACE_ID)
        if not tid or r.get(S.KIND) != S.KIND_REWARD:
            continue
        end = r.get(S.END_NS) or 0
        if _is_log_reward(r):
            attrs = _loads(r.get(S.ATTRIBUTES))
            info = {k: v for k, v in attrs.items() if k != REWARD_SOURCE_KEY} if isinstance(attrs, Mapping) else {}
            rec = RewardRecord(r.get(S.REWARD), reward_source(attrs), end, info)
            out.setdefault(tid, []).append((1, end, i, rec))
        elif r.get(S.REWARD) is not None:
            out.setdefault(tid, []).append((0, end, i, RewardRecord(r[S.REWARD], SOURCE_OP, end, {})))
    return {tid: [rec for *_, rec in sorted(recs, key=lambda x: x[:3])] for tid, recs in out.items()}


# -- step metrics ------------------------------------------------------------------


def _percentile(ordered: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default)."""
    if len(ordered) == 0:
        return math.nan
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


#: Per-token arrays a trainer logs with :func:`tracer.log_token_stats` (verl's names, ``logprobs`` in one word).
TRAINER_LOGPROBS = "old_logprobs"
ROLLOUT_LOGPROBS = "rollout_logprobs"
REF_LOGPROBS = "ref_logprobs"
ENTROPY = "entropy"
ADVANTAGES = "advantages"
LOSS_MASK = "loss_mask"
#: Column of :func:`tracer.read_token_stats`' table: the turn (0-based index of the llm call).
TURN = "turn"
#: Column of that table: where the arrays came from (``log_token_stats(source=...)``, e.g. ``"synthetic"``).
TOKEN_STATS_SOURCE = "source"
#: Columns of that table that are not arrays.
TOKEN_STATS_KEY_COLUMNS: tuple[str, ...] = (
    S.TRACE_ID,
    S.STEP,
    S.SAMPLE_INDEX,
    S.ROLLOUT_N,
    S.VALIDATE,
    TURN,
    TOKEN_STATS_SOURCE,
)


def token_stat_metrics(token_stats: pa.Table) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) train/inference mismatch from :func:`tracer.read_token_stats`.

    Keys of each dict: ``logprob_mismatch`` (mean over tokens of
    ``|rollout_logprobs - old_logprobs|``), ``logprob_ratio/max`` (the
    largest ``exp(old_logprobs - rollout_logprobs)``, the importance ratio
    of trainer against rollout) and ``mismatch_tokens`` (tokens counted).
    Only tokens with both logprobs and, where a ``loss_mask`` was logged, a
    non-zero mask count. Groups without such tokens are left out.
    """
    names = set(token_stats.column_names)
    if TRAINER_LOGPROBS not in names or ROLLOUT_LOGPROBS not in names:
        return {}
    sums: dict[tuple[int | None, bool], list[float]] = {}
    cols = [S.STEP, S.VALIDATE, TRAINER_LOGPROBS, ROLLOUT_LOGPROBS] + ([LOSS_MASK] if LOSS_MASK in names else [])
    for r in token_stats.select(cols).to_pylist():
        old, new, mask = r[TRAINER_LOGPROBS], r[ROLLOUT_LOGPROBS], r.get(LOSS_MASK)
        if old is None or new is None:
            continue
        acc = sums.setdefault((r[S.STEP], bool(r[S.VALIDATE])), [0.0, 0.0, -math.inf])
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a is None or b is None or (mask is not None and (i >= len(mask) or not mask[i])):
                continue
            acc[0] += abs(b - a)
            acc[1] += 1
            acc[2] = max(acc[2], a - b)
    return {
        k: {
            "logprob_mismatch": v[0] / v[1],
            "logprob_ratio/max": math.exp(min(v[2], _MAX_LOG_RATIO)),
            "mismatch_tokens": v[1],
        }
        for k, v in sums.items()
        if v[1]
    }


#: exp() of a log ratio above this overflows a float; the ratio is clamped there.
_MAX_LOG_RATIO = 700.0


def step_metrics(
    trajectories: pa.Table, token_stats: pa.Table | None = None
) -> dict[tuple[int | None, bool], dict[str, float]]:
    """Per-(step, validate) rollout metrics from :func:`tracer.read_trajectories`.

    With ``token_stats`` (:func:`tracer.read_token_stats`), each group also
    gets :func:`token_stat_metrics`' ``logprob_mismatch``,
    ``logprob_ratio/max`` and ``mismatch_tokens`` (NaN, NaN, 0 without tokens).

    Keys of each dict: ``trajectories``, ``reward/mean|std|min|max`` (NaN
    when no trajectory of the group has a reward; std is the population
    std), ``turns/mean`` (llm calls), ``tool_calls/mean``, ``tool_error_rate``
    (tool errors / tool calls), ``errors`` (trajectories whose status is not
    ok), ``latency_s/p50|p95``. Grouped in Arrow: only the groups are looped
    over in Python (125k trajectories in ~0.08 s, against ~1.1 s row by row).
    """
    return partial_metrics(step_partials(trajectories), token_stats)


#: Count columns of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, summed when partials merge.
_PART_SUMS = (S.PART_TRAJECTORIES, S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS, S.PART_NOT_OK)
#: Value columns of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, concatenated and sorted when partials merge.
_PART_LISTS = (S.PART_REWARDS, S.PART_LATENCIES)


def step_partials(trajectories: pa.Table) -> pa.Table:
    """Per-(step, validate) aggregates of trajectory rows (:data:`tracer.schema.STEP_PARTIALS_SCHEMA`).

    What :func:`step_metrics` is computed from: counts and sums of the rows,
    and the rewards and latencies themselves (sorted), whose mean, spread and
    percentiles it shows. The rows of several parts merge
    (:func:`merge_step_partials`) into exactly the rows of their union. Shard
    indexes store these rows for their trajectories: the counts and sums as
    :func:`step_counts` gives them, the values sorted per group in columns of
    their own (:data:`tracer.index.shard.SORTED_COLUMNS`).
    """
    return _merge_parts([_rows_part(trajectories, counts=True, values=True)])


def step_counts(trajectories: pa.Table) -> pa.Table:
    """:func:`step_partials` without the values (empty ``rewards`` and ``latencies_s``): what shard indexes store."""
    return _merge_parts([_rows_part(trajectories, counts=True, values=False)])


#: Trajectory columns the values of the aggregates come from (rewards and latencies, by step and split).
VALUE_COLUMNS = (S.STEP, S.VALIDATE, S.REWARD, S.START_NS, S.END_NS)


def step_values(trajectories: pa.Table) -> pa.Table:
    """:func:`step_partials` without the counts (zero): the values of rows with at least :data:`VALUE_COLUMNS`."""
    return _merge_parts([_rows_part(trajectories, counts=False, values=True)])


def merge_step_partials(parts: Sequence[pa.Table]) -> pa.Table:
    """The per-(step, validate) aggregates of the union of ``parts`` (tables of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`).

    One row per group, by step (nulls last) then validate; counts summed,
    values concatenated and sorted, so the result does not depend on how the
    trajectories were split into parts or in which order the parts come.
    """
    return _merge_parts([_partials_part(p) for p in parts])


@dataclasses.dataclass
class _Part:
    """Rows to merge into per-step aggregates, as numpy arrays (one place for every source of them).

    ``step`` holds 0 where ``null`` is set; ``sums`` one row per :data:`_PART_SUMS` column (None: zeros);
    ``values`` per :data:`_PART_LISTS` column the values and the row each belongs to (None: one per row, in
    order), or None for no values.
    """

    step: np.ndarray
    null: np.ndarray
    validate: np.ndarray
    sums: np.ndarray | None
    values: tuple[tuple[np.ndarray, np.ndarray | None], ...] | None


def _column(t: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    col = t.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _ints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """An integer column as int64 (0 where null) and where it is null (None: nowhere)."""
    if arr.null_count == 0:
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64), None
    return np.asarray(pc.fill_null(arr, 0).to_numpy(), dtype=np.int64), np.asarray(
        arr.is_null().to_numpy(zero_copy_only=False)
    )


def _flags(arr: pa.Array) -> np.ndarray:
    """A boolean column as numpy, null as False."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _keys(t: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    step, null = _ints(_column(t, S.STEP))
    return step, (np.zeros(len(step), dtype=bool) if null is None else null), _flags(_column(t, S.VALIDATE))


def _rows_part(t: pa.Table | pa.RecordBatch, *, counts: bool, values: bool) -> _Part:
    """One aggregate row per trajectory row; the latency of a row is ``(end_ns - start_ns) / 1e9`` seconds."""
    step, null, validate = _keys(t)
    sums = None
    if counts:
        status = _column(t, S.STATUS)
        not_ok = pc.fill_null(pc.not_equal(status, S.STATUS_OK), True).to_numpy(zero_copy_only=False)
        sums = np.vstack(
            [np.ones(len(step), dtype=np.int64)]
            + [_ints(_column(t, c))[0] for c in (S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS)]
            + [np.asarray(not_ok, dtype=np.int64)]
        )
    vals = None
    if values:
        reward = _column(t, S.REWARD).cast(pa.float64())
        r = np.asarray(pc.fill_null(reward, 0.0).to_numpy(), dtype=np.float64)
        r_ok = None if reward.null_count == 0 else ~np.asarray(reward.is_null().to_numpy(zero_copy_only=False))
        start, s_null = _ints(_column(t, S.START_NS))
        end, e_null = _ints(_column(t, S.END_NS))
        lat = (end - start).astype(np.float64) / 1e9  # int64 wraps as Arrow's subtract does
        l_ok = None
        if s_null is not None or e_null is not None:
            l_ok = ~np.logical_or(False if s_null is None else s_null, False if e_null is None else e_null)
        vals = tuple((v, None) if ok is None else (v[ok], np.flatnonzero(ok)) for v, ok in ((r, r_ok), (lat, l_ok)))
    return _Part(step, null, validate, sums, vals)


def _partials_part(p: pa.Table) -> _Part:
    """The rows of a table of :data:`tracer.schema.STEP_PARTIALS_SCHEMA`, merged or not."""
    if p.schema != S.STEP_PARTIALS_SCHEMA:
        p = p.select(S.STEP_PARTIALS_SCHEMA.names).cast(S.STEP_PARTIALS_SCHEMA)
    step, null, validate = _keys(p)
    sums = np.vstack([_ints(_column(p, c))[0] for c in _PART_SUMS]) if p.num_rows else None
    vals = []
    for c in _PART_LISTS:
        lists = _column(p, c)
        flat = pc.list_flatten(lists)
        if not len(flat):  # what indexes store
            vals.append((np.zeros(0), np.zeros(0, dtype=np.int64)))
            continue
        vals.append(
            (
                np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64),
                np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64),
            )
        )
    return _Part(step, null, validate, sums, tuple(vals))


#: Distinct steps spanning at most this many integers are ranked by a table lookup, more by sorting.
_DENSE_STEPS = 1 << 20


def _groups(parts: Sequence[_Part]) -> tuple[np.ndarray, dict[str, Any], int]:
    """The group of each row of ``parts`` (in turn), the key columns of the groups, and how many there are.

    Groups are ordered by step (nulls last), then validate.
    """
    step = np.concatenate([p.step for p in parts])
    null = np.concatenate([p.null for p in parts])
    validate = np.concatenate([p.validate for p in parts])
    known = step[~null] if null.any() else step
    if len(known) and int(known.max()) - int(known.min()) < _DENSE_STEPS:
        lo = int(known.min())
        seen = np.zeros(int(known.max()) - lo + 1, dtype=bool)
        seen[known - lo] = True
        distinct = np.flatnonzero(seen).astype(np.int64) + lo
        rank = np.cumsum(seen) - 1
        at = np.where(null, len(distinct), rank[np.where(null, lo, step) - lo])
    else:
        distinct, inverse = np.unique(known, return_inverse=True)
        at = np.full(len(step), len(distinct), dtype=np.int64)
        at[~null] = inverse
    slot = at * 2 + validate  # by step (nulls last), then validate
    used = np.bincount(slot, minlength=2 * (len(distinct) + 1)) > 0
    group = (np.cumsum(used) - 1)[slot]
    slots = np.flatnonzero(used)
    key_step = slots // 2
    out: dict[str, Any] = {
        S.STEP: pa.array(np.append(distinct, 0)[key_step], pa.int64(), mask=key_step == len(distinct)),
        S.VALIDATE: pa.array(slots % 2 == 1, pa.bool_()),
    }
    return group, out, len(slots)


def _merge_parts(parts: Sequence[_Part]) -> pa.Table:
    """One row per (step, validate) of the rows of ``parts`` (see :func:`merge_step_partials`)."""
    if not parts or not sum(len(p.step) for p in parts):
        return S.STEP_PARTIALS_SCHEMA.empty_table()
    group, out, groups = _groups(parts)
    starts = np.cumsum([0] + [len(p.step) for p in parts])
    sums = np.zeros((len(_PART_SUMS), groups), dtype=np.int64)
    for p, at0 in zip(parts, starts[:-1], strict=False):
        if p.sums is not None and len(p.step):
            g = group[at0 : at0 + len(p.step)]
            for i in range(len(_PART_SUMS)):  # float weights: exact while a sum stays below 2**53
                sums[i] += np.bincount(g, weights=p.sums[i], minlength=groups).astype(np.int64)
    for i, c in enumerate(_PART_SUMS):
        out[c] = pa.array(sums[i], pa.int64())
    by_group: tuple[np.ndarray, np.ndarray] | None = None  # (groups, their stable order), shared by equal groups
    for k, c in enumerate(_PART_LISTS):
        chunks = [
            (v, group[at0 : at0 + len(p.step)] if rows is None else group[at0 + rows])
            for p, at0 in zip(parts, starts[:-1], strict=False)
            if p.values is not None
            for v, rows in [p.values[k]]
        ]
        values = np.concatenate([v for v, _ in chunks]) if chunks else np.zeros(0)
        of = np.concatenate([g for _, g in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        if by_group is None or not np.array_equal(by_group[0], of):
            by_group = (of, np.argsort(of.astype(np.uint16) if groups <= 1 << 16 else of, kind="stable"))
        out[c] = _sorted_lists(values[by_group[1]], of, groups)
    return pa.table([out[f.name] for f in S.STEP_PARTIALS_SCHEMA], schema=S.STEP_PARTIALS_SCHEMA)


def _sorted_lists(ordered: np.ndarray, group: np.ndarray, groups: int) -> pa.ListArray:
    """One list per group of the values, each sorted ascending (NaN last).

    ``ordered`` holds the values in the order of their group (a copy: sorted in place), ``group``
    the group of each value in its original order.
    """
    return _sorted_runs(ordered, np.bincount(group, minlength=groups))


def _sorted_runs(ordered: np.ndarray, counts: np.ndarray) -> pa.ListArray:
    """One list per group of ``ordered``'s values, ``counts[i]`` of them for group ``i``, each sorted in place."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    for i in np.flatnonzero(counts > 1).tolist():
        ordered[offsets[i] : offsets[i + 1]].sort()
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), pa.array(ordered, pa.float64()))


def _merged(partials: pa.Table) -> bool:
    """Whether ``partials`` already has one row per (step, validate) and its values sorted within each row."""
    keys = list(zip(partials.column(S.STEP).to_pylist(), partials.column(S.VALIDATE).to_pylist(), strict=True))
    if len(set(keys)) != len(keys):
        return False
    for c in _PART_LISTS:
        lists = partials.column(c).combine_chunks()
        values = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
        if len(values) < 2:
            continue
        starts = np.asarray(lists.offsets.to_numpy()) - lists.offsets[0].as_py()
        falls = np.flatnonzero(values[1:] < values[:-1]) + 1  # positions where a value is below the one before
        if not np.isin(falls, starts).all():  # ... anywhere but at the start of a row's list
            return False
    return True


def _moments(flat: np.ndarray, at: np.ndarray) -> tuple[list[float], list[float], list[float], list[float]]:
    """``np.mean``, ``np.std``, ``np.min`` and ``np.max`` of each run ``flat[at[i]:at[i + 1]]`` (NaN for an empty one).

    The same operations numpy's own functions do, in the same order (so the same bits): the mean is
    the pairwise sum over the count, the variance the pairwise sum of squared deviations from it over
    the count; only the elementwise steps run on every run at once. Sums stay one call per run, since
    ``np.add.reduceat`` is not the pairwise sum.
    """
    groups = len(at) - 1
    nan = [math.nan] * groups
    if not len(flat):
        return nan, list(nan), list(nan), list(nan)
    counts = np.diff(at)
    full = np.flatnonzero(counts > 0)
    starts, ends = at[:-1].tolist(), at[1:].tolist()
    add = np.add.reduce
    totals = np.array([add(flat[starts[i] : ends[i]]) for i in full.tolist()], dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as np.std gives
        means = totals / counts[full]
        square = flat - np.repeat(means, counts[full])
        np.square(square, out=square)
        spread = np.array([add(square[starts[i] : ends[i]]) for i in full.tolist()], dtype=np.float64)
        spread = np.sqrt(spread / counts[full])
    low, high = np.minimum.reduceat(flat, at[full]), np.maximum.reduceat(flat, at[full])
    out = (list(nan), list(nan), list(nan), list(nan))
    for column, got in zip(out, (means, spread, low, high), strict=True):
        for i, v in zip(full.tolist(), got.tolist(), strict=True):
            column[i] = v
    return out


def _stored_metrics(partials: pa.Table) -> bool:
    """Whether ``partials`` carries :data:`tracer.schema.VALUE_METRICS` (a run rollup's table, :func:`with_value_metrics`)."""
    return all(m in partials.schema.names for m in S.VALUE_METRICS)


def _value_metrics(partials: pa.Table) -> dict[str, list[float]]:
    """:data:`tracer.schema.VALUE_METRICS` of each row of merged aggregates: stored or computed.

    A run rollup stores them beside its merged aggregates, so the overview does not go through
    every value at each visit; the rest of :func:`partial_metrics` comes from counts and sums.
    """
    if _stored_metrics(partials):
        return {m: partials.column(m).to_pylist() for m in S.VALUE_METRICS}

    def values(c: str) -> tuple[np.ndarray, np.ndarray]:
        lists = partials.column(c).combine_chunks()
        flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
        return flat, np.asarray(lists.offsets.to_numpy()) - lists.offsets[0].as_py()

    rewards, r_at = values(S.PART_REWARDS)
    lats, l_at = values(S.PART_LATENCIES)
    mean, std, low, high = _moments(np.asarray(rewards, dtype=np.float64), r_at)
    rows = range(partials.num_rows)
    return {
        "reward/mean": mean,
        "reward/std": std,
        "reward/min": low,
        "reward/max": high,
        "latency_s/p50": [_percentile(lats[l_at[i] : l_at[i + 1]], 0.5) for i in rows],
        "latency_s/p95": [_percentile(lats[l_at[i] : l_at[i + 1]], 0.95) for i in rows],
    }


def with_value_metrics(partials: pa.Table) -> pa.Table:
    """Merged aggregates (:func:`merge_step_partials`) with a float64 column per :data:`tracer.schema.VALUE_METRICS`, which
    :func:`partial_metrics` then takes as they are: what a run rollup stores."""
    if not _merged(partials):
        raise ValueError("value metrics are stored only beside merged aggregates")
    got = _value_metrics(partials.select(S.STEP_PARTIALS_SCHEMA.names))
    for m in S.VALUE_METRICS:
        partials = partials.append_column(pa.field(m, pa.float64()), pa.array(got[m], pa.float64()))
    return partials


def partial_metrics(
    partials: pa.Table, token_stats: pa.Table | None = None
) -> dict[tuple[int | None, bool], dict[str, float]]:
    """:func:`step_metrics` from per-step aggregates (:func:`step_partials`, merged or stored).

    A table with the :data:`tracer.schema.VALUE_METRICS` columns (a run rollup's, rows filtered or not) is one merged
    table whose metrics were computed from its values: they are taken as they are.
    """
    if not _stored_metrics(partials) and not _merged(partials):
        partials = merge_step_partials([partials])
    if partials.num_rows == 0:
        return {}
    by_value = _value_metrics(partials)
    sums = {c: partials.column(c).to_pylist() for c in _PART_SUMS}
    out: dict[tuple[int | None, bool], dict[str, float]] = {}
    for i, (step, val) in enumerate(zip(partials.column(S.STEP).to_pylist(), partials.column(S.VALIDATE).to_pylist())):
        n = sums[S.PART_TRAJECTORIES][i]
        calls = sums[S.NUM_TOOL_CALLS][i]
        out[(step, bool(val))] = {
            "trajectories": float(n),
            "reward/mean": by_value["reward/mean"][i],
            "reward/std": by_value["reward/std"][i],
            "reward/min": by_value["reward/min"][i],
            "reward/max": by_value["reward/max"][i],
            "turns/mean": sums[S.NUM_LLM_CALLS][i] / n,
            "tool_calls/mean": calls / n,
            "tool_error_rate": (sums[S.NUM_TOOL_ERRORS][i] / calls) if calls else 0.0,
            "errors": float(sums[S.PART_NOT_OK][i]),
            "latency_s/p50": by_value["latency_s/p50"][i],
            "latency_s/p95": by_value["latency_s/p95"][i],
        }
    if token_stats is not None:
        mismatch = token_stat_metrics(token_stats)
        empty = {"logprob_mismatch": math.nan, "logprob_ratio/max": math.nan, "mismatch_tokens": 0.0}
        for k, metrics in out.items():
            metrics.update(mismatch.get(k, empty))
    return {k: out[k] for k in sorted(out, key=lambda k: (k[0] is None, k[0] or 0, k[1]))}

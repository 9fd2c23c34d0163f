"""Turns: the output shapes agent code returns, recognised in one place, as each trajectory's conversation."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.record.pieces import split_text
from tracer.schema import parse_json_or_text as _loads

#: A trajectory's key: the columns it takes from its first row besides its name and status.
KEY_COLUMNS = (S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE)
#: Span columns :func:`trajectory_turns` reads (missing ones count as null): all but the keys and the reward.
TURN_SPAN_COLUMNS: tuple[str, ...] = tuple(c for c in S.SPAN_COLUMNS if c not in (*KEY_COLUMNS, S.REWARD))


def text_field_name(ids_field: str) -> str:
    """``prompt_ids`` -> ``prompt_text``: where token2text puts a token list's decoded text."""
    return ids_field[: -len("_ids")] + "_text" if ids_field.endswith("_ids") else ids_field + "_text"


def token_texts_field_name(ids_field: str) -> str:
    """``response_ids`` -> ``response_token_texts``, ``token_ids`` -> ``token_texts``: where per-token text goes."""
    stem = ids_field[: -len("_ids")] if ids_field.endswith("_ids") else ids_field
    return stem + "_texts" if stem == "token" or stem.endswith("_token") else stem + "_token_texts"


def token_offsets_field_name(ids_field: str) -> str:
    """``response_ids`` -> ``response_token_offsets``: where each token's end in the decoded text goes."""
    return token_texts_field_name(ids_field)[: -len("_texts")] + "_offsets"


# Where the recognised shapes keep things (first match wins).
#: Keys of a turn's response token ids (ours, verl's TokenOutput, vLLM's).
RESPONSE_ID_KEYS = ("response_ids", "token_ids", "output_ids")
_RESPONSE_TEXT_KEYS = (*(text_field_name(k) for k in RESPONSE_ID_KEYS), "text", "content")
_LOGPROB_KEYS = ("logprobs", "log_probs", "response_logprobs")
_TOKEN_TEXT_KEYS = (*(token_texts_field_name(k) for k in RESPONSE_ID_KEYS), "response_tokens", "tokens")
_TOKEN_OFFSET_KEYS = tuple(token_offsets_field_name(k) for k in RESPONSE_ID_KEYS)
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


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A tool call an assistant turn asked for: ``arguments`` as JSON text, ``id`` its result's ``tool_call_id``."""

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
        tool_call_id, tool_name, arguments: On a tool turn: the call it answers, the tool, its arguments as JSON.
        error: On a failed tool or llm span: ``{"type", "message", ...}``.
        status, span_id, name, start_ns, end_ns: The turn's span's (None for a turn with no span).
        prompt_text, response_text, token_ids, logprobs: On an llm turn: the prompt as text (token2text or as
            given), the reply as recorded (before parsing), its kept token ids, a logprob per token (None: unknown).
        token_count, truncated, prompt_token_count: Reply tokens the engine produced, whether the tracer's
            ``max_tokens`` cut their list, and prompt tokens (counts before truncation).
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
                {k: v for k, v in openai_tool_call(c).items() if v is not None} for c in self.tool_calls
            ]
        if self.role == ROLE_TOOL:
            named = {"tool_call_id": self.tool_call_id, "name": self.tool_name}
            out.update({k: v for k, v in named.items() if v is not None})
        return out


def openai_tool_call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


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


def _messages(value: Any) -> list[Mapping[str, Any]] | None:
    """A chat message list, or None when ``value`` is not one."""
    if not isinstance(value, list) or not value:
        return None
    return value if all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value) else None


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
    if isinstance(x, Mapping):  # OpenAI: {"token", "logprob"}; vLLM: {token_id: {"logprob": ..}}
        for v in (x, *x.values()):
            if isinstance(v, Mapping) and isinstance(v.get("logprob"), (int, float)):
                return float(v["logprob"])
    return None


def _logprobs(value: Any) -> list[float | None] | None:
    if isinstance(value, Mapping) and isinstance(value.get("content"), list):
        value = value["content"]  # OpenAI choices[0].logprobs
    if isinstance(value, list):
        return [_logprob(x) for x in value]
    return None


def _reply(out: Any) -> dict[str, Any]:
    """What an llm span returned, in any recognised shape, as :class:`Turn` fields (and ``ids_key``)."""
    if out is None:
        return {}
    if isinstance(out, str):
        return {"text": out}
    msgs = _messages(out)
    if msgs is not None:
        last = next((m for m in reversed(msgs) if m.get("role") == ROLE_ASSISTANT), msgs[-1])
        return {"text": content_text(last.get("content")), "tool_calls": _tool_calls(last.get("tool_calls"))}
    if not isinstance(out, Mapping):
        return {"text": _dumps(out)}
    choices = out.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):  # OpenAI chat completion
        ch = choices[0]
        msg: Mapping[str, Any] = ch["message"] if isinstance(ch.get("message"), Mapping) else {}
        text = content_text(msg.get("content")) if msg else ch.get("text")
        lps = ch.get("logprobs")
        texts = None
        if isinstance(lps, Mapping) and isinstance(lps.get("content"), list):
            texts = [str(e.get("token", "")) for e in lps["content"] if isinstance(e, Mapping)]
        return {
            "text": text if isinstance(text, str) else None,
            "token_texts": texts,
            "logprobs": _logprobs(lps),
            "finish_reason": _str(ch.get("finish_reason")),
            "tool_calls": _tool_calls(msg.get("tool_calls")),
        }
    outputs = out.get("outputs")
    if isinstance(outputs, list) and outputs and isinstance(outputs[0], Mapping):  # vLLM RequestOutput
        out = outputs[0]
    # This project's rollout, verl's TokenOutput, vLLM's CompletionOutput, a chat message, or {"text": ...}.
    ids_key, ids = _first(out, RESPONSE_ID_KEYS, list)
    _, text = _first(out, _RESPONSE_TEXT_KEYS, (str, list))
    _, lps = _first(out, _LOGPROB_KEYS, (list, Mapping))
    _, texts = _first(out, _TOKEN_TEXT_KEYS, list)
    if texts is None:
        _, ends = _first(out, _TOKEN_OFFSET_KEYS, list)
        texts = split_text(text, ends) if ends is not None and isinstance(text, str) else None
    _, finish = _first(out, _FINISH_KEYS, str)
    calls = _tool_calls(out.get("tool_calls"))
    if ids is None and text is None and lps is None and not calls:
        return {"text": _dumps(out)}
    return {
        "text": content_text(text),
        "token_ids": ids,
        "ids_key": ids_key,
        "token_texts": texts if texts is not None and all(isinstance(x, str) for x in texts) else None,
        "logprobs": _logprobs(lps),
        "finish_reason": finish,
        "tool_calls": calls,
    }


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
        inputs = next((inputs[k] for k in ("arguments", "parameters") if k in inputs), inputs)
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
    """The :class:`Turn` fields named as the span columns they copy."""
    return {c: row.get(c) for c in (S.STATUS, S.SPAN_ID, S.NAME, S.START_NS, S.END_NS)}


def _llm_turn(row: Mapping[str, Any]) -> Turn:
    """The assistant turn an llm span (or a root returning a reply) recorded."""
    reply = _reply(_loads(row.get(S.OUTPUTS)))
    ids_key, ids = reply.pop("ids_key", None), reply.get("token_ids")
    prompt_text, prompt_ids, _ = _prompt(_loads(row.get(S.INPUTS)))
    recorded, truncated, prompt_count = _token_meta(_loads(row.get(S.ATTRIBUTES)), ids_key)
    if prompt_count is None and prompt_ids is not None:
        prompt_count = len(prompt_ids)
    return Turn(
        role=ROLE_ASSISTANT,
        content=reply.get("text"),
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        response_text=reply.get("text"),
        token_count=recorded if recorded is not None else (len(ids) if ids else None),
        truncated=truncated,
        prompt_token_count=prompt_count,
        error=_error(row),
        **reply,
        **_span_fields(row),
    )


def _start(row: Mapping[str, Any]) -> int:
    v = row.get(S.START_NS)
    return v if isinstance(v, int) else 0


def root_span(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """A trajectory's root: a span without a parent, ``kind="rollout"`` first, then the earliest."""
    roots = [
        (0 if r.get(S.KIND) == S.KIND_ROLLOUT else 1, _start(r), i)
        for i, r in enumerate(rows)
        if r.get(S.PARENT_SPAN_ID) is None and not is_log_reward(r)
    ]
    return rows[min(roots)[2]] if roots else None


def is_log_reward(row: Mapping[str, Any]) -> bool:
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
    last = next((i for i in reversed(range(len(turns))) if turns[i].role == ROLE_ASSISTANT), None)
    if last is not None and calls and not turns[last].tool_calls:
        turns[last] = dataclasses.replace(turns[last], tool_calls=calls)


def _merge(msgs: Sequence[Mapping[str, Any]], spans: list[Turn]) -> list[Turn]:
    """Root messages joined to their spans: the i-th assistant message to the i-th llm span when their counts agree,
    a tool message to the next unused tool span of its name (else, when the counts agree, the next unused one)."""
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


def rows_by_trace(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The rows of ``spans`` (a table or dicts with :data:`TURN_SPAN_COLUMNS`) by trace id, in order."""
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    for r in _rows_of(spans):
        by_trace.setdefault(r.get(S.TRACE_ID), []).append(r)  # type: ignore[arg-type]
    return by_trace


def trajectory_turns(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, list[Turn]]:
    """The turns of every trajectory in ``spans`` (a table or dicts with :data:`TURN_SPAN_COLUMNS`), by trace id.

    A root returning ``{"messages": [...]}`` gives the conversation, each message joined to its span; else it is
    rebuilt: the root's chat (verl's ``raw_prompt``) or the first llm prompt, then one turn per llm and tool span.
    """
    return {tid: _conversation(rows) for tid, rows in rows_by_trace(spans).items()}


def span_turns(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[Turn]:
    """One turn per llm or tool span, in start order (every call, whether or not the conversation shows it)."""
    rows = sorted(_rows_of(spans), key=_start)
    return [t for t in (span_turn(r) for r in rows) if t is not None]


def trajectory_messages(spans: pa.Table | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The :func:`trajectory_turns` of one trajectory's spans as OpenAI chat messages (``{"role", "content", ...}``)."""
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
    """A trajectory's prompt (the first llm call's, else the turns before the first reply) and final response.

    The response is the last llm call's reply as recorded, else the last assistant turn's text.
    """
    assistant = [t for t in turns if t.role == ROLE_ASSISTANT]
    prompt = assistant[0].prompt_text if assistant else None
    if prompt is None:
        prompt = render_turns(list(itertools.takewhile(lambda t: t.role != ROLE_ASSISTANT, turns)))
    response = None
    if assistant:
        last = assistant[-1]
        response = last.response_text if last.response_text is not None else last.text
    return prompt, response or ""

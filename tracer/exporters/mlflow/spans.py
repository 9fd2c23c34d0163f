"""Trajectory (rows of SPAN_SCHEMA) <-> MLflow span data, without importing mlflow.

One trajectory is one MLflow trace (id from ours and the experiment: :func:`mlflow_trace_id`, so re-sending upserts).
Spans keep their times and parents; what MLflow has no slot for is under ``rollout_trace.*`` attributes, so
:mod:`tracer.exporters.mlflow.importer` restores the rows exactly. The root and llm spans get OpenAI-style ``messages``
and ``choices`` for MLflow's chat view, listed in ``rollout_trace.added`` so the import strips them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa

from tracer import schema as S
from tracer.summary import ROLE_ASSISTANT, root_span, span_turn, summarize, trajectory_turns

#: MLflow trace ids are this prefix plus 32 hex chars of the OpenTelemetry trace id.
MLFLOW_TRACE_ID_PREFIX = "tr-"

# MLflow span types by span kind (verl's own MLflow backend uses these names too).
SPAN_TYPE_BY_KIND = {
    S.KIND_ROLLOUT: "AGENT",
    S.KIND_LLM: "CHAT_MODEL",
    S.KIND_TOOL: "TOOL",
    S.KIND_REWARD: "EVALUATOR",
    S.KIND_SPAN: "CHAIN",
}
#: And back, with MLflow's ``LLM`` as an llm span.
KIND_BY_SPAN_TYPE = {**{t: k for k, t in SPAN_TYPE_BY_KIND.items()}, "LLM": S.KIND_LLM}

# MLflow's reserved span attribute keys (mlflow.tracing.constant.SpanAttributeKey).
MLFLOW_REQUEST_ID = "mlflow.traceRequestId"
MLFLOW_SPAN_TYPE = "mlflow.spanType"
MLFLOW_INPUTS = "mlflow.spanInputs"
MLFLOW_OUTPUTS = "mlflow.spanOutputs"
MLFLOW_MESSAGE_FORMAT = "mlflow.message.format"
MLFLOW_CHAT_USAGE = "mlflow.chat.tokenUsage"
#: Root-span attribute prefix that MLflow's span ingestion turns into trace tags.
MLFLOW_TRACE_TAG_PREFIX = "mlflow.traceTag."

# Our span attributes (values JSON-encoded, as MLflow stores all attributes).
ATTR_TRACE_ID = "rollout_trace.trace_id"
ATTR_SPAN_ID = "rollout_trace.span_id"
ATTR_PARENT = "rollout_trace.parent_span_id"
ATTR_KIND = "rollout_trace.kind"
ATTR_STATUS = "rollout_trace.status"
ATTR_ERROR = "rollout_trace.error"
ATTR_REWARD = "rollout_trace.reward"
ATTR_STEP = "rollout_trace.step"
ATTR_SAMPLE = "rollout_trace.sample_index"
ATTR_ROLLOUT_N = "rollout_trace.rollout_n"
ATTR_VALIDATE = "rollout_trace.validate"
ATTR_ATTRIBUTES = "rollout_trace.attributes"
ATTR_ADDED = "rollout_trace.added"
ATTR_SYNTHETIC = "rollout_trace.synthetic"
ATTR_PROJECT = "rollout_trace.project_name"
ATTR_EXPERIMENT = "rollout_trace.experiment_name"
#: Every span attribute key this exporter writes itself (an importer tells them from the user's own).
OUR_ATTR_KEYS: frozenset[str] = frozenset(v for k, v in list(globals().items()) if k.startswith("ATTR_"))

TAG_TRACE_ID = "rollout_trace.trace_id"
TAG_EXPERIMENT = "experiment_name"
TAG_PROJECT = "project_name"
TAG_REWARD = "reward"
#: The trace's name in the MLflow UI: its root span's name (verl's ``agent_loop``).
TAG_TRACE_NAME = "mlflow.traceName"
#: Prefix of tags holding log_reward extras (``reward.advantage``).
TAG_REWARD_PREFIX = "reward."

# Token-count keys (span attribute "tokens") that count prompt and response tokens.
PROMPT_TOKEN_KEYS = ("prompt_ids", "input_ids")
RESPONSE_TOKEN_KEYS = ("response_ids", "output_ids", "token_ids")

_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def otel_span_hex(span_id: str) -> str:
    """Our span id as 16 hex chars (itself when it already is)."""
    return span_id if _HEX16.match(span_id) and int(span_id, 16) else hashlib.sha256(span_id.encode()).hexdigest()[:16]


def namespaced_trace_hex(trace_id: str, experiment: str) -> str:
    """32 hex chars for ``trace_id`` in MLflow experiment ``experiment`` (ids are unique across a store)."""
    return hashlib.sha256(f"{experiment}\x00{trace_id}".encode()).hexdigest()[:32]


def mlflow_trace_id(trace_id: str, experiment: str) -> str:
    """The MLflow trace id a trajectory is exported under, in the MLflow experiment ``experiment``."""
    return MLFLOW_TRACE_ID_PREFIX + namespaced_trace_hex(trace_id, experiment)


@dataclasses.dataclass
class SpanData:
    """One span ready for MLflow: ids in hex, values not yet JSON-encoded."""

    span_id: str
    parent_id: str | None
    name: str
    span_type: str
    start_ns: int
    end_ns: int
    error: bool = False
    status_message: str = ""
    inputs: Any = None
    outputs: Any = None
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``(name, time_ns, attributes)`` of span events (the exception of a failed span).
    events: list[tuple[str, int, dict[str, str]]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrajectoryData:
    """One trajectory as an MLflow trace."""

    trace_id: str
    mlflow_trace_id: str
    otel_trace_hex: str
    tags: dict[str, str]
    #: Parents before children; ``spans[0]`` is the root (unless ``partial``).
    spans: list[SpanData]
    summary: dict[str, Any]
    response_tokens: int
    #: Late spans of a trajectory sent before (no root among ``spans``).
    partial: bool = False


def _loads(text: Any) -> Any:
    """A JSON column parsed with the standard library, which (unlike orjson) decodes lone surrogates: a hostile value
    is then refused by MLflow's UTF-8 encoding, trajectory by trajectory, instead of reaching it as JSON text."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def dumps(value: Any) -> str:
    """``value`` as JSON text: orjson's, else (ints beyond 64 bits, ...) the standard library's, other types as text."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, default=str)


def count_tokens(tokens: Any, keys: Sequence[str]) -> int:
    """Sum of the token counts under ``keys`` of a span's ``tokens`` attribute."""
    numbers = [tokens.get(k) for k in keys] if isinstance(tokens, Mapping) else []
    return sum(int(n) for n in numbers if isinstance(n, (int, float)))


def _order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with every parent before its children (roots first), by start time."""
    by_parent: dict[Any, list[dict[str, Any]]] = {}
    ids = {r[S.SPAN_ID] for r in rows}
    for r in sorted(rows, key=lambda r: (r[S.START_NS], r[S.END_NS])):
        parent = r[S.PARENT_SPAN_ID] if r[S.PARENT_SPAN_ID] in ids else None
        by_parent.setdefault(parent, []).append(r)
    out: list[dict[str, Any]] = []
    stack = list(reversed(by_parent.get(None, [])))
    while stack:
        r = stack.pop()
        out.append(r)
        stack.extend(reversed(by_parent.get(r[S.SPAN_ID], [])))
    seen = {id(r) for r in out}
    out.extend(r for r in rows if id(r) not in seen)  # cycles: keep, MLflow links what it can
    return out


def _augment(value: Any, key: str, extra: Any, added: dict[str, Any], side: str) -> Any:
    """Add ``key: extra`` to a dict-valued input/output, recording what was added."""
    if value is None:
        added[side] = None  # the original was null: the import restores null
        return {key: extra}
    if isinstance(value, dict) and key not in value:
        added[side] = [key]
        return {**value, key: extra}
    return value


def _chat_completion(message: Mapping[str, Any], finish_reason: Any) -> list[dict[str, Any]]:
    return [{"index": 0, "message": dict(message), "finish_reason": finish_reason or "stop"}]


#: ``(column, span attribute, trace tag)`` of the context a trajectory's spans share.
CONTEXT_KEYS = (
    (S.STEP, ATTR_STEP, "step"),
    (S.SAMPLE_INDEX, ATTR_SAMPLE, "sample_index"),
    (S.ROLLOUT_N, ATTR_ROLLOUT_N, "rollout_n"),
    (S.VALIDATE, ATTR_VALIDATE, "validate"),
)


class _Chat:
    """A trajectory's conversation, and where each llm span's reply stands in it."""

    def __init__(self, rows: list[dict[str, Any]], trace_id: str) -> None:
        turns = trajectory_turns(rows).get(trace_id, [])
        self.messages = [t.as_message() for t in turns]
        self.assistant = [i for i, t in enumerate(turns) if t.role == ROLE_ASSISTANT]
        self.reply_pos = {turns[i].span_id: i for i in self.assistant if turns[i].span_id is not None}

    def llm_view(self, r: dict[str, Any], inputs: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        """An llm span's ``messages`` input (the conversation before its reply) and ``choices`` output."""
        pos = self.reply_pos.get(r[S.SPAN_ID])
        own = span_turn(r)
        if pos is not None:
            prompt_msgs: list[Any] = self.messages[:pos]
            reply: Mapping[str, Any] = self.messages[pos]
        else:
            prompt = own.prompt_text if own is not None else None
            prompt_msgs = [{"role": "user", "content": prompt if prompt is not None else json.dumps(inputs)}]
            reply = own.as_message() if own is not None else {"role": "assistant", "content": ""}
        return prompt_msgs, _chat_completion(reply, own.finish_reason if own is not None else None)


#: ``(exception event attribute, key of our error JSON)``.
EXCEPTION_KEYS = (("type", "type"), ("message", "message"), ("stacktrace", "traceback"))


def _span_data(
    r: dict[str, Any], is_root: bool, parent_hex: str | None, orphan: bool, summary: dict[str, Any], chat: _Chat
) -> SpanData:
    """One span row as MLflow span data (what MLflow has no slot for under ``rollout_trace.*``)."""
    kind = r[S.KIND]
    attrs: dict[str, Any] = {ATTR_KIND: kind, ATTR_STATUS: r[S.STATUS]}
    if not _HEX16.match(r[S.SPAN_ID]):
        attrs[ATTR_SPAN_ID] = r[S.SPAN_ID]
    if orphan:
        attrs[ATTR_PARENT] = r[S.PARENT_SPAN_ID]
    for col, key, _ in CONTEXT_KEYS:
        if is_root or r[col] != summary[col]:
            attrs[key] = r[col]
    if r[S.REWARD] is not None:
        attrs[ATTR_REWARD] = r[S.REWARD] if math.isfinite(r[S.REWARD]) else str(r[S.REWARD])
    own_attrs, error = _loads(r[S.ATTRIBUTES]), _loads(r[S.ERROR])
    attrs.update({k: v for k, v in ((ATTR_ATTRIBUTES, own_attrs), (ATTR_ERROR, error)) if v is not None})
    inputs, outputs = _loads(r[S.INPUTS]), _loads(r[S.OUTPUTS])
    added: dict[str, Any] = {}
    if kind == S.KIND_LLM:
        attrs[MLFLOW_MESSAGE_FORMAT] = "openai"
        tokens = own_attrs.get(S.ATTR_TOKENS) if isinstance(own_attrs, Mapping) else None
        n_in, n_out = count_tokens(tokens, PROMPT_TOKEN_KEYS), count_tokens(tokens, RESPONSE_TOKEN_KEYS)
        if n_in or n_out:  # where MLflow's chat view reads token counts
            attrs[MLFLOW_CHAT_USAGE] = {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}
        prompt_msgs, choices = chat.llm_view(r, inputs)
        inputs = _augment(inputs, "messages", prompt_msgs, added, "inputs")
        outputs = _augment(outputs, "choices", choices, added, "outputs")
    elif is_root and chat.messages:
        attrs[MLFLOW_MESSAGE_FORMAT] = "openai"
        last = chat.assistant[-1] if chat.assistant else len(chat.messages)
        inputs = _augment(inputs, "messages", chat.messages[:last], added, "inputs")
        if chat.assistant:
            outputs = _augment(outputs, "choices", _chat_completion(chat.messages[last], None), added, "outputs")
    if added:
        attrs[ATTR_ADDED] = added
    failed = r[S.STATUS] in (S.STATUS_ERROR, S.STATUS_CANCELLED)
    events: list[tuple[str, int, dict[str, str]]] = []
    if r[S.STATUS] == S.STATUS_ERROR and isinstance(error, Mapping):
        exc = {f"exception.{k}": str(error.get(f, "")) for k, f in EXCEPTION_KEYS}
        events = [("exception", r[S.END_NS], exc)]
    message = (str(error.get("message", "")) if isinstance(error, Mapping) else r[S.STATUS]) if failed else ""
    names = (otel_span_hex(r[S.SPAN_ID]), parent_hex, r[S.NAME], SPAN_TYPE_BY_KIND.get(kind, "UNKNOWN"))
    times = (r[S.START_NS], max(r[S.END_NS], r[S.START_NS]))
    return SpanData(*names, *times, failed, message, inputs, outputs, attrs, events)


def trajectory_data(
    rows: list[dict[str, Any]],
    project: str,
    experiment: str,
    reward: tuple[float | None, str | None] | None = None,
    partial: bool = False,
) -> TrajectoryData:
    """The span rows of one trajectory as an MLflow trace. ``reward``: ``(reward, reward_info JSON)`` known from
    outside the rows (logged by another process). ``partial``: the rows are late spans of a trajectory already sent:
    parents kept, no root added, only the reward tagged."""
    trace_id = rows[0][S.TRACE_ID]
    ids = {r[S.SPAN_ID] for r in rows}
    root_row = root_span(rows)
    summary = summarize(pa.Table.from_pylist(rows, schema=S.SPAN_SCHEMA)).to_pylist()[0]
    if reward is not None and reward[0] is not None:
        summary[S.REWARD], summary[S.REWARD_INFO] = reward
    chat = _Chat(rows, trace_id)
    spans: list[SpanData] = []
    root_hex = otel_span_hex(root_row[S.SPAN_ID]) if root_row is not None else None
    if root_row is None and not partial:
        # The root never ended (the writer was killed mid-rollout): MLflow needs one root.
        root_hex = otel_span_hex(trace_id + ":root")
        attrs = {ATTR_SYNTHETIC: True, ATTR_KIND: S.KIND_ROLLOUT, ATTR_STATUS: S.STATUS_INCOMPLETE}
        spans.append(
            SpanData(root_hex, None, "trajectory", "AGENT", summary[S.START_NS], summary[S.END_NS], attributes=attrs)
        )
    for r in _order(rows):
        parent = r[S.PARENT_SPAN_ID]
        # A second root or an orphan hangs under the root.
        orphan = r is not root_row and (parent is None or not (parent in ids or partial))
        parent_hex = None if r is root_row else root_hex if orphan else otel_span_hex(parent)
        spans.append(_span_data(r, r is root_row, parent_hex, orphan, summary, chat))
    tags: dict[str, str] = {}  # a partial trajectory's: the reward alone
    if not partial:
        spans[0].attributes.update({ATTR_PROJECT: project, ATTR_EXPERIMENT: experiment, ATTR_TRACE_ID: trace_id})
        tags = {
            TAG_TRACE_ID: trace_id,
            TAG_PROJECT: project,
            TAG_EXPERIMENT: experiment,
            "status": summary[S.STATUS],
            TAG_TRACE_NAME: spans[0].name,
        }
        # str() of the value, as verl's MLflow backend writes tags ('False', '3'): its searches find ours.
        tags.update({tag: str(summary[col]) for col, _, tag in CONTEXT_KEYS if summary[col] is not None})
    if summary[S.REWARD] is not None:
        tags[TAG_REWARD] = str(summary[S.REWARD])
    info = _loads(summary[S.REWARD_INFO])
    extras = info.items() if isinstance(info, Mapping) else ()
    tags.update({TAG_REWARD_PREFIX + str(k): str(v) for k, v in extras if isinstance(v, (int, float, str, bool))})
    trace_ids = (trace_id, mlflow_trace_id(trace_id, project), namespaced_trace_hex(trace_id, project))
    response_tokens = sum(s.attributes.get(MLFLOW_CHAT_USAGE, {}).get("output_tokens", 0) for s in spans)
    return TrajectoryData(*trace_ids, tags, spans, summary, response_tokens, partial)

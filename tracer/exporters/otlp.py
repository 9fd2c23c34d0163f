"""OTLP/HTTP export: every trajectory as an OpenTelemetry trace, with the GenAI conventions.

Trace and span ids are the files' own, so a receiver that upserts keeps one copy. The root is ``invoke_agent`` with the
RL keys under ``rollout_trace.*`` and the reward and each numeric reward component as ``gen_ai.evaluation.result``
events; llm spans are ``chat`` (model, temperature, token usage, finish reasons), tool spans ``execute_tool``. Content
(messages, tool arguments and results, inputs and outputs) is sent only with the ``content`` option. ``log_reward`` rows
are not spans: the reward is on the root. Protobuf over HTTP POST, with the standard library.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.base import NEW, SinkBase, StepBatch, Target, Trajectory, Written
from tracer.exporters.bounded import CALL_TIMEOUT_S
from tracer.exporters.tables import number
from tracer.extras import import_backend
from tracer.summary import ROLE_ASSISTANT, ROLE_TOOL, Turn, content_text, span_turn, trajectory_turns

#: Endpoint when none is given: an OpenTelemetry collector on this machine.
DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
#: Trajectories per HTTP request.
TRAJECTORIES_PER_REQUEST = 64
#: Longest attribute value sent, in characters (receivers refuse huge attributes).
MAX_ATTRIBUTE_CHARS = 65_536
SERVICE_NAME = "rollout-trace"
#: Attribute names follow the OpenTelemetry GenAI semantic conventions; this project's own have this prefix.
ATTR_PREFIX = "rollout_trace."
GEN_AI_OPERATION = "gen_ai.operation.name"
#: Keys of an llm span's inputs or attributes (or one level down) giving the request's model and temperature.
MODEL_KEYS = ("model", "model_name", "model_path")
TEMPERATURE_KEYS = ("temperature",)
#: The reward component that is the RL advantage, not an evaluation.
ADVANTAGE = "advantage"


def traces_url(endpoint: str | None) -> str:
    """The URL to POST to: ``endpoint`` (or the OTEL environment variables), ``/v1/traces`` added to a bare host."""
    if endpoint is None:
        given = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if given:
            return given
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"otlp endpoint {endpoint!r} is not an http(s) URL; e.g. --endpoint http://127.0.0.1:4318")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def parse_headers(text: str | None) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` (as ``OTEL_EXPORTER_OTLP_HEADERS``) as a dict."""
    out: dict[str, str] = {}
    for item in filter(str.strip, (text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"otlp header {item!r} is not NAME=VALUE; e.g. --headers x-mlflow-experiment-id=1")
        out[key.strip()] = urllib.parse.unquote(value.strip())
    return out


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ATTRIBUTE_CHARS else text[:MAX_ATTRIBUTE_CHARS] + "...(cut)"


def _lookup(keys: Sequence[str], *sources: Any) -> Any:
    """The first value under one of ``keys`` in ``sources`` (JSON text or mappings), top level or one level down."""
    for source in map(S.parse_json_or_text, sources):
        if not isinstance(source, Mapping):
            continue
        for level in (source, *(v for v in source.values() if isinstance(v, Mapping))):
            for key in keys:
                value = level.get(key)
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    return value
    return None


def _parts_message(turn: Turn) -> dict[str, Any]:
    """A turn as a GenAI-conventions message (``role`` and ``parts``)."""
    parts: list[dict[str, Any]] = []
    text = content_text(turn.content) if turn.content is not None else turn.text
    if turn.role == ROLE_TOOL:
        parts.append({"type": "tool_call_response", "id": turn.tool_call_id, "response": text or ""})
    elif text:
        parts.append({"type": "text", "content": text})
    for call in turn.tool_calls:
        try:
            args: Any = json.loads(call.arguments)
        except ValueError:
            args = call.arguments
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": args})
    msg: dict[str, Any] = {"role": turn.role, "parts": parts}
    if turn.role == ROLE_ASSISTANT and turn.finish_reason:
        msg["finish_reason"] = turn.finish_reason
    return msg


def _span_rows(traj: Trajectory) -> list[dict[str, Any]]:
    """A trajectory's rows sent as spans: ``log_reward`` rows left out (the reward is on the root)."""
    return [r for r in traj.spans if not (r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME)]


class OtlpSink(SinkBase):
    """POSTs each trajectory as an OTLP trace to an OTLP/HTTP endpoint (protobuf)."""

    span_columns: ClassVar[Sequence[str] | None] = None
    streams: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.pb = import_backend("opentelemetry.proto.collector.trace.v1.trace_service_pb2", "otlp")
        self.trace_pb = import_backend("opentelemetry.proto.trace.v1.trace_pb2", "otlp")
        self.common_pb = import_backend("opentelemetry.proto.common.v1.common_pb2", "otlp")
        self.url = traces_url(self.options.get("endpoint"))
        self.headers = parse_headers(self.options.get("headers"))
        self.timeout = float(self.options.get("timeout_s") or 30.0)
        self.destination = self.url
        self.target: Target | None = None
        self.requests = 0

    @property
    def timeout_s(self) -> float:
        """A call (a step's requests) waits :data:`CALL_TIMEOUT_S`; each request is bounded by ``timeout_s`` itself."""
        return max(CALL_TIMEOUT_S, self.timeout)

    def open(self, target: Target) -> set[str]:
        """Remember the run's names (resource attributes); nothing is skipped: re-sending upserts."""
        self.target = target
        return set()

    def _value(self, value: Any) -> Any:
        v = self.common_pb.AnyValue()
        if isinstance(value, bool):
            v.bool_value = value
        elif isinstance(value, int):
            v.int_value = value
        elif isinstance(value, float):
            v.double_value = value
        elif isinstance(value, (list, tuple)):
            v.array_value.values.extend(self._value(x) for x in value)
        else:
            v.string_value = _cut(str(value))
        return v

    def _attrs(self, attrs: Mapping[str, Any]) -> list[Any]:
        return [self.common_pb.KeyValue(key=k, value=self._value(v)) for k, v in attrs.items() if v is not None]

    def _span_attrs(self, row: Mapping[str, Any], summary: Mapping[str, Any], turns: list[Turn]) -> dict[str, Any]:
        kind = row[S.KIND]
        content = bool(self.options.get("content"))
        attrs: dict[str, Any] = {ATTR_PREFIX + "kind": kind, "gen_ai.conversation.id": summary[S.TRACE_ID]}
        if content:
            attrs["input.value"], attrs["output.value"] = row.get(S.INPUTS), row.get(S.OUTPUTS)
        turn = span_turn(row)
        if kind == S.KIND_LLM and turn is not None:
            request = (row.get(S.INPUTS), row.get(S.ATTRIBUTES))
            attrs.update(
                {
                    GEN_AI_OPERATION: "chat",
                    "gen_ai.provider.name": SERVICE_NAME,
                    "gen_ai.request.model": _lookup(MODEL_KEYS, *request),
                    "gen_ai.request.temperature": number(_lookup(TEMPERATURE_KEYS, *request)),
                    "gen_ai.usage.input_tokens": turn.prompt_token_count,
                    "gen_ai.usage.output_tokens": turn.token_count,
                    "gen_ai.response.finish_reasons": [turn.finish_reason] if turn.finish_reason else None,
                }
            )
            if content:
                pos = next((i for i, t in enumerate(turns) if t.span_id == row[S.SPAN_ID]), None)
                before = turns[:pos] if pos is not None else []
                if not before and turn.prompt_text is not None:
                    before = [Turn(role="user", text=turn.prompt_text, content=turn.prompt_text)]
                shown = turns[pos] if pos is not None else turn
                attrs["gen_ai.input.messages"] = json.dumps([_parts_message(t) for t in before], ensure_ascii=False)
                attrs["gen_ai.output.messages"] = json.dumps([_parts_message(shown)], ensure_ascii=False)
        elif kind == S.KIND_TOOL and turn is not None:
            shown = next((t for t in turns if t.span_id == row[S.SPAN_ID]), turn)
            attrs[GEN_AI_OPERATION], attrs["gen_ai.tool.call.id"] = "execute_tool", shown.tool_call_id
            attrs["gen_ai.tool.name"] = shown.tool_name or row[S.NAME]
            if content:
                attrs["gen_ai.tool.call.arguments"], attrs["gen_ai.tool.call.result"] = turn.arguments, shown.text
        return attrs

    def trajectory_spans(self, traj: Trajectory) -> list[Any]:
        """The OTLP spans of one trajectory (``log_reward`` rows left out: the reward is on the root)."""
        tp = self.trace_pb
        summary = traj.summary
        rows = _span_rows(traj)
        turns = trajectory_turns(rows).get(summary[S.TRACE_ID], [])
        info = S.parse_json_or_text(summary.get(S.REWARD_INFO))
        info = info if isinstance(info, dict) else {}
        root_attrs = {
            GEN_AI_OPERATION: "invoke_agent",
            "gen_ai.agent.name": summary[S.NAME],
            ATTR_PREFIX + S.STEP: summary[S.STEP],
            ATTR_PREFIX + S.SAMPLE_INDEX: summary[S.SAMPLE_INDEX],
            ATTR_PREFIX + S.ROLLOUT_N: summary[S.ROLLOUT_N],
            ATTR_PREFIX + S.VALIDATE: bool(summary[S.VALIDATE]),
            ATTR_PREFIX + ADVANTAGE: number(info.get(ADVANTAGE)),
            ATTR_PREFIX + S.REWARD: summary[S.REWARD],
            ATTR_PREFIX + S.STATUS: summary[S.STATUS],
            ATTR_PREFIX + S.REWARD_INFO: summary[S.REWARD_INFO],
        }
        scores = {S.REWARD: number(summary[S.REWARD])}
        scores.update({str(k): number(v) for k, v in info.items() if k != ADVANTAGE})
        scores = {k: v for k, v in scores.items() if v is not None}
        out = []
        for r in rows:
            attrs = self._span_attrs(r, summary, turns)
            is_root = r[S.PARENT_SPAN_ID] is None
            if is_root:
                attrs.update(root_attrs)
            events = [
                tp.Span.Event(
                    time_unix_nano=int(r[S.END_NS]),
                    name="gen_ai.evaluation.result",
                    attributes=self._attrs({"gen_ai.evaluation.name": k, "gen_ai.evaluation.score.value": v}),
                )
                for k, v in (scores.items() if is_root else ())
            ]
            err = r.get(S.ERROR)
            ok = r[S.STATUS] == S.STATUS_OK
            status = tp.Status(code=tp.Status.STATUS_CODE_ERROR, message=_cut(str(r[S.STATUS] if err is None else err)))
            out.append(
                tp.Span(
                    trace_id=bytes.fromhex(r[S.TRACE_ID]),
                    span_id=bytes.fromhex(r[S.SPAN_ID]),
                    parent_span_id=b"" if is_root else bytes.fromhex(r[S.PARENT_SPAN_ID]),
                    name=str(r[S.NAME]),
                    kind=tp.Span.SPAN_KIND_CLIENT if r[S.KIND] == S.KIND_LLM else tp.Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=int(r[S.START_NS]),
                    end_time_unix_nano=int(r[S.END_NS]),
                    attributes=self._attrs(attrs),
                    events=events,
                    status=tp.Status(code=tp.Status.STATUS_CODE_OK) if ok else status,
                )
            )
        return out

    def request(self, spans: Sequence[Any]) -> Any:
        """The ``ExportTraceServiceRequest`` of some trajectories' spans."""
        resource_attrs = {
            "service.name": SERVICE_NAME,
            ATTR_PREFIX + "project": self.target.project if self.target else None,
            ATTR_PREFIX + "experiment": self.target.experiment if self.target else None,
            # OpenInference's resource attribute: Phoenix files traces under this project (else under "default").
            "openinference.project.name": self.target.project if self.target else None,
        }
        rs = self.trace_pb.ResourceSpans()
        rs.resource.attributes.extend(self._attrs(resource_attrs))
        scope = rs.scope_spans.add()
        scope.scope.name = "rollout_trace"
        scope.spans.extend(spans)
        return self.pb.ExportTraceServiceRequest(resource_spans=[rs])

    def post(self, body: bytes) -> tuple[int, str]:
        """POST one protobuf request; return the receiver's ``partial_success`` (spans rejected, its message).
        RuntimeError when the receiver answers with an error status, ConnectionError when it cannot be reached."""
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf", **self.headers}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - a user-given http(s) URL
                answer = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise RuntimeError(f"OTLP receiver {self.url} answered {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise ConnectionError(f"cannot reach the OTLP receiver at {self.url} ({exc.reason})") from None
        except TimeoutError:
            raise TimeoutError(f"the OTLP receiver at {self.url} gave no answer within {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:  # a reset or a torn answer
            raise ConnectionError(f"the OTLP receiver at {self.url} broke the connection ({exc!r})") from None
        self.requests += 1
        response = self.pb.ExportTraceServiceResponse()
        try:
            response.ParseFromString(answer)
        except Exception:  # not protobuf (a proxy's page): nothing said about rejected spans
            return 0, ""
        partial = response.partial_success
        return int(partial.rejected_spans), str(partial.error_message)

    def write(self, batch: StepBatch) -> Written:
        """Send the batch's new trajectories (late rewards are not re-sent: the root went out already)."""
        todo = [t for t in batch.trajectories if t.state == NEW and t.spans]
        built = self.payloads(todo, self.trajectory_spans)  # a trajectory whose spans cannot be built: refused alone
        # The refused count as sent (the drivers take them back out); late rewards are skipped.
        written = Written(sent=len(todo), skipped=len(batch.trajectories) - len(todo))
        for i in range(0, len(built), TRAJECTORIES_PER_REQUEST):
            chunk = built[i : i + TRAJECTORIES_PER_REQUEST]
            part = [t for t, _ in chunk]
            req = self.request([sp for _, spans in chunk for sp in spans])
            rejected, why = self.post(req.SerializeToString())
            spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            written.spans += spans
            written.rows.update({t.summary[S.TRACE_ID]: t.summary[S.REWARD] for t in part})
            said = f": {why}" if why else ""
            if rejected >= spans:  # every span of the request refused: none of its trajectories is there
                self.refused.extend(
                    (t.summary[S.TRACE_ID], len(_span_rows(t)), f"the receiver rejected all its spans{said}")
                    for t in part
                )
            elif rejected:
                written.problems.append(
                    f"the OTLP receiver at {self.url} rejected {rejected} of {spans} spans of {len(part)} "
                    f"trajectories (step {batch.step}){said}; see the receiver's log, then export again"
                )
        return written

    def close(self) -> list[str]:
        """Nothing is held; say where the traces went."""
        return [f"OTLP traces posted to {self.url} ({self.requests} requests)"] if self.requests else []

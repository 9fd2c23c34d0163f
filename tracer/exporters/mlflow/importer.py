"""Read MLflow traces back into trace files (``rollout-trace import mlflow``).

Traces written by :mod:`tracer.exporters.mlflow` come back as the rows they
were made from: same ids, times, tree, kinds, statuses, errors, rewards,
attributes, inputs and outputs (minus what the exporter added for MLflow's
chat view). Any other MLflow trace with spans is mapped as well: span types
give the kinds (AGENT rollout, CHAT_MODEL/LLM llm, TOOL tool, EVALUATOR
reward, others span), the root becomes the trajectory's rollout span, the
non-MLflow span attributes become our attributes, an exception event becomes
the error, and a ``reward`` trace tag becomes a ``log_reward`` row.
Every text of every row goes through the recorder's redactor
(:func:`tracer.exporters.base.redact_rows`) before it is written: a foreign
trace holds whatever its application put there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa

from tracer import schema as S
from tracer.exporters.base import redact_rows
from tracer.exporters.bounded import CALL_TIMEOUT_S, BackendTimeoutError, call_within
from tracer.exporters.mlflow.server import TrackingUriError, check_tracking_uri
from tracer.exporters.mlflow.spans import (
    ATTR_ADDED,
    ATTR_ATTRIBUTES,
    ATTR_ERROR,
    ATTR_EXPERIMENT,
    ATTR_KIND,
    ATTR_PARENT,
    ATTR_PROJECT,
    ATTR_REWARD,
    ATTR_ROLLOUT_N,
    ATTR_SAMPLE,
    ATTR_SPAN_ID,
    ATTR_STATUS,
    ATTR_STEP,
    ATTR_SYNTHETIC,
    ATTR_TRACE_ID,
    ATTR_VALIDATE,
    KIND_BY_SPAN_TYPE,
    MLFLOW_TRACE_ID_PREFIX,
    OUR_ATTR_KEYS,
    TAG_EXPERIMENT,
    TAG_PROJECT,
    TAG_REWARD,
    TAG_REWARD_PREFIX,
    TAG_ROLLOUT_N,
    TAG_SAMPLE,
    TAG_STEP,
    TAG_TRACE_ID,
    TAG_VALIDATE,
)
from tracer.exporters.tables import Progress
from tracer.extras import import_backend
from tracer.index.closed import shard_closed
from tracer.record.redact import Redactor
from tracer.storage.writer import SpanWriter

#: Experiment name of imported traces that do not name one.
DEFAULT_IMPORT_EXPERIMENT = "mlflow-import"
#: Rows per written batch.
WRITE_BATCH_ROWS = 4096
#: Traces per MLflow search page.
PAGE_SIZE = 100
#: Characters of an error kept in the report.
ERROR_CHARS = 300


@dataclasses.dataclass
class ImportReport:
    """What an import read and wrote.

    Attributes:
        trajectories: Trajectories written.
        spans: Span rows written.
        skipped: Traces not imported (no spans).
        files: Files written.
        details: Human-readable notes.
    """

    trajectories: int = 0
    spans: int = 0
    skipped: int = 0
    #: Traces that could not be mapped (``"<mlflow id>: <why>"``); the others were imported.
    refused: list[str] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    details: list[str] = dataclasses.field(default_factory=list)


def _json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return json.dumps(value, default=str)


def _hex(value: str, n: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


#: The int64 columns' range: a tag value beyond it is dropped, not a crash.
_INT64 = (-(2**63), 2**63 - 1)


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if _INT64[0] <= out <= _INT64[1] else None


def _str(value: Any) -> str | None:
    """A string column's value: strings kept, anything else (a number, a list) as its JSON."""
    if value is None or isinstance(value, str):
        return value
    return _json(value)


def _bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in ("true", "1") else False if text in ("false", "0") else None


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _strip_added(value: Any, added: Any) -> Any:
    if added is None:
        return None  # the original was null
    if isinstance(value, dict) and isinstance(added, list):
        return {k: v for k, v in value.items() if k not in added}
    return value


def trace_rows(trace: Any) -> list[dict[str, Any]]:
    """Rows of :data:`tracer.schema.SPAN_SCHEMA` for one MLflow trace (empty if it has no spans)."""
    spans = list(trace.data.spans) if trace.data is not None else []
    if not spans:
        return []
    tags: Mapping[str, str] = trace.info.tags or {}
    root = next((s for s in spans if s.parent_id is None), spans[0])
    root_attrs = root.attributes or {}
    mlflow_id = str(trace.info.trace_id)
    hex_id = mlflow_id[len(MLFLOW_TRACE_ID_PREFIX) :] if mlflow_id.startswith(MLFLOW_TRACE_ID_PREFIX) else mlflow_id
    trace_id = (
        tags.get(TAG_TRACE_ID)
        or root_attrs.get(ATTR_TRACE_ID)
        or (hex_id if len(hex_id) == 32 else _hex(mlflow_id, 32))
    )
    ours = ATTR_KIND in root_attrs
    ctx = {
        S.STEP: _int(root_attrs.get(ATTR_STEP, tags.get(TAG_STEP))),
        S.SAMPLE_INDEX: root_attrs.get(ATTR_SAMPLE, tags.get(TAG_SAMPLE)),
        S.ROLLOUT_N: _int(root_attrs.get(ATTR_ROLLOUT_N, tags.get(TAG_ROLLOUT_N))),
        S.VALIDATE: _bool(root_attrs.get(ATTR_VALIDATE, tags.get(TAG_VALIDATE))),
    }
    if ctx[S.SAMPLE_INDEX] is not None:
        ctx[S.SAMPLE_INDEX] = str(ctx[S.SAMPLE_INDEX])
    our_ids = {s.span_id: (s.attributes or {}).get(ATTR_SPAN_ID) or s.span_id for s in spans}
    synthetic = {s.span_id for s in spans if (s.attributes or {}).get(ATTR_SYNTHETIC)}
    rows: list[dict[str, Any]] = []
    for s in spans:
        if s.span_id in synthetic:
            continue
        attrs = s.attributes or {}
        if ATTR_PARENT in attrs:
            parent = attrs[ATTR_PARENT]
        elif s.parent_id is None or s.parent_id in synthetic:
            parent = None
        else:
            parent = our_ids.get(s.parent_id, s.parent_id)
        kind = attrs.get(ATTR_KIND) or KIND_BY_SPAN_TYPE.get(str(s.span_type), S.KIND_SPAN)
        if not ours and s is root:
            kind = S.KIND_ROLLOUT
        failed = str(getattr(s.status.status_code, "value", s.status.status_code)) == "ERROR"
        status = attrs.get(ATTR_STATUS) or (S.STATUS_ERROR if failed else S.STATUS_OK)
        error = attrs.get(ATTR_ERROR)
        if error is None and failed:
            exc = next((e for e in s.events if e.name == "exception"), None)
            ea = exc.attributes if exc is not None else {}
            error = {
                "type": ea.get("exception.type", ""),
                "message": ea.get("exception.message", s.status.description or ""),
                "traceback": ea.get("exception.stacktrace", ""),
            }
        if ours:
            own = attrs.get(ATTR_ATTRIBUTES)
        else:
            own = {k: v for k, v in attrs.items() if not k.startswith("mlflow.") and k not in OUR_ATTR_KEYS} or None
        added = attrs.get(ATTR_ADDED) or {}
        inputs, outputs = s.inputs, s.outputs
        if "inputs" in added:
            inputs = _strip_added(inputs, added["inputs"])
        if "outputs" in added:
            outputs = _strip_added(outputs, added["outputs"])
        sample = attrs.get(ATTR_SAMPLE, ctx[S.SAMPLE_INDEX])
        rows.append(
            {
                S.TRACE_ID: _str(trace_id),
                S.SPAN_ID: _str(our_ids[s.span_id]),
                S.PARENT_SPAN_ID: _str(parent),
                S.NAME: _str(s.name),
                S.KIND: _str(kind),
                S.START_NS: int(s.start_time_ns),
                S.END_NS: int(s.end_time_ns if s.end_time_ns is not None else s.start_time_ns),
                S.STATUS: _str(status),
                S.ERROR: _json(error),
                S.STEP: _int(attrs.get(ATTR_STEP, ctx[S.STEP])),
                S.SAMPLE_INDEX: None if sample is None else str(sample),
                S.ROLLOUT_N: _int(attrs.get(ATTR_ROLLOUT_N, ctx[S.ROLLOUT_N])),
                S.VALIDATE: _bool(attrs.get(ATTR_VALIDATE, ctx[S.VALIDATE])),
                S.REWARD: _float(attrs.get(ATTR_REWARD)),
                S.INPUTS: _json(inputs),
                S.OUTPUTS: _json(outputs),
                S.ATTRIBUTES: _json(own),
            }
        )
    reward = _float(tags.get(TAG_REWARD))
    if reward is not None and not any(r[S.KIND] == S.KIND_REWARD for r in rows):
        extras = {
            k[len(TAG_REWARD_PREFIX) :]: _float(v) if _float(v) is not None else v
            for k, v in tags.items()
            if k.startswith(TAG_REWARD_PREFIX)
        }
        root_row = next((r for r in rows if r[S.PARENT_SPAN_ID] is None), rows[0])
        rows.append(
            {
                **{k: root_row[k] for k in (S.TRACE_ID, S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE)},
                S.SPAN_ID: _hex(trace_id + ":reward", 16),
                S.PARENT_SPAN_ID: root_row[S.SPAN_ID],
                S.NAME: S.REWARD_SPAN_NAME,
                S.KIND: S.KIND_REWARD,
                S.START_NS: root_row[S.END_NS],
                S.END_NS: root_row[S.END_NS],
                S.STATUS: S.STATUS_OK,
                S.ERROR: None,
                S.REWARD: reward,
                S.INPUTS: None,
                S.OUTPUTS: None,
                S.ATTRIBUTES: _json(extras or None),
            }
        )
    return rows


def _names(trace: Any, experiment_name: str) -> tuple[str, str]:
    tags = trace.info.tags or {}
    root = next((s for s in trace.data.spans if s.parent_id is None), None)
    attrs = (root.attributes or {}) if root is not None else {}
    project = attrs.get(ATTR_PROJECT) or tags.get(TAG_PROJECT) or experiment_name
    exp = attrs.get(ATTR_EXPERIMENT) or tags.get(TAG_EXPERIMENT) or DEFAULT_IMPORT_EXPERIMENT
    return str(project), str(exp)


def _safe(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)
    return safe if safe.strip(".") else "_" * max(1, len(safe))  # never "." or "..": stay under out_dir


def import_traces(
    tracking_uri: str,
    experiment: str,
    out_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    filter_string: str | None = None,
    timeout_s: float = CALL_TIMEOUT_S,
) -> ImportReport:
    """Read an MLflow experiment's traces into trace files under ``out_dir``.

    Files land in ``out_dir/<project>/<experiment>/``: the project and
    experiment names the exporter recorded, else the MLflow experiment's name
    and ``mlflow-import``.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment: MLflow experiment name.
        out_dir: Root folder of the written files.
        progress: Print a count on stderr.
        filter_string: MLflow trace filter (``"tags.step = '3'"``).
        timeout_s: Seconds one call to MLflow may take (said while it waits, then given up).

    Raises:
        ValueError: the experiment does not exist.
        TrackingUriError: the URI is malformed, its server does not answer, or MLflow cannot open its store.
        BackendTimeoutError: a call to MLflow got no answer within ``timeout_s`` (an OSError).
    """
    import_backend("mlflow", "mlflow")  # a missing mlflow fails here with the pip line that installs it
    from mlflow.tracking import MlflowClient

    check_tracking_uri(tracking_uri)  # a server that is down: said in seconds, not after MLflow's retries
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        exp = call_within(
            functools.partial(client.get_experiment_by_name, experiment),
            f"mlflow at {tracking_uri}: experiment",
            timeout_s,
        )
    except BackendTimeoutError as exc:
        raise BackendTimeoutError(f"{exc}; check that the server answers its API, then import again") from None
    except Exception as exc:  # a store MLflow cannot open (bad path, unknown scheme, refused login)
        raise TrackingUriError(f"cannot read the MLflow tracking store at {tracking_uri}: {_short(exc)}") from None
    if exp is None:
        names = [e.name for e in client.search_experiments(max_results=50)]
        raise ValueError(
            f"no MLflow experiment named {experiment!r} at {tracking_uri}; experiments there: {', '.join(names) or 'none'}"
        )
    report = ImportReport()
    redactor = Redactor()
    out = _Outputs(os.fspath(out_dir), tracking_uri, experiment, report)
    bar = Progress(0, f"import {experiment}", progress)
    token = None
    try:
        while True:
            search = functools.partial(
                client.search_traces,
                locations=[exp.experiment_id],
                filter_string=filter_string,
                max_results=PAGE_SIZE,
                page_token=token,
                include_spans=True,
            )
            page = call_within(search, f"mlflow at {tracking_uri}: search of traces", timeout_s)
            for trace in page:
                name = str(getattr(trace.info, "trace_id", "?"))
                try:
                    rows = redact_rows(redactor, trace_rows(trace))  # foreign traces hold what they hold
                    batch = pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA) if rows else None
                    key = _names(trace, experiment)
                except Exception as exc:  # one trace we cannot map: skip it, say which, import the rest
                    report.refused.append(f"{name}: {type(exc).__name__}: {_short(exc)}")
                    continue
                if batch is None:
                    report.skipped += 1
                    continue
                out.add(key, batch, name)
                bar.update(1)
            token = page.token
            if not token:
                break
    except BackendTimeoutError as exc:
        raise BackendTimeoutError(
            f"{exc}; {report.trajectories} traces read before it stopped answering are written under "
            f"{os.fspath(out_dir)}; check that the server answers, then import again"
        ) from None
    finally:
        bar.close()
        out.close()
    report.details.append(
        f"imported {report.trajectories} trajectories ({report.spans} spans) from MLflow experiment {experiment!r} "
        f"at {tracking_uri} into {len(report.files)} file(s) under {os.fspath(out_dir)}"
    )
    if report.skipped:
        report.details.append(f"skipped {report.skipped} traces without spans")
    for line in report.refused:
        report.details.append(f"not imported: {line}")
    return report


class _Outputs:
    """One writer per (project, experiment) under the output folder; a folder that fails refuses its own traces alone.

    A trace is counted as imported when it is handed over; when its folder's
    writer then fails (a name the file system refuses, a full disk), the
    traces it still held move to :attr:`ImportReport.refused`, named, and every
    later trace of that folder is refused at once; the other folders go on.
    """

    def __init__(self, out_dir: str, tracking_uri: str, experiment: str, report: ImportReport) -> None:
        self.out_dir, self.tracking_uri, self.experiment, self.report = out_dir, tracking_uri, experiment, report
        self.writers: dict[tuple[str, str], tuple[SpanWriter, list[pa.RecordBatch], list[str]]] = {}
        self.broken: dict[tuple[str, str], str] = {}

    def add(self, key: tuple[str, str], batch: pa.RecordBatch, name: str) -> None:
        """Hand one trace's rows to its folder's writer (written once :data:`WRITE_BATCH_ROWS` are held)."""
        if key in self.broken:
            self.report.refused.append(f"{name}: {self.broken[key]}")
            return
        if key not in self.writers:
            self.writers[key] = (
                SpanWriter(
                    os.path.join(self.out_dir, _safe(key[0]), _safe(key[1])), self._meta(key), on_close=shard_closed
                ),
                [],
                [],
            )
        _, buf, names = self.writers[key]
        buf.append(batch)
        names.append(name)
        self.report.trajectories += 1
        self.report.spans += batch.num_rows
        if (
            sum(b.num_rows for b in buf) >= WRITE_BATCH_ROWS or len(names) == 1
        ):  # the first at once: a bad folder shows early
            self._write(key)

    def _write(self, key: tuple[str, str]) -> None:
        writer, buf, names = self.writers[key]
        if not buf:
            return
        try:
            writer.write(_concat(buf))
        except Exception as exc:
            why = f"cannot write under {writer.run_dir!r} ({type(exc).__name__}: {_short(exc)})"
            self.broken[key] = why
            self.report.trajectories -= len(names)
            self.report.spans -= sum(b.num_rows for b in buf)
            self.report.refused.extend(f"{n}: {why}" for n in names)
            del self.writers[key]
            with contextlib.suppress(Exception):
                writer.close()
            return
        buf.clear()
        names.clear()

    def close(self) -> None:
        """Write what is held and close every writer; the files written go to the report."""
        for key in list(self.writers):
            self._write(key)
            if key in self.writers:
                writer = self.writers.pop(key)[0]
                try:
                    writer.close()
                except Exception as exc:
                    self.report.refused.append(f"{writer.run_dir}: not closed ({type(exc).__name__}: {_short(exc)})")
                self.report.files.extend(writer.paths)

    def _meta(self, key: tuple[str, str]) -> dict[str, str]:
        return {
            S.META_SCHEMA_VERSION: S.SCHEMA_VERSION,
            S.META_CONFIG: json.dumps(
                {
                    "project_name": key[0],
                    "experiment_name": key[1],
                    "imported_from": self.tracking_uri,
                    "mlflow_experiment": self.experiment,
                }
            ),
            S.META_PROJECT: key[0],
            S.META_EXPERIMENT: key[1],
            S.META_HOST: socket.gethostname(),
            S.META_PID: str(os.getpid()),
            S.META_CREATED_NS: str(time.time_ns()),
        }


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch of several (same schema)."""
    return pa.Table.from_batches(batches, schema=S.SPAN_SCHEMA).combine_chunks().to_batches()[0]


def _short(exc: BaseException) -> str:
    """The error's message on one line, bounded, printable whatever the trace held."""
    text = " ".join(str(exc).split()).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."

"""Read MLflow traces back into trace files (``rollout-trace import mlflow``).

Traces this exporter wrote come back as the rows they were made from. Any other trace is mapped too: span types give
kinds, the root is the rollout span, non-MLflow attributes are ours, an exception event is the error, a ``reward`` tag a
``log_reward`` row. Every text goes through the redactor before it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

import tracer.exporters.mlflow.spans as M  # noqa: N812 - the span mapping, short
from tracer import schema as S
from tracer.exporters.base import redact_rows, short_error
from tracer.exporters.bounded import CALL_TIMEOUT_S, BackendTimeoutError, call_within
from tracer.exporters.mlflow.server import TrackingUriError, check_tracking_uri
from tracer.exporters.tables import Progress
from tracer.extras import import_backend
from tracer.index.closed import shard_closed
from tracer.record.redact import Redactor
from tracer.storage.writer import SpanWriter, file_meta
from tracer.summary import log_reward_row

#: Experiment name of imported traces that do not name one.
DEFAULT_IMPORT_EXPERIMENT = "mlflow-import"
#: Rows per written batch.
WRITE_BATCH_ROWS = 4096
#: Traces per MLflow search page.
PAGE_SIZE = 100


@dataclasses.dataclass
class ImportReport:
    """What an import read and wrote."""

    trajectories: int = 0
    spans: int = 0
    skipped: int = 0  # traces without spans
    #: Traces that could not be mapped (``"<mlflow id>: <why>"``); the others were imported.
    refused: list[str] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    details: list[str] = dataclasses.field(default_factory=list)


def _json(value: Any) -> str | None:
    return None if value is None else M.dumps(value)


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
    return {"true": True, "1": True, "false": False, "0": False}.get(str(value).strip().lower())


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _strip_added(value: Any, added: Mapping[str, Any], side: str) -> Any:
    """``value`` (a span's ``side``, inputs or outputs) without what the exporter added for MLflow's chat view."""
    keys = added.get(side, ())
    if keys is None:
        return None  # the original was null
    if isinstance(value, dict) and isinstance(keys, list):
        return {k: v for k, v in value.items() if k not in keys}
    return value


def _error(s: Any, attrs: Mapping[str, Any], failed: bool) -> Any:
    """A span's error: the one the exporter recorded (a span it wrote has none else), or its exception event's."""
    error = attrs.get(M.ATTR_ERROR)
    if error is None and failed and M.ATTR_STATUS not in attrs:
        exc = next((e for e in s.events if e.name == "exception"), None)
        ea = exc.attributes if exc is not None else {}
        error = {f: ea.get(f"exception.{k}", "") for k, f in M.EXCEPTION_KEYS}
        error["message"] = ea.get("exception.message", s.status.description or "")
    return error


def _reward_row(tags: Mapping[str, str], rows: list[dict[str, Any]], trace_id: str) -> dict[str, Any] | None:
    """A ``log_reward`` row for a ``reward`` trace tag (None when there is none, or a reward span already)."""
    reward = _float(tags.get(M.TAG_REWARD))
    if reward is None or any(r[S.KIND] == S.KIND_REWARD for r in rows):
        return None
    extras = {
        k[len(M.TAG_REWARD_PREFIX) :]: _float(v) if _float(v) is not None else v
        for k, v in tags.items()
        if k.startswith(M.TAG_REWARD_PREFIX)
    }
    root_row = next((r for r in rows if r[S.PARENT_SPAN_ID] is None), rows[0])
    return log_reward_row(
        root_row, _hex(trace_id + ":reward", 16), root_row[S.SPAN_ID], root_row[S.END_NS], reward, _json(extras or None)
    )


def trace_rows(trace: Any) -> list[dict[str, Any]]:
    """Rows of :data:`tracer.schema.SPAN_SCHEMA` for one MLflow trace (empty if it has no spans)."""
    spans = list(trace.data.spans) if trace.data is not None else []
    if not spans:
        return []
    tags: Mapping[str, str] = trace.info.tags or {}
    root = next((s for s in spans if s.parent_id is None), spans[0])
    root_attrs = root.attributes or {}
    # Our trace id: the one the exporter recorded, else the MLflow id's hex.
    mlflow_id = str(trace.info.trace_id)
    hex_id = mlflow_id.removeprefix(M.MLFLOW_TRACE_ID_PREFIX)
    fallback = hex_id if len(hex_id) == 32 else _hex(mlflow_id, 32)
    trace_id = str(tags.get(M.TAG_TRACE_ID) or root_attrs.get(M.ATTR_TRACE_ID) or fallback)
    ours = M.ATTR_KIND in root_attrs
    ctx = {col: root_attrs.get(attr, tags.get(tag)) for col, attr, tag in M.CONTEXT_KEYS}
    our_ids = {s.span_id: (s.attributes or {}).get(M.ATTR_SPAN_ID) or s.span_id for s in spans}
    synthetic = {s.span_id for s in spans if (s.attributes or {}).get(M.ATTR_SYNTHETIC)}
    rows: list[dict[str, Any]] = []
    for s in spans:
        if s.span_id in synthetic:
            continue
        attrs = s.attributes or {}
        if M.ATTR_PARENT in attrs:
            parent = attrs[M.ATTR_PARENT]
        elif s.parent_id is None or s.parent_id in synthetic:
            parent = None
        else:
            parent = our_ids.get(s.parent_id, s.parent_id)
        kind = attrs.get(M.ATTR_KIND) or M.KIND_BY_SPAN_TYPE.get(str(s.span_type), S.KIND_SPAN)
        if not ours and s is root:
            kind = S.KIND_ROLLOUT
        failed = str(getattr(s.status.status_code, "value", s.status.status_code)) == "ERROR"
        foreign = {k: v for k, v in attrs.items() if not k.startswith("mlflow.") and k not in M.OUR_ATTR_KEYS}
        own = attrs.get(M.ATTR_ATTRIBUTES) if ours else foreign or None
        added = attrs.get(M.ATTR_ADDED) or {}
        inputs, outputs = _strip_added(s.inputs, added, "inputs"), _strip_added(s.outputs, added, "outputs")
        context = {col: attrs.get(attr, ctx[col]) for col, attr, _ in M.CONTEXT_KEYS}
        rows.append(
            {
                S.TRACE_ID: _str(trace_id),
                S.SPAN_ID: _str(our_ids[s.span_id]),
                S.PARENT_SPAN_ID: _str(parent),
                S.NAME: _str(s.name),
                S.KIND: _str(kind),
                S.START_NS: int(s.start_time_ns),
                S.END_NS: int(s.end_time_ns if s.end_time_ns is not None else s.start_time_ns),
                S.STATUS: _str(attrs.get(M.ATTR_STATUS) or (S.STATUS_ERROR if failed else S.STATUS_OK)),
                S.ERROR: _json(_error(s, attrs, failed)),
                S.STEP: _int(context[S.STEP]),
                S.SAMPLE_INDEX: None if context[S.SAMPLE_INDEX] is None else str(context[S.SAMPLE_INDEX]),
                S.ROLLOUT_N: _int(context[S.ROLLOUT_N]),
                S.VALIDATE: _bool(context[S.VALIDATE]),
                S.REWARD: _float(attrs.get(M.ATTR_REWARD)),
                S.INPUTS: _json(inputs),
                S.OUTPUTS: _json(outputs),
                S.ATTRIBUTES: _json(own),
            }
        )
    reward_row = _reward_row(tags, rows, trace_id)
    return rows if reward_row is None else [*rows, reward_row]


def _names(trace: Any, experiment_name: str) -> tuple[str, str]:
    tags = trace.info.tags or {}
    root = next((s for s in trace.data.spans if s.parent_id is None), None)
    attrs = (root.attributes or {}) if root is not None else {}
    project = attrs.get(M.ATTR_PROJECT) or tags.get(M.TAG_PROJECT) or experiment_name
    exp = attrs.get(M.ATTR_EXPERIMENT) or tags.get(M.TAG_EXPERIMENT) or DEFAULT_IMPORT_EXPERIMENT
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

    Files land in ``out_dir/<project>/<experiment>/`` as the exporter recorded them, else under the MLflow
    experiment's name and ``mlflow-import``. ``filter_string``: an MLflow trace filter (``"tags.step = '3'"``);
    ``timeout_s``: seconds one call to MLflow may take.

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
            lambda: client.get_experiment_by_name(experiment), f"mlflow at {tracking_uri}: experiment", timeout_s
        )
    except BackendTimeoutError as exc:
        raise BackendTimeoutError(f"{exc}; check that the server answers its API, then import again") from None
    except Exception as exc:  # a store MLflow cannot open (bad path, unknown scheme, refused login)
        raise TrackingUriError(f"cannot read the MLflow tracking store at {tracking_uri}: {short_error(exc)}") from None
    if exp is None:
        names = [e.name for e in client.search_experiments(max_results=50)]
        raise ValueError(
            f"no MLflow experiment named {experiment!r} at {tracking_uri}; experiments there: {', '.join(names) or 'none'}"
        )
    report = ImportReport()
    redactor = Redactor()
    out = _Outputs(os.fspath(out_dir), tracking_uri, experiment, report)
    bar = Progress(0, f"import {experiment}", progress)
    query = {"locations": [exp.experiment_id], "filter_string": filter_string, "include_spans": True}
    token = None
    try:
        while True:
            search = functools.partial(client.search_traces, max_results=PAGE_SIZE, page_token=token, **query)
            page = call_within(search, f"mlflow at {tracking_uri}: search of traces", timeout_s)
            for trace in page:
                name = str(getattr(trace.info, "trace_id", "?"))
                try:
                    rows = redact_rows(redactor, trace_rows(trace))  # foreign traces hold what they hold
                    batch = pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA) if rows else None
                    key = _names(trace, experiment)
                except Exception as exc:  # one trace we cannot map: skip it, say which, import the rest
                    report.refused.append(f"{name}: {type(exc).__name__}: {short_error(exc)}")
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
    report.details.extend(f"not imported: {line}" for line in report.refused)
    return report


class _Outputs:
    """One writer per (project, experiment) under the output folder. When a folder's writer fails (a name refused,
    a full disk), the traces it held move to :attr:`ImportReport.refused`, and so do later traces of that folder."""

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
            folder = os.path.join(self.out_dir, _safe(key[0]), _safe(key[1]))
            config = {"project_name": key[0], "experiment_name": key[1], "imported_from": self.tracking_uri}
            meta = file_meta({**config, "mlflow_experiment": self.experiment}, key[0], key[1])
            self.writers[key] = (SpanWriter(folder, meta, on_close=shard_closed), [], [])
        _, buf, names = self.writers[key]
        buf.append(batch)
        names.append(name)
        self.report.trajectories += 1
        self.report.spans += batch.num_rows
        # The first at once: a bad folder fails early.
        if len(names) == 1 or sum(b.num_rows for b in buf) >= WRITE_BATCH_ROWS:
            self._write(key)

    def _write(self, key: tuple[str, str]) -> None:
        writer, buf, names = self.writers[key]
        if not buf:
            return
        try:
            writer.write(pa.Table.from_batches(buf, schema=S.SPAN_SCHEMA).combine_chunks().to_batches()[0])
        except Exception as exc:
            why = f"cannot write under {writer.run_dir!r} ({type(exc).__name__}: {short_error(exc)})"
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
                    self.report.refused.append(
                        f"{writer.run_dir}: not closed ({type(exc).__name__}: {short_error(exc)})"
                    )
                self.report.files.extend(writer.paths)

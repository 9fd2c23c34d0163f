"""MLflow exporter: one MLflow trace per trajectory, linked to a run with per-step metrics.

The project is the MLflow experiment; the experiment is a run in it (tagged ``rollout_trace.experiment_name``) that
every trace links to and that holds the step metrics (``rollout/...``, ``val/...``) at ``step=``. Trace ids derive from
ours and the experiment (:func:`mlflow_trace_id`): sending again upserts. On the MLflow versions in
:data:`FAST_PATH_VERSIONS` whole traces go to the store's ``log_spans`` in batches; other versions use the public span
API (12-18 traces/s). :func:`import_traces` reads MLflow traces back into trace files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import orjson

from tracer import schema as S
from tracer.compare import flatten_config
from tracer.exporters.base import (
    EXISTING,
    KEEP_STEPS,
    LATE,
    ExportReport,
    ReadBack,
    SinkBase,
    StepBatch,
    Target,
    VerifyResult,
    Written,
    short_error,
)
from tracer.exporters.base import export_files as _export_files
from tracer.exporters.mlflow.importer import ImportReport, import_traces
from tracer.exporters.mlflow.server import TrackingUriError, check_tracking_uri
from tracer.exporters.mlflow.spans import (
    ATTR_SPAN_ID,
    MLFLOW_INPUTS,
    MLFLOW_OUTPUTS,
    MLFLOW_REQUEST_ID,
    MLFLOW_SPAN_TYPE,
    MLFLOW_TRACE_TAG_PREFIX,
    RESPONSE_TOKEN_KEYS,
    TAG_EXPERIMENT,
    TAG_REWARD,
    TAG_TRACE_ID,
    TAG_TRACE_NAME,
    TrajectoryData,
    count_tokens,
    dumps,
    mlflow_trace_id,
    trajectory_data,
)
from tracer.exporters.tables import open_run
from tracer.extras import import_backend
from tracer.read import TracePaths, list_trace_files, read_file_metadata

logger = logging.getLogger("rollout_trace")

__all__ = [
    "ENV_TRACKING_URI",
    "ExportReport",
    "ImportReport",
    "MlflowSink",
    "TrackingUriError",
    "export_files",
    "fast_path_available",
    "import_traces",
    "mlflow_trace_id",
    "resolve_tracking_uri",
    "verify_export",
]

BACKEND = "mlflow"
#: Environment variable giving the tracking URI (MLflow's own, as verl uses it).
ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
#: SQLite file used when no tracking URI is given (where ``mlflow ui`` in the same folder looks).
DEFAULT_DB_FILE = "mlflow.db"
#: MLflow versions the fast path (``log_spans`` with our span entities) was checked on.
FAST_PATH_VERSIONS = ("3.17.",)
#: Traces per ``log_spans`` call: one OTLP request to a server...
BATCH_TRACES = 100
#: ...and one transaction into a SQL store (bigger batches were ~15% faster there).
SQL_BATCH_TRACES = 400
#: Traces between flushes of MLflow's async queue on the public path (a fuller queue drops work).
PUBLIC_BATCH_TRACES = 50
#: Traces per ``link_traces_to_run`` call (MLflow's limit).
LINK_BATCH = 100
#: Trace metadata key linking a trace to the run it came from (MLflow's own).
TRACE_META_SOURCE_RUN = "mlflow.sourceRun"
#: Traces refused one after another, with none sent yet, before the destination is blamed.
MAX_REFUSED_BEFORE_GIVING_UP = 3
#: Run tag naming the experiment a run holds.
RUN_TAG_EXPERIMENT = "rollout_trace.experiment_name"
#: Metric key prefixes for training and validation rollouts.
METRIC_PREFIX = {False: "rollout/", True: "val/"}

#: How each send method is described in an export's report (plain words, then the method's name).
_METHOD_WORDS = {
    "fast": "whole traces written in batches, one store call per batch (fast path)",
    "public": "span by span through MLflow's public tracing API, slower (public path)",
}


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """Tracking URI in force: the argument, else ``MLFLOW_TRACKING_URI``, else ``./mlflow.db``."""
    return tracking_uri or os.environ.get(ENV_TRACKING_URI) or "sqlite:///" + os.path.abspath(DEFAULT_DB_FILE)


def fast_path_available() -> bool:
    """True when the installed mlflow is one the fast path was checked on."""
    return str(getattr(import_backend("mlflow", "mlflow"), "__version__", "")).startswith(FAST_PATH_VERSIONS)


#: MLflow keeps a param value of at most this many characters.
MLFLOW_PARAM_CHARS = 6000
#: Params per ``log_batch`` call (MLflow's limit is 100).
MLFLOW_PARAMS_PER_BATCH = 100


def _write_sql_tags(store: Any, trajectories: Sequence[TrajectoryData], run_id: str) -> None:
    """Upsert the traces' tags and their ``mlflow.sourceRun`` metadata in one transaction (SQL stores)."""
    import importlib

    from mlflow.store.tracking.dbmodels.models import SqlTraceInfo, SqlTraceMetadata, SqlTraceTag

    internal: Any = importlib.import_module("mlflow.store.tracking.sqlalchemy_store")  # checked on 3.17.x
    tags, meta, names = [], [], {}
    for t in trajectories:
        for key, value in t.tags.items():
            key, value = internal._validate_trace_tag(key, value)
            if key == TAG_TRACE_NAME:
                names[t.mlflow_trace_id] = value  # a column of the trace's row in SQL stores, not a tag row
                continue
            tags.append({"request_id": t.mlflow_trace_id, "key": key, "value": value})
        meta.append({"request_id": t.mlflow_trace_id, "key": TRACE_META_SOURCE_RUN, "value": run_id})
    with store.ManagedSessionMaker(read_only=False) as session:
        for model, rows in ((SqlTraceTag, tags), (SqlTraceMetadata, meta)):
            if session.bind.dialect.name in ("sqlite", "postgresql"):
                # executemany-style: compiled once, unlike MLflow's multi-VALUES upsert (anew every 100 rows).
                dialect: Any = importlib.import_module(f"sqlalchemy.dialects.{session.bind.dialect.name}")
                ins = dialect.insert(model.__table__)
                stmt = ins.on_conflict_do_update(
                    index_elements=["key", "request_id"], set_={"value": ins.excluded.value}
                )
                session.execute(stmt, rows)
            else:
                internal._bulk_upsert(session, model, rows)
        for trace_id, name in names.items():
            session.query(SqlTraceInfo).filter(SqlTraceInfo.request_id == trace_id).update(
                {SqlTraceInfo.trace_name: name}, synchronize_session=False
            )


def _mlflow_spans(t: TrajectoryData, tags_as_attributes: bool = True) -> list[Any]:
    """MLflow span entities of one trajectory (the fast path)."""
    from mlflow.entities import Span
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, Status, StatusCode

    trace_int = int(t.otel_trace_hex, 16)
    request_id = dumps(t.mlflow_trace_id)
    resource = Resource.get_empty()
    out = []
    for i, s in enumerate(t.spans):
        attrs = {k: dumps(v) for k, v in s.attributes.items()}
        attrs[MLFLOW_REQUEST_ID] = request_id
        attrs[MLFLOW_SPAN_TYPE] = dumps(s.span_type)
        sides = {MLFLOW_INPUTS: s.inputs, MLFLOW_OUTPUTS: s.outputs}
        attrs.update({k: dumps(v) for k, v in sides.items() if v is not None})
        if i == 0 and tags_as_attributes and not t.partial:
            for key, value in t.tags.items():
                attrs[MLFLOW_TRACE_TAG_PREFIX + key] = dumps(value)
        parent = SpanContext(trace_int, int(s.parent_id, 16), is_remote=False) if s.parent_id else None
        otel = ReadableSpan(
            name=s.name,
            context=SpanContext(trace_int, int(s.span_id, 16), is_remote=False),
            parent=parent,
            start_time=s.start_ns,
            end_time=s.end_ns,
            attributes=attrs,
            status=Status(StatusCode.ERROR, s.status_message) if s.error else Status(StatusCode.OK),
            resource=resource,
            events=[Event(name, attributes=a, timestamp=ts) for name, ts, a in s.events],
        )
        out.append(Span(otel))
    return out


def _send_public(t: TrajectoryData, experiment_id: str, run_id: str) -> str:
    """Write one trajectory with MLflow's public span API (slow; every version)."""
    mlflow = import_backend("mlflow", "mlflow")
    entities: Any = mlflow.entities

    live: dict[str, Any] = {}
    for i, s in enumerate(t.spans):
        first = {"tags": t.tags, "metadata": {TRACE_META_SOURCE_RUN: run_id}, "experiment_id": experiment_id}
        span = mlflow.start_span_no_context(
            s.name,
            span_type=s.span_type,
            parent_span=live.get(s.parent_id) if s.parent_id else None,
            inputs=s.inputs,
            # MLflow picks random ids here: keep ours so the import restores the tree.
            attributes={ATTR_SPAN_ID: s.span_id, **s.attributes},
            start_time_ns=s.start_ns,
            **(first if i == 0 else {}),
        )
        live[s.span_id] = span
    for s in reversed(t.spans):
        span = live[s.span_id]
        for name, ts, attrs in s.events:
            span.add_event(entities.SpanEvent(name, timestamp=ts, attributes=attrs))
        if s.error:
            span.set_status(entities.SpanStatus(entities.SpanStatusCode.ERROR, s.status_message))
        span.end(outputs=s.outputs, end_time_ns=s.end_ns)
    return str(live[t.spans[0].span_id].trace_id)


def _span_response_tokens(spans: Sequence[dict[str, Any]]) -> int:
    """Response tokens of a trajectory's llm spans (from their ``tokens`` attribute)."""
    llm = [orjson.loads(r[S.ATTRIBUTES]) for r in spans if r.get(S.KIND) == S.KIND_LLM and r.get(S.ATTRIBUTES)]
    return sum(count_tokens(a.get(S.ATTR_TOKENS), RESPONSE_TOKEN_KEYS) for a in llm if isinstance(a, dict))


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class MlflowSink(SinkBase):
    """One MLflow trace per trajectory as soon as the driver has it, a step's metrics once it is complete. Post hoc,
    trajectories already in the experiment are skipped but counted in the metrics: exporting again creates no
    duplicates and catches up what a live export missed."""

    streams: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.client: Any = None  # set by :meth:`_connect`, with the experiment and run
        self._live = False
        self._pending: list[TrajectoryData] = []
        self._response: dict[tuple[int | None, bool], list[int]] = {}
        self._sent = self._spans = self._skipped = self._metrics_logged = 0
        self.destination = resolve_tracking_uri(self.options.get("tracking_uri"))

    @classmethod
    def sources(cls, path: str, options: Mapping[str, Any]) -> Iterator[tuple[TracePaths, str | None, str | None]]:
        """One destination per (project, experiment) recorded in the files, each read from its own file list
        (option ``experiment``, the MLflow experiment, overrides the recorded project)."""
        groups: dict[tuple[str, str], list[str]] = {}
        for file in list_trace_files(path):
            try:
                meta = read_file_metadata(file)
            except Exception:
                meta = {}
            project = options.get("experiment") or meta.get(S.META_PROJECT) or "rollout_trace"
            groups.setdefault((project, meta.get(S.META_EXPERIMENT) or "default"), []).append(file)
        if not groups:
            raise FileNotFoundError(f"no trace files (*{S.FILE_SUFFIX}) under {path!r}")
        for (project, experiment), files in groups.items():
            yield (path if len(groups) == 1 else files), project, experiment

    def open(self, target: Target) -> set[str]:
        """Find or create the experiment and run, log the run config as params; return our trace ids there (post hoc)."""
        self._live = target.live
        project = self.options.get("experiment") or target.project or "rollout_trace"
        self._connect(project, target.experiment or "default", self.options.get("method") or "auto")
        from mlflow.entities import Param

        params = [
            Param(k, (v if isinstance(v, str) else json.dumps(v, default=str))[:MLFLOW_PARAM_CHARS])
            for k, v in flatten_config(target.run_config).items()
        ]
        for i in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
            try:
                self.client.log_batch(self.run_id, params=params[i : i + MLFLOW_PARAMS_PER_BATCH])
            except Exception as exc:  # a changed value of an existing param: keep the run going
                logger.warning("rollout-trace mlflow exporter: run config not logged as params: %s", exc)
                break
        if target.live:
            return set()
        return {t.info.tags[TAG_TRACE_ID] for t in self._traces() if t.info.tags.get(TAG_TRACE_ID)}

    def _connect(self, project: str, experiment: str, method: str = "auto") -> None:
        """Find or create MLflow experiment ``project`` and its run ``experiment``; pick how traces are sent."""
        mlflow = import_backend("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        tracking_uri = self.destination
        check_tracking_uri(tracking_uri)  # a server that is down: said in seconds, not after MLflow's retries
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.project = project
        self.experiment = experiment
        exp = self.client.get_experiment_by_name(project)
        try:
            self.experiment_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        except Exception:
            exp = self.client.get_experiment_by_name(project)  # created meanwhile
            if exp is None:
                raise
            self.experiment_id = exp.experiment_id
        # MLflow's filter syntax has no escape for quotes: names with one are matched here.
        quoted = "'" in experiment
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string="" if quoted else f"tags.`{RUN_TAG_EXPERIMENT}` = '{experiment}'",
            max_results=1000 if quoted else 50,
        )
        run = next((r for r in runs if r.data.tags.get(RUN_TAG_EXPERIMENT) == experiment), None)
        if run is None:
            run = self.client.create_run(self.experiment_id, run_name=experiment, tags={RUN_TAG_EXPERIMENT: experiment})
        self.run_id = str(run.info.run_id)
        self.method = ("fast" if fast_path_available() else "public") if method == "auto" else method
        self._sql_store: Any = None
        self.batch_size = PUBLIC_BATCH_TRACES  # traces per :meth:`_write_traces`
        if self.method == "fast":
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
            from mlflow.tracing.client import TracingClient

            self._tracing = TracingClient(tracking_uri)
            # SQL stores: tags and the run link in one statement per batch (MLflow: ~11 queries a trace).
            self._sql_store = self._tracing.store if isinstance(self._tracing.store, SqlAlchemyStore) else None
            self.batch_size = SQL_BATCH_TRACES if self._sql_store is not None else BATCH_TRACES
        else:
            mlflow.set_tracking_uri(tracking_uri)

    def _traces(self, **search: Any) -> Iterator[Any]:
        """The experiment's traces (without spans), page by page; ``search``: more of ``search_traces``'s arguments."""
        token = None
        while True:
            page = self.client.search_traces(
                locations=[self.experiment_id], include_spans=False, max_results=500, page_token=token, **search
            )
            yield from page
            token = page.token
            if not token:
                return

    def _write_traces(self, trajectories: Sequence[TrajectoryData]) -> list[str]:
        """Write these traces and link them to the run; return their MLflow ids."""
        late = [t for t in trajectories if t.partial]  # late spans (a reward logged after the trace went)
        if late and self.method == "fast":
            self._tracing.log_spans(self.experiment_id, [s for t in late for s in _mlflow_spans(t)])
            for t in late:
                for key, value in t.tags.items():
                    self.client.set_trace_tag(t.mlflow_trace_id, key, value)
        elif late:  # the public API cannot add spans to a finished trace; the files hold them
            logger.debug("rollout-trace mlflow exporter: %d late span groups left in the files", len(late))
        trajectories = [t for t in trajectories if not t.partial]
        if not trajectories:
            return []
        if self.method == "fast":
            sql = self._sql_store is not None
            spans = [s for t in trajectories for s in _mlflow_spans(t, tags_as_attributes=not sql)]
            self._tracing.log_spans(self.experiment_id, spans)
            if sql:
                _write_sql_tags(self._sql_store, trajectories, self.run_id)
            ids = [t.mlflow_trace_id for t in trajectories]
        else:
            ids = [_send_public(t, self.experiment_id, self.run_id) for t in trajectories]
            import_backend("mlflow", "mlflow").flush_trace_async_logging()
        for i in range(0, len(ids), LINK_BATCH):
            self.client.link_traces_to_run(ids[i : i + LINK_BATCH], self.run_id)
        return ids

    def write(self, batch: StepBatch) -> Written:
        """Queue the step's new trajectories (and late spans) as traces; log its metrics when complete."""
        written = Written()
        for t in batch.trajectories:
            key = (t.summary[S.STEP], bool(t.summary[S.VALIDATE]))
            tid = t.summary[S.TRACE_ID]
            if t.state == LATE:
                self._pending.append(trajectory_data(t.spans, self.project, self.experiment, partial=True))
                continue
            written.rows[tid] = t.summary[S.REWARD]
            if t.state == EXISTING:
                self._response.setdefault(key, []).append(_span_response_tokens(t.spans))
                written.skipped += 1
                continue
            reward = None if self._live else (t.summary[S.REWARD], t.summary[S.REWARD_INFO])
            written.sent += 1  # a refused one is taken back out with its refusal
            try:
                data = trajectory_data(t.spans, self.project, self.experiment, reward=reward)
            except Exception as exc:  # this trajectory's content: refuse it alone, the rest go
                self.refused.append((tid, 0, f"{type(exc).__name__}: {short_error(exc)}"))
                continue
            self._response.setdefault(key, []).append(data.response_tokens)
            self._pending.append(data)
            written.spans += len(data.spans)
        self._skipped += written.skipped
        while len(self._pending) >= self.batch_size:
            self._send(self.batch_size)
        if batch.metrics is not None:
            self._log_metrics(batch)
        return written

    def flush(self) -> None:
        """Send every queued trace."""
        while self._pending:
            self._send(len(self._pending))

    def close(self) -> list[str]:
        """Send what is queued, mark the run finished, and say where everything went."""
        if self.client is None:
            return []
        self.flush()
        with contextlib.suppress(Exception):  # the run stays usable for later exports
            self.client.set_terminated(self.run_id)
        notes = [
            f"{self.project}/{self.experiment}: sent {self._sent} trajectories ({self._spans} spans) to MLflow "
            f"experiment {self.project!r} (id {self.experiment_id}), run {self.experiment!r} (id {self.run_id}) at "
            f"{self.destination} {_METHOD_WORDS[self.method]}; "
            f"logged {self._metrics_logged} step metrics"
        ]
        if self._skipped:
            notes.append(f"skipped {self._skipped} trajectories already in MLflow")
        return notes

    def _send(self, n: int) -> None:
        """Send the first ``n`` queued traces; when the batch fails, one by one, refusing only the bad ones."""
        chunk = self._pending[:n]
        went: list[TrajectoryData] = []
        failed: list[tuple[TrajectoryData, Exception]] = []
        try:
            self._write_traces(chunk)
            went = chunk
        except Exception as exc:
            logger.debug("rollout-trace mlflow exporter: a batch of %d failed (%s); sending one by one", n, exc)
            for t in chunk:
                try:
                    self._write_traces([t])
                    went.append(t)
                except Exception as one:
                    failed.append((t, one))
                    if not went and not self._sent and len(failed) >= MAX_REFUSED_BEFORE_GIVING_UP:
                        raise  # the first few all fail: the destination is broken, stop here with its error
        for t, error in failed:  # refused alone: recorded, the rest went
            if t.partial:
                logger.warning("rollout-trace mlflow exporter: late spans of %s not sent: %s", t.trace_id, error)
                continue
            self.refused.append((t.trace_id, len(t.spans), f"{type(error).__name__}: {short_error(error)}"))
        del self._pending[:n]
        whole = [t for t in went if not t.partial]
        self._sent += len(whole)
        self._spans += sum(len(t.spans) for t in whole)

    def _log_metrics(self, batch: StepBatch) -> None:
        """Log a complete step's metrics on the run (idempotent: same values, same timestamps)."""
        from mlflow.entities import Metric

        step = batch.step
        if step is None:
            return
        metrics: list[Any] = []
        for validate, values in (batch.metrics or {}).items():
            values = dict(values)
            lengths = self._response.get((step, validate))
            if lengths:
                values["response_length/mean"] = sum(lengths) / len(lengths)
            # The end of the step's last trajectory, in ms: a stable timestamp.
            ends = (t[S.END_NS] or 0 for t in batch.summaries if bool(t[S.VALIDATE]) == validate)
            at = max(ends, default=0) // 1_000_000
            prefix = METRIC_PREFIX[validate]
            metrics += [Metric(prefix + k, float(v), at, int(step)) for k, v in values.items() if _finite(v)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        self._metrics_logged += len(metrics)
        if self._live:
            for old in [k for k in self._response if k[0] is not None and k[0] < step - KEEP_STEPS]:
                del self._response[old]

    def read_back(self) -> ReadBack:
        """Our trace ids and reward tags of the traces linked to the run."""
        found: dict[str, float | None] = {}
        for trace in self._traces(run_id=self.run_id):
            tags = trace.info.tags
            if tags.get(TAG_EXPERIMENT) == self.experiment and tags.get(TAG_TRACE_ID):
                tagged = tags.get(TAG_REWARD)
                found[tags[TAG_TRACE_ID]] = float(tagged) if tagged is not None else None
        return ReadBack(found, shared=True, where=f"MLflow run {self.run_id}")


def export_files(path: str | os.PathLike[str], **options: Any) -> ExportReport:
    """Export trace files to MLflow (:func:`tracer.exporters.export_files` with ``to="mlflow"``)."""
    return _export_files(path, BACKEND, **options)


def verify_export(
    path: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    steps: int | Iterable[int] | None = None,
    since_step: int | None = None,
) -> tuple[bool, list[str]]:
    """``(ok, a line per destination)``: whether every trajectory of the files is in MLflow with the same reward."""
    wanted = [steps] if isinstance(steps, int) else steps
    result: VerifyResult | None = None
    for read_path, project, exp in MlflowSink.sources(os.fspath(path), {"experiment": experiment}):
        run = open_run(read_path, wanted, since_step)
        expected = dict(zip(run.trajectories[S.TRACE_ID].to_pylist(), run.trajectories[S.REWARD].to_pylist()))
        sink = MlflowSink({"tracking_uri": tracking_uri})
        sink._connect(project or "rollout_trace", exp or "default")
        one = VerifyResult.compare(BACKEND, expected, {}, sink.read_back())
        result = one if result is None else result.merge(one)
    assert result is not None  # sources() yields at least once or raises
    return result.ok, result.lines

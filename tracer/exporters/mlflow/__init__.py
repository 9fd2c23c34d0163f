"""MLflow exporter: one MLflow trace per trajectory, linked to a run with per-step metrics.

Post-hoc: :func:`export_files` (``rollout-trace export PATH --to mlflow``).
Live: :class:`MlflowExporter`, the ``"mlflow"`` backend of
``tracer.init(backend=[..., "mlflow"])``, ships finished trajectories from a
background thread.

Where things land: the project name is the MLflow experiment, the experiment
name is a run in it (found by the run tag ``rollout_trace.experiment_name``,
created when missing), every trace is linked to that run, and per-step rollout
metrics (:func:`tracer.step_metrics`) are logged on the run with ``step=``
(``rollout/...`` for training, ``val/...`` for validation rollouts).

Speed: MLflow's public span API commits every span end on its own (12-18
traces/s into SQLite). On the MLflow versions in :data:`FAST_PATH_VERSIONS`
the exporter builds the finished span entities itself and hands batches of
:data:`BATCH_TRACES` traces to the tracking store's ``log_spans`` (one
transaction per batch into SQL stores, one OTLP request per batch to an
``mlflow server``). Trace ids are derived from ours and the experiment name
(:func:`mlflow_trace_id`), so sending a trajectory twice upserts it. Other
versions use the public API.

:func:`import_traces` reads MLflow traces back into trace files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson
import pyarrow as pa

from tracer import schema as S
from tracer.config import TraceConfig
from tracer.exporters import ExportReport
from tracer.exporters.live import LiveShipper
from tracer.exporters.mlflow.importer import ImportReport, import_traces
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
    TrajectoryData,
    count_tokens,
    mlflow_trace_id,
    trajectory_data,
)
from tracer.read import list_trace_files, read_file_metadata, read_spans
from tracer.summary import read_trajectories, step_metrics

logger = logging.getLogger("rollout_trace")

__all__ = [
    "ENV_TRACKING_URI",
    "ExportReport",
    "ImportReport",
    "MlflowExporter",
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
#: SQLite file used when no tracking URI is given: ``./mlflow.db``, where
#: ``mlflow ui`` / ``mlflow server`` started in the same folder look by default.
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
#: Trajectories read from the files at a time.
READ_CHUNK = 2000
#: Trace metadata key linking a trace to the run it came from (MLflow's own).
TRACE_META_SOURCE_RUN = "mlflow.sourceRun"
#: Trajectory ids a live exporter remembers as shipped (to recognise late spans).
SHIPPED_MEMORY = 1_000_000
#: Run tag naming the experiment a run holds.
RUN_TAG_EXPERIMENT = "rollout_trace.experiment_name"
#: Metric key prefixes for training and validation rollouts.
METRIC_PREFIX = {False: "rollout/", True: "val/"}

_PIP_HINT = "the MLflow exporter needs mlflow: pip install 'rollout-trace[mlflow]'"


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_PIP_HINT) from exc
    return mlflow


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """Tracking URI in force: the argument, else ``MLFLOW_TRACKING_URI``, else ``./mlflow.db``."""
    if tracking_uri:
        return tracking_uri
    env = os.environ.get(ENV_TRACKING_URI)
    if env:
        return env
    return "sqlite:///" + os.path.abspath(DEFAULT_DB_FILE)


def fast_path_available() -> bool:
    """True when the installed mlflow is one the fast path was checked on."""
    version = getattr(_mlflow(), "__version__", "")
    return any(version.startswith(v) for v in FAST_PATH_VERSIONS)


# -- sending -----------------------------------------------------------------


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # values orjson refuses (ints beyond 64 bits, ...)
        return json.dumps(value, ensure_ascii=False, default=str)


class _Destination:
    """An MLflow experiment and run, and how traces are sent there."""

    def __init__(self, tracking_uri: str, project: str, experiment: str, method: str = "auto") -> None:
        mlflow = _mlflow()
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.project = project
        self.experiment = experiment
        exp = self.client.get_experiment_by_name(project)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(project)
            except Exception:
                exp = self.client.get_experiment_by_name(project)  # created meanwhile
                if exp is None:
                    raise
                self.experiment_id = exp.experiment_id
        else:
            self.experiment_id = exp.experiment_id
        self.run_id = self._find_or_create_run()
        if method == "auto":
            method = "fast" if fast_path_available() else "public"
        if method not in ("fast", "public"):
            raise ValueError(f"method must be 'auto', 'fast' or 'public', not {method!r}")
        self.method = method
        self._sql_store: Any = None
        if method == "fast":
            from mlflow.tracing.client import TracingClient

            self._tracing = TracingClient(tracking_uri)
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            # SQL stores: tags and the run link are written in one statement per batch
            # (MLflow merges root-span tag attributes row by row: ~11 queries a trace).
            self._sql_store = self._tracing.store if isinstance(self._tracing.store, SqlAlchemyStore) else None
        else:
            mlflow.set_tracking_uri(tracking_uri)

    @property
    def batch_size(self) -> int:
        """Traces per :meth:`send`."""
        if self.method == "public":
            return PUBLIC_BATCH_TRACES
        return SQL_BATCH_TRACES if self._sql_store is not None else BATCH_TRACES

    def _find_or_create_run(self) -> str:
        # MLflow's filter syntax has no escape for quotes: names with one are matched here.
        quoted = "'" in self.experiment
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string="" if quoted else f"tags.`{RUN_TAG_EXPERIMENT}` = '{self.experiment}'",
            max_results=1000 if quoted else 50,
        )
        for run in runs:
            if run.data.tags.get(RUN_TAG_EXPERIMENT) == self.experiment:
                return str(run.info.run_id)
        run = self.client.create_run(
            self.experiment_id, run_name=self.experiment, tags={RUN_TAG_EXPERIMENT: self.experiment}
        )
        return str(run.info.run_id)

    def existing_trace_ids(self) -> dict[str, str]:
        """Our trace ids already in the experiment -> their MLflow trace ids."""
        found: dict[str, str] = {}
        token = None
        while True:
            page = self.client.search_traces(
                locations=[self.experiment_id], include_spans=False, max_results=500, page_token=token
            )
            for trace in page:
                ours = trace.info.tags.get(TAG_TRACE_ID)
                if ours:
                    found[ours] = trace.info.trace_id
            token = page.token
            if not token:
                return found

    def send(self, trajectories: Sequence[TrajectoryData]) -> list[str]:
        """Write these traces and link them to the run; return their MLflow ids."""
        late = [t for t in trajectories if t.partial]
        if late:
            self._send_late(late)
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
            _mlflow().flush_trace_async_logging()
        for i in range(0, len(ids), LINK_BATCH):
            self.client.link_traces_to_run(ids[i : i + LINK_BATCH], self.run_id)
        return ids

    def _send_late(self, late: Sequence[TrajectoryData]) -> None:
        """Add late spans (a reward logged after its trajectory was shipped) to their traces."""
        if self.method != "fast":
            # The public API cannot add spans to a finished trace; the files hold them.
            logger.debug("rollout-trace mlflow exporter: %d late span groups left in the files", len(late))
            return
        self._tracing.log_spans(self.experiment_id, [s for t in late for s in _mlflow_spans(t)])
        for t in late:
            for key, value in t.tags.items():
                self.client.set_trace_tag(t.mlflow_trace_id, key, value)

    def log_step_metrics(
        self, metrics: dict[tuple[int | None, bool], dict[str, float]], timestamps: dict[tuple[int | None, bool], int]
    ) -> int:
        """Log per-step metrics on the run (idempotent: same values, same timestamps)."""
        from mlflow.entities import Metric

        batch = []
        for (step, validate), values in metrics.items():
            if step is None:
                continue
            ts = timestamps.get((step, validate), 0)
            for key, value in values.items():
                if value is None or not math.isfinite(value):
                    continue
                batch.append(Metric(METRIC_PREFIX[validate] + key, float(value), ts, int(step)))
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])
        return len(batch)

    def finish(self) -> None:
        """Mark the run finished (it stays usable for later exports)."""
        try:
            self.client.set_terminated(self.run_id)
        except Exception:
            pass


def _write_sql_tags(store: Any, trajectories: Sequence[TrajectoryData], run_id: str) -> None:
    """Upsert the traces' tags and their ``mlflow.sourceRun`` metadata in one transaction (SQL stores)."""
    import importlib

    from mlflow.store.tracking.dbmodels.models import SqlTraceMetadata, SqlTraceTag

    internal: Any = importlib.import_module("mlflow.store.tracking.sqlalchemy_store")  # checked on 3.17.x
    _bulk_upsert, _validate_trace_tag = internal._bulk_upsert, internal._validate_trace_tag

    tags, meta = [], []
    for t in trajectories:
        for key, value in t.tags.items():
            key, value = _validate_trace_tag(key, value)
            tags.append({"request_id": t.mlflow_trace_id, "key": key, "value": value})
        meta.append({"request_id": t.mlflow_trace_id, "key": TRACE_META_SOURCE_RUN, "value": run_id})
    with store.ManagedSessionMaker(read_only=False) as session:
        for model, rows in ((SqlTraceTag, tags), (SqlTraceMetadata, meta)):
            if session.bind.dialect.name in ("sqlite", "postgresql"):
                # One statement run executemany-style: compiled once, unlike MLflow's
                # multi-VALUES upsert, which compiles anew for every 100 rows.
                dialect: Any = importlib.import_module(f"sqlalchemy.dialects.{session.bind.dialect.name}")
                ins = dialect.insert(model.__table__)
                stmt = ins.on_conflict_do_update(
                    index_elements=["key", "request_id"], set_={"value": ins.excluded.value}
                )
                session.execute(stmt, rows)
            else:
                _bulk_upsert(session, model, rows)


def _mlflow_spans(t: TrajectoryData, tags_as_attributes: bool = True) -> list[Any]:
    """MLflow span entities of one trajectory (the fast path)."""
    from mlflow.entities import Span
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, Status, StatusCode

    trace_int = int(t.otel_trace_hex, 16)
    request_id = _dumps(t.mlflow_trace_id)
    resource = Resource.get_empty()
    out = []
    for i, s in enumerate(t.spans):
        attrs = {k: _dumps(v) for k, v in s.attributes.items()}
        attrs[MLFLOW_REQUEST_ID] = request_id
        attrs[MLFLOW_SPAN_TYPE] = _dumps(s.span_type)
        if s.inputs is not None:
            attrs[MLFLOW_INPUTS] = _dumps(s.inputs)
        if s.outputs is not None:
            attrs[MLFLOW_OUTPUTS] = _dumps(s.outputs)
        if i == 0 and tags_as_attributes and not t.partial:
            for key, value in t.tags.items():
                attrs[MLFLOW_TRACE_TAG_PREFIX + key] = _dumps(value)
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
    mlflow = _mlflow()
    entities: Any = mlflow.entities

    live: dict[str, Any] = {}
    for i, s in enumerate(t.spans):
        kwargs: dict[str, Any] = {}
        if i == 0:
            kwargs = {"tags": t.tags, "metadata": {TRACE_META_SOURCE_RUN: run_id}, "experiment_id": experiment_id}
        span = mlflow.start_span_no_context(
            s.name,
            span_type=s.span_type,
            parent_span=live.get(s.parent_id) if s.parent_id else None,
            inputs=s.inputs,
            # MLflow picks random ids here: keep ours so the import restores the tree.
            attributes={ATTR_SPAN_ID: s.span_id, **s.attributes},
            start_time_ns=s.start_ns,
            **kwargs,
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


# -- reading the files ---------------------------------------------------------


@dataclasses.dataclass
class _Group:
    project: str
    experiment: str
    files: list[str]


def _groups(path: str, experiment: str | None) -> list[_Group]:
    groups: dict[tuple[str, str], list[str]] = {}
    for file in list_trace_files(path):
        try:
            meta = read_file_metadata(file)
        except Exception:
            meta = {}
        project = experiment or meta.get(S.META_PROJECT) or "rollout_trace"
        exp = meta.get(S.META_EXPERIMENT) or "default"
        groups.setdefault((project, exp), []).append(file)
    return [_Group(p, e, f) for (p, e), f in groups.items()]


class _FileSet:
    """A path to read one group's files through (the path itself, or a folder of links)."""

    def __init__(self, path: str, group: _Group, whole: bool) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if whole:
            self.path = path
            return
        self._tmp = tempfile.TemporaryDirectory(prefix="rollout-trace-export-")
        for i, file in enumerate(group.files):
            os.symlink(os.path.abspath(file), os.path.join(self._tmp.name, f"{i:06d}{S.FILE_SUFFIX}"))
        self.path = self._tmp.name

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _select(trajectories: pa.Table, steps: Any, since_step: int | None) -> pa.Table:
    import pyarrow.compute as pc

    if steps is not None:
        wanted = [steps] if isinstance(steps, int) else list(steps)
        trajectories = trajectories.filter(pc.is_in(trajectories[S.STEP], value_set=pa.array(wanted, pa.int64())))
    if since_step is not None:
        trajectories = trajectories.filter(pc.fill_null(pc.greater_equal(trajectories[S.STEP], since_step), False))
    return trajectories


def _iter_trajectory_rows(path: str, trace_ids: list[str]) -> Iterator[list[dict[str, Any]]]:
    """Span rows of these trajectories, one list per trajectory, READ_CHUNK at a time."""
    for i in range(0, len(trace_ids), READ_CHUNK):
        chunk = trace_ids[i : i + READ_CHUNK]
        table = read_spans(path, trace_ids=chunk)
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for row in table.to_pylist():
            by_trace.setdefault(row[S.TRACE_ID], []).append(row)
        for tid in chunk:
            if tid in by_trace:
                yield by_trace[tid]


class _Progress:
    """A tqdm bar when tqdm is installed (mlflow does not require it), else a counter on stderr."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self._bar: Any = None
        self._enabled = enabled
        self._total = total
        self._done = 0
        self._desc = desc
        self._last = 0.0
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="traj", file=sys.stderr)
        except ImportError:
            pass

    def update(self, n: int) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._enabled and (time.monotonic() - self._last > 1 or self._done == self._total):
            self._last = time.monotonic()
            print(f"\r{self._desc}: {self._done}/{self._total} trajectories", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._enabled:
            print(file=sys.stderr)


def _response_tokens(path: str, trace_ids: list[str]) -> dict[str, int]:
    """Response tokens per trajectory, from the llm spans' ``tokens`` attribute (3 columns read)."""
    import pyarrow.compute as pc

    table = read_spans(path, columns=[S.TRACE_ID, S.KIND, S.ATTRIBUTES], trace_ids=trace_ids)
    table = table.filter(pc.equal(table[S.KIND], S.KIND_LLM))
    out: dict[str, int] = dict.fromkeys(trace_ids, 0)
    for tid, attrs in zip(table[S.TRACE_ID].to_pylist(), table[S.ATTRIBUTES].to_pylist()):
        tokens = orjson.loads(attrs).get(S.ATTR_TOKENS) if attrs else None
        out[tid] = out.get(tid, 0) + count_tokens(tokens, RESPONSE_TOKEN_KEYS)
    return out


def _step_timestamps(trajectories: pa.Table) -> dict[tuple[int | None, bool], int]:
    """Per (step, validate): the end of its last trajectory, in ms (a stable metric timestamp)."""
    out: dict[tuple[int | None, bool], int] = {}
    for step, validate, end in zip(*(trajectories[c].to_pylist() for c in (S.STEP, S.VALIDATE, S.END_NS))):
        key = (step, bool(validate))
        out[key] = max(out.get(key, 0), end // 1_000_000)
    return out


def _response_length(per_trace: dict[str, int], trajectories: pa.Table) -> dict[tuple[int | None, bool], float]:
    sums: dict[tuple[int | None, bool], list[int]] = {}
    for tid, step, validate in zip(*(trajectories[c].to_pylist() for c in (S.TRACE_ID, S.STEP, S.VALIDATE))):
        if tid in per_trace:
            sums.setdefault((step, bool(validate)), []).append(per_trace[tid])
    return {k: sum(v) / len(v) for k, v in sums.items() if v}


def export_files(
    path: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    steps: int | Iterable[int] | None = None,
    since_step: int | None = None,
    progress: bool = True,
    verify: bool = False,
    method: str = "auto",
) -> ExportReport:
    """Export trace files to MLflow: one trace per trajectory, linked to a run.

    Trajectories already in the MLflow experiment (found by their
    ``rollout_trace.trace_id`` tag) are skipped, so exporting the same files
    again creates no duplicates and catches up what a live exporter missed.

    Args:
        path: A trace file or a folder of them (searched recursively).
        tracking_uri: MLflow tracking URI; default ``MLFLOW_TRACKING_URI``,
            else ``sqlite:///./mlflow.db``.
        experiment: MLflow experiment name; default the files' project name.
        steps: Export only this step or these steps.
        since_step: Export only steps >= this.
        progress: Show a progress bar on stderr.
        verify: Read the experiment back and compare counts and rewards.
        method: ``"auto"`` (fast path on checked mlflow versions), ``"fast"``
            or ``"public"`` (MLflow's public span API).

    Returns:
        What was sent and skipped; ``details`` says where it went.
    """
    path = os.fspath(path)
    uri = resolve_tracking_uri(tracking_uri)
    report = ExportReport(backend=BACKEND)
    groups = _groups(path, experiment)
    if not groups:
        report.details.append(f"no trace files under {path}")
        return report
    for group in groups:
        fileset = _FileSet(path, group, whole=len(groups) == 1)
        try:
            _export_group(fileset.path, group, uri, steps, since_step, progress, verify, method, report)
        finally:
            fileset.close()
    return report


def _export_group(
    path: str,
    group: _Group,
    uri: str,
    steps: Any,
    since_step: int | None,
    progress: bool,
    verify: bool,
    method: str,
    report: ExportReport,
) -> None:
    all_traj = read_trajectories(path)
    selected = _select(all_traj, steps, since_step)
    filtered = all_traj.num_rows - selected.num_rows
    dest = _Destination(uri, group.project, group.experiment, method)
    existing = dest.existing_trace_ids()
    ids = selected[S.TRACE_ID].to_pylist()
    rewards = dict(zip(ids, zip(selected[S.REWARD].to_pylist(), selected["reward_info"].to_pylist())))
    todo = [t for t in ids if t not in existing]
    bar = _Progress(len(todo), progress, f"mlflow {group.project}/{group.experiment}")
    response_tokens: dict[str, int] = {}
    sent = spans = 0
    pending: list[TrajectoryData] = []

    def send() -> None:
        nonlocal sent, spans
        dest.send(pending)
        sent += len(pending)
        spans += sum(len(t.spans) for t in pending)
        bar.update(len(pending))
        pending.clear()

    try:
        for rows in _iter_trajectory_rows(path, todo):
            tid = rows[0][S.TRACE_ID]
            data = trajectory_data(rows, group.project, group.experiment, reward=rewards.get(tid))
            response_tokens[tid] = data.response_tokens
            pending.append(data)
            if len(pending) >= dest.batch_size:
                send()
        send()
    finally:
        bar.close()
    earlier = [t for t in ids if t in existing]
    if earlier:
        # Response lengths of trajectories sent earlier: only their llm spans' token counts.
        response_tokens.update(_response_tokens(path, earlier))
    metrics = step_metrics(selected)
    for key, value in _response_length(response_tokens, selected).items():
        metrics.setdefault(key, {})["response_length/mean"] = value
    n_metrics = dest.log_step_metrics(metrics, _step_timestamps(selected))
    dest.finish()
    report.trajectories_sent += sent
    report.spans_sent += spans
    skipped = len(ids) - len(todo)
    report.trajectories_skipped += skipped + filtered
    report.details.append(
        f"{group.project}/{group.experiment}: sent {sent} trajectories ({spans} spans) to MLflow experiment "
        f"{group.project!r} (id {dest.experiment_id}), run {group.experiment!r} (id {dest.run_id}) at {uri} "
        f"via the {dest.method} path; logged {n_metrics} step metrics"
    )
    if skipped:
        report.details.append(f"skipped {skipped} trajectories already in MLflow")
    if filtered:
        report.details.append(f"skipped {filtered} trajectories outside the selected steps")
    if verify:
        report.details.extend(_verify(dest, selected))


def _verify(dest: _Destination, selected: pa.Table) -> list[str]:
    """Compare the experiment's traces with the files: counts and rewards."""
    found: dict[str, dict[str, str]] = {}
    token = None
    while True:
        page = dest.client.search_traces(
            locations=[dest.experiment_id],
            include_spans=False,
            max_results=500,
            page_token=token,
            run_id=dest.run_id,
        )
        for trace in page:
            tags = trace.info.tags
            if tags.get(TAG_EXPERIMENT) == dest.experiment and tags.get(TAG_TRACE_ID):
                found[tags[TAG_TRACE_ID]] = tags
        token = page.token
        if not token:
            break
    missing = mismatched = 0
    for tid, reward in zip(selected[S.TRACE_ID].to_pylist(), selected[S.REWARD].to_pylist()):
        tags = found.get(tid)
        if tags is None:
            missing += 1
            continue
        tagged = tags.get(TAG_REWARD)
        if (reward is None) != (tagged is None) or (
            reward is not None
            and tagged is not None
            and not math.isclose(float(tagged), reward, rel_tol=1e-9, abs_tol=1e-12)
        ):
            mismatched += 1
    ok = not missing and not mismatched
    return [
        f"verify {'OK' if ok else 'FAILED'}: {selected.num_rows} trajectories in the files, "
        f"{selected.num_rows - missing} found in MLflow run {dest.run_id}, {missing} missing, "
        f"{mismatched} with a different reward"
    ]


def verify_export(
    path: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    steps: int | Iterable[int] | None = None,
    since_step: int | None = None,
) -> tuple[bool, list[str]]:
    """Check that every trajectory of the files is in MLflow with the same reward.

    Returns:
        ``(ok, lines)``: whether all matched, and a line per group.
    """
    path = os.fspath(path)
    uri = resolve_tracking_uri(tracking_uri)
    groups = _groups(path, experiment)
    lines: list[str] = []
    for group in groups:
        fileset = _FileSet(path, group, whole=len(groups) == 1)
        try:
            selected = _select(read_trajectories(fileset.path), steps, since_step)
            lines.extend(_verify(_Destination(uri, group.project, group.experiment), selected))
        finally:
            fileset.close()
    return all(line.startswith("verify OK") for line in lines), lines


# -- live ----------------------------------------------------------------------


class MlflowExporter(LiveShipper):
    """Live backend ``"mlflow"``: ships finished trajectories to MLflow in the background.

    The tracking URI comes from ``config.backend_options["mlflow"]["tracking_uri"]``,
    else ``MLFLOW_TRACKING_URI``, else ``./mlflow.db``. The experiment is the
    config's project, the run its experiment name. Step metrics of a step are
    logged once a later step's trajectory arrives, and at shutdown. When
    MLflow is down nothing is lost: the files hold everything and
    ``rollout-trace export RUN_DIR --to mlflow`` sends what is missing.
    """

    def __init__(self, config: TraceConfig) -> None:
        options = dict((config.backend_options or {}).get(BACKEND) or {})
        self.tracking_uri = resolve_tracking_uri(options.get("tracking_uri"))
        self.method = str(options.get("method", "auto"))
        self._dest: _Destination | None = None
        self._summaries: dict[tuple[int | None, bool], list[dict[str, Any]]] = {}
        self._response: dict[tuple[int | None, bool], list[int]] = {}
        self._logged_steps: set[tuple[int | None, bool]] = set()
        self._shipped: set[str] = set()
        super().__init__(config, BACKEND)

    def _destination(self) -> _Destination:
        if self._dest is None:
            self._dest = _Destination(
                self.tracking_uri, self.config.project_name, self.config.experiment_name, self.method
            )
        return self._dest

    def ship(self, trajectories: list[pa.Table]) -> None:
        """Send finished trajectories (one span table each); raise to be retried."""
        dest = self._destination()
        data = []
        for table in trajectories:
            rows = table.to_pylist()
            if not rows:
                continue
            trace_id = rows[0][S.TRACE_ID]
            late = trace_id in self._shipped and not any(r[S.PARENT_SPAN_ID] is None for r in rows)
            data.append(trajectory_data(rows, self.config.project_name, self.config.experiment_name, partial=late))
        for i in range(0, len(data), dest.batch_size):
            dest.send(data[i : i + dest.batch_size])
        if len(self._shipped) > SHIPPED_MEMORY:
            self._shipped.clear()  # bounded memory; later late spans then get a root of their own
        self._shipped.update(d.trace_id for d in data)
        for d in data:
            if d.partial:
                continue  # late spans: their trajectory was counted already
            key = (d.summary[S.STEP], bool(d.summary[S.VALIDATE]))
            self._summaries.setdefault(key, []).append(d.summary)
            self._response.setdefault(key, []).append(d.response_tokens)
        newest = max((k[0] for k in self._summaries if k[0] is not None), default=None)
        if newest is not None:
            self._log_metrics(lambda key: key[0] is not None and key[0] < newest)

    def _log_metrics(self, done: Callable[[tuple[int | None, bool]], bool]) -> None:
        keys = [k for k in self._summaries if done(k) and k not in self._logged_steps]
        if not keys or self._dest is None:
            return
        rows = [row for k in keys for row in self._summaries[k]]
        table = pa.Table.from_pylist(rows, schema=S.TRAJECTORY_SCHEMA)
        metrics = step_metrics(table)
        for k in keys:
            lengths = self._response.get(k) or []
            if lengths and k in metrics:
                metrics[k]["response_length/mean"] = sum(lengths) / len(lengths)
        self._dest.log_step_metrics(metrics, _step_timestamps(table))
        self._logged_steps.update(keys)

    def close(self) -> None:
        """Log the metrics of the last steps and end the run."""
        if self._dest is None:
            return
        try:
            self._log_metrics(lambda key: True)
            self._dest.finish()
        except Exception as exc:
            self._warn_once("close", f"could not log the last step metrics ({type(exc).__name__}: {exc})")

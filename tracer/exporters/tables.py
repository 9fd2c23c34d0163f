"""What the table-shaped backends (WandB, SwanLab, console) share.

One row per trajectory (:data:`TABLE_COLUMNS`), built the same way from files
(post-hoc export) and from live span batches; per-step metrics from
:func:`tracer.summary.step_metrics`; reading trace files step chunk by step
chunk; a plain stderr progress bar; a reader for the LevelDB-log framed run
files both wandb (``.wandb``) and swanlab (``.swanlab``) write, used by
``--verify``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.read import list_trace_files, read_file_metadata, read_spans
from tracer.summary import read_trajectories, step_metrics, trajectory_messages

#: Columns of the per-step trajectory table, in order.
TABLE_COLUMNS = (
    "step",
    "sample_index",
    "rollout_n",
    "validate",
    "reward",
    "advantage",
    "turns",
    "tool_calls",
    "tool_errors",
    "status",
    "latency_s",
    "conversation",
    "prompt",
    "response",
    "trace_id",
)
#: Index of a column in a table row.
COL = {name: i for i, name in enumerate(TABLE_COLUMNS)}

#: Metric name prefixes: training and validation trajectories.
METRIC_PREFIX = "rollout_trace/"
VAL_METRIC_PREFIX = "rollout_trace_val/"
#: Table keys: training and validation trajectories.
TABLE_KEY = "rollout_trace/table"
VAL_TABLE_KEY = "rollout_trace_val/table"

#: Longest text kept in one table cell (conversation, prompt, response);
#: longer text is cut with a note saying how much was cut.
MAX_CELL_CHARS = 100_000
#: Post-hoc export reads the spans of this many trajectories' steps at a time.
SPANS_PER_CHUNK = 200_000

#: Span columns needed to build table rows.
_ROW_SPAN_COLUMNS = [
    S.TRACE_ID,
    S.PARENT_SPAN_ID,
    S.NAME,
    S.KIND,
    S.START_NS,
    S.END_NS,
    S.STATUS,
    S.ERROR,
    S.STEP,
    S.SAMPLE_INDEX,
    S.ROLLOUT_N,
    S.VALIDATE,
    S.REWARD,
    S.INPUTS,
    S.OUTPUTS,
    S.ATTRIBUTES,
]


def import_backend(module: str, extra: str) -> Any:
    """Import a backend library or fail with the ``pip install`` line that fixes it.

    Raises:
        ImportError: naming the missing library and the install command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"the {extra} exporter needs the '{module}' package, which is not installed "
            f"({exc}); install it with: pip install 'rollout-trace[{extra}]'"
        ) from exc


def require_backend(module: str, extra: str) -> None:
    """Check (without importing it) that a backend library is installed.

    Raises:
        ImportError: naming the missing library and the install command.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(
            f"the {extra} exporter needs the '{module}' package, which is not installed; "
            f"install it with: pip install 'rollout-trace[{extra}]'"
        )


# -- rows ----------------------------------------------------------------------


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
        # OpenAI content parts: keep the text parts.
        return "".join(str(p.get("text", "")) for p in value)
    return json.dumps(value, ensure_ascii=False)


def cut(text: str, limit: int = MAX_CELL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut by rollout-trace]"


def render_conversation(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as readable text: one ``[role]`` block per message, tool calls spelled out."""
    blocks = []
    for m in messages:
        role = str(m.get("role", "?"))
        head = f"[{role}]"
        if role == "tool" and (m.get("name") or m.get("tool_call_id")):
            head = f"[tool {m.get('name') or ''}]".replace(" ]", "]")
        body = _as_text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, Mapping) else {}
            args = fn.get("arguments", "")
            body += ("\n" if body else "") + f"-> {fn.get('name', '?')}({_as_text(args)})"
        blocks.append(f"{head}\n{body}")
    return "\n\n".join(blocks)


def _prompt_and_response(rows: list[dict[str, Any]], messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The first llm call's prompt text and the last one's response text, else from the messages."""
    llm = [r for r in rows if r.get(S.KIND) == S.KIND_LLM]
    prompt = response = None
    if llm:
        inputs = _loads(llm[0].get(S.INPUTS))
        if isinstance(inputs, Mapping):
            prompt = inputs.get("prompt_text")
        outputs = _loads(llm[-1].get(S.OUTPUTS))
        response = outputs.get("response_text") if isinstance(outputs, Mapping) else None
    if prompt is None:
        head = []
        for m in messages:
            if m.get("role") == "assistant":
                break
            head.append(m)
        prompt = render_conversation(head) if head else None
    if response is None:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        response = _as_text(last.get("content")) if last else None
    return _as_text(prompt), _as_text(response)


def trajectory_row(traj: Mapping[str, Any], spans: list[dict[str, Any]]) -> list[Any]:
    """One table row (:data:`TABLE_COLUMNS`) from a trajectory summary and its spans.

    Args:
        traj: A row of :func:`tracer.read_trajectories` (or :func:`summarize_trajectories`).
        spans: The trajectory's span rows (dicts), any order.
    """
    spans = sorted(spans, key=lambda r: r.get(S.START_NS) or 0)
    messages = trajectory_messages(spans) if spans else []
    prompt, response = _prompt_and_response(spans, messages)
    info = _loads(traj.get("reward_info"))
    advantage = info.get("advantage") if isinstance(info, Mapping) else None
    start, end = traj.get(S.START_NS), traj.get(S.END_NS)
    latency = (end - start) / 1e9 if start is not None and end is not None else None
    row = {
        "step": traj.get(S.STEP),
        "sample_index": traj.get(S.SAMPLE_INDEX),
        "rollout_n": traj.get(S.ROLLOUT_N),
        "validate": bool(traj.get(S.VALIDATE)),
        "reward": traj.get(S.REWARD),
        "advantage": float(advantage) if isinstance(advantage, (int, float)) else None,
        "turns": traj.get("num_llm_calls"),
        "tool_calls": traj.get("num_tool_calls"),
        "tool_errors": traj.get("num_tool_errors"),
        "status": traj.get(S.STATUS),
        "latency_s": latency,
        "conversation": cut(render_conversation(messages)),
        "prompt": cut(prompt),
        "response": cut(response),
        "trace_id": traj.get(S.TRACE_ID),
    }
    return [row[c] for c in TABLE_COLUMNS]


def summarize_trajectories(spans: pa.Table) -> pa.Table:
    """:func:`tracer.read_trajectories`' summary computed from in-memory spans.

    Used by live exporters, which see spans before (or without) files; rewards
    are taken from the trajectory's own ``log_reward`` rows.
    """
    out: dict[str, list[Any]] = {c: [] for c in S.TRAJECTORY_COLUMNS}
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in spans.to_pylist():
        by_trace.setdefault(r[S.TRACE_ID], []).append(r)
    for tid, rows in by_trace.items():
        rewards = [r for r in rows if r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME]
        body = [r for r in rows if not (r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME)]
        timed = body or rows
        root = next((r for r in body if r[S.PARENT_SPAN_ID] is None), None)
        reward = info = None
        if rewards:
            last = max(rewards, key=lambda r: r[S.END_NS] or 0)
            reward, info = last[S.REWARD], last.get(S.ATTRIBUTES)
        else:
            scored = sorted((r for r in body if r[S.REWARD] is not None), key=lambda r: r[S.END_NS] or 0)
            reward = scored[-1][S.REWARD] if scored else None
        first = timed[0]
        tools = [r for r in body if r[S.KIND] == S.KIND_TOOL]
        values = {
            S.TRACE_ID: tid,
            S.NAME: root[S.NAME] if root else None,
            S.STEP: first[S.STEP],
            S.SAMPLE_INDEX: first[S.SAMPLE_INDEX],
            S.ROLLOUT_N: first[S.ROLLOUT_N],
            S.VALIDATE: first[S.VALIDATE],
            S.REWARD: reward,
            "reward_info": info,
            S.STATUS: root[S.STATUS] if root else S.STATUS_INCOMPLETE,
            S.START_NS: min(r[S.START_NS] for r in timed),
            S.END_NS: max(r[S.END_NS] for r in timed),
            "num_spans": len(body),
            "num_llm_calls": sum(1 for r in body if r[S.KIND] == S.KIND_LLM),
            "num_tool_calls": len(tools),
            "num_tool_errors": sum(1 for r in tools if r[S.STATUS] != S.STATUS_OK),
            "num_errors": sum(1 for r in body if r[S.STATUS] == S.STATUS_ERROR),
        }
        for c in S.TRAJECTORY_COLUMNS:
            out[c].append(values[c])
    return pa.table(out, schema=S.TRAJECTORY_SCHEMA)


@dataclasses.dataclass
class StepData:
    """Everything a table backend logs for one step.

    Attributes:
        step: The training step (None for trajectories recorded without one).
        rows: Training trajectory rows (:data:`TABLE_COLUMNS`).
        val_rows: Validation trajectory rows, at most ``log_val_generations``.
        metrics: ``{"rollout_trace/reward/mean": ..., "rollout_trace_val/...": ...}``.
        val_dropped: Validation trajectories left out of the table by the cap.
        raw_metrics: ``{validate: step_metrics values}`` without prefixes.
    """

    step: int | None
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    val_rows: list[list[Any]] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    val_dropped: int = 0
    raw_metrics: dict[bool, dict[str, float]] = dataclasses.field(default_factory=dict)


def _sort_key(row: list[Any]) -> tuple[Any, ...]:
    sample = row[COL["sample_index"]] or ""
    return (len(sample), sample, row[COL["rollout_n"]] or 0)


def build_steps(
    trajectories: pa.Table, spans_by_trace: Mapping[str, list[dict[str, Any]]], log_val_generations: int
) -> list[StepData]:
    """Group trajectory rows and metrics by step, capping validation rows per step.

    The validation rows kept are the first ``log_val_generations`` by sample
    index and rollout, so the same ones are kept on every export.
    """
    metrics = step_metrics(trajectories)
    steps: dict[int | None, StepData] = {}
    for traj in trajectories.to_pylist():
        data = steps.setdefault(traj[S.STEP], StepData(traj[S.STEP]))
        row = trajectory_row(traj, spans_by_trace.get(traj[S.TRACE_ID], []))
        (data.val_rows if traj[S.VALIDATE] else data.rows).append(row)
    for (step, validate), values in metrics.items():
        prefix = VAL_METRIC_PREFIX if validate else METRIC_PREFIX
        steps[step].metrics.update({prefix + k: float(v) for k, v in values.items()})
        steps[step].raw_metrics[bool(validate)] = dict(values)
    for data in steps.values():
        data.rows.sort(key=_sort_key)
        data.val_rows.sort(key=_sort_key)
        if len(data.val_rows) > log_val_generations:
            data.val_dropped = len(data.val_rows) - log_val_generations
            data.val_rows = data.val_rows[:log_val_generations]
    return [steps[k] for k in sorted(steps, key=lambda s: (s is None, s or 0))]


# -- reading files ---------------------------------------------------------------


@dataclasses.dataclass
class RunFiles:
    """What a post-hoc export reads from a trace path before sending anything.

    Attributes:
        path: The trace file or directory.
        project: Project name recorded in the files (None when absent).
        experiment: Experiment name recorded in the files.
        log_val_generations: The recorded config's value (default 10).
        trajectories: Selected trajectories (:data:`tracer.TRAJECTORY_SCHEMA`).
        not_selected: Trajectories outside ``steps``/``since_step``.
    """

    path: str
    project: str | None
    experiment: str | None
    log_val_generations: int
    trajectories: pa.Table
    not_selected: int


def open_run(
    path: str | os.PathLike[str], steps: Iterable[int] | None = None, since_step: int | None = None
) -> RunFiles:
    """Read a trace path's names, config and (selected) trajectory summaries.

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no trace files.
    """
    p = os.fspath(path)
    files = list_trace_files(p)
    if not files:
        raise FileNotFoundError(f"no trace files (*{S.FILE_SUFFIX}) under {p!r}")
    project = experiment = None
    log_val = 10
    for f in files:
        try:
            meta = read_file_metadata(f)
        except (OSError, pa.ArrowException):
            continue
        project = meta.get(S.META_PROJECT) or project
        experiment = meta.get(S.META_EXPERIMENT) or experiment
        config = _loads(meta.get(S.META_CONFIG))
        if isinstance(config, Mapping) and isinstance(config.get("log_val_generations"), int):
            log_val = config["log_val_generations"]
        break
    table = read_trajectories(p)
    mask = None
    if steps is not None:
        wanted = sorted(set(steps))
        mask = pc.is_in(table[S.STEP], value_set=pa.array(wanted, pa.int64()))
    if since_step is not None:
        m = pc.greater_equal(table[S.STEP], since_step)
        mask = m if mask is None else pc.and_(mask, m)
    selected = table.filter(pc.fill_null(mask, False)) if mask is not None else table
    return RunFiles(p, project, experiment, log_val, selected, table.num_rows - selected.num_rows)


def iter_step_chunks(run: RunFiles) -> Iterator[tuple[pa.Table, dict[str, list[dict[str, Any]]]]]:
    """Yield ``(trajectories, spans_by_trace)`` for groups of whole steps, in step order.

    Each group holds about :data:`SPANS_PER_CHUNK` spans, so memory stays
    bounded while the files are read only a few times.
    """
    table = run.trajectories
    if table.num_rows == 0:
        return
    counts: dict[int | None, int] = {}
    for step, n in zip(table[S.STEP].to_pylist(), table["num_spans"].to_pylist(), strict=True):
        counts[step] = counts.get(step, 0) + (n or 0)
    ordered = sorted(counts, key=lambda s: (s is None, s or 0))
    chunks: list[list[int | None]] = [[]]
    size = 0
    for step in ordered:
        if chunks[-1] and size + counts[step] > SPANS_PER_CHUNK:
            chunks.append([])
            size = 0
        chunks[-1].append(step)
        size += counts[step]
    for chunk in chunks:
        yield _read_chunk(run, chunk)


def _read_chunk(run: RunFiles, steps: list[int | None]) -> tuple[pa.Table, dict[str, list[dict[str, Any]]]]:
    numbered = [s for s in steps if s is not None]
    table = run.trajectories
    mask = pc.is_in(table[S.STEP], value_set=pa.array(numbered, pa.int64()))
    if None in steps:
        mask = pc.or_(pc.fill_null(mask, False), pc.is_null(table[S.STEP]))
    trajs = table.filter(pc.fill_null(mask, False))
    ids = trajs[S.TRACE_ID].to_pylist()
    spans = read_spans(
        run.path, columns=_ROW_SPAN_COLUMNS, steps=numbered if None not in steps else None, trace_ids=ids
    )
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in spans.to_pylist():
        by_trace.setdefault(r[S.TRACE_ID], []).append(r)
    return trajs, by_trace


# -- progress --------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (silent when disabled or not a terminal's job)."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total = max(total, 0)
        self.label = label
        self.enabled = enabled
        self.done = 0
        self._start = time.monotonic()
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` items and redraw (at most 10 times a second)."""
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = self.done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = self.done / max(now - self._start, 1e-9)
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total} trajectories ({rate:.0f}/s)")
        sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            if self._last == 0.0:
                self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


# -- run files written by wandb and swanlab ------------------------------------------

_LOG_BLOCK = 32 * 1024
_LOG_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_leveldb_log(path: str | os.PathLike[str], ident: bytes) -> list[bytes]:
    """Records of a LevelDB-log framed file (wandb's ``.wandb``, swanlab's ``.swanlab``).

    The file starts with a 7-byte header (``ident``, a 2-byte magic, a
    version byte), then 32 KiB blocks of ``crc32c:u32 length:u16 type:u8
    data`` fragments. A torn tail is ignored.

    Raises:
        ValueError: the file does not start with ``ident``.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[: len(ident)] != ident:
        raise ValueError(f"{os.fspath(path)}: not a {ident.decode(errors='replace')} run file")
    records: list[bytes] = []
    pos = _LOG_HEADER
    pending: bytes | None = None
    while pos + _LOG_HEADER <= len(data):
        left = _LOG_BLOCK - pos % _LOG_BLOCK
        if left < _LOG_HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _LOG_HEADER])
        pos += _LOG_HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == 0 or len(chunk) < length:
            break
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE and pending is not None:
            pending += chunk
        elif kind == _LAST and pending is not None:
            records.append(pending + chunk)
            pending = None
    return records


@dataclasses.dataclass
class Sent:
    """What a post-hoc export sent, kept small for ``--verify``.

    Attributes:
        rows: ``trace_id -> reward`` of every row sent.
        metrics: ``(step, metric key) -> value`` of every metric sent.
    """

    rows: dict[str, float | None] = dataclasses.field(default_factory=dict)
    metrics: dict[tuple[Any, str], float] = dataclasses.field(default_factory=dict)


def send_steps(
    run: RunFiles, log_val_generations: int, log_step: Callable[[StepData], Sequence[str]], report: Any, progress: bool
) -> Sent:
    """Build every selected step's rows and metrics, in step order, and hand each to ``log_step``.

    Counts what was sent and left out into ``report`` (an ``ExportReport``),
    with ``log_step``'s notes, and draws a progress bar when ``progress``.
    """
    sent = Sent()
    bar = Progress(run.trajectories.num_rows, f"export {report.backend}", progress)
    try:
        for trajs, spans in iter_step_chunks(run):
            for data in build_steps(trajs, spans, log_val_generations):
                report.details.extend(log_step(data))
                report.trajectories_sent += len(data.rows) + len(data.val_rows)
                report.trajectories_skipped += data.val_dropped
                if data.val_dropped:
                    report.details.append(
                        f"step {data.step}: {data.val_dropped} validation trajectories left out of the table "
                        f"(log_val_generations={log_val_generations})"
                    )
                for row in (*data.rows, *data.val_rows):
                    sent.rows[row[COL["trace_id"]]] = row[COL["reward"]]
                if data.step is not None:
                    sent.metrics.update({(data.step, k): v for k, v in data.metrics.items()})
                bar.update(len(data.rows) + len(data.val_rows) + data.val_dropped)
    finally:
        bar.close()
    if run.not_selected:
        report.trajectories_skipped += run.not_selected
        report.details.append(f"{run.not_selected} trajectories outside the selected steps not exported")
    return sent


def compare_rows(
    backend: str, expected: Mapping[str, float | None], found: Mapping[str, float | None], extra: Sequence[str] = ()
) -> list[str]:
    """Verification lines: counts and rewards of the rows found against those sent."""
    lines = []
    missing = [t for t in expected if t not in found]
    unexpected = [t for t in found if t not in expected]
    wrong = [t for t in expected if t in found and not _same(expected[t], found[t])]
    ok = not (missing or unexpected or wrong)
    lines.append(
        f"verify {backend}: {'OK' if ok else 'FAILED'}: {len(found)} trajectory rows read back, "
        f"{len(expected)} expected; {len(missing)} missing, {len(unexpected)} unexpected, "
        f"{len(wrong)} with a different reward"
    )
    lines.extend(extra)
    return lines


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def compare_metrics(
    backend: str, expected: Mapping[tuple[Any, str], float], found: Mapping[tuple[Any, str], float]
) -> str:
    """One verification line for ``(step, metric) -> value`` maps."""
    missing = [k for k in expected if k not in found]
    wrong = [k for k in expected if k in found and not _same(expected[k], found[k])]
    status = "OK" if not (missing or wrong) else "FAILED"
    return (
        f"verify {backend}: {status}: {len(expected)} step metric values expected, "
        f"{len(missing)} missing, {len(wrong)} different"
    )

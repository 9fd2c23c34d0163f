"""``rollout-trace check``: validate trace files, and repair the damaged ones.

A file is *damaged* when it is empty, not a trace file, or torn (a batch
cannot be read); spans whose ``(trace_id, span_id)`` appear twice are
damage too. Orphan spans (a parent that is not in the files) and files
without an end-of-stream marker (a writer still running, or killed between
batches) are reported but are not damage: both are what a killed worker
leaves behind. ``--repair`` rewrites the readable batches of each damaged
file into ``<name>.repaired.arrow`` and renames the original to
``<name>.damaged``, which readers skip: nothing is deleted.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pyarrow as pa

from tracer import schema as S
from tracer.read import _major, list_trace_files, read_schema
from tracer.storage.index import is_arrow_file_format
from tracer.storage.writer import fsync_dir

#: The 8 bytes that end a cleanly closed Arrow IPC stream.
EOS_MARKER = b"\xff\xff\xff\xff\x00\x00\x00\x00"
DAMAGED_SUFFIX = ".damaged"
REPAIRED_SUFFIX = ".repaired" + S.FILE_SUFFIX


@dataclasses.dataclass
class FileReport:
    """What check found in one file."""

    path: str
    rows: int = 0
    batches: int = 0
    closed: bool = False
    damage: str = ""
    schema_version: str = ""
    repaired_to: str = ""


@dataclasses.dataclass
class CheckReport:
    """What check found under a path."""

    files: list[FileReport] = dataclasses.field(default_factory=list)
    spans: int = 0
    trajectories: int = 0
    duplicate_spans: int = 0
    orphan_spans: int = 0

    @property
    def damaged(self) -> list[FileReport]:
        return [f for f in self.files if f.damage]

    @property
    def ok(self) -> bool:
        return not self.damaged and self.duplicate_spans == 0


def _ends_with_eos(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(-len(EOS_MARKER), os.SEEK_END)
            return f.read() == EOS_MARKER
    except OSError:
        return False


def _scan(path: str, keep: list[pa.RecordBatch] | None) -> FileReport:
    report = FileReport(path)
    try:
        size = os.path.getsize(path)
    except OSError as exc:  # a dangling link, a file removed meanwhile
        report.damage = f"cannot stat: {exc}"
        return report
    if size == 0:
        report.damage = "empty file (0 bytes)"
        return report
    if is_arrow_file_format(path):
        return _scan_ipc_file(path, report, keep)
    try:
        with pa.OSFile(path, "rb") as f:
            reader = pa.ipc.open_stream(f)
            meta = reader.schema.metadata or {}
            report.schema_version = meta.get(S.META_SCHEMA_VERSION.encode(), b"").decode()
            if not report.schema_version:
                report.damage = "not a rollout-trace file (no schema version)"
                return report
            if _major(report.schema_version) > _major(S.SCHEMA_VERSION):
                report.damage = f"format {report.schema_version} is newer than this tool's {S.SCHEMA_VERSION}"
                return report
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                report.batches += 1
                report.rows += batch.num_rows
                if keep is not None:
                    keep.append(batch)
    except (OSError, pa.ArrowException) as exc:
        what = "unreadable" if report.batches == 0 and not report.schema_version else "torn"
        report.damage = f"{what} after {report.batches} complete batch(es), {report.rows} span(s) readable: {exc}"
        return report
    report.closed = _ends_with_eos(path)
    return report


def _scan_ipc_file(path: str, report: FileReport, keep: list[pa.RecordBatch] | None) -> FileReport:
    """A compacted file (IPC file format, with footer)."""
    try:
        with pa.OSFile(path, "rb") as f:
            reader = pa.ipc.open_file(f)
            report.schema_version = (reader.schema.metadata or {}).get(S.META_SCHEMA_VERSION.encode(), b"").decode()
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                report.batches += 1
                report.rows += batch.num_rows
                if keep is not None:
                    keep.append(batch)
    except (OSError, pa.ArrowException) as exc:
        report.damage = f"compacted file unreadable after {report.batches} batch(es): {exc}"
        return report
    report.closed = True
    return report


def check_path(path: str | os.PathLike[str], repair: bool = False) -> CheckReport:
    """Validate every trace file under ``path``; with ``repair``, fix the damaged ones."""
    out = CheckReport()
    seen: dict[tuple[str, str], int] = {}
    parents: list[tuple[str, str]] = []
    traces: set[str] = set()
    for file in list_trace_files(path):
        batches: list[pa.RecordBatch] = []
        report = _scan(file, batches)
        out.files.append(report)
        for batch in batches:
            cols = {
                name: batch.column(batch.schema.get_field_index(name)).to_pylist()
                for name in (S.TRACE_ID, S.SPAN_ID, S.PARENT_SPAN_ID)
            }
            for tid, sid, pid in zip(cols[S.TRACE_ID], cols[S.SPAN_ID], cols[S.PARENT_SPAN_ID]):
                key = (tid, sid)
                seen[key] = seen.get(key, 0) + 1
                traces.add(tid)
                if pid is not None:
                    parents.append((tid, pid))
        out.spans += report.rows
        if repair and report.damage:
            _repair(report, batches)
    out.duplicate_spans = sum(n - 1 for n in seen.values() if n > 1)
    out.orphan_spans = sum(1 for key in parents if key not in seen)
    out.trajectories = len(traces - {""})
    return out


def _repair(report: FileReport, batches: list[pa.RecordBatch]) -> None:
    path = report.path
    stem = path[: -len(S.FILE_SUFFIX)] if path.endswith(S.FILE_SUFFIX) else path
    if batches:
        target = stem + REPAIRED_SUFFIX
        schema = batches[0].schema
        try:
            schema = read_schema(path)
        except (OSError, pa.ArrowException):
            pass
        tmp = target + ".tmp"
        with open(tmp, "wb") as sink:
            with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp, target)
        report.repaired_to = target
    os.replace(path, path + DAMAGED_SUFFIX)
    fsync_dir(os.path.dirname(path) or ".")


def format_report(report: CheckReport, root: str) -> str:
    """Human-readable summary."""
    lines = []
    for f in report.files:
        name = os.path.relpath(f.path, root) if os.path.isdir(root) else f.path
        if f.damage:
            line = f"DAMAGED  {name}: {f.damage}"
            if f.repaired_to:
                line += f" -> repaired into {os.path.basename(f.repaired_to)}; original kept as {os.path.basename(f.path)}{DAMAGED_SUFFIX}"
            elif f.path and not os.path.exists(f.path):
                line += f" -> moved aside as {os.path.basename(f.path)}{DAMAGED_SUFFIX}"
            lines.append(line)
        elif not f.closed:
            lines.append(
                f"open     {name}: {f.rows} span(s) in {f.batches} batch(es), no end-of-stream marker (writer running, or killed between batches)"
            )
    verdict = "OK" if report.ok else "DAMAGE FOUND"
    lines.append(
        f"{verdict}: {len(report.files)} file(s), {len(report.damaged)} damaged, {report.spans} span(s), "
        f"{report.trajectories} trajectories, {report.duplicate_spans} duplicate span(s), "
        f"{report.orphan_spans} orphan span(s) (parents never written: killed mid-trajectory)"
    )
    if not report.ok and not any(f.repaired_to or (f.damage and not os.path.exists(f.path)) for f in report.files):
        lines.append("run again with --repair to rewrite the readable data of damaged files (originals are kept)")
    return "\n".join(lines)


def summary_dict(report: CheckReport) -> dict[str, Any]:
    """The report as JSON-able data."""
    return {
        "ok": report.ok,
        "files": [dataclasses.asdict(f) for f in report.files],
        "spans": report.spans,
        "trajectories": report.trajectories,
        "duplicate_spans": report.duplicate_spans,
        "orphan_spans": report.orphan_spans,
    }

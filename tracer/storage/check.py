"""``rollout-trace check``: validate trace files as the readers read them, and repair the damaged ones (empty, not
Arrow, torn, corrupt, refused, skipped, or a span twice); orphan spans and open files are only reported."""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any

from tracer import schema as S
from tracer.read import TracePaths, list_trace_files
from tracer.storage.files import read_batches
from tracer.storage.repair import DAMAGED_SUFFIX, REPAIRED, repair_file


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
    left_as_is: bool = False


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
        """Files with damage."""
        return [f for f in self.files if f.damage]

    @property
    def ok(self) -> bool:
        """No damaged file and no duplicate span."""
        return not self.damaged and self.duplicate_spans == 0


def _damage(read: Any) -> str:
    if read.skipped or read.refused or not read.damage:  # a read stops at the first refusal or damage: never both
        return str(read.skipped or read.refused)
    what = "unreadable" if read.batches == 0 and not read.schema_version else "torn"
    return f"{what} after {read.batches} complete batch(es), {read.rows} span(s) readable: {read.damage}"


def check_path(path: TracePaths, repair: bool = False) -> CheckReport:
    """Validate every trace file under ``path``; with ``repair``, fix the damaged ones."""
    out = CheckReport()
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    parents: list[tuple[str, str]] = []
    traces: set[str] = set()
    for file in list_trace_files(path):
        reading = read_batches(file, list(S.SPAN_COLUMNS))
        for batch in reading:
            tids, sids, pids = (batch.column(c).to_pylist() for c in (S.TRACE_ID, S.SPAN_ID, S.PARENT_SPAN_ID))
            seen.update(zip(tids, sids))
            traces.update(tids)
            parents.extend((tid, pid) for tid, pid in zip(tids, pids) if pid is not None)
        read = reading.result
        report = FileReport(file, read.rows, read.batches, read.closed, _damage(read), read.schema_version)
        out.files.append(report)
        out.spans += report.rows
        if repair and report.damage:
            fixed = repair_file(file)
            report.repaired_to = fixed.repaired_to
            report.left_as_is = fixed.action != REPAIRED
    out.duplicate_spans = sum(n - 1 for n in seen.values() if n > 1)
    out.orphan_spans = sum(1 for key in parents if key not in seen)
    out.trajectories = len(traces - {""})
    return out


def format_report(report: CheckReport, root: str) -> str:
    """Human-readable summary."""
    lines = []
    for f in report.files:
        name = os.path.relpath(f.path, root) if os.path.isdir(root) else f.path
        if f.damage:
            line = f"DAMAGED  {name}: {f.damage}"
            if f.repaired_to:
                line += f" -> repaired into {os.path.basename(f.repaired_to)}; original kept as {os.path.basename(f.path)}{DAMAGED_SUFFIX}"
            elif f.left_as_is:
                line += " -> left as it is (not something repair can fix)"
            elif f.path and not os.path.lexists(f.path):
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
    acted = any(f.repaired_to or f.left_as_is or (f.damage and not os.path.lexists(f.path)) for f in report.files)
    if not report.ok and not acted:
        lines.append("run again with --repair to rewrite the readable data of damaged files (originals are kept)")
    return "\n".join(lines)


def summary_dict(report: CheckReport) -> dict[str, Any]:
    """The report as JSON-able data."""
    return {"ok": report.ok, **dataclasses.asdict(report)}

"""Follow a run while it is written: :class:`RunFollower` reads only the batches added since the last look and
summarises again only the trajectories that got rows, so :meth:`RunFollower.trajectories` equals
:func:`tracer.index.readers.read_trajectories` of the run. A file gone or shorter (compaction, repair) makes the
next poll read the run again."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import warnings
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.index.shard import write_index
from tracer.read import TraceFileWarning, TracePaths, list_trace_files
from tracer.storage import uri as _uri
from tracer.storage.files import read_batches, read_layout
from tracer.storage.seal import SEALED, seal_if_abandoned
from tracer.summary import SUMMARY_SPAN_COLUMNS, summarize

_SORT_KEYS = [(c, "ascending") for c in (S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.START_NS, S.TRACE_ID)]


@dataclasses.dataclass
class FileProgress:
    """What the follower has read of one trace file."""

    size: int = -1  # when last read
    mtime_ns: int = -1
    batches: int = 0  # complete record batches read
    closed: bool = False  # ended cleanly: its writer is done with it
    end: int = 0  # where the last batch read ends (0: walk the file from the start)
    max_step: int | None = None
    changed_at: float = 0.0  # when a poll last found new batches in it (monotonic)


@dataclasses.dataclass
class Update:
    """What one :meth:`RunFollower.poll` found."""

    rows: int = 0
    batches: int = 0
    changed: list[str] = dataclasses.field(default_factory=list)  # trace ids summarised again
    reset: bool = False  # read again from the start (a file read was replaced or cut)
    warnings: list[str] = dataclasses.field(default_factory=list)  # about damaged files


def _by_step(table: pa.Table) -> dict[int | None, pa.Table]:
    """The rows of ``table`` by their step: one sort and slices, not one filter per step."""
    unique = pc.unique(table.column(S.STEP))
    if len(unique) <= 1:
        return {unique[0].as_py() if len(unique) else None: table} if table.num_rows else {}
    ordered = table.sort_by(S.STEP)  # nulls last
    counts = pc.value_counts(ordered.column(S.STEP))
    values, sizes = counts.field("values").to_pylist(), counts.field("counts").to_pylist()
    return {v: ordered.slice(start, n) for v, n, start in zip(values, sizes, itertools.accumulate(sizes, initial=0))}


def _keyed_rewards(spans: pa.Table) -> Any:
    """Mask of the ``log_reward`` rows without a trace id (they join their trajectory by key)."""
    no_tid = pc.invert(pc.fill_null(pc.not_equal(spans.column(S.TRACE_ID), ""), False))
    kind, name = spans.column(S.KIND), spans.column(S.NAME)
    is_log = pc.and_(pc.equal(kind, S.KIND_REWARD), pc.equal(name, S.REWARD_SPAN_NAME))
    return pc.and_(no_tid, pc.fill_null(is_log, False))


class _ShrunkError(Exception):
    """A file is shorter than when it was read."""


def _step_key(step: int | None) -> tuple[bool, int]:
    return (step is None, step or 0)


class RunFollower:
    """Reads a run again and again, each time only what was written since; not thread-safe (callers sharing
    one follower hold a lock around :meth:`poll`)."""

    def __init__(self, path: TracePaths) -> None:
        self.path = path
        self.columns = [*SUMMARY_SPAN_COLUMNS, S.SPAN_ID]  # kept of every row read: what the summary needs
        self._clear()

    def _clear(self) -> None:
        #: How many times the run was read from the start (with :attr:`step_versions`, a cache key).
        self.generation: int = getattr(self, "generation", -1) + 1
        self.files: dict[str, FileProgress] = {}
        #: Span rows read so far (every row of the files, log_reward rows included).
        self.rows = 0
        self._spans: dict[int | None, list[pa.Table]] = {}
        self._summaries: dict[int | None, pa.Table] = {}
        self._trace_steps: dict[str, set[int | None]] = {}
        self._trace_files: dict[str, set[str]] = {}
        self._table: pa.Table | None = None
        #: How many polls read something; a counter views can key caches on.
        self.version = 0
        #: Per step, how many times its summaries were replaced (a step's cache key).
        self.step_versions: dict[int | None, int] = {}

    def poll(self) -> Update:
        """Read the batches written since the last poll and update the summaries (FileNotFoundError: no path)."""
        files = list_trace_files(self.path)
        # A file read before is gone (compacted, removed) or remote (no cheap look at its batches): start over.
        gone = not self.files.keys() <= set(files) or any(_uri.is_remote(f) for f in files)
        try:
            return self._read(files, gone)
        except _ShrunkError:  # a file got shorter (repaired, rewritten): start over
            return self._read(files, True)

    def _read(self, files: list[str], start_over: bool) -> Update:
        update = Update(reset=start_over and bool(self.files))
        if start_over:
            self._clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceFileWarning)
            pieces = [table for table in (self._read_file(f, update) for f in files) if table is not None]
        update.warnings = list(dict.fromkeys(str(w.message) for w in caught))
        if pieces:
            new = pa.concat_tables(pieces)
            update.rows = new.num_rows
            self.rows += new.num_rows
            update.changed = self._absorb(new)
            self._table = None
            self.version += 1
        return update

    def _read_file(self, file: str, update: Update) -> pa.Table | None:
        progress = self.files.setdefault(file, FileProgress())
        if _uri.is_remote(file):
            reading = read_batches(file, self.columns)
        else:
            try:  # the file may be gone since the listing (seal_if_abandoned never raises)
                st = os.stat(file)
                if st.st_size == progress.size and st.st_mtime_ns == progress.mtime_ns:
                    # Unchanged: an open file whose writer is gone is sealed, so its last step counts as finished.
                    if progress.closed or seal_if_abandoned(file, on_sealed=write_index).action != SEALED:
                        return None
                    st = os.stat(file)
                if st.st_size < progress.size:
                    raise _ShrunkError(file)
                progress.mtime_ns = st.st_mtime_ns
                # Walk the headers from where the last read ended, read only the batches after it.
                if progress.end or not progress.batches:
                    resume = (progress.end, progress.batches) if progress.end else None
                    reading = read_batches(file, self.columns, resume=resume)
                else:  # after damage: walk the whole file, read the batches not read yet
                    complete = len(read_layout(file).batches)
                    reading = read_batches(file, self.columns, range(progress.batches, complete))
            except OSError:
                return None
        got = list(reading)
        result = reading.result
        message = result.describe()
        whole = result.batches == result.batches_in_file - progress.batches  # every batch walked was read
        torn_tail = result.damage and not result.refused and not result.closed and whole
        if message and not torn_tail:  # a batch still being written is not damage
            warnings.warn(message, TraceFileWarning, stacklevel=2)
        progress.size = result.size
        progress.batches += result.batches
        progress.closed = result.closed
        progress.end = result.end if whole and not result.skipped else 0
        if result.damage or result.refused:
            progress.size = -1  # look again next time: a batch being written ends up complete
        if not got:
            return None
        update.batches += len(got)
        table = pa.Table.from_batches(got)
        progress.changed_at = time.monotonic()
        steps = (pc.max(table.column(S.STEP)).as_py(), progress.max_step)
        progress.max_step = max((s for s in steps if s is not None), default=None)
        for tid in pc.unique(table.column(S.TRACE_ID)).to_pylist():
            if tid:
                self._trace_files.setdefault(tid, set()).add(file)
        return table

    def _absorb(self, new: pa.Table) -> list[str]:
        """File the new rows by step and summarise again every trajectory they touch."""
        for step, rows in _by_step(new).items():
            self._spans.setdefault(step, []).append(rows)
        pairs = new.select([S.TRACE_ID, S.STEP]).group_by([S.TRACE_ID, S.STEP], use_threads=False).aggregate([])
        affected: set[str] = set()
        for tid, step in zip(pairs.column(0).to_pylist(), pairs.column(1).to_pylist()):
            if tid:
                affected.add(tid)
                self._trace_steps.setdefault(tid, set()).add(step)
        # Rewards logged without a trace id join trajectories of their step by key: redo those steps.
        for step in pc.unique(pc.filter(new.column(S.STEP), _keyed_rewards(new))).to_pylist():
            summary = self._summaries.get(step)
            if summary is not None:
                affected.update(summary.column(S.TRACE_ID).to_pylist())
        if not affected:
            return []
        by_step: dict[int | None, list[str]] = {}
        for tid in affected:
            for step in self._trace_steps.get(tid, ()):
                by_step.setdefault(step, []).append(tid)
        ids_of = {step: pa.array(sorted(tids), pa.string()) for step, tids in by_step.items()}
        parts = []
        for step, ids in ids_of.items():
            spans = pa.concat_tables(self._spans.get(step, []))
            own = pc.fill_null(pc.is_in(spans.column(S.TRACE_ID), value_set=ids), False)
            parts.append(spans.filter(pc.or_(own, _keyed_rewards(spans))))
        fresh = _by_step(summarize(pa.concat_tables(parts)))
        for step in ids_of.keys() | fresh.keys():
            keep, gone = self._summaries.get(step), ids_of.get(step)
            if keep is not None and gone is not None:
                keep = keep.filter(pc.invert(pc.is_in(keep.column(S.TRACE_ID), value_set=gone)))
            mine = fresh.get(step, S.TRAJECTORY_SCHEMA.empty_table())
            table = mine if keep is None or keep.num_rows == 0 else pa.concat_tables([keep, mine])
            if table.num_rows:
                self._summaries[step] = table.sort_by(_SORT_KEYS)
            else:
                self._summaries.pop(step, None)
            self.step_versions[step] = self.step_versions.get(step, 0) + 1
        return sorted(affected)

    def trajectories(self, steps: Iterable[int | None] | None = None) -> pa.Table:
        """One summary row per trajectory read so far, of ``steps`` (None: all), as ``read_trajectories``."""
        if steps is None and self._table is not None:
            return self._table
        chosen = sorted(self._summaries.keys() & set(self._summaries if steps is None else steps), key=_step_key)
        table = pa.concat_tables([self._summaries[s] for s in chosen]) if chosen else S.TRAJECTORY_SCHEMA.empty_table()
        if steps is None:
            self._table = table
        return table

    def steps(self) -> list[int]:
        """The steps of the rows read so far, ascending (rows without a step left out)."""
        return sorted(s for s in self._spans if s is not None)

    def spans(self, trace_ids: Iterable[str]) -> pa.Table:
        """The rows read so far of these trajectories (:attr:`columns`), by start time."""
        wanted = list(dict.fromkeys(trace_ids))
        steps = {s for t in wanted for s in self._trace_steps.get(t, ())}
        ids = pa.array(wanted, pa.string())
        parts = []
        for step in steps:
            spans = pa.concat_tables(self._spans[step])
            parts.append(spans.filter(pc.fill_null(pc.is_in(spans.column(S.TRACE_ID), value_set=ids), False)))
        return pa.concat_tables(parts).sort_by([(S.START_NS, "ascending")]) if parts else self._no_spans()

    def summary_spans(self, step: int | None) -> pa.Table:
        """At least every row of the trajectories whose summary is in ``step`` (rows of others may come along):
        the step's own rows when none of its trajectories has rows in another step, else :meth:`spans`."""
        summary = self._summaries.get(step)
        if summary is None:
            return self._no_spans()
        ids = summary.column(S.TRACE_ID).to_pylist()
        if all(len(self._trace_steps.get(t, ())) <= 1 for t in ids):
            return pa.concat_tables(self._spans.get(step, []))
        return self.spans(ids)

    def _no_spans(self) -> pa.Table:
        return pa.schema([S.SPAN_SCHEMA.field(c) for c in self.columns]).empty_table()

    def files_of(self, trace_ids: Iterable[str]) -> list[str]:
        """The files holding rows of these trajectories."""
        return sorted({f for t in trace_ids for f in self._trace_files.get(t, ())})

    def running(self, now_ns: int | None = None) -> pa.Table:
        """Trajectories in progress (no root span yet, a file still open): the summary columns plus ``running_s``,
        seconds since the trajectory's first span started."""
        table = self.trajectories()
        incomplete = table.filter(pc.equal(table.column(S.STATUS), S.STATUS_INCOMPLETE))
        open_files = {f for f, p in self.files.items() if not p.closed}
        keep = [not open_files.isdisjoint(self._trace_files.get(t, ())) for t in incomplete[S.TRACE_ID].to_pylist()]
        running = incomplete.filter(pa.array(keep, pa.bool_()))
        now = time.time_ns() if now_ns is None else now_ns
        since = pc.divide(
            pc.cast(pc.subtract(pa.scalar(now, pa.int64()), running.column(S.START_NS)), pa.float64(), safe=False), 1e9
        )
        return running.append_column(RUNNING_S, since)


#: Column :meth:`RunFollower.running` adds: seconds the trajectory has been running.
RUNNING_S = "running_s"


def step_progress(trajectories: pa.Table, running: pa.Table) -> list[dict[str, Any]]:
    """Per step of :meth:`RunFollower.trajectories`: finished (a root span), running, abandoned (writer done)."""
    running_ids = set(running.column(S.TRACE_ID).to_pylist())
    out: dict[int | None, dict[str, Any]] = {}
    for tid, step, status in zip(*trajectories.select([S.TRACE_ID, S.STEP, S.STATUS]).to_pydict().values()):
        row = out.setdefault(step, {S.STEP: step, "finished": 0, "running": 0, "abandoned": 0})
        row["finished" if status != S.STATUS_INCOMPLETE else "running" if tid in running_ids else "abandoned"] += 1
    return [out[s] for s in sorted(out, key=_step_key)]

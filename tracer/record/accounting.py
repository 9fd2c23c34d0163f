"""Flush accounting: what was written, dropped, failed and replaced, and what the last flush reported."""

from __future__ import annotations

import collections
import dataclasses
import logging

logger = logging.getLogger("rollout_trace")

#: Attribute naming the values of a span that were replaced by a placeholder.
ATTR_REPLACED = "rollout_trace.replaced"


@dataclasses.dataclass
class FlushResult:
    """What :func:`tracer.flush` achieved. Truthy when nothing failed."""

    #: Everything recorded before the call is durable on disk.
    ok: bool
    #: Spans written by this process so far.
    spans_written: int = 0
    #: Spans dropped because the buffer was full (``on_buffer_full="drop"``).
    spans_dropped: int = 0
    #: Spans that could not be written (storage errors).
    spans_failed: int = 0
    #: Tracer errors counted (encoding, decoding, ...).
    internal_errors: int = 0
    #: What happened since the previous result (losses, values replaced, problems), or "".
    message: str = ""
    #: Values written as a marked placeholder (named in ``rollout_trace.replaced``).
    values_replaced: int = 0

    def __bool__(self) -> bool:
        return self.ok


class ProblemLog:
    """Counts the tracer's own problems and logs each kind once."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.last: dict[str, str] = {}
        self.first_exception: BaseException | None = None

    def report(self, kind: str, detail: str, exc: BaseException | None = None) -> None:
        self.counts[kind] += 1
        self.last[kind] = detail
        if exc is not None and self.first_exception is None:
            self.first_exception = exc
        if self.counts[kind] == 1:
            logger.warning(
                "rollout-trace: %s: %s (logged once; later ones are counted, see tracer.flush())", kind, detail
            )


#: The span and value counts of a recorder (attributes of :class:`Accounting`).
COUNTS = ("written", "dropped", "failed", "replaced")
#: What a result had reported: process totals by count, problems by kind (see :meth:`Accounting.marks`).
Marks = tuple["collections.Counter[str]", "collections.Counter[str]"]


class Accounting:
    """The counts of one recorder, and what its last :class:`FlushResult` reported."""

    def __init__(self) -> None:
        self.problems = ProblemLog()
        #: Spans written; dropped (buffer full, writer stalled, recorder closed); not written (storage errors,
        #: unencodable); values replaced by a placeholder because a column could not hold them.
        self.written, self.dropped, self.failed, self.replaced = 0, 0, 0, 0
        #: Totals of the recorders this one replaced, by name in :data:`COUNTS`.
        self.base: collections.Counter[str] = collections.Counter()
        self._reported: collections.Counter[str] = collections.Counter()
        self._problems_at: collections.Counter[str] = collections.Counter()

    def total(self, name: str) -> int:
        """This process's count ``name`` (one of :data:`COUNTS`)."""
        return self.base[name] + int(getattr(self, name))

    def result(self, done: bool, message: str = "") -> FlushResult:
        """The flush result: ok when nothing failed or was dropped since the previous one; counts are process totals."""
        totals = collections.Counter({name: self.total(name) for name in COUNTS})
        new = totals - self._reported
        counts = collections.Counter(self.problems.counts)
        new_problems = counts - self._problems_at
        self._reported, self._problems_at = totals, counts
        # A writer error is a cycle that ended early: what it held is unaccounted for.
        ok = done and not new["failed"] and not new["dropped"] and not new_problems["writer error"]
        parts = [message] if message else []
        if new["dropped"]:
            parts.append(f"{new['dropped']} spans dropped since the last flush (buffer full or writer stalled)")
        if new["failed"]:
            parts.append(f"{new['failed']} spans not written since the last flush")
        if new["replaced"]:
            parts.append(f"{new['replaced']} values replaced by placeholders (see the spans' {ATTR_REPLACED!r})")
        parts.extend(f"{k} x{v}: {self.problems.last.get(k, '')}" for k, v in new_problems.items())
        written, dropped, failed, replaced = (totals[name] for name in COUNTS)
        return FlushResult(ok, written, dropped, failed, sum(counts.values()), "; ".join(parts), replaced)

    def marks(self) -> Marks:
        """What the last result had reported (pass to :meth:`adopt`)."""
        return collections.Counter(self._reported), collections.Counter(self._problems_at)

    def adopt(self, old: Accounting, marks: Marks) -> None:
        """Take over the counts of ``old``; ``marks`` (taken before its shutdown): what was already reported."""
        self.base = collections.Counter({name: old.total(name) for name in COUNTS})
        self._reported, problems_at = marks
        self._problems_at = self._problems_at + problems_at
        self.problems.counts.update(old.problems.counts)
        for kind, detail in old.problems.last.items():
            self.problems.last.setdefault(kind, detail)
        if self.problems.first_exception is None:
            self.problems.first_exception = old.problems.first_exception

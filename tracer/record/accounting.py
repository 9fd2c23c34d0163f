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


class Totals:
    """Counts carried over from the recorders a re-init replaced."""

    __slots__ = ("written", "dropped", "failed", "replaced")

    def __init__(self, written: int = 0, dropped: int = 0, failed: int = 0, replaced: int = 0) -> None:
        self.written, self.dropped, self.failed, self.replaced = written, dropped, failed, replaced


#: What a result had reported: failed, dropped, replaced, problems by kind (see :meth:`Accounting.marks`).
Marks = tuple[int, int, int, "collections.Counter[str]"]


class Accounting:
    """The counts of one recorder, and what its last :class:`FlushResult` reported."""

    def __init__(self) -> None:
        self.problems = ProblemLog()
        #: Spans written to the files by this recorder.
        self.written = 0
        #: Spans dropped (buffer full, writer stalled, recorder closed).
        self.dropped = 0
        #: Spans that could not be written (storage errors, unencodable).
        self.failed = 0
        #: Values replaced by a placeholder because a column could not hold them.
        self.replaced = 0
        #: Totals of the recorders this one replaced.
        self.base = Totals()
        self._failed_at, self._dropped_at, self._replaced_at = 0, 0, 0
        self._problems_at: collections.Counter[str] = collections.Counter()

    def written_total(self, n: int = 0) -> int:
        """Spans this process has written, counting ``n`` more."""
        return self.base.written + self.written + n

    def dropped_total(self) -> int:
        """Spans this process has dropped."""
        return self.base.dropped + self.dropped

    def result(self, done: bool, message: str = "") -> FlushResult:
        """The flush result: ok when nothing failed or was dropped since the previous one; counts are process totals."""
        base = self.base
        failed = base.failed + self.failed
        dropped = base.dropped + self.dropped
        replaced = base.replaced + self.replaced
        new_failed = failed - self._failed_at
        new_dropped = dropped - self._dropped_at
        new_replaced = replaced - self._replaced_at
        counts = collections.Counter(self.problems.counts)
        new_problems = counts - self._problems_at
        self._failed_at, self._dropped_at = failed, dropped
        self._replaced_at, self._problems_at = replaced, counts
        # A writer error is a cycle that ended early: what it held is unaccounted for.
        ok = done and new_failed == 0 and new_dropped == 0 and not new_problems["writer error"]
        parts = [message] if message else []
        if new_dropped:
            parts.append(f"{new_dropped} spans dropped since the last flush (buffer full or writer stalled)")
        if new_failed:
            parts.append(f"{new_failed} spans not written since the last flush")
        if new_replaced:
            parts.append(f"{new_replaced} values replaced by placeholders (see the spans' {ATTR_REPLACED!r})")
        parts.extend(f"{k} x{v}: {self.problems.last.get(k, '')}" for k, v in new_problems.items())
        return FlushResult(
            ok, base.written + self.written, dropped, failed, sum(counts.values()), "; ".join(parts), replaced
        )

    def marks(self) -> Marks:
        """What the last result had reported (pass to :meth:`adopt`)."""
        return (self._failed_at, self._dropped_at, self._replaced_at, collections.Counter(self._problems_at))

    def adopt(self, old: Accounting, marks: Marks | None = None) -> None:
        """Take over the counts of ``old``; ``marks`` (taken before its shutdown): what was already reported."""
        ob = old.base
        self.base = Totals(
            ob.written + old.written, ob.dropped + old.dropped, ob.failed + old.failed, ob.replaced + old.replaced
        )
        failed_at, dropped_at, replaced_at, problems_at = marks if marks is not None else old.marks()
        self._failed_at, self._dropped_at, self._replaced_at = failed_at, dropped_at, replaced_at
        self._problems_at = self._problems_at + problems_at
        self.problems.counts.update(collections.Counter(old.problems.counts))
        for kind, detail in old.problems.last.items():
            self.problems.last.setdefault(kind, detail)
        if self.problems.first_exception is None:
            self.problems.first_exception = old.problems.first_exception

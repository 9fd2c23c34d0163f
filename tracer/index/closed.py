"""What happens when a shard is closed: its index is written and the run's rollup takes it.

The callbacks storage is given by its composition root: :class:`tracer.storage.writer.SpanWriter`
calls :func:`shard_closed` (its ``on_close``), :func:`tracer.storage.seal.seal_if_abandoned`
calls :func:`shard_sealed` (its ``on_sealed``), and compaction builds each output's index with
:func:`builder` while it holds the output's table. The index holds the trajectory model's summary
and per-step aggregates (:mod:`tracer.summary`), so this module imports the model directly.
"""

from __future__ import annotations

import logging
import os
import threading

from tracer import schema as S
from tracer import summary as model
from tracer.index import rollup
from tracer.index.shard import ShardIndexBuilder, write_sidecar
from tracer.storage.files import read_batches

logger = logging.getLogger("rollout_trace")
_index_warned = threading.Event()


def builder(bounded: bool = True) -> ShardIndexBuilder:
    """An index builder with the model's summary and per-step aggregates (see :class:`ShardIndexBuilder`)."""
    return ShardIndexBuilder(model.SUMMARY_SPAN_COLUMNS, model.summarize, model.step_partials, bounded=bounded)


def write_index(shard: str) -> bool:
    """Write the index of the closed local ``shard`` from its spans, read back from the file.

    Only the summary's columns are read, batch by batch (at most
    :data:`tracer.index.shard.MAX_BUILD_BYTES` of them kept), so a writer keeps nothing of a shard
    in memory while it is open. Never raises: a shard that gets no index is read whole. The first
    failure in a process is logged (a warning), later ones are not.

    Returns:
        True when the sidecar was written.
    """
    try:
        b = builder()
        wanted = list(dict.fromkeys([*b.columns, S.STEP]))
        reading = read_batches(shard, wanted)
        for batch in reading:
            b.add(batch)
        if not reading.result.complete:
            raise ValueError(reading.result.describe() or "not read completely")
        write_sidecar(shard, b)
    except Exception as exc:  # the shard stands without an index: readers read the spans
        warn_no_index(shard, exc)
        return False
    return True


def shard_closed(shard: str) -> None:
    """A writer closed ``shard`` cleanly: its index, then the run's rollup (``on_close`` of a writer)."""
    if write_index(shard):
        rollup.update_quietly(os.path.dirname(shard) or ".")


def shard_sealed(shard: str) -> None:
    """A reader sealed a dead writer's ``shard``: its index, and the rollup on the rollup thread (a read
    seals many shards at once) (``on_sealed`` of :func:`tracer.storage.seal.seal_if_abandoned`)."""
    if write_index(shard):
        rollup.update_later(os.path.dirname(shard) or ".")


def warn_no_index(shard: str, exc: BaseException) -> None:
    """Log, once per process, that ``shard`` got no index; later calls log nothing."""
    if _index_warned.is_set():
        return
    _index_warned.set()
    logger.warning(
        "rollout-trace: no index written for %s (%s: %s); readers read its spans instead "
        "(further failures to write an index are not logged)",
        shard,
        type(exc).__name__,
        exc,
    )


__all__ = ["builder", "shard_closed", "shard_sealed", "warn_no_index", "write_index"]

"""What a closing shard writes: its index, then the run's rollup (a :class:`tracer.storage.writer.SpanWriter`'s
``on_close``; compaction calls :func:`update_rollup` for its outputs)."""

from __future__ import annotations

import os

from tracer.index import readers, rollup
from tracer.index.shard import write_index


def update_rollup(run_dir: str) -> None:
    """Bring the rollup of the local ``run_dir`` up to date (:func:`tracer.index.rollup.update_quietly`)."""
    rollup.update_quietly(run_dir, readers.read_step_partials)


def shard_closed(shard: str) -> None:
    """A writer closed ``shard`` cleanly: its index, then the run's rollup."""
    if write_index(shard):
        update_rollup(os.path.dirname(shard) or ".")

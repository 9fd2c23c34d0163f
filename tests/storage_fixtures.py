"""Helpers of the storage tests: span rows whose ids say where they came from, copies of run directories."""

from __future__ import annotations

import os
import shutil

from tracer import schema as S
from tracer.index import rollup
from tracer.index.shard import INDEX_SUFFIX

#: How long the helpers below wait for the rollup thread: an update may itself wait its lock
#: (``rollup.LOCK_WAIT_S``) and then rebuild, which takes longer than that on a loaded CI machine.
ROLLUP_IDLE_WAIT_S = 30.0


def copy_run(
    run: str | os.PathLike[str], where: str | os.PathLike[str], indexes: bool = True, symlinks: bool = False
) -> str:
    """Copy the run directory ``run`` to ``where`` (which must not exist); without its shard indexes
    unless ``indexes``. First waits for this process's rollup thread: a read that sealed a killed
    writer's shard hands it a rollup update, whose temporary file would come and go mid-copy."""
    rollup.wait_idle(ROLLUP_IDLE_WAIT_S)
    skipped = ["*.tmp"] + ([] if indexes else ["*" + INDEX_SUFFIX])
    return os.fspath(shutil.copytree(run, where, symlinks=symlinks, ignore=shutil.ignore_patterns(*skipped)))


def temporaries(run: str | os.PathLike[str]) -> list[str]:
    """The temporary files left in the directory ``run`` once this process's rollup thread is idle
    (before, the file of an update in flight would count): what a failed write must not leave."""
    rollup.wait_idle(ROLLUP_IDLE_WAIT_S)
    return sorted(n for n in os.listdir(run) if n.endswith(".tmp"))


def span_rows(batch: int, n: int, tag: str = "") -> list[dict[str, object]]:
    """``n`` spans of one trajectory per batch, with ids that say where they came from."""
    return [
        {
            S.TRACE_ID: f"{tag}t{batch:04d}",
            S.SPAN_ID: f"{tag}b{batch:04d}s{i:04d}",
            S.PARENT_SPAN_ID: None if i == 0 else f"{tag}b{batch:04d}s0000",
            S.NAME: "tool",
            S.KIND: "tool",
            S.START_NS: 1_000 + i,
            S.END_NS: 2_000 + i,
            S.STATUS: "ok",
            S.STEP: batch,
            S.SAMPLE_INDEX: str(batch),
            S.ROLLOUT_N: 0,
            S.INPUTS: f'{{"x": {i}}}',
        }
        for i in range(n)
    ]

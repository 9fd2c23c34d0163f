"""The run-directory index written by compaction: which batches hold which step.

``{run_dir}/_index.json`` maps compacted file names to their size, rows and,
per record batch, the step it holds, so a reader asking for one step opens
only the batches of that step (compacted files use the Arrow IPC *file*
format, whose footer allows reading one batch without the others). An entry
may list the files it ``replaces``: readers skip those while the entry's file
exists, which makes a compaction interrupted at any moment safe (every row
is read exactly once).
"""

from __future__ import annotations

import json
import os
from typing import Any

from tracer.storage.writer import fsync_dir

INDEX_NAME = "_index.json"
INDEX_VERSION = 1

#: First bytes of an Arrow IPC *file* (streams start with a continuation marker).
ARROW_FILE_MAGIC = b"ARROW1"


def load_index(run_dir: str) -> dict[str, Any]:
    """The index of ``run_dir`` (empty when there is none or it is unreadable)."""
    from tracer.storage import remote as _remote

    try:
        if _remote.is_remote(run_dir):
            with _remote.open_input(_remote.join_uri(run_dir, INDEX_NAME)) as f:
                data = json.loads(f.read().decode("utf-8"))
        else:
            with open(os.path.join(run_dir, INDEX_NAME), encoding="utf-8") as f:
                data = json.load(f)
    except (OSError, ValueError):
        return {"version": INDEX_VERSION, "files": {}}
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return {"version": INDEX_VERSION, "files": {}}
    return data


def save_index(run_dir: str, index: dict[str, Any]) -> None:
    """Write the index atomically (temp file, fsync, rename, fsync the directory)."""
    path = os.path.join(run_dir, INDEX_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(run_dir)


def replaced_files(run_dir: str, index: dict[str, Any]) -> set[str]:
    """Names readers must skip: replaced by a compacted file that exists."""
    from tracer.storage import remote as _remote

    def exists(name: str) -> bool:
        if _remote.is_remote(run_dir):
            try:
                _remote.file_size(_remote.join_uri(run_dir, name))
            except OSError:
                return False
            return True
        return os.path.exists(os.path.join(run_dir, name))

    hidden: set[str] = set()
    for name, entry in index["files"].items():
        group = entry.get("group", [name])
        if entry.get("replaces") and all(exists(g) for g in group):
            hidden.update(entry["replaces"])
    return hidden


def batches_for_steps(entry: dict[str, Any], size: int, steps: set[int] | None) -> list[int] | None:
    """Batch numbers of a compacted file holding ``steps``; None when the index cannot say."""
    if steps is None or entry.get("size") != size:
        return None
    return [i for i, step in enumerate(entry.get("batch_steps", [])) if step in steps]


def is_arrow_file_format(path: str) -> bool:
    """True for an Arrow IPC file (with footer), False for a stream."""
    from tracer.storage import remote as _remote

    try:
        with _remote.open_input(path) as f:
            return bytes(f.read(len(ARROW_FILE_MAGIC))) == ARROW_FILE_MAGIC
    except OSError:
        return False

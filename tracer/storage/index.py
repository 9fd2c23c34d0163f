"""The run-directory index written by compaction, ``_index.json``: compacted file names to their size, rows and each
batch's step (reading one step opens only its batches), and the files each ``replaces`` (readers skip those)."""

from __future__ import annotations

import json
import os
from typing import Any

from tracer.schema import FILE_SUFFIX
from tracer.storage import side_files
from tracer.storage import uri as _uri
from tracer.storage.files import write_replacing
from tracer.storage.writer import fsync_dir

INDEX_NAME = "_index.json"
INDEX_VERSION = 1


def load_index(run_dir: str) -> dict[str, Any]:
    """The index of ``run_dir`` (empty when there is none, or it is refused: :mod:`tracer.storage.side_files`)."""
    path = _uri.join_uri(run_dir, INDEX_NAME) if _uri.is_remote(run_dir) else os.path.join(run_dir, INDEX_NAME)
    data = side_files.read_json(path, side_files.MAX_JSON_BYTES, valid_index, "a compaction index")
    return {"version": INDEX_VERSION, "files": {}} if data is None else data


#: Types of the fields of an index entry readers use (absent ones are fine).
_ENTRY_FIELDS = {
    "size": side_files.is_int,
    "rows": side_files.is_int,
    "batch_steps": lambda v: isinstance(v, list) and all(s is None or side_files.is_int(s) for s in v),
    "replaces": side_files.is_str_list,
    "group": side_files.is_str_list,
    "replaced_at": side_files.is_number,
}


def valid_index(data: Any) -> bool:
    """Whether ``data`` (decoded JSON) is shaped as :func:`save_index` writes an index."""
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return False
    return all(
        isinstance(entry, dict) and all(check(entry[k]) for k, check in _ENTRY_FIELDS.items() if k in entry)
        for entry in data["files"].values()
    )


def save_index(run_dir: str, index: dict[str, Any]) -> None:
    """Write the index atomically (temp file, fsync, rename, fsync the directory)."""
    path = os.path.join(run_dir, INDEX_NAME)
    write_replacing(path, path + ".tmp", lambda f: f.write(json.dumps(index).encode("utf-8")))
    fsync_dir(run_dir)


def listing(run_dir: str) -> tuple[list[str], dict[str, Any]]:
    """The trace files readers read in the local ``run_dir`` (names, sorted; replaced ones left out) and its index,
    loaded after the listing. Raises OSError when the directory cannot be listed."""
    listed = sorted(e.name for e in os.scandir(run_dir) if e.name.endswith(FILE_SUFFIX) and not e.is_dir())
    index = load_index(run_dir)
    hidden = replaced_files(index, set(listed))
    return [n for n in listed if n not in hidden], index


def replaced_files(index: dict[str, Any], listed: set[str]) -> set[str]:
    """Names readers must skip: replaced by compacted files in ``listed`` (taken *before* ``index`` was loaded, so every
    row is read exactly once even while a compaction renames its output)."""
    hidden: set[str] = set()
    for name, entry in index["files"].items():
        if entry.get("replaces") and all(g in listed for g in entry.get("group", [name])):
            hidden.update(entry["replaces"])
    return hidden


def batches_for_steps(entry: dict[str, Any], size: int, steps: set[int] | None) -> list[int] | None:
    """Batch numbers of a compacted file holding ``steps``; None when the index cannot say."""
    if steps is None or entry.get("size") != size:
        return None
    return [i for i, step in enumerate(entry.get("batch_steps", [])) if step in steps]

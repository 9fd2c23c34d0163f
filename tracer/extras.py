"""The ``pip install`` line that adds an optional extra, spelled for how this copy was installed (rollout-trace is
not on a package index, so every "needs package X" message names what works here)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import urllib.parse
import urllib.request
from typing import Any

#: The distribution name in pyproject.toml.
DISTRIBUTION = "rollout-trace"

_NAME_LINE = re.compile(r'^name\s*=\s*"rollout-trace"\s*$', re.MULTILINE)


def install_command(extra: str) -> str:
    """The pip command that installs the optional ``extra`` (``viewer``, ``mlflow``, ...) into this environment."""
    return f"pip install {_target()}".replace("{extra}", extra)


@functools.lru_cache(maxsize=1)
def _target() -> str:
    """The install target with an ``{extra}`` placeholder: the source tree this runs from (its pyproject.toml
    beside it), else the local folder or file pip installed it from, else the distribution name."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with contextlib.suppress(OSError), open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        if _NAME_LINE.search(f.read()):
            return "-e " + shlex.quote(root + "[{extra}]")
    try:
        url = json.loads(importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}")["url"]
    except (importlib.metadata.PackageNotFoundError, ValueError, TypeError, KeyError):
        url = None
    if isinstance(url, str) and url.startswith("file:"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        if os.path.exists(path):
            return shlex.quote(path + "[{extra}]")
    return shlex.quote(DISTRIBUTION + "[{extra}]")


def _missing(module: str, extra: str, detail: str = "") -> ImportError:
    return ImportError(
        f"the {extra} exporter needs the '{module}' package, which is not installed{detail}; "
        f"install it with: {install_command(extra)}"
    )


def import_backend(module: str, extra: str) -> Any:
    """Import a backend library; ImportError naming it and the ``pip install`` line that fixes it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise _missing(module, extra, f" ({exc})") from exc


def require_backend(module: str, extra: str) -> None:
    """Check, without importing it, that a backend library is installed; ImportError as :func:`import_backend`."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise _missing(module, extra)

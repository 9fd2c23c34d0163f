"""The ``pip install`` line that adds an optional extra, spelled for how this copy was installed.

rollout-trace is not on a package index: a hint of ``pip install
'rollout-trace[viewer]'`` only works by accident (when pip happens to find
the editable clone). Every "needs package X" message calls
:func:`install_command` instead, which names what works here:

- running from a source tree (an editable install, or the clone on
  ``sys.path``): ``pip install -e '/path/to/clone[viewer]'``;
- installed from a local folder or wheel (pip's ``direct_url.json``):
  ``pip install '/that/path[viewer]'``;
- otherwise (an index install): ``pip install 'rollout-trace[viewer]'``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import urllib.parse
import urllib.request
from typing import Any

#: The distribution name in pyproject.toml.
DISTRIBUTION = "rollout-trace"

_NAME_LINE = re.compile(r'^name\s*=\s*"rollout-trace"\s*$', re.MULTILINE)


def install_command(extra: str) -> str:
    """The pip command line that installs the optional ``extra`` (``viewer``, ``mlflow``, ...) into this environment.

    Args:
        extra: An extra of pyproject.toml's ``[project.optional-dependencies]``.

    Returns:
        A shell command, e.g. ``pip install -e '/home/me/rollout-trace[viewer]'``.
    """
    return f"pip install {_target()}".replace("{extra}", extra)


@functools.lru_cache(maxsize=1)
def _target() -> str:
    """The install target with an ``{extra}`` placeholder (computed once per process)."""
    root = _source_root()
    if root is not None:
        return "-e " + _quote(root + "[{extra}]")
    location = _direct_url_path()
    if location is not None:
        return _quote(location + "[{extra}]")
    return _quote(DISTRIBUTION + "[{extra}]")


def _source_root() -> str | None:
    """The clone this package runs from, when it runs from a source tree (its pyproject.toml is beside it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return root if _NAME_LINE.search(text) else None


def _direct_url_path() -> str | None:
    """The local folder or file pip installed this distribution from, if pip recorded one."""
    try:
        raw = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not raw:
        return None
    try:
        url = json.loads(raw).get("url", "")
    except (ValueError, AttributeError):
        return None
    if not isinstance(url, str) or not url.startswith("file:"):
        return None
    path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    return path if os.path.exists(path) else None


def _quote(text: str) -> str:
    """Single-quote ``text`` for a POSIX shell (brackets would otherwise be globbed)."""
    return "'" + text.replace("'", "'\\''") + "'"


def import_backend(module: str, extra: str) -> Any:
    """Import a backend library or fail with the ``pip install`` line that fixes it.

    Raises:
        ImportError: naming the missing library and the install command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"the {extra} exporter needs the '{module}' package, which is not installed "
            f"({exc}); install it with: {install_command(extra)}"
        ) from exc


def require_backend(module: str, extra: str) -> None:
    """Check (without importing it) that a backend library is installed.

    Raises:
        ImportError: naming the missing library and the install command.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(
            f"the {extra} exporter needs the '{module}' package, which is not installed; "
            f"install it with: {install_command(extra)}"
        )

"""Every test, bench and source path the docs name exists, and every ``path::test`` they cite is defined there.

The docs say which test proves each claim (RELIABILITY.md most of all); a
moved or renamed file must not leave them pointing at nothing.
"""

from __future__ import annotations

import glob
import os
import re

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = sorted(
    os.path.relpath(p, REPO)
    for p in [*glob.glob(os.path.join(REPO, "*.md")), *glob.glob(os.path.join(REPO, "docs", "*.md"))]
    + [os.path.join(REPO, "sample_data", "README.md")]
)
#: A repository path to a Python file under one of these folders, optionally ``::name``.
PATH_RE = re.compile(r"\b((?:tests|bench|tracer|viewer|rollout|examples)/[A-Za-z0-9_/]*\.py)(?:::([A-Za-z0-9_]+))?")


def _references(doc: str) -> list[tuple[str, str | None]]:
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        return [(m.group(1), m.group(2)) for m in PATH_RE.finditer(f.read())]


@pytest.mark.parametrize("doc", DOCS)
def test_named_files_and_tests_exist(doc: str) -> None:
    """Each path exists; each ``::name`` is a function or class defined in that file."""
    missing = []
    for path, name in _references(doc):
        full = os.path.join(REPO, path)
        if not os.path.isfile(full):
            missing.append(path)
            continue
        if name:
            with open(full, encoding="utf-8") as f:
                if not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", f.read(), re.M):
                    missing.append(f"{path}::{name}")
    assert not missing, f"{doc} names what does not exist: {', '.join(sorted(set(missing)))}"


def test_the_docs_cite_tests_at_all() -> None:
    """The pattern finds the citations (a check that could not fail otherwise)."""
    assert len(_references("RELIABILITY.md")) > 20

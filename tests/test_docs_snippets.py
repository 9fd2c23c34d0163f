"""The docs cannot drift: their code blocks run, and every path, test and flag they name exists.

Docs: the Markdown files at the repository's root, ``docs/*.md`` and
``sample_data/README.md``. Each fenced ``bash``/``sh``/``shell``/``console``/``python``
block of a doc runs, in order, in one temporary directory per doc (a block may
use what an earlier one made), unless the line just above it is an HTML
comment ``<!-- not run: REASON -->``. ``console`` blocks run their ``$ `` lines.
Consecutive Python blocks run as one script (a later block uses what an
earlier one defined). Blocks of other languages (``sql``, ``json``, none) are text.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = sorted(
    os.path.relpath(p, REPO)
    for p in [*glob.glob(os.path.join(REPO, "*.md")), *glob.glob(os.path.join(REPO, "docs", "*.md"))]
    + [os.path.join(REPO, "sample_data", "README.md")]
)
#: A repository path to a Python file under one of these folders, optionally ``::name``.
PATH_RE = re.compile(r"\b((?:tests|bench|tracer|viewer|rollout|examples)/[A-Za-z0-9_/]*\.py)(?:::([A-Za-z0-9_]+))?")
#: ``::name`` right after a backtick: a test of the last path named before it on the same line.
MORE_RE = re.compile(r"`::([A-Za-z0-9_]+)`")
FENCE_RE = re.compile(r"^( *)```(\S*)\n(.*?)^\1```$", re.M | re.S)
NOT_RUN_RE = re.compile(r"<!-- not run: [^>]*\S[^>]*-->\s*$")
SHELLS = {"bash", "sh", "shell", "console"}
#: Flags of programs other than rollout-trace and the benches that the docs name.
OTHER_FLAGS = {
    "--no-deps",
    "--upgrade",
    "--dry-run",
    "--report",
    "--backend-store-uri",
    "--host",
    "--port",
    "--workers",
}
BLOCK_TIMEOUT_S = 180


def _text(doc: str) -> str:
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        return f.read()


def _references(doc: str) -> list[tuple[str, str | None]]:
    refs: list[tuple[str, str | None]] = []
    for line in _text(doc).splitlines():
        last = None
        for m in re.finditer(rf"{PATH_RE.pattern}|{MORE_RE.pattern}", line):
            if m.group(1):
                last = m.group(1)
                refs.append((last, m.group(2)))
            elif last:
                refs.append((last, m.group(3)))
    return refs


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
    """The patterns find the citations, continuations included (a check that could not fail otherwise)."""
    refs = _references("RELIABILITY.md")
    assert len(refs) > 20
    assert any(name and name.startswith("test_") and refs[i - 1][0] == path for i, (path, name) in enumerate(refs))


def _subcommand_flags() -> dict[str, set[str]]:
    from tracer.cli import build_parser

    def flags(parser: argparse.ArgumentParser) -> set[str]:
        out: set[str] = set()
        for action in parser._actions:
            out.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out |= flags(sub)
        return out

    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: flags(parser) for name, parser in subs.choices.items()}


def _bench_flags() -> set[str]:
    found: set[str] = set()
    for path in glob.glob(os.path.join(REPO, "bench", "*.py")) + glob.glob(os.path.join(REPO, "examples", "*.py")):
        with open(path, encoding="utf-8") as f:
            found.update(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", f.read()))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_named_cli_flags_exist(doc: str) -> None:
    """``rollout-trace SUB ... --flag`` names a flag SUB has; a flag named alone is some command's."""
    subs = _subcommand_flags()
    known = set().union(*subs.values()) | _bench_flags() | OTHER_FLAGS
    wrong = []
    text = _text(doc)
    for m in re.finditer(r"rollout-trace\s+([a-z]+)([^`\n|#]*)", text):
        if m.group(1) in subs:
            wrong += [
                f"{m.group(1)} {f}"
                for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2))
                if f not in subs[m.group(1)]
            ]
    wrong += [f for f in re.findall(r"`(--[a-z][a-z0-9-]*)", text) if f not in known]
    assert not wrong, f"{doc} names flags that do not exist: {', '.join(sorted(set(wrong)))}"


def _console_commands(code: str) -> str:
    """The commands of a console block: its ``$ `` lines and the lines a trailing backslash continues."""
    out, more = [], False
    for line in code.splitlines():
        if line.startswith("$ ") or more:
            out.append(line[2:] if line.startswith("$ ") else line)
            more = line.endswith("\\")
    return "".join(f"{line}\n" for line in out)


def _blocks(doc: str) -> list[tuple[int, str, str]]:
    """(line, language, code) of each block of ``doc`` that runs; consecutive Python blocks joined into one."""
    text = _text(doc)
    out: list[tuple[int, str, str]] = []
    for m in FENCE_RE.finditer(text):
        lang, code = m.group(2), textwrap.dedent(m.group(3))
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if lang not in SHELLS | {"python"} or NOT_RUN_RE.search(before):
            continue
        if lang == "console":
            code = _console_commands(code)
        line = text[: m.start()].count("\n") + 1
        if lang == "python" and out and out[-1][1] == "python":
            out[-1] = (out[-1][0], "python", out[-1][2] + code)
        else:
            out.append((line, lang, code))
    return out


RUNNABLE = [doc for doc in DOCS if _blocks(doc)]


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE)
def test_code_blocks_run(doc: str, tmp_path: Path) -> None:
    """Each of the doc's runnable blocks exits 0, in order, in one fresh directory."""
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PYTHONPATH": REPO, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    for name in ("ROLLOUT_TRACE_DIR", "ROLLOUT_TRACE_BACKEND", "ROLLOUT_TRACE_CONFIG", "ROLLOUT_TRACE_STRICT"):
        env.pop(name, None)
    blocks = _blocks(doc)
    installs = [line for line, _, code in blocks if re.search(r"\bpip3? install\b|\bapt(-get)? install\b", code)]
    assert not installs, f"{doc}: blocks at lines {installs} install packages: mark them not run"
    for line, lang, code in blocks:
        if lang == "python":
            script = tmp_path / f"block_{line}.py"
            script.write_text(code, encoding="utf-8")
            cmd = [sys.executable, str(script)]
        else:
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert proc.returncode == 0, (
            f"{doc}:{line} ({lang}) exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )


def test_every_not_run_mark_gives_a_reason() -> None:
    """A ``not run`` comment says why, and sits right above a block."""
    bad = []
    for doc in DOCS:
        lines = _text(doc).splitlines()
        for i, line in enumerate(lines):
            below = lines[i + 1].lstrip() if i + 1 < len(lines) else ""
            if "<!-- not run" in line and not (NOT_RUN_RE.search(line) and below.startswith("```")):
                bad.append(f"{doc}:{i + 1}")
    assert not bad, f"not-run marks without a reason or a block below: {', '.join(bad)}"


def test_front_pages_keep_their_budgets() -> None:
    """README.md: at most 200 lines with a screenshot of the viewer; RELIABILITY.md: at most 15 KB."""
    readme = _text("README.md")
    assert len(readme.splitlines()) <= 200
    images = re.findall(r"!\[[^\]]*\]\((docs/img/[^)]+\.png)\)", readme)
    assert images and all(os.path.isfile(os.path.join(REPO, p)) for p in images)
    assert len(_text("RELIABILITY.md").encode()) <= 15 * 1024

"""A plain install (the core dependencies alone) records, reads, ``info``s and ``--help``s with no traceback.

A fresh virtual environment gets pyproject.toml's ``[project] dependencies``
from the package index pip is configured with, then this tree with
``--no-deps``: nothing optional (pandas, streamlit, mlflow, transformers) is
there. A command that needs an optional package says which, and the
``pip install`` line that adds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracer.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]

RECORD = """
import sys, tracer
tracer.init(output_dir=sys.argv[1], project_name="plain", experiment_name="run")

@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids, sampling_params):
    return {"response_ids": [5, 6, 7], "finish_reason": "stop"}

@tracer.rollout_trace_op(kind="reward")
def score(i):
    return float(i)

for i in range(4):
    with tracer.rollout_trace_attr(step=0, sample_index=i, rollout_n=0):
        generate([1, 2, 3], {"temperature": 1.0})
        score(i)
assert tracer.shutdown().ok
assert tracer.read_spans(sys.argv[1]).num_rows == 12
assert sorted(tracer.read_trajectories(sys.argv[1])["reward"].to_pylist()) == [0.0, 1.0, 2.0, 3.0]
print("recorded")
"""


def _subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the core dependencies and this tree (editable, no extras)."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    core = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    subprocess.run([*pip, *core], check=True, env=_env())
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True, env=_env())
    return venv / "bin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_plain_install_records_reads_and_answers_every_help(plain_venv: Path, tmp_path: Path) -> None:
    """Core dependencies only: record, read back, ``info`` and every subcommand's ``--help``, no traceback."""
    absent = _run(
        [str(plain_venv / "python"), "-c", "import importlib.util as u; print(u.find_spec('pandas'))"], tmp_path
    )
    assert absent.stdout.strip() == "None"  # nothing optional came along
    script = tmp_path / "record.py"
    script.write_text(RECORD, encoding="utf-8")
    recorded = _run([str(plain_venv / "python"), str(script), str(tmp_path / "traces")], tmp_path)
    assert recorded.returncode == 0 and "recorded" in recorded.stdout, recorded.stderr
    info = _run([str(plain_venv / "rollout-trace"), "info", str(tmp_path / "traces")], tmp_path)
    assert info.returncode == 0, info.stderr
    assert "4 trajectories" in info.stdout
    for command in ["", *_subcommands()]:
        shown = _run([str(plain_venv / "rollout-trace"), *([command] if command else []), "--help"], tmp_path)
        assert shown.returncode == 0, (command, shown.stderr)
        assert "Traceback" not in shown.stdout + shown.stderr, command


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,extra",
    [
        (["demo", "--steps", "1"], "demo"),
        (["view", "traces"], "viewer"),
        (["export", "traces", "--to", "mlflow"], "mlflow"),
    ],
)
def test_a_missing_optional_package_names_its_install_line(
    plain_venv: Path, tmp_path: Path, args: list[str], extra: str
) -> None:
    """A subcommand that needs an optional package exits 2 with the ``pip install`` line of its extra."""
    (tmp_path / "traces").mkdir()
    ran = _run([str(plain_venv / "rollout-trace"), *args], tmp_path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    assert "pip install" in ran.stderr and f"[{extra}]" in ran.stderr, ran.stderr

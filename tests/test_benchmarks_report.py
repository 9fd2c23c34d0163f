"""BENCHMARKS.md is what ``bench/report.py`` renders from ``bench/results``, within its size budget."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
assert _spec and _spec.loader
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_benchmarks_md_is_generated_from_the_results() -> None:
    """The committed BENCHMARKS.md equals the script's output: regenerate it with ``python bench/report.py``."""
    assert (REPO / "BENCHMARKS.md").read_text(encoding="utf-8") == report.report(), "run python bench/report.py"


def test_benchmarks_md_fits_its_budget() -> None:
    """BENCHMARKS.md stays under 15 KB and has a row for every results file."""
    text = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 15 * 1024
    for path in (REPO / "bench" / "results").glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        for row in data if isinstance(data, list) else [data]:
            assert f"| {row['bench']} | " in text


def test_any_results_file_renders(tmp_path: Path) -> None:
    """An object, a list and missing keys all render; a bench in two files shows the file measured last."""
    (tmp_path / "a.json").write_text(
        json.dumps(
            [{"bench": "a", "what": "w", "figure": "old", "measured": "2026-01-01"}, {"bench": "a", "what": "v"}]
        )
    )
    (tmp_path / "bench_a.json").write_text(
        json.dumps(
            [{"bench": "bench_a", "what": "w", "figure": "new", "measured": "2026-02-01"}, {"what": "x|y", "met": True}]
        )
    )
    text = report.render(report.load_rows(str(tmp_path)), [{"design": "d", "evidence": "e", "commit": "abc1234"}])
    assert "| bench_a | w | - | new | - | - | 2026-02-01 |" in text
    assert "| old |" not in text and "| v |" not in text
    assert "| bench_a | x\\|y | - | - | - | yes | - |" in text
    assert "- d: e (abc1234)." in text


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_bad_results_file_is_named(tmp_path: Path, content: str) -> None:
    """A file that is not JSON objects raises one error naming it."""
    (tmp_path / "broken.json").write_text(content)
    with pytest.raises(report.ResultsError, match="broken.json"):
        report.load_rows(str(tmp_path))


def test_check_mode_reports_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--check`` exits 1 when BENCHMARKS.md differs and 0 when it matches, writing nothing."""
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("stale\n")
    monkeypatch.setattr(report, "OUTPUT", os.fspath(out))
    assert report.main(["--check"]) == 1
    assert out.read_text() == "stale\n"
    assert report.main([]) == 0
    assert report.main(["--check"]) == 0

"""``rollout-trace import mlflow`` refuses a bad trace alone, names it and imports the rest (real SQLite stores)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from export_mlflow_fixtures import empty_store  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tracer  # noqa: E402
from tracer.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("in_tmp_dir")  # MLflow's ./mlruns lands in each test's temp folder


@pytest.fixture(scope="module")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An empty MLflow SQLite store, migrated once: each test copies it."""
    return empty_store(tmp_path_factory.mktemp("template") / "mlflow.db")


def _foreign_store(template: str, root: Path, traces: list[dict[str, Any]]) -> str:
    """A copy of ``template`` holding one foreign trace (an AGENT root and an LLM child) per item of ``traces``.

    Each item: ``tags`` (trace tags), ``inputs`` and ``outputs`` of the llm span, ``attributes`` of it.
    """
    import mlflow

    shutil.copyfile(template, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.set_experiment("foreign")
    for t in traces:
        root_span = mlflow.start_span_no_context(
            "agent", span_type="AGENT", tags=t.get("tags", {}), experiment_id=exp.experiment_id
        )
        child = mlflow.start_span_no_context(
            "llm",
            span_type="LLM",
            parent_span=root_span,
            inputs=t.get("inputs", {"q": 1}),
            attributes=t.get("attributes"),
        )
        child.end(outputs=t.get("outputs", {"a": 2}))
        root_span.end()
    mlflow.flush_trace_async_logging()
    return uri


def _import(uri: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(
        ["import", "mlflow", "--tracking-uri", uri, "--experiment", "foreign", "--out", str(out), "--no-progress"]
    )
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(lengths=st.lists(st.one_of(st.integers(1, 40), st.integers(256, 600)), min_size=2, max_size=5))
def test_a_trace_whose_folder_cannot_be_made_is_refused_alone(
    tmp_path_factory: pytest.TempPathFactory,
    store_template: str,
    lengths: list[int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Project tags too long for a folder name: those traces are refused and named, every other one is written, exit 1."""
    root = tmp_path_factory.mktemp("batch")
    traces = [{"tags": {"project_name": "p" * n, "step": str(i)}} for i, n in enumerate(lengths)]
    uri = _foreign_store(store_template, root, traces)
    code, out = _import(uri, root / "out", capsys)
    bad = sum(1 for n in lengths if n > 255)
    assert code == (1 if bad else 0), out
    assert out.count("cannot write under") == bad, out
    imported = tracer.read_trajectories(str(root / "out")).to_pylist() if bad < len(lengths) else []
    assert sorted(r["step"] for r in imported) == [i for i, n in enumerate(lengths) if n <= 255]


def test_import_writes_no_secret_of_a_foreign_trace(
    tmp_path: Path, store_template: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A foreign trace holding an sk- key and an Authorization: Bearer header: neither reaches the written files."""
    key = "sk-live-9fQ2mX7rT4vB1nC8kD3gH6jZ0pW5s"
    token = "eyJhbGciOiJIUzI1NiJ9.aW1wb3J0ZWQtc2VjcmV0"
    trace = {
        "inputs": {"api_key": key, "headers": {"Authorization": f"Bearer {token}"}},
        "outputs": {"echo": f"called with {key}"},
        "attributes": {"http.request.header.authorization": f"Bearer {token}"},
        "tags": {"step": "1"},
    }
    uri = _foreign_store(store_template, tmp_path, [trace])
    code, out = _import(uri, tmp_path / "out", capsys)
    assert code == 0, out
    rows = tracer.read_spans(str(tmp_path / "out")).to_pylist()
    assert len(rows) == 2
    text = str(rows)
    assert key not in text and token not in text
    assert "<redacted>" in text

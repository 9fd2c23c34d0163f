"""The cases of verl's own rollout_trace unit tests, run against the drop-in (our words, rollout-trace's files).

verl checks its module with weave and trackio mocked and MLflow real; here each
case records with a real rollout-trace backend and reads back what was written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

import tracer
from tracer.integrations import verl as drop_in
from tracer.integrations.verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op


@pytest.fixture(autouse=True)
def _fresh_config() -> Any:
    """verl's config is a per-process singleton: forget it around each case, as verl's own fixture does."""
    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()


class Traced:
    @rollout_trace_op
    async def leaf(self, a: str, b: str = "default") -> str:
        return f"result: {a}, {b}"

    @rollout_trace_op
    async def middle(self, a: str, b: str = "default") -> str:
        await self.leaf("x1", b="y1")
        return f"result: {a}, {b}"

    @rollout_trace_op
    async def fails(self) -> None:
        raise ValueError("Test Exception")

    async def outer(self) -> bool:
        await self.leaf("x0", b="y0")
        await self.middle("x2", b="y2")
        return True


def _start(tmp_path: Path, backend: str = "arrow") -> str:
    out = str(tmp_path / "traces")
    tracer.init(output_dir=out)  # verl's config has no output_dir: the drop-in keeps this one
    RolloutTraceConfig.init(project_name="my-project", experiment_name="my-experiment", backend=backend)
    return out


def _spans(out: str) -> list[dict[str, Any]]:
    tracer.flush()
    if not os.path.exists(out):
        return []
    return [s for s in tracer.read_spans(out).to_pylist() if s["kind"] != "rollout" or s["name"] != "rollout_trace"]


def test_no_backend_calls_straight_through(tmp_path: Path) -> None:
    """With no backend configured the decorated method returns its value and nothing is written."""
    assert asyncio.run(Traced().leaf("a")) == "result: a, default"
    assert RolloutTraceConfig.get_backend() is None and tracer.get_config() is None


def test_a_call_is_recorded_with_its_name_inputs_and_output(tmp_path: Path) -> None:
    """A traced call: span named by the method's qualified name, its arguments by name, its return value."""
    out = _start(tmp_path)
    assert RolloutTraceConfig.get_client() is tracer
    assert asyncio.run(Traced().leaf("test_a", b="test_b")) == "result: test_a, test_b"
    (span,) = _spans(out)
    assert span["name"] == "Traced.leaf" and span["status"] == "ok"
    assert json.loads(span["inputs"]) == {"a": "test_a", "b": "test_b"}
    assert json.loads(span["outputs"]) == "result: test_a, test_b"


def test_an_exception_passes_through_and_is_recorded(tmp_path: Path) -> None:
    """The method's exception reaches the caller unchanged; its span is marked error with the exception."""
    out = _start(tmp_path)
    with pytest.raises(ValueError, match="Test Exception"):
        asyncio.run(Traced().fails())
    (span,) = _spans(out)
    assert span["status"] == "error" and json.loads(span["error"])["type"] == "ValueError"


def test_an_unknown_backend_warns_once_and_records_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """backend="dummy" (or any name verl does not know): one warning, nothing recorded, the method runs, as in verl."""
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        RolloutTraceConfig.init(project_name="p", experiment_name="e", backend="dummy")
        assert asyncio.run(Traced().leaf("test_a")) == "result: test_a, default"
        RolloutTraceConfig.reset()
        RolloutTraceConfig.init(project_name="p", experiment_name="e", backend="dummy")
        RolloutTraceConfig.reset()
        RolloutTraceConfig.init(project_name="p", experiment_name="e", backend="mlfow")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "'dummy' is unknown" in warnings[0]
    assert "did you mean 'mlflow'?" in warnings[1]
    assert RolloutTraceConfig.get_backend() == "mlfow" and RolloutTraceConfig.get_client() is None
    assert tracer.get_config() is None


def test_trace_false_records_nothing_in_its_block_and_tracing_resumes(tmp_path: Path) -> None:
    """trace=False: the block records nothing; the next block without it records its call."""
    out = _start(tmp_path)
    with rollout_trace_attr(step=1, sample_index=0, rollout_n=0, trace=False):
        assert asyncio.run(Traced().leaf("a", b="b")) == "result: a, b"
    assert _spans(out) == []
    with rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
        asyncio.run(Traced().leaf("a", b="b"))
    assert [s["name"] for s in _spans(out)] == ["Traced.leaf"]


def test_trace_false_turns_off_nested_ops(tmp_path: Path) -> None:
    """trace=False reaches every decorated call nested under the block (three here)."""
    out = _start(tmp_path)
    with rollout_trace_attr(step=1, sample_index=0, rollout_n=0, trace=False):
        assert asyncio.run(Traced().outer()) is True
    assert _spans(out) == []
    with rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
        asyncio.run(Traced().leaf("a", b="b"))
    assert len(_spans(out)) == 1


def test_tracing_comes_back_after_an_exception_in_a_trace_false_block(tmp_path: Path) -> None:
    """An exception leaving a trace=False block does not leave tracing off."""
    out = _start(tmp_path)
    with pytest.raises(RuntimeError), rollout_trace_attr(step=1, sample_index=0, rollout_n=0, trace=False):
        raise RuntimeError("raised with tracing off")
    with rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
        asyncio.run(Traced().leaf("a", b="b"))
    assert len(_spans(out)) == 1


def test_a_named_block_is_one_trajectory_with_its_keys_in_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backend=mlflow on a SQLite store: the block named agent_run is one trace with its step and sample tags."""
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = _start(tmp_path, backend="mlflow")
    with rollout_trace_attr(step=1, sample_index=2, rollout_n=3, name="agent_run"):
        assert asyncio.run(Traced().outer()) is True
    assert {s["name"] for s in _spans(out)} >= {"Traced.leaf", "Traced.middle"}
    tracer.shutdown()
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("my-project")
    (trace,) = mlflow.search_traces(locations=[experiment.experiment_id], return_type="list")
    assert trace.info.tags["step"] == "1" and trace.info.tags["sample_index"] == "2"
    assert trace.data.spans[0].name == "agent_run" and len(trace.data.spans) == 4


@pytest.mark.parametrize(
    ("given", "expected"), [("false", False), ("False", False), ("0", False), ("true", True), (0, False), (1, True)]
)
def test_token2text_given_as_text_reads_as_its_word(tmp_path: Path, given: Any, expected: bool) -> None:
    """A config layer that hands verl's flag over as text: "false" is false, not a non-empty string."""
    tracer.init(output_dir=str(tmp_path / "traces"))
    RolloutTraceConfig.init(project_name="p", experiment_name="e", backend="arrow", token2text=given)
    assert RolloutTraceConfig.enable_token2text() is expected
    assert tracer.get_config().token2text is expected

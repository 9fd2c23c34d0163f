"""One redactor over every exporter's payload and the importer's output: planted secrets reach no destination.

The run is recorded with ``redact=False`` (its files hold the secrets, checked
first); each backend's destination is then read back as bytes or records.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer.exporters import export_files
from tracer.exporters.base import redact_rows
from tracer.record.redact import Redactor

#: One secret of each credential shape the redactor knows, as a provider would issue them.
SECRETS = (
    "sk-proj-Q9x2Lm4Rt7Vb1Nc8Kd3Fg6Hj0Zp5Ws",
    "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "AKIAQ7Z2X9V4B6N8M1L3",
    "hf_Zx8Cv7Bn6Mq5Wr4Et3Ty2Ui1Op0",
)
BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ"


@tracer.rollout_trace_op(kind="tool", name="http_get")
def _http_get(url: str, headers: dict[str, str]) -> str:
    return f"fetched with key {SECRETS[1]}"


@tracer.rollout_trace_op(kind="tool", name="fails")
def _fails(key: str) -> str:
    raise PermissionError(f"key {key} refused")


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _loop(question: str) -> dict[str, Any]:
    _http_get("https://api.example.com", {"Authorization": BEARER, "X-Key": SECRETS[2]})
    try:
        _fails(SECRETS[3])
    except PermissionError:
        pass
    return {"answer": "done", "messages": [{"role": "user", "content": question}]}


def _planted(blob: str) -> list[str]:
    return [s for s in (*SECRETS, BEARER.split()[1]) if s in blob]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One step of 2 trajectories holding every planted secret in inputs, outputs and errors, recorded unredacted."""
    cfg = tracer.init(
        project_name="secrets", experiment_name="e", output_dir=str(tmp_path_factory.mktemp("s")), redact=False
    )
    for n in range(2):
        with tracer.rollout_trace_attr(step=1, sample_index=0, rollout_n=n):
            _loop(f"use {SECRETS[0]} please")
        tracer.log_reward(float(n), step=1, sample_index=0, rollout_n=n)
    tracer.shutdown()
    rows = json.dumps(tracer.read_spans(cfg.run_dir).to_pylist(), default=str)
    assert len(_planted(rows)) == 5, "the files must hold every planted secret for the test to mean anything"
    return cfg.run_dir


def _files_text(root: str) -> str:
    out = []
    for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out.append(f.read().decode("utf-8", "replace"))
    return "\n".join(out)


def test_otlp_payload_holds_no_planted_secret(run: str) -> None:
    """Every request body the receiver got (content included) is free of the secrets."""
    pytest.importorskip("opentelemetry.proto")
    from fault_server_fixtures import OtlpReceiver

    receiver = OtlpReceiver()
    try:
        report = export_files(run, "otlp", endpoint=receiver.url, content=True, progress=False)
    finally:
        receiver.close()
    assert report.trajectories_sent == 2 and receiver.spans
    assert _planted(json.dumps(list(receiver.spans.values()), default=str)) == []


def test_mlflow_traces_hold_no_planted_secret(run: str, tmp_path: Path) -> None:
    """The MLflow traces (spans, inputs, outputs, tags) read back hold none of the secrets."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export_files(run, "mlflow", tracking_uri=uri, progress=False)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("secrets")
    traces = client.search_traces(locations=[exp.experiment_id], include_spans=True)
    assert len(traces) == 2
    assert _planted("\n".join(t.to_json() for t in traces)) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["wandb", "swanlab"])
def test_table_backends_files_hold_no_planted_secret(
    run: str, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wandb (offline) and SwanLab (offline): no file of the run holds a secret."""
    pytest.importorskip(backend)
    if backend == "wandb":
        from export_fixtures import wandb_env

        wandb_env(monkeypatch, tmp_path)
        export_files(run, "wandb", run_dir=str(tmp_path), progress=False)
    else:
        export_files(run, "swanlab", mode="offline", log_dir=str(tmp_path / "swanlog"), progress=False)
    assert _planted(_files_text(str(tmp_path))) == []


#: Text around a planted secret: JSON punctuation, prose, nothing that continues the secret itself.
_around = st.text(alphabet=' {}[]":,=\n\tabc', max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    secret=st.sampled_from((*SECRETS, BEARER)),
    before=_around,
    after=_around,
    column=st.sampled_from(["inputs", "outputs", "attributes", "error", "name", "token_texts"]),
)
def test_redact_rows_leaves_no_planted_secret_in_any_text_column(
    secret: str, before: str, after: str, column: str
) -> None:
    """The payload every sink gets (redact_rows): a secret planted in any text column or per-token text is gone."""
    text = before + secret + after
    value: Any = [text[: len(text) // 2], text[len(text) // 2 :]] if column == "token_texts" else text
    row = {"trace_id": "0" * 32, "span_id": "1" * 16, column: value, "reward": 1.0}
    clean = redact_rows(Redactor(), [row])[0]
    assert clean["trace_id"] == row["trace_id"] and clean["reward"] == 1.0
    texts = clean[column] if column == "token_texts" else [clean[column]]
    assert _planted("".join(texts)) == []

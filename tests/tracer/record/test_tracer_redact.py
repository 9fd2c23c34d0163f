"""Secrets never reach the files: by key name, by shape, by environment value, by configured pattern."""

from __future__ import annotations

import json

import pytest

import tracer


def record(trace_dir: str, **config: object) -> dict:
    tracer.init(output_dir=trace_dir, **config)

    @tracer.rollout_trace_op(kind="tool")
    def call_api(headers: dict, prompt: str, api_key: str) -> dict:
        raise PermissionError(f"rejected key {api_key}")

    with pytest.raises(PermissionError):
        call_api(
            {"Authorization": "Bearer abcdefghijklmnop1234", "X-Trace": "visible"},
            "my key is sk-proj-AAAABBBBCCCCDDDDEEEE and hf_ABCDEFGHIJKLMNOPQRSTUVWX, wandb e0f1e2d3c4b5a697",
            api_key="sk-AAAABBBBCCCCDDDDEEEEFFFF",
        )
    tracer.flush()
    return tracer.read_spans(trace_dir).to_pylist()[0]


def test_secrets_are_redacted_from_inputs_errors_and_config(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Secret-named keys, key-shaped strings, secret env values and configured patterns are replaced."""
    monkeypatch.setenv("WANDB_API_KEY", "e0f1e2d3c4b5a697")
    row = record(trace_dir, redact_patterns=("visible",), backend_options={"wandb": {"api_key": "zzz-secret-zzz"}})
    everything = json.dumps(row) + json.dumps(tracer.read_file_metadata(tracer.list_trace_files(trace_dir)[0]))
    for secret in (
        "abcdefghijklmnop1234",
        "sk-proj-AAAA",
        "hf_ABCDEFG",
        "e0f1e2d3c4b5a697",
        "sk-AAAABBBB",
        "zzz-secret-zzz",
    ):
        assert secret not in everything, secret
    assert "visible" not in json.dumps(row)  # the configured pattern (the config itself lists it)
    inputs = json.loads(row["inputs"])
    assert inputs["headers"]["Authorization"] == "<redacted>" and inputs["api_key"] == "<redacted>"
    assert inputs["prompt"].startswith("my key is <redacted> and <redacted>, wandb <redacted>")
    assert "rejected key <redacted>" in json.loads(row["error"])["message"]


def test_redaction_can_be_turned_off(trace_dir: str) -> None:
    """redact=False records values as given (for private runs that need them)."""
    row = record(trace_dir, redact=False)
    assert json.loads(row["inputs"])["api_key"] == "sk-AAAABBBBCCCCDDDDEEEEFFFF"


def test_bad_redact_pattern_is_a_config_error() -> None:
    """An invalid regular expression in redact_patterns names itself."""
    with pytest.raises(tracer.TraceConfigError, match="redact_patterns"):
        tracer.TraceConfig(redact_patterns=("[unclosed",))


def test_secrets_in_decoded_token_text_are_redacted(trace_dir: str) -> None:
    """A key the model wrote (found only after token2text decodes it) is redacted too."""
    from tracer_fixtures import hf_tokenizer

    tok = hf_tokenizer()
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok)

    @tracer.rollout_trace_op(kind="llm")
    def generate(prompt_ids: list[int]) -> dict:
        return {"response_ids": tok.encode("here: hf_ABCDEFGHIJKLMNOPQRSTUVWX done")}

    generate(tok.encode("key sk-AAAABBBBCCCCDDDDEEEE1234"))
    tracer.flush()
    row = tracer.read_spans(trace_dir).to_pylist()[0]
    assert json.loads(row["inputs"])["prompt_text"] == "key <redacted>"
    assert json.loads(row["outputs"])["response_text"] == "here: <redacted> done"


def test_secrets_in_unknown_objects_reprs_are_redacted(trace_dir: str) -> None:
    """An object recorded by its repr is scanned as a whole."""

    class Client:
        def __repr__(self) -> str:
            return "Client(key='sk-proj-ZZZZYYYYXXXXWWWWVVVV')"

    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op
    def call(client: object) -> int:
        return 1

    call(Client())
    tracer.flush()
    assert "ZZZZYYYY" not in tracer.read_spans(trace_dir)["inputs"][0].as_py()

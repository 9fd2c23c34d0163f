"""Configuration mistakes fail at tracer.init with a TraceConfigError that names the key, the value and the fix."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracer_fixtures import hf_tokenizer, tokenizer_dir

import tracer
from tracer import TraceConfig, TraceConfigError
from tracer.record.tokenizer import load_tokenizer

FIELDS = sorted(f.name for f in dataclasses.fields(TraceConfig))


class RaisingTokenizer:
    """A tokenizer object whose decode fails."""

    def batch_decode(self, batch: list[list[int]], **_: Any) -> list[str]:
        raise RuntimeError("vocabulary not loaded")


def test_missing_tokenizer_path_fails_at_init(trace_dir: str) -> None:
    """token2text with a tokenizer path that does not exist raises at init, naming the key, the path and the fix."""
    with pytest.raises(TraceConfigError) as exc:
        tracer.init(output_dir=trace_dir, token2text=True, tokenizer="/nonexistent")
    message = str(exc.value)
    assert message.startswith("tokenizer: '/nonexistent' does not exist")
    assert "tokenizer.json" in message and "token2text=False" in message
    assert tracer.get_config() is None
    assert not os.path.exists(trace_dir)


def test_unreadable_tokenizer_file_fails_at_init(trace_dir: str, tmp_path: Path) -> None:
    """A tokenizer.json that is not a tokenizer raises at init with the library's reason."""
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(TraceConfigError, match=r"^tokenizer: cannot load '.*tokenizer\.json' \("):
        tracer.init(output_dir=trace_dir, token2text=True, tokenizer=str(bad))


def test_tokenizer_object_without_decode_fails_when_configured() -> None:
    """An object with no decode method is refused when the config is built."""
    with pytest.raises(TraceConfigError, match=r"^tokenizer: a dict cannot decode token ids"):
        TraceConfig(token2text=True, tokenizer={"vocab": {}})


def test_tokenizer_object_whose_decode_raises_fails_at_init(trace_dir: str) -> None:
    """A tokenizer whose decode raises is refused at init with its error."""
    with pytest.raises(
        TraceConfigError, match=r"^tokenizer: a RaisingTokenizer cannot decode token ids \(RuntimeError"
    ):
        tracer.init(output_dir=trace_dir, token2text=True, tokenizer=RaisingTokenizer())


def test_bad_tokenizer_is_not_checked_when_token2text_is_off(trace_dir: str) -> None:
    """Without token2text the tokenizer is never used, so a stale path does not stop recording."""
    tracer.init(output_dir=trace_dir, tokenizer="/nonexistent")
    assert tracer.get_config() is not None


def test_output_dir_under_a_file_fails_at_init(tmp_path: Path) -> None:
    """An output_dir whose run directory cannot be created (a file is in the way) raises at init."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(TraceConfigError) as exc:
        tracer.init(output_dir=str(blocker / "traces"))
    message = str(exc.value)
    assert message.startswith(f"output_dir: {str(blocker / 'traces')!r} cannot hold the run directory")
    assert f"{str(blocker)!r} is a file" in message and "ROLLOUT_TRACE_DIR" in message


def test_output_dir_is_not_checked_when_tracing_is_off(tmp_path: Path) -> None:
    """backend=None records nothing, so an unusable output_dir is no error."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    tracer.init(output_dir=str(blocker / "traces"), backend=None)


def test_a_good_tokenizer_path_is_loaded_once(trace_dir: str) -> None:
    """init's check and the writer share one load: the same path gives the same tokenizer object."""
    path = tokenizer_dir()
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=path)
    assert load_tokenizer(path) is load_tokenizer(path)


def test_tokenizer_object_is_recorded_by_its_folder(trace_dir: str) -> None:
    """A tokenizer object loaded from a local folder is recorded by that folder, where the viewer finds it."""
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=hf_tokenizer())

    @tracer.rollout_trace_op(kind="llm")
    def generate(prompt_ids: list[int]) -> str:
        return "ok"

    with tracer.rollout_trace_attr(0, 1):
        generate([1, 2, 3])
    tracer.flush()
    run_dir = tracer.get_config().run_dir
    meta = tracer.read_file_metadata(tracer.list_trace_files(run_dir)[0])
    assert json.loads(meta[tracer.schema.META_CONFIG])["tokenizer"] == os.path.abspath(tokenizer_dir())


def test_misspelt_field_suggests_the_field() -> None:
    """An unknown keyword names the closest valid field."""
    with pytest.raises(TraceConfigError, match=r"unknown config field\(s\) max_token \(did you mean 'max_tokens'\?\)"):
        TraceConfig.resolve(max_token=5)


def test_misspelt_override_suggests_the_full_key() -> None:
    """A misspelt verl override is answered with the key as the user would type it."""
    with pytest.raises(TraceConfigError) as exc:
        TraceConfig.from_overrides(["actor_rollout_ref.rollout.trace.token2txt=True"])
    assert "(did you mean 'actor_rollout_ref.rollout.trace.token2text'?)" in str(exc.value)


def test_misspelt_key_in_env_config_suggests_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROLLOUT_TRACE_CONFIG with a typo names the closest field."""
    monkeypatch.setenv(tracer.ENV_CONFIG, json.dumps({"flush_intreval_s": 2}))
    with pytest.raises(TraceConfigError, match=r"did you mean 'flush_interval_s'\?"):
        TraceConfig.resolve()


def test_a_word_like_no_field_gets_no_suggestion() -> None:
    """A key unlike every field gets the list of fields, not a wild guess."""
    with pytest.raises(TraceConfigError) as exc:
        TraceConfig.resolve(zzzzqqq=1)
    assert "did you mean" not in str(exc.value)
    assert "valid fields are" in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(FIELDS), data=st.data())
def test_any_one_letter_slip_in_a_field_is_answered_with_that_field(field: str, data: st.DataObject) -> None:
    """Dropping, doubling or swapping one letter of any field name gets that field as the suggestion."""
    i = data.draw(st.integers(0, len(field) - 2))
    slip = data.draw(
        st.sampled_from(
            [
                field[:i] + field[i + 1 :],
                field[:i] + field[i] + field[i:],
                field[:i] + field[i + 1] + field[i] + field[i + 2 :],
            ]
        )
    )
    if slip == field:
        return
    with pytest.raises(TraceConfigError) as exc:
        TraceConfig.resolve(**{slip: None})
    assert f"did you mean '{field}'" in str(exc.value)

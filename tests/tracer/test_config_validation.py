"""Every configuration source is checked once, at init: finite numbers in range, real booleans, usable names.

A bad value from keywords, verl-style overrides, YAML or ``ROLLOUT_TRACE_CONFIG``
is refused with one line naming where it came from, the key, the value and
the fix; a value that is accepted records and reads back.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer.config import _BOOLS, _NUMBERS, ENV_CONFIG, MAX_NAME_BYTES, TraceConfig, TraceConfigError

NAMES = ("project_name", "experiment_name")
FIELDS = (*_NUMBERS, *_BOOLS, *NAMES)

#: What a hostile user or a broken environment puts in a field.
HOSTILE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(
        ["inf", "-inf", "nan", "Infinity", "1e309", "1e-9", "true", "FALSE", "yes", "off", "0", "1", "", " ", "1_000"]
    ),
    st.sampled_from(["a\x00b", "x" * 300, "é" * 200, "/Shared/rl-team", "..", ".", "a/../b", "line\nbreak"]),
)


def _assert_usable(config: TraceConfig, key: str) -> None:
    """What an accepted config holds is what every write can use."""
    value = getattr(config, key)
    if key in _NUMBERS:
        kind, low, high, optional = _NUMBERS[key]
        if value is None:
            assert optional, key
            return
        assert type(value) is kind, (key, value)
        assert math.isfinite(value) and low <= value <= high, (key, value)
    elif key in _BOOLS:
        assert type(value) is bool, (key, value)
    else:
        segment = config.project_dir if key == "project_name" else config.experiment_dir
        assert "/" not in segment and "\x00" not in segment and segment not in (".", ".."), segment
        assert 0 < len(segment.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES


def _check(build: Any, key: str, prefix: str) -> None:
    try:
        config = build()
    except TraceConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{prefix}{key}:"), message
        assert "\n" not in message.replace(repr("\n")[1:-1], ""), message
        assert "give" in message, message  # the fix
        return
    _assert_usable(config, key)


def _text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(FIELDS), value=HOSTILE)
def test_keywords_are_refused_with_one_line_or_usable(key: str, value: Any, tmp_path: Path) -> None:
    """Property: any value for any field as a keyword is refused naming the key, or usable."""
    _check(lambda: TraceConfig(output_dir=str(tmp_path), **{key: value}), key, "")


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(FIELDS), value=HOSTILE)
def test_overrides_are_refused_with_one_line_or_usable(key: str, value: Any) -> None:
    """Property: verl-style ``trace.<key>=<text>`` overrides are refused naming the override, or usable."""
    if "\n" in _text(value) or "\x00" in _text(value):
        return  # not a command-line word
    _check(lambda: TraceConfig.from_overrides([f"trace.{key}={_text(value)}"]), key, "trace.")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(FIELDS), value=HOSTILE)
def test_yaml_values_are_refused_with_one_line_or_usable(key: str, value: Any, tmp_path: Path) -> None:
    """Property: the same keys in a YAML file are refused naming the key, or usable."""
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump({"trace": {key: value}}), encoding="utf-8")
    _check(lambda: TraceConfig.from_yaml(path), key, "trace.")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(FIELDS), value=HOSTILE)
def test_environment_values_are_refused_with_one_line_or_usable(
    key: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a field in ROLLOUT_TRACE_CONFIG (NaN and Infinity included) is refused naming the variable."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({key: value}))
    _check(TraceConfig.resolve, key, f"{ENV_CONFIG}: ")


@pytest.mark.parametrize(
    "source",
    ["keyword", "override", "environment"],
)
def test_an_infinite_flush_interval_is_refused_at_init(
    source: str, trace_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flush_interval_s=inf`` (keyword, verl override, ``Infinity`` in the environment) fails init, not the writer."""
    with pytest.raises(TraceConfigError, match=r"flush_interval_s: .*inf.* give a number of seconds"):
        if source == "keyword":
            tracer.init(output_dir=trace_dir, flush_interval_s=float("inf"))
        elif source == "override":
            tracer.init(TraceConfig.from_overrides(["actor_rollout_ref.rollout.trace.flush_interval_s=inf"]))
        else:
            monkeypatch.setenv(ENV_CONFIG, '{"flush_interval_s": Infinity}')
            tracer.init(output_dir=trace_dir)
    assert tracer.get_config() is None


@pytest.mark.parametrize("name", ["run\x00one", "x" * 256, "é" * 128])
def test_a_name_no_directory_can_take_is_refused_at_init(name: str, trace_dir: str) -> None:
    """A project name with NUL or over 255 bytes fails init, before any span."""
    with pytest.raises(TraceConfigError, match="project_name: .* give a name"):
        tracer.init(output_dir=trace_dir, project_name=name)


@pytest.mark.parametrize(
    "text,expected", [("false", False), ("FALSE", False), ("0", False), ("true", True), ("1", True)]
)
def test_boolean_text_in_the_environment_reads_as_written(
    text: str, expected: bool, trace_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``"false"`` for a bool field in ROLLOUT_TRACE_CONFIG reads as false (it read as true)."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({"redact": text, "store_full_token": text}))
    config = tracer.init(output_dir=trace_dir)
    assert config.redact is expected and config.store_full_token is expected


@pytest.mark.parametrize("text", ["yes", "maybe", "", "2"])
def test_other_boolean_text_is_refused(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text other than true/false/1/0 for a bool field is refused, naming the variable and the key."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({"token2text": text}))
    with pytest.raises(TraceConfigError, match=f"{ENV_CONFIG}: token2text: .* give true or false"):
        TraceConfig.resolve()


def test_names_verl_accepts_record_under_a_safe_directory_and_keep_the_original(trace_dir: str) -> None:
    """MLflow experiment paths (``/Shared/rl-team``) record under one directory level; metadata keeps them."""
    config = TraceConfig.from_overrides(
        [
            "trainer.project_name=/Shared/rl-team",
            "trainer.experiment_name=grpo/run 1",
            f"actor_rollout_ref.rollout.trace.output_dir={trace_dir}",
        ]
    )
    tracer.init(config)

    @tracer.rollout_trace_op(kind="tool")
    def tool(x: int) -> int:
        return x

    tool(1)
    assert tracer.shutdown().ok
    files = tracer.list_trace_files(trace_dir)
    assert len(files) == 1
    assert os.path.relpath(os.path.dirname(files[0]), trace_dir).split(os.sep) == [
        "%2FShared%2Frl-team",
        "grpo%2Frun 1",
    ]
    meta = tracer.read_file_metadata(files[0])
    assert json.loads(meta["rollout_trace.config"])["project_name"] == "/Shared/rl-team"
    assert meta["rollout_trace.experiment_name"] == "grpo/run 1"
    assert len(tracer.read_spans(trace_dir)) == 1


def test_different_names_never_share_a_directory() -> None:
    """``a/b``, ``a%2Fb`` and ``a_b`` are three directories."""
    dirs = {TraceConfig(project_name=n).project_dir for n in ("a/b", "a%2Fb", "a_b", "a\\b")}
    assert len(dirs) == 4


def test_the_reference_names_every_field() -> None:
    """docs/config.md is where TraceConfig's fields are described: each one has a row of its table."""
    import dataclasses

    table = Path(__file__).parents[2].joinpath("docs", "config.md").read_text(encoding="utf-8").split("## ")[1]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = {n for row in rows for n in row.split("`")[1::2]} - {"max_samples"}  # the alias, named beside its field
    assert named == {f.name for f in dataclasses.fields(TraceConfig)}


@given(st.sampled_from(["_dir", "config", "options", "token", "out", "r"]))
@settings(max_examples=10, deadline=None)
def test_a_redact_pattern_that_matches_a_field_name_redacts_values_only(pattern: str) -> None:
    """Patterns redact the values written to file metadata; a field's name matching one changes nothing else."""
    cfg = TraceConfig(output_dir="/tmp/run_dir", redact_patterns=(pattern,), run_config={"a": 1})
    data = cfg.to_dict()
    assert set(data) == {f for f in TraceConfig.__dataclass_fields__}
    assert data["run_config"] == {"a": 1} and data["redact_patterns"] == ["<redacted>"]

"""Config for many workers: ROLLOUT_TRACE_CONFIG and upload_interval_s."""

from __future__ import annotations

import json

import pytest

import tracer

ENV_CONFIG = "ROLLOUT_TRACE_CONFIG"


def test_env_json_config_is_the_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROLLOUT_TRACE_CONFIG gives fields; ROLLOUT_TRACE_DIR and keyword arguments override it."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({"max_tokens": 64, "output_dir": "/a", "max_samples": 3}))
    monkeypatch.setenv(tracer.ENV_TRACE_DIR, "/b")
    cfg = tracer.TraceConfig.resolve(project_name="p")
    assert (cfg.max_tokens, cfg.output_dir, cfg.max_samples_per_step_per_worker, cfg.project_name) == (64, "/b", 3, "p")


def test_env_json_config_bad_json_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text that is not JSON fails with the variable's name and an example."""
    monkeypatch.setenv(ENV_CONFIG, "{max_tokens: 4}")
    with pytest.raises(tracer.TraceConfigError, match="ROLLOUT_TRACE_CONFIG: not valid JSON"):
        tracer.TraceConfig.resolve()


def test_env_json_config_unknown_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown field in ROLLOUT_TRACE_CONFIG is named with the valid fields."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({"max_tokenz": 4}))
    with pytest.raises(tracer.TraceConfigError, match="unknown config field.*max_tokenz.*valid fields"):
        tracer.TraceConfig.resolve()


def test_explicit_config_ignores_env_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TraceConfig passed in is not overridden by ROLLOUT_TRACE_CONFIG."""
    monkeypatch.setenv(ENV_CONFIG, json.dumps({"max_tokens": 64}))
    cfg = tracer.TraceConfig.resolve(tracer.TraceConfig(max_tokens=5))
    assert cfg.max_tokens == 5


def test_upload_interval_must_be_positive() -> None:
    """upload_interval_s <= 0 is refused with the field's name."""
    with pytest.raises(tracer.TraceConfigError, match="upload_interval_s"):
        tracer.TraceConfig(upload_interval_s=0)

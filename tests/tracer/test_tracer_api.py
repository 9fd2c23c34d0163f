"""The public face of tracer: pinned names, light import, config parsing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tracer
from tracer import TraceConfig, TraceConfigError


def test_public_names_are_pinned() -> None:
    """A change to tracer's public API is a visible decision."""
    assert sorted(tracer.__all__) == [
        "ENV_BACKEND",
        "ENV_CONFIG",
        "ENV_TRACE_DIR",
        "FlushResult",
        "TraceConfig",
        "TraceConfigError",
        "TraceFileWarning",
        "available_backends",
        "compare_runs",
        "dataset",
        "flush",
        "get_config",
        "init",
        "iter_batches",
        "list_trace_files",
        "log_reward",
        "log_token_stats",
        "parse_json",
        "propagate",
        "read_file_metadata",
        "read_rewards",
        "read_run_config",
        "read_spans",
        "read_token_stats",
        "read_trajectories",
        "rollout_trace_attr",
        "rollout_trace_op",
        "shutdown",
        "step_metrics",
        "to_dataset",
        "trajectory_messages",
    ]
    for name in tracer.__all__:
        assert hasattr(tracer, name), name


def test_schema_names_live_in_the_schema_module_only() -> None:
    """Column constants are imported from tracer.schema; the package does not repeat them."""
    from tracer.schema import KIND_LLM, SAMPLE_INDEX, SPAN_SCHEMA, TRACE_ID

    assert (KIND_LLM, TRACE_ID, SAMPLE_INDEX) == ("llm", "trace_id", "sample_index")
    assert SPAN_SCHEMA.names[0] == TRACE_ID
    assert not any(hasattr(tracer, n) for n in ("SPAN_SCHEMA", "SPAN_COLUMNS", "TRAJECTORY_SCHEMA", "ENV_STRICT"))


def test_import_tracer_loads_no_heavy_library() -> None:
    """`import tracer` imports none of the optional backends or ML libraries."""
    heavy = ["mlflow", "wandb", "swanlab", "torch", "transformers", "vllm", "streamlit", "ray", "tokenizers"]
    code = f"import sys, tracer, tracer.exporters; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_schema_record_and_columns_agree() -> None:
    """The field docs, the column list and the Arrow schema name the same columns."""
    assert tuple(f.name for f in tracer.schema.SPAN_SCHEMA) == tracer.schema.SPAN_COLUMNS
    assert len({f[0] for f in tracer.schema.SPAN_FIELDS}) == len(tracer.schema.SPAN_FIELDS)
    required = {
        "trace_id",
        "span_id",
        "parent_span_id",
        "name",
        "kind",
        "start_ns",
        "end_ns",
        "status",
        "error",
        "step",
        "sample_index",
        "rollout_n",
        "validate",
        "inputs",
        "outputs",
        "attributes",
    }
    assert required <= set(tracer.schema.SPAN_COLUMNS)
    assert all(f[3] for f in tracer.schema.SPAN_FIELDS)


def test_default_output_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """ROLLOUT_TRACE_DIR sets the default output_dir; keyword arguments win over it."""
    monkeypatch.setenv("ROLLOUT_TRACE_DIR", "/data/traces")
    assert TraceConfig.resolve().output_dir == "/data/traces"
    assert TraceConfig.resolve(output_dir="/elsewhere").output_dir == "/elsewhere"
    monkeypatch.delenv("ROLLOUT_TRACE_DIR")
    assert TraceConfig.resolve().output_dir == "./rollout_traces"


def test_verl_overrides_parse_to_field_types() -> None:
    """verl's dotted keys, short keys and trainer names become typed fields."""
    cfg = TraceConfig.from_overrides(
        [
            "actor_rollout_ref.rollout.trace.backend=arrow",
            "actor_rollout_ref.rollout.trace.token2text=True",
            "rollout.trace.max_tokens=256",
            "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=null",
            "trace.flush_interval_s=0.5",
            "trainer.project_name=gsm8k",
            "trainer.experiment_name=grpo_1",
            "trainer.log_val_generations=4",
            "data.train_batch_size=1024",  # the rest of a verl command line is ignored
        ]
    )
    assert cfg.backend == "arrow" and cfg.token2text is True and cfg.max_tokens == 256
    assert cfg.max_samples_per_step_per_worker is None and cfg.flush_interval_s == 0.5
    assert (cfg.project_name, cfg.experiment_name, cfg.log_val_generations) == ("gsm8k", "grpo_1", 4)


def test_trace_keys_win_over_trainer_names_and_alias_works() -> None:
    """rollout.trace.project_name beats trainer.project_name; max_samples is an alias."""
    cfg = TraceConfig.from_overrides(
        ["trainer.project_name=a", "rollout.trace.project_name=b", "rollout.trace.max_samples=4"]
    )
    assert cfg.project_name == "b" and cfg.max_samples_per_step_per_worker == 4 and cfg.max_samples == 4


def test_backend_list_and_none() -> None:
    """backend takes a list, and null/None turns tracing off."""
    assert TraceConfig.from_overrides(["rollout.trace.backend=[arrow]"]).backends == ("arrow",)
    off = TraceConfig.from_overrides(["rollout.trace.backend=null"])
    assert off.backend is None and not off.enabled


def test_misspelt_backend_lists_valid_backends() -> None:
    """A bad backend names the key, the value and the valid choices."""
    with pytest.raises(TraceConfigError) as err:
        TraceConfig.from_overrides(["actor_rollout_ref.rollout.trace.backend=mlfow"])
    msg = str(err.value)
    assert "actor_rollout_ref.rollout.trace.backend" in msg and "'mlfow'" in msg and "arrow" in msg


def test_unknown_key_lists_valid_keys() -> None:
    """A misspelt trace key names itself and the valid keys."""
    with pytest.raises(TraceConfigError) as err:
        TraceConfig.from_overrides(["rollout.trace.token_to_text=True"])
    assert "token_to_text" in str(err.value) and "rollout.trace.token2text" in str(err.value)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("rollout.trace.max_tokens=lots", "an integer"),
        ("rollout.trace.token2text=maybe", "true or false"),
        ("rollout.trace.max_tokens=-3", "positive integer"),
        ("rollout.trace.on_buffer_full=wait", "block, drop"),
        ("rollout.trace.backend", "no '='"),
    ],
)
def test_bad_values_name_key_value_and_allowed(override: str, fragment: str) -> None:
    """Each bad value raises TraceConfigError saying what is allowed."""
    with pytest.raises(TraceConfigError) as err:
        TraceConfig.from_overrides([override])
    assert fragment in str(err.value)
    assert override.split("=")[0] in str(err.value) or "no '='" in str(err.value)


def test_yaml_nested_and_dotted(tmp_path: os.PathLike[str]) -> None:
    """from_yaml reads the same keys nested as in verl's config, or dotted."""
    path = os.path.join(tmp_path, "c.yaml")
    with open(path, "w") as f:
        f.write(
            "trainer:\n  project_name: p\n  experiment_name: e\n"
            "actor_rollout_ref:\n  rollout:\n    trace:\n      backend: arrow\n      token2text: true\n"
            "      max_samples_per_step_per_worker: 2\n"
            "rollout.trace.seed: 7\n"
        )
    cfg = TraceConfig.from_yaml(path)
    assert (cfg.project_name, cfg.experiment_name, cfg.backend, cfg.token2text, cfg.max_samples, cfg.seed) == (
        "p",
        "e",
        "arrow",
        True,
        2,
        7,
    )


def test_yaml_errors_are_clear(tmp_path: os.PathLike[str]) -> None:
    """A missing file, bad YAML or bad value each name the problem."""
    with pytest.raises(TraceConfigError, match="does not exist"):
        TraceConfig.from_yaml(os.path.join(tmp_path, "nope.yaml"))
    bad = os.path.join(tmp_path, "bad.yaml")
    with open(bad, "w") as f:
        f.write("rollout.trace.max_tokens: [1, 2\n")
    with pytest.raises(TraceConfigError, match="not valid YAML"):
        TraceConfig.from_yaml(bad)
    with open(bad, "w") as f:
        f.write("rollout:\n  trace:\n    backend: weave\n")
    with pytest.raises(TraceConfigError, match="rollout.trace.backend"):
        TraceConfig.from_yaml(bad)


def test_init_twice_replaces_the_configuration(trace_dir: str) -> None:
    """A second init() flushes the first recorder and records under the new config."""

    @tracer.rollout_trace_op
    def f(x: int) -> int:
        return x

    first = tracer.init(output_dir=trace_dir, experiment_name="one")
    f(1)
    second = tracer.init(output_dir=trace_dir, experiment_name="two")
    f(2)
    tracer.flush()
    assert tracer.get_config() is second and first is not second
    one = tracer.read_spans(os.path.join(trace_dir, "rollout_trace", "one"))
    two = tracer.read_spans(os.path.join(trace_dir, "rollout_trace", "two"))
    assert one["inputs"].to_pylist() == ['{"x":1}'] and two["inputs"].to_pylist() == ['{"x":2}']


def test_unknown_init_field_is_named() -> None:
    """init() with a field that does not exist says which and lists the valid ones."""
    with pytest.raises(TraceConfigError, match="tokenizr.*valid fields"):
        tracer.init(tokenizr="x")


def test_format_doc_lists_every_column() -> None:
    """docs/format.md lists every span and trajectory column."""
    with open(
        os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")), "docs", "format.md")
    ) as f:
        readme = f.read()
    for name in (*tracer.schema.SPAN_COLUMNS, *tracer.schema.TRAJECTORY_COLUMNS):
        assert f"| `{name}` |" in readme, name

"""Comparing runs and steps prompt by prompt, the recorded training config, and ``rollout-trace diff``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from compare_fixtures import CONFIG_A, CONFIG_B, record_compare_run
from hypothesis import given
from hypothesis import strategies as st

import tracer
from tracer.compare import MISSING, flatten_config

#: The rollout-trace command, run by this interpreter.
CLI = [sys.executable, "-c", "import sys; from tracer.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Run A passes sample 1 only; run B passes sample 2 only (step 2 of B also passes sample 0)."""
    root = os.fspath(tmp_path_factory.mktemp("runs"))
    a = record_compare_run(root, "a", CONFIG_A, lambda s, p, n: 1.0 if p == 1 else 0.0)
    b = record_compare_run(root, "b", CONFIG_B, lambda s, p, n: 1.0 if p == 2 or (s == 2 and p == 0) else 0.0)
    tracer.shutdown()
    return a, b


def test_compare_runs_gives_one_row_per_prompt_with_the_delta(runs: tuple[str, str]) -> None:
    """Each prompt gets rollouts, reward mean and pass rate of A and B, and delta = reward_b - reward_a."""
    a, b = runs
    rows = {r["sample_index"]: r for r in tracer.compare_runs(a, b).to_pylist()}
    assert set(rows) == {"0", "1", "2"}
    assert rows["1"]["reward_a"] == 1.0 and rows["1"]["reward_b"] == 0.0 and rows["1"]["delta"] == -1.0
    assert rows["0"]["delta"] == pytest.approx(0.5)  # B passes sample 0 at step 2 only
    assert rows["2"]["pass_rate_b"] == 1.0 and rows["2"]["pass_rate_a"] == 0.0
    assert rows["1"]["rollouts_a"] == rows["1"]["rollouts_b"] == 4
    assert "What is 1 + 0?" in rows["1"]["prompt"]


def test_compare_runs_sorts_the_biggest_regression_first(runs: tuple[str, str]) -> None:
    """Rows come by delta ascending: the prompt B lost comes first."""
    a, b = runs
    deltas = tracer.compare_runs(a, b).column("delta").to_pylist()
    assert deltas == sorted(deltas)
    assert tracer.compare_runs(a, b).column("sample_index")[0].as_py() == "1"


def test_two_steps_of_one_run_compare_the_same_way(runs: tuple[str, str]) -> None:
    """steps_a/steps_b pick the steps: run B's step 1 against its step 2 shows sample 0 improving."""
    _, b = runs
    rows = {r["sample_index"]: r for r in tracer.compare_runs(b, b, steps_a=1, steps_b=[2]).to_pylist()}
    assert rows["0"]["reward_a"] == 0.0 and rows["0"]["reward_b"] == 1.0
    assert rows["2"]["delta"] == 0.0
    assert rows["0"]["rollouts_a"] == 2


def test_the_run_config_is_kept_in_the_files_with_secrets_redacted(runs: tuple[str, str]) -> None:
    """tracer.init(run_config=...) is read back by read_run_config; an api_key is redacted."""
    a, _ = runs
    config = tracer.read_run_config(a)
    assert config["actor"] == {"lr": 1e-6, "clip": 0.2}
    assert config["api_key"] != CONFIG_A["api_key"]


def test_diff_configs_names_the_settings_that_differ(runs: tuple[str, str]) -> None:
    """The two runs' configs differ in actor.lr, the key only A has and the key only B has."""
    a, b = runs
    diff = {k: (x, y) for k, x, y in tracer.compare.diff_configs(tracer.read_run_config(a), tracer.read_run_config(b))}
    assert diff["actor.lr"] == (1e-6, 3e-6)
    assert diff["seed"] == (MISSING, 7)
    assert "actor.clip" not in diff and "data.train_batch_size" not in diff


configs = st.recursive(
    st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.booleans(), st.none()),
    lambda children: st.dictionaries(st.text("abc", min_size=1, max_size=3), children, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text("abc", min_size=1, max_size=3), configs, max_size=4), st.data())
def test_diff_configs_reports_exactly_the_changed_keys(a: dict, data: st.DataObject) -> None:
    """For any nested config and any change to it, the diff lists exactly the dotted keys whose values changed."""
    b = data.draw(st.dictionaries(st.text("abc", min_size=1, max_size=3), configs, max_size=4))
    fa, fb = flatten_config(a), flatten_config(b)
    reported = {k for k, _, _ in tracer.compare.diff_configs(a, b)}
    expected = {
        k for k in set(fa) | set(fb) if k not in fa or k not in fb or fa[k] != fb[k] or type(fa[k]) is not type(fb[k])
    }
    assert reported == expected
    assert tracer.compare.diff_configs(a, a) == []


def test_run_config_must_be_a_mapping() -> None:
    """A run_config that is not a dict fails at init with a message naming the field and the fix."""
    with pytest.raises(tracer.TraceConfigError, match="run_config.*to_container"):
        tracer.TraceConfig(run_config=["lr", 1e-6])  # type: ignore[arg-type]


def test_diff_cli_prints_the_same_numbers_as_compare_runs(runs: tuple[str, str]) -> None:
    """`rollout-trace diff A B --all-steps --json` carries compare_runs' rows and the config differences."""
    a, b = runs
    out = subprocess.run([*CLI, "diff", a, b, "--all-steps", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    expected = tracer.compare_runs(a, b).to_pylist()
    assert [r["sample_index"] for r in data["prompts"]] == [r["sample_index"] for r in expected]
    assert [r["delta"] for r in data["prompts"]] == [r["delta"] for r in expected]
    assert {"key": "actor.lr", "a": 1e-6, "b": 3e-6} in data["config"]
    text = subprocess.run([*CLI, "diff", a, b, "--all-steps"], capture_output=True, text=True, check=True)
    assert "actor.lr: 1e-06 -> 3e-06" in text.stdout
    assert text.stdout.index("\n         1 ") < text.stdout.index("\n         2 ")  # regression first


def test_diff_cli_compares_the_last_step_both_runs_have(runs: tuple[str, str]) -> None:
    """By default `diff` compares one step of each run, says which, and names each prompt's step on both sides."""
    a, b = runs
    last = max(set(tracer.read.read_steps(a)[0]) & set(tracer.read.read_steps(b)[0]))
    out = subprocess.run([*CLI, "diff", a, b, "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["steps_a"] == data["steps_b"] == [last]
    assert "last step both have" in data["steps"]
    expected = tracer.compare_runs(a, b, steps_a=[last], steps_b=[last]).to_pylist()
    assert [r["delta"] for r in data["prompts"]] == [r["delta"] for r in expected]
    assert all(r["steps_a"] == r["steps_b"] == str(last) for r in data["prompts"])
    assert {r["sample_index"]: r["question"] for r in data["prompts"]}["1"] == "What is 1 + 0?"


def test_diff_cli_names_a_missing_run(tmp_path: os.PathLike[str], runs: tuple[str, str]) -> None:
    """A run path that does not exist fails with exit code 2 and says so."""
    out = subprocess.run(
        [*CLI, "diff", runs[0], os.path.join(tmp_path, "nope")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "nope" in out.stderr

"""rollout/data/sample_problems.jsonl (the sample run's problems) is consistent like the default set."""

from __future__ import annotations

from importlib import resources

from rollout.runner import load_problems
from rollout.tools import evaluate_expression, format_number


def test_sample_problems_are_consistent() -> None:
    """It ships in the package; every expression evaluates (with the calculator) to its answer; ids are unique."""
    path = resources.files("rollout").joinpath("data", "sample_problems.jsonl")
    problems = load_problems(str(path))
    assert len(problems) >= 6  # 3 steps x 2 problems without repeats
    assert len({p["id"] for p in problems}) == len(problems)
    for p in problems:
        assert format_number(evaluate_expression(p["expression"])) == p["answer"], p["id"]

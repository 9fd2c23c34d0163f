"""The GSM8K-style reward and the GRPO group advantage."""

from __future__ import annotations

import pytest

from rollout.reward import compute_score, extract_answer, group_advantages


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("So the total is \\boxed{1,200}.", "1200"),
        ("Work...\n#### 42", "42"),
        ("The answer is $3.50.", "3.5"),
        ("The answer is: **17**", "17"),
        ("first \\boxed{3} then \\boxed{4}", "4"),
        ("\\boxed{-7}", "-7"),
        ("\\boxed{12.0}", "12"),
    ],
)
def test_extract_answer_finds_the_committed_answer(text: str, answer: str) -> None:
    """Boxed, #### and 'the answer is' forms are recognised and normalised."""
    assert extract_answer(text) == answer


@pytest.mark.parametrize("text", [None, "", "I think it is 12 or 13", "\\boxed{twelve}", "\\boxed{"])
def test_no_committed_answer_gives_none(text: str | None) -> None:
    """A bare number, a word or an unclosed box is not an answer."""
    assert extract_answer(text) is None


def test_score_is_exact_numeric_match() -> None:
    """1.0 for the same number however it is written, else 0.0."""
    assert compute_score("1200.00", "1200") == 1.0
    assert compute_score("1201", "1200") == 0.0
    assert compute_score(None, "1200") == 0.0


def test_advantage_is_reward_minus_group_mean() -> None:
    """Each advantage is its reward minus the group's mean; they sum to zero."""
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]
    assert group_advantages([]) == []


def test_shipped_problems_are_consistent() -> None:
    """Every shipped problem's expression evaluates (with the calculator) to its answer, and ids are unique."""
    from rollout.runner import load_problems
    from rollout.tools import evaluate_expression, format_number

    problems = load_problems()
    assert len(problems) >= 30
    assert len({p["id"] for p in problems}) == len(problems)
    for p in problems:
        assert format_number(evaluate_expression(p["expression"])) == p["answer"], p["id"]


def test_load_problems_names_the_bad_line(tmp_path: object) -> None:
    """A problems file with a line missing 'answer' fails with the file and line number."""
    from pathlib import Path

    from rollout.runner import load_problems

    path = Path(str(tmp_path)) / "p.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n{"question": "no answer"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2"):
        load_problems(path)

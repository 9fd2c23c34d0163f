"""Reward for GSM8K-style problems (exact match on the final answer) and GRPO advantages."""

from __future__ import annotations

import re
from collections.abc import Sequence

_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?"
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_ANSWER_IS = re.compile(r"answer\s*(?:is\s*:?|:|=)\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)


def _boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}``, with nested braces."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def normalize_number(text: str) -> str | None:
    """``"$1,200.00"`` -> ``"1200"``; None when ``text`` is not a number."""
    cleaned = text.strip().strip(".").replace(",", "").replace("$", "").replace(" ", "")
    cleaned = re.sub(r"\\text\{[^}]*\}|\\!|\\,", "", cleaned)
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", cleaned):
        return None
    if "." in cleaned:
        cleaned = cleaned.rstrip("0").rstrip(".")
    if cleaned in ("-0", ""):
        cleaned = "0"
    return cleaned


def extract_answer(text: str | None) -> str | None:
    """The final answer a response commits to, normalised, or None.

    Looks, in order, for the last ``\\boxed{N}``, then ``#### N`` (GSM8K's
    format), then "the answer is N". A bare last number does not count: the
    model has to commit to an answer.
    """
    if not text:
        return None
    boxed = _boxed(text)
    if boxed is not None:
        return normalize_number(boxed)
    for pattern in (_HASHES, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            return normalize_number(found[-1])
    return None


def compute_score(answer: str | None, ground_truth: str) -> float:
    """1.0 when the extracted ``answer`` equals ``ground_truth`` as a number, else 0.0."""
    if answer is None:
        return 0.0
    return 1.0 if normalize_number(answer) == normalize_number(ground_truth) else 0.0


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO's advantage without std scaling: each reward minus its group's mean."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]

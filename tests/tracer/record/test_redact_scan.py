"""The secret scan's fast trigger search decides exactly as a search for every trigger would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.redact import MAX_ANCHOR_HITS, TRIGGERS, TriggerScan

SCAN = TriggerScan(TRIGGERS)
#: Text made of pieces of triggers, their characters and filler: near-misses are common.
PIECES = st.one_of(
    st.sampled_from(TRIGGERS),
    st.sampled_from(TRIGGERS).map(lambda t: t[1:]),
    st.sampled_from(TRIGGERS).map(lambda t: t[:-1]),
    st.sampled_from(sorted(set("".join(TRIGGERS)))),
    st.text(max_size=5),
)

#: The non-alphanumeric characters of the triggers: the common anchors the scan splits its search at.
ANCHORS = st.sampled_from(sorted({c for t in TRIGGERS for c in t if not c.isalnum()}))


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(PIECES, max_size=30))
def test_found_agrees_with_searching_every_trigger(parts: list[str]) -> None:
    """Property: for any text, found() is any(trigger in text)."""
    text = "".join(parts)
    assert SCAN.found(text) == any(t in text for t in TRIGGERS)


@given(trigger=st.sampled_from(TRIGGERS), filler=st.sampled_from(["_", ":", "=", "-", "K"]))
def test_a_trigger_after_many_common_anchor_characters_is_found(trigger: str, filler: str) -> None:
    """A trigger past more than MAX_ANCHOR_HITS occurrences of its anchor character is still found."""
    text = (filler + " ") * (MAX_ANCHOR_HITS + 10) + trigger
    assert SCAN.found(text)


def test_secret_values_of_any_characters_are_found() -> None:
    """Values with no rankable character (digits, non-ASCII) and long ones are searched for whole."""
    values = ["12345678901234", "пароль-секрет", "x" * 100]
    scan = TriggerScan(values)
    for v in values:
        assert scan.found(f"a {v} b") and not scan.found(f"a {v[:-1]} b")


@settings(max_examples=300, deadline=None)
@given(anchor=ANCHORS, parts=st.lists(PIECES, max_size=30), lead=st.text(max_size=4))
def test_the_split_scan_of_a_common_anchor_agrees_with_searching_every_trigger(
    anchor: str, parts: list[str], lead: str
) -> None:
    """Property: past MAX_ANCHOR_HITS of one anchor character, found() is still any(trigger in text)."""
    text = lead + (anchor + " ") * (MAX_ANCHOR_HITS + 1) + "".join(parts)
    assert SCAN.found(text) == any(t in text for t in TRIGGERS)

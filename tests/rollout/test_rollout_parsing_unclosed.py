"""A last tool call without its closing tag: run when its JSON is complete, an error when it is cut."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rollout.parsing import parse_tool_calls

_names = st.sampled_from(["calculator", "python", "search"])
_args = st.dictionaries(
    st.text(alphabet="abcdexyz_", min_size=1, max_size=8),
    st.one_of(st.integers(), st.text(max_size=20), st.booleans()),
    max_size=3,
)
_endings = st.sampled_from(["", "\n", "<|im_end|>", "\n<|im_end|>", "<|im_end|><|endoftext|>", " \n<|endoftext|>\n"])


@given(name=_names, args=_args, ending=_endings, string_args=st.booleans())
def test_complete_unclosed_last_call_runs(name: str, args: dict[str, object], ending: str, string_args: bool) -> None:
    """Complete JSON after an unclosed ``<tool_call>``, then end-of-turn tokens, is one well-formed call."""
    body = json.dumps({"name": name, "arguments": json.dumps(args) if string_args else args})
    turn = parse_tool_calls(f"Let me compute.\n<tool_call>\n{body}{ending}")
    assert turn.errors == []
    assert [(c.name, c.arguments) for c in turn.calls] == [(name, args)]
    assert turn.content == "Let me compute."


@given(name=_names, args=_args, data=st.data())
def test_cut_unclosed_last_call_is_an_error(name: str, args: dict[str, object], data: st.DataObject) -> None:
    """Any proper prefix of the call's JSON (a generation cut at the token limit) is a "not closed" error."""
    body = json.dumps({"name": name, "arguments": args})
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    turn = parse_tool_calls(f"<tool_call>\n{body[:cut]}")
    assert turn.calls == []
    assert len(turn.errors) == 1 and "not closed" in turn.errors[0].reason


def test_closed_call_then_unclosed_complete_call() -> None:
    """A closed call followed by a complete unclosed one: both run, in order."""
    first = '{"name": "calculator", "arguments": {"expression": "2 + 2"}}'
    second = '{"name": "python", "arguments": {"code": "print(3)"}}'
    turn = parse_tool_calls(f"<tool_call>\n{first}\n</tool_call>\n<tool_call>\n{second}\n<|im_end|>")
    assert [c.name for c in turn.calls] == ["calculator", "python"] and turn.errors == []


def test_two_unclosed_calls_are_an_error() -> None:
    """Two opening tags and no closing one: the model's intent is unclear, so nothing runs."""
    call = '{"name": "calculator", "arguments": {"expression": "1"}}'
    turn = parse_tool_calls(f"<tool_call>\n{call}\n<tool_call>\n{call}")
    assert turn.calls == [] and "not closed" in turn.errors[0].reason

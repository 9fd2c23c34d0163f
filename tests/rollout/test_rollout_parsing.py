"""Tool-call parsing of well-formed, malformed and adversarial model output."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.parsing import MAX_CALL_CHARS, parse_tool_calls


def call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_well_formed_call_is_split_from_prose() -> None:
    """A Hermes-style call is parsed; the prose around it becomes the content."""
    turn = parse_tool_calls("Let me compute.\n" + call("calculator", expression="2 + 3"))
    assert turn.content == "Let me compute."
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", {"expression": "2 + 3"})]
    assert turn.errors == []


def test_several_calls_keep_their_order() -> None:
    """Two calls in one turn come back in the order written."""
    turn = parse_tool_calls(call("a", x=1) + "\n" + call("b", y=2))
    assert [c.name for c in turn.calls] == ["a", "b"]


def test_arguments_given_as_a_json_string_are_accepted() -> None:
    """Arguments encoded as a JSON string (a common model habit) are decoded."""
    body = json.dumps({"name": "python", "arguments": json.dumps({"code": "print(1)"})})
    turn = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert turn.calls[0].arguments == {"code": "print(1)"}


def test_plain_answer_has_no_calls() -> None:
    """Text without tags is an answer: no calls, no errors."""
    turn = parse_tool_calls("The answer is \\boxed{4}.")
    assert not turn.attempted_tools
    assert turn.content == "The answer is \\boxed{4}."


def test_broken_json_is_an_error_not_an_exception() -> None:
    """Invalid JSON inside the tags is reported as a malformed call."""
    turn = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}\n</tool_call>')
    assert turn.calls == []
    assert len(turn.errors) == 1 and "not valid JSON" in turn.errors[0].reason
    assert turn.attempted_tools


def test_unclosed_tag_is_an_error() -> None:
    """A <tool_call> without its closing tag (a cut generation) is a malformed call."""
    turn = parse_tool_calls('Working.\n<tool_call>\n{"name": "calculator", "argu')
    assert turn.calls == [] and "not closed" in turn.errors[0].reason
    assert turn.content == "Working."


def test_stray_closing_tag_is_an_error() -> None:
    """A </tool_call> with no opening tag is reported and removed from the content."""
    turn = parse_tool_calls("oops </tool_call> done")
    assert "without a matching" in turn.errors[0].reason
    assert "</tool_call>" not in turn.content


def test_wrong_shapes_are_errors() -> None:
    """A list, a missing name and non-object arguments are each malformed."""
    bodies = ["[1, 2]", '{"arguments": {}}', '{"name": "calculator", "arguments": [1]}', '{"name": 7}']
    for body in bodies:
        turn = parse_tool_calls(f"<tool_call>{body}</tool_call>")
        assert turn.calls == [] and len(turn.errors) == 1, body


def test_calls_beyond_the_limit_are_refused() -> None:
    """More calls than allowed in one turn: the extra ones become errors."""
    turn = parse_tool_calls("".join(call("calculator", expression=str(i)) for i in range(6)), max_calls=4)
    assert len(turn.calls) == 4
    assert len(turn.errors) == 2 and "too many" in turn.errors[0].reason


def test_huge_call_is_refused() -> None:
    """A runaway call body longer than the limit is an error, and its raw text is clipped."""
    turn = parse_tool_calls(call("python", code="x" * (MAX_CALL_CHARS + 10)))
    assert turn.calls == [] and "limit" in turn.errors[0].reason
    assert len(turn.errors[0].raw) < 300


def test_nested_tags_do_not_smuggle_a_call() -> None:
    """A call nested in another opening tag is malformed, not executed."""
    turn = parse_tool_calls(
        "<tool_call><tool_call>" + json.dumps({"name": "python", "arguments": {"code": "1"}}) + "</tool_call>"
    )
    assert turn.calls == []
    assert turn.errors


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", '"calculator"', "\n"]
        )
        | st.text(max_size=8),
        max_size=30,
    ).map("".join)
)
def test_parser_never_raises(text: str) -> None:
    """Any model output parses into calls and errors without raising."""
    turn = parse_tool_calls(text)
    assert isinstance(turn.content, str)
    for c in turn.calls:
        assert isinstance(c.name, str) and isinstance(c.arguments, dict)

"""Tool calls in rendered history show their arguments as a JSON object, never as a double-encoded string."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout.agent_loop import FEW_SHOT_EXAMPLE
from rollout.chat import ChatFormat
from rollout.parsing import parse_tool_calls
from rollout.tools import default_tools

_args = st.dictionaries(
    st.text(alphabet="abcxyz_", min_size=1, max_size=6),
    st.one_of(st.integers(), st.text(alphabet="0123456789 +-*/()", max_size=12)),
    min_size=1,
    max_size=3,
)


def _schemas() -> list[dict[str, Any]]:
    return [t.schema for t in default_tools()]


def test_few_shot_example_renders_arguments_as_an_object(qwen_tokenizer: Any) -> None:
    """The worked example (arguments given as OpenAI's JSON string) shows the model a call it can copy as is."""
    text = ChatFormat(qwen_tokenizer).render_prompt([*FEW_SHOT_EXAMPLE, {"role": "user", "content": "Q"}], _schemas())
    assert '"arguments": {"expression": "100 - 4 * 12"}' in text
    assert '\\"expression\\"' not in text


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_args, as_string=st.booleans())
def test_rendered_call_parses_back_to_its_arguments(qwen_tokenizer: Any, args: dict[str, Any], as_string: bool) -> None:
    """Whether history gives ``arguments`` as a string or an object, the rendered call parses back to the same object."""
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps(args) if as_string else args},
    }
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": "1"},
    ]
    text = ChatFormat(qwen_tokenizer).render_prompt(messages, _schemas())
    assistant = text[text.rindex("<tool_call>") :]
    turn = parse_tool_calls(assistant[: assistant.index("</tool_call>") + len("</tool_call>")])
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", args)]
    assert json.loads(turn.calls[0].raw)["arguments"] == args  # an object in the text, not a string

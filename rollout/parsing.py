"""Parsing tool calls out of model output (Qwen/Hermes ``<tool_call>{json}</tool_call>``).

Models write malformed calls all the time: broken JSON, a missing name,
arguments as a string, an unclosed tag (a last call that is complete JSON
without its closing tag still runs, as in vLLM's Hermes parser). Each problem becomes a
:class:`ToolCallError` that the agent loop records and shows the model as an
observation; nothing here raises on model output.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
#: A call's JSON longer than this is refused (a runaway generation, not a call).
MAX_CALL_CHARS = 8000
#: Calls beyond this many in one turn are refused.
MAX_CALLS_PER_TURN = 4

#: Special tokens (``<|im_end|>``, ``<|endoftext|>``) ending a decoded turn.
_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|[^|<>]{1,40}\|>)+\s*$")
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclasses.dataclass
class ToolCall:
    """A well-formed call: a tool name and a JSON object of arguments.

    Attributes:
        name: The function name the model asked for.
        arguments: Its arguments.
        raw: The text between the tags, as the model wrote it.
    """

    name: str
    arguments: dict[str, Any]
    raw: str


@dataclasses.dataclass
class ToolCallError:
    """A call the model tried to make but wrote wrong.

    Attributes:
        reason: What is wrong, phrased for the model to read and fix.
        raw: The offending text (cut to 200 characters).
    """

    reason: str
    raw: str


@dataclasses.dataclass
class ParsedTurn:
    """One model turn split into prose and tool calls.

    Attributes:
        content: The text outside the tool-call tags, stripped.
        calls: Well-formed calls, in order.
        errors: Malformed calls, in order.
    """

    content: str
    calls: list[ToolCall]
    errors: list[ToolCallError]

    @property
    def attempted_tools(self) -> bool:
        """True when the model tried to call any tool, well-formed or not."""
        return bool(self.calls or self.errors)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_one(body: str) -> ToolCall | ToolCallError:
    text = body.strip()
    if len(text) > MAX_CALL_CHARS:
        return ToolCallError(f"tool call is {len(text)} characters long; the limit is {MAX_CALL_CHARS}", _clip(text))
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return ToolCallError(
            f'tool call is not valid JSON ({exc}); write {{"name": "<tool>", "arguments": {{...}}}}', _clip(text)
        )
    if not isinstance(obj, dict):
        return ToolCallError(f"tool call must be a JSON object, not {type(obj).__name__}", _clip(text))
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError('tool call has no "name" string', _clip(text))
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        # Some models encode the arguments object as a JSON string.
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ToolCallError(f'"arguments" of {name!r} is a string that is not a JSON object', _clip(text))
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCallError(f'"arguments" of {name!r} must be a JSON object, not {type(args).__name__}', _clip(text))
    return ToolCall(name.strip(), args, text)


def parse_tool_calls(text: str, max_calls: int = MAX_CALLS_PER_TURN) -> ParsedTurn:
    """Split model output into prose, well-formed calls and malformed calls.

    Args:
        text: The decoded model turn (special tokens may be present).
        max_calls: Calls beyond this many become errors.

    Returns:
        The parsed turn; never raises on any input string.
    """
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    pieces: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        pieces.append(text[pos : match.start()])
        pos = match.end()
        result = _parse_one(match.group(1))
        if isinstance(result, ToolCallError):
            errors.append(result)
        elif len(calls) >= max_calls:
            errors.append(
                ToolCallError(f"too many tool calls in one turn; the limit is {max_calls}", _clip(result.raw))
            )
        else:
            calls.append(result)
    rest = text[pos:]
    if TOOL_CALL_OPEN in rest:
        before, _, after = rest.partition(TOOL_CALL_OPEN)
        pieces.append(before)
        # A last call that is complete JSON but lacks its closing tag (the model
        # ended its turn right after the object) is run, as vLLM's Hermes parser
        # does; a cut or broken one stays an error.
        last = _parse_one(_TRAILING_SPECIAL.sub("", after)) if TOOL_CALL_OPEN not in after else None
        if isinstance(last, ToolCall) and len(calls) < max_calls:
            calls.append(last)
        else:
            errors.append(ToolCallError(f"{TOOL_CALL_OPEN} is not closed with {TOOL_CALL_CLOSE}", _clip(after.strip())))
    else:
        pieces.append(rest)
    content = "".join(pieces)
    if TOOL_CALL_CLOSE in content:
        errors.append(ToolCallError(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}", ""))
        content = content.replace(TOOL_CALL_CLOSE, "")
    return ParsedTurn(content.strip(), calls, errors)

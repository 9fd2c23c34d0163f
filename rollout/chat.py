"""Rendering conversations to token ids with the tokenizer's chat template.

The agent loop keeps one growing token sequence per rollout, as an RL trainer
needs it: the prompt, then model turns and tool observations appended as
token ids (never re-tokenising what the model wrote). :class:`ChatFormat`
renders the first prompt (tools included) and each batch of tool
observations as the exact text the chat template would put there.

Templates without tool support (e.g. SmolLM2's) get the tools written into
the system prompt in the Hermes format and tool results as user turns
wrapped in ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
from typing import Any

TOOLS_SYSTEM_TEMPLATE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_7f3a", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with each tool call's ``arguments`` JSON string (OpenAI's form) parsed into an object.

    Chat templates write ``arguments | tojson``: given a string they would
    render it double-encoded (``"arguments": "{\\"expression\\": ...}"``),
    and a model shown that in a worked example copies it. A string that is not
    a JSON object is left as it is.
    """
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fn = {**fn, "arguments": parsed}
                call = {**call, "function": fn} if "function" in call else fn
        fixed.append(call)
    return {**message, "tool_calls": fixed}


class ChatFormat:
    """Turns chat messages into token ids for one tokenizer.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
    """

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat template; set tokenizer.chat_template "
                f"(rollout.tokenizer.CHATML_TOOLS_TEMPLATE is a ChatML template with tools)"
            )
        self.tokenizer = tokenizer
        self.template_has_tools = self._probe_tools()
        self.template_has_tool_role = self.template_has_tools
        probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        closed = self._render(probe, None, add_generation_prompt=False)
        # The text the template puts after the end-of-turn token (usually "\n").
        self.eos_text, self.turn_separator = self._end_of_turn(closed)
        self.stop_token_ids = self._stop_ids()

    # -- probing -------------------------------------------------------

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return str(self.tokenizer.apply_chat_template([_arguments_as_objects(m) for m in messages], **kwargs))

    def _probe_tools(self) -> bool:
        try:
            text = self._render([{"role": "user", "content": "U"}], [_PROBE_TOOL], add_generation_prompt=True)
        except Exception:
            return False
        return "probe_tool_7f3a" in text

    def _end_of_turn(self, closed: str) -> tuple[str, str]:
        eos = getattr(self.tokenizer, "eos_token", None)
        for candidate in ("<|im_end|>", eos, "<|eot_id|>", "</s>"):
            if candidate and candidate in closed:
                return candidate, closed[closed.rfind(candidate) + len(candidate) :]
        return eos or "", ""

    def _stop_ids(self) -> list[int]:
        ids: list[int] = []
        tok = self.tokenizer
        for text in (self.eos_text, getattr(tok, "eos_token", None)):
            if not text:
                continue
            tid = tok.convert_tokens_to_ids(text)
            if isinstance(tid, int) and tid >= 0 and tid != getattr(tok, "unk_token_id", None) and tid not in ids:
                ids.append(tid)
        return ids

    # -- rendering -----------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings become their ids)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The prompt text for ``messages`` with ``tools``, ending with the assistant header."""
        if tools and not self.template_has_tools:
            messages = self._tools_in_system(messages, tools)
            tools = None
        if not self.template_has_tool_role:
            messages = self._plain_messages(messages)
        return self._render(messages, tools, add_generation_prompt=True)

    def encode_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of :meth:`render_prompt`."""
        return self.encode_text(self.render_prompt(messages, tools))

    def render_observations(self, tool_messages: list[dict[str, Any]], response_ended: bool) -> str:
        """The text that follows a model turn: the tool results and the next assistant header.

        Args:
            tool_messages: ``{"role": "tool", "content": ...}`` messages.
            response_ended: The model turn ended with the end-of-turn token;
                if not (it was cut), the token is added here.
        """
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        msgs = tool_messages if self.template_has_tool_role else [self._as_user(tool_messages)]
        before = self._render(base, None, add_generation_prompt=False)
        after = self._render(base + msgs, None, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template renders earlier messages differently when tool results follow; cannot append tool results as tokens"
            )
        head = self.turn_separator if response_ended else self.eos_text + self.turn_separator
        return head + after[len(before) :]

    def encode_observations(self, tool_messages: list[dict[str, Any]], response_ended: bool) -> list[int]:
        """Token ids of :meth:`render_observations`."""
        return self.encode_text(self.render_observations(tool_messages, response_ended))

    @staticmethod
    def _as_user(tool_messages: list[dict[str, Any]]) -> dict[str, Any]:
        parts = [f"<tool_response>\n{m['content']}\n</tool_response>" for m in tool_messages]
        return {"role": "user", "content": "\n".join(parts)}

    @classmethod
    def _plain_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool calls and results as plain text, for templates that cannot render them."""
        out: list[dict[str, Any]] = []
        pending: list[dict[str, Any]] = []
        for m in messages:
            if m.get("role") == "tool":
                pending.append(m)
                continue
            if pending:
                out.append(cls._as_user(pending))
                pending = []
            if m.get("role") == "assistant" and m.get("tool_calls"):
                parts = [str(m.get("content") or "")]
                for call in m["tool_calls"]:
                    fn = call.get("function", call)
                    args = fn.get("arguments")
                    args_text = args if isinstance(args, str) else json.dumps(args)
                    parts.append(f'<tool_call>\n{{"name": "{fn.get("name")}", "arguments": {args_text}}}\n</tool_call>')
                out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
            else:
                out.append(m)
        if pending:
            out.append(cls._as_user(pending))
        return out

    @staticmethod
    def _tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        text = TOOLS_SYSTEM_TEMPLATE.format(tools="\n".join(json.dumps(t) for t in tools))
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": str(messages[0]["content"]) + text}, *messages[1:]]
        return [{"role": "system", "content": text.lstrip()}, *messages]

"""OpenAI-compatible completions endpoint (``--engine openai --base-url URL``).

Token in, token out: the prompt goes as a list of token ids (the completions
API accepts token arrays; vLLM, SGLang and ``python -m rollout.serve`` do),
and the response's token ids are read from, in order: the choice's
``token_ids`` (vLLM's ``return_token_ids``), ``logprobs.tokens`` spelled
``token_id:N`` (vLLM's ``return_tokens_as_token_ids``), or the text encoded
with the tokenizer (then logprobs are kept only when the counts agree).
Uses only the standard library's HTTP client, in a thread.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from rollout.engines import Generation, SamplingParams


class OpenAIEngine:
    """Completions API client behind the engine interface.

    Args:
        base_url: E.g. ``http://127.0.0.1:8000/v1`` (``/completions`` is appended).
        model: The model name the server expects.
        tokenizer: Encodes response text when the server returns no token
            ids, and names the end-of-turn token.
        api_key: Sent as a bearer token when given.
        timeout_s: Per-request timeout.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
    ):
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.eos_id: int | None = None
        if tokenizer is not None:
            for text in ("<|im_end|>", getattr(tokenizer, "eos_token", None)):
                tid = tokenizer.convert_tokens_to_ids(text) if text else None
                if isinstance(tid, int) and tid >= 0 and tid != getattr(tokenizer, "unk_token_id", None):
                    self.eos_id = tid
                    break

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body sent for one turn."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": max(sampling.temperature, 0.0),
            "top_p": sampling.top_p,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.logprobs:
            body["logprobs"] = 1
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise RuntimeError(f"{self.url} answered HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise ConnectionError(
                f"cannot reach {self.url}: {exc.reason}; is the server running and --base-url right?"
            ) from None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completions request."""
        data = await asyncio.to_thread(self._post, self.request_body(prompt_ids, sampling))
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.url} returned no choices: {str(data)[:300]}") from None
        return self.parse_choice(choice)

    def parse_choice(self, choice: dict[str, Any]) -> Generation:
        """Token ids, logprobs and finish reason of one returned choice."""
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
        ids = choice.get("token_ids")
        if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            tokens = lp.get("tokens") if isinstance(lp, dict) else None
            if (
                isinstance(tokens, list)
                and tokens
                and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
            ):
                ids = [int(t.split(":", 1)[1]) for t in tokens]
            elif self.tokenizer is not None:
                ids = list(self.tokenizer.encode(choice.get("text") or "", add_special_tokens=False))
            else:
                raise RuntimeError(f"{self.url} returned no token ids and no tokenizer was given to encode its text")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if finish == "stop" and self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids = [*ids, self.eos_id]  # the server dropped the stop token; the sequence has it
            if isinstance(logprobs, list):
                logprobs = [*logprobs, 0.0]
        if not isinstance(logprobs, list) or len(logprobs) != len(ids) or any(x is None for x in logprobs):
            logprobs = None
        return Generation(list(ids), [float(x) for x in logprobs] if logprobs is not None else None, finish)

    async def close(self) -> None:
        """Nothing held between requests."""

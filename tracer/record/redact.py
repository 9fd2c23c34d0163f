"""Secret redaction: API keys and tokens never reach the files or a backend.

Two rules, applied on the writer thread before anything is written:

- **By name.** A mapping key that names a secret (``api_key``, ``*_TOKEN``,
  ``*_SECRET``, ``password``, ``Authorization``, ...) has its value replaced
  by ``"<redacted>"``, in inputs, outputs, attributes and the recorded config.
- **By shape and by value.** Strings that look like a credential (``sk-...``
  OpenAI-style keys, ``hf_...`` Hugging Face tokens, GitHub and AWS keys,
  ``Bearer ...`` headers), the values of secret-named environment variables
  present when the recorder started (``WANDB_API_KEY``, ``HF_TOKEN``, ...),
  and any extra patterns the config names are replaced wherever they appear
  in the recorded JSON text, error messages and tracebacks included.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

REDACTED = "<redacted>"

#: Mapping keys whose values are secrets (matched case-insensitively, whole key).
SECRET_KEY_PATTERN = re.compile(
    r"(?i)^(.*[_-])?(api[_-]?key|apikey|token|access[_-]?token|secret|secret[_-]?key|password|passwd|"
    r"authorization|auth[_-]?token|private[_-]?key|credentials?)$"
)

#: Credential shapes found inside any string.
SECRET_VALUE_PATTERNS = (
    r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic-style keys
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face tokens
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"(?i:bearer)\s+[A-Za-z0-9._~+/\-]{12,}=*",  # Authorization: Bearer ...
)

#: Substrings every match of SECRET_VALUE_PATTERNS contains.
TRIGGERS = ("sk-", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "AKIA", "earer", "EARER")

#: Environment variable names whose values are secrets.
SECRET_ENV_PATTERN = re.compile(r"(?i)(api_?key|token|secret|password|passwd|credentials?)$")

#: Shortest environment value treated as a secret (shorter ones match too much).
MIN_SECRET_LEN = 8


def secret_env_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of secret-named environment variables, longest first."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if SECRET_ENV_PATTERN.search(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


class Redactor:
    """Replaces secrets in strings; built once per recorder.

    Args:
        extra_patterns: More regular expressions to redact (from the config).
        environ: Environment to take secret values from (default ``os.environ``).
    """

    def __init__(self, extra_patterns: Iterable[str] = (), environ: dict[str, str] | None = None) -> None:
        values = secret_env_values(environ)
        extra = list(extra_patterns)
        parts = [re.escape(v) for v in values]
        parts.extend(SECRET_VALUE_PATTERNS)
        parts.extend(extra)
        self._pattern = re.compile("|".join(f"(?:{p})" for p in parts))
        # A string holding none of these substrings cannot match the built-in
        # patterns or the secret values: skip the regex (C-speed scans instead
        # of a regex alternation tried at every position). Configured patterns
        # have no known prefix, so they always run the regex.
        self._triggers: tuple[str, ...] | None = None if extra else (*TRIGGERS, *values)

    def records_to_scan(self, strings: list[list[str]], opaque: set[int]) -> list[bool] | None:
        """Which records' JSON may hold a secret, from the strings that went into it.

        ``strings[i]`` are record i's string values and keys (everything in
        its JSON that is not a number); ``opaque`` are records with text the
        encoder could not list (reprs), always scanned. None: no record.
        One scan of all strings joined decides the common case (no secret
        anywhere); token id lists, the bulk of llm spans, are never scanned.
        """
        n = len(strings)
        triggers = self._triggers
        if triggers is None:
            return [True] * n
        if not opaque:
            blob = "\x00".join("\x00".join(s) for s in strings)
            if not any(t in blob for t in triggers):
                return None
        flags = []
        for i, record in enumerate(strings):
            joined = "\x00".join(record)
            flags.append(i in opaque or any(t in joined for t in triggers))
        return flags

    def texts(self, values: list[str | None]) -> list[str | None]:
        """Redact a column of values at once.

        One scan of the joined column decides whether any value can hold a
        secret; only then is each value searched (most batches hold none).
        """
        triggers = self._triggers
        if triggers is not None:
            blob = "\x00".join(v for v in values if v is not None)
            if not any(t in blob for t in triggers):
                return values
        return [None if v is None else self.text(v) for v in values]

    def text(self, value: str) -> str:
        """``value`` with every secret replaced by ``<redacted>``."""
        triggers = self._triggers
        if triggers is not None and not any(t in value for t in triggers):
            return value
        return self._pattern.sub(REDACTED, value)


def is_secret_key(key: str) -> bool:
    """True when a mapping key names a secret."""
    return bool(SECRET_KEY_PATTERN.match(key))

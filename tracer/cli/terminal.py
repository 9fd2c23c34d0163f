"""Text from trace files made safe to print on a terminal (:func:`terminal_text`, for every such string a subcommand
prints): a newline cannot forge an output line, an escape sequence cannot move the cursor, retitle or hide text."""

from __future__ import annotations

import re
from typing import Any

#: Characters shown escaped: C0 and C1 controls, DEL, line and paragraph separators, bidi controls.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_text(value: Any) -> str:
    """``value`` as text with every control, separator and bidi character shown as ``\\xNN``/``\\uNNNN``."""
    return _UNSAFE.sub(_escaped, value if isinstance(value, str) else str(value))

"""Showing what a trajectory wrote: inert, bounded, and one bad record breaks only its own element.

Every string that comes from a trace file (model and tool output, span
names, error messages, sample indices, paths) reaches the page through one
of these helpers:

- :func:`md` for anything Streamlit renders as Markdown (captions, error
  boxes, metric values, expander labels): every ASCII punctuation character
  is backslash-escaped and control characters are shown as ``\\xNN``, so no
  link, image, HTML tag, emoji shortcode or directive is made from it;
- :func:`text` and :func:`code` for bodies: at most :data:`MAX_ELEMENT_CHARS`
  characters are drawn, and a download button hands over the whole text;
- :func:`isolated` around each record's element: an exception there is shown
  in place of that element, and the rest of the page is drawn.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import streamlit as st

from viewer.data.trajectory import escape_markdown

#: Characters one text or code element draws; the rest is offered as a download.
MAX_ELEMENT_CHARS = 20_000
#: Characters of a label (caption line, expander title, chart label, metric value).
MAX_LABEL_CHARS = 300
_SURROGATE = re.compile("[\ud800-\udfff]")


def sendable(value: Any) -> str:
    """``value`` as a string the browser can be sent: a lone surrogate (not UTF-8) becomes U+FFFD."""
    s = value if isinstance(value, str) else str(value)
    return _SURROGATE.sub("\ufffd", s)


def clip(value: Any, limit: int = MAX_LABEL_CHARS) -> str:
    """``value`` as a sendable string of at most ``limit`` characters (an ellipsis marks a cut)."""
    s = sendable(value)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def md(value: Any, limit: int = MAX_LABEL_CHARS) -> str:
    """``value`` as Markdown that shows it literally, cut to ``limit`` characters."""
    return escape_markdown(clip(value, limit))


def _bounded(body: str, key: str, what: str) -> str:
    """The first :data:`MAX_ELEMENT_CHARS` characters of ``body``; when cut, a note and a download of the rest."""
    body = sendable(body)
    if len(body) <= MAX_ELEMENT_CHARS:
        return body
    st.caption(
        f"Showing the first {MAX_ELEMENT_CHARS:,} of {len(body):,} characters of this {what}; "
        "download it to read all of it."
    )
    digest = hashlib.sha1(body.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    st.download_button(
        f"Download the whole {what} ({len(body):,} characters)",
        body.encode("utf-8", "replace"),
        file_name=f"{what.replace(' ', '_')}.txt",
        mime="text/plain",
        key=f"dl_{key}_{digest}",
        on_click="ignore",
    )
    return body[:MAX_ELEMENT_CHARS]


def text(body: Any, key: str, what: str = "text") -> None:
    """``body`` as plain text, bounded (see module docstring)."""
    st.text(_bounded(body if isinstance(body, str) else str(body), key, what))


def code(body: Any, key: str, what: str = "text", language: str | None = None, wrap: bool = True) -> None:
    """``body`` as a code block, bounded (see module docstring)."""
    st.code(_bounded(body if isinstance(body, str) else str(body), key, what), language=language, wrap_lines=wrap)


@contextmanager
def isolated(what: str) -> Iterator[None]:
    """Draw one record's element; if it raises, show why in its place and carry on with the page."""
    try:
        yield
    except Exception as exc:  # one malformed record must not take the page down
        st.error(md(f"Could not show this {what}: {type(exc).__name__}: {exc}", 1000))
        with st.expander("details"):
            st.code(clip(traceback.format_exc(), MAX_ELEMENT_CHARS), language="python")

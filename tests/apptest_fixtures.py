"""The viewer's app run in-process through Streamlit's AppTest, and what its page shows: for the viewer's tests."""

from __future__ import annotations

import os
from typing import Any

from streamlit.testing.v1 import AppTest

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "viewer", "app.py")
#: Seconds one run of the app may take: generous, for a loaded 2-core machine.
TIMEOUT = 120


def new_app(**query: str) -> AppTest:
    """The app with these query parameters, not run yet."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = v
    return at


def run_app(at: AppTest) -> AppTest:
    """Run (or rerun) ``at``; the script must not raise."""
    at.run()
    assert not at.exception, at.exception[0].message if at.exception else ""
    return at


def open_app(path: str | None, **query: str) -> AppTest:
    """Run the app once on ``path`` (none: no ``?path=``) with these query parameters."""
    return run_app(new_app(**query) if path is None else new_app(path=path, **query))


def frame_with(at: AppTest, column: str) -> Any:
    """The first data frame (pandas) on the page that has ``column`` (display-only frames carry no key)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with column {column!r}")


def all_text(at: AppTest) -> str:
    """The page's text, code, markdown and captions, one element a line."""
    parts = (
        [e.value for e in at.text]
        + [e.value for e in at.code]
        + [e.value for e in at.markdown]
        + [e.value for e in at.caption]
    )
    return "\n".join(str(p) for p in parts)

"""Issue 12, item 10: whatever a trajectory holds is shown inert and bounded, and the server serves only its own.

- a hypothesis property records hostile strings (Markdown, HTML, autolinks,
  emoji and directive syntax, control characters, lone surrogates, huge
  unbroken runs) into every field of a trajectory (span and tool names,
  messages, a ``tool_calls`` that is a string, tool output, error message,
  sample index) and replays it through AppTest: no exception escapes, no
  Markdown element carries a fragment unescaped, no text element exceeds the
  per-element bound, and the rest of the page is drawn;
- ``?path=`` outside the directories the server was started with is refused;
- a real server answers 403 to plain requests and websocket upgrades whose
  Host or Origin names another host (DNS rebinding), and serves its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from server_fixtures import free_port, serving
from streamlit.testing.v1 import AppTest

import tracer
from viewer import data as D
from viewer import safe
from viewer.cli import streamlit_command
from viewer.hosts import ENV_ALLOW_HOSTS, ENV_BIND, HostGuard, host_name

APP = os.path.join(os.path.dirname(__file__), "..", "..", "viewer", "app.py")
TIMEOUT = 180

#: Fragments Markdown would turn into something (each holds ASCII punctuation, which escaping splits).
FRAGMENTS = [
    "![img](http://127.0.0.1:9/x.png)",
    "[link](javascript:alert(1))",
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "www.evil.example",
    "mail@evil.example",
    "http://evil.example/p",
    ":red[red]",
    ":material/home:",
    "**bold**",
    "$x^2$",
    "# heading",
    "`code`",
]
_PIECES = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.text(max_size=20),
    st.sampled_from(["\x1b[31m", "\x00", "\r", "\u202e", "\ud800", "\n\n---\n"]),
)
#: Pieces joined, a fragment among them by construction (a filter for one threw most draws away).
HOSTILE = st.tuples(st.lists(_PIECES, max_size=5), st.sampled_from(FRAGMENTS), st.integers(0, 5)).map(
    lambda t: "".join([*t[0][: t[2]], t[1], *t[0][t[2] :]])
)
#: A run of one character far longer than any element may draw.
HUGE = "A" * (safe.MAX_ELEMENT_CHARS * 3)


def _record(root: str, name: str, text: str, sample: str) -> str:
    tracer.init(output_dir=root, project_name="hostile", experiment_name="run")

    @tracer.rollout_trace_op(kind="tool", name=name)
    async def tool(arg: str) -> str:
        return text

    @tracer.rollout_trace_op(kind="tool", name=name + "-fails")
    async def failing(arg: str) -> str:
        raise ValueError(text)

    @tracer.rollout_trace_op(kind="rollout", name=name)
    async def agent(question: str) -> dict[str, Any]:
        out = await tool(text)
        try:
            await failing(text)
        except ValueError:
            pass
        return {
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": text, "tool_calls": text},  # a string, not a list
                {"role": "assistant", "content": HUGE, "tool_calls": [{"id": text, "function": "not a dict"}]},
                {"role": "tool", "name": text, "content": out},
            ]
        }

    async def main() -> str:
        with tracer.rollout_trace_attr(sample_index=sample, step=1) as attr:
            await agent(text)
            tracer.log_reward(1.0)
        return attr.trace_id or ""

    try:
        return asyncio.run(main())
    finally:
        tracer.shutdown()


def _markdown_bodies(at: AppTest) -> list[str]:
    out = [
        str(e.value)
        for kind in ("markdown", "caption", "error", "warning", "info", "subheader", "header")
        for e in getattr(at, kind)
    ]
    out += [str(m.value) for m in at.metric] + [str(m.label) for m in at.metric]
    out += [str(e.label) for e in at.expander]
    return out


# An AppTest run per example: report a failure as found, do not spend minutes shrinking it.
@settings(
    max_examples=5,
    phases=[Phase.explicit, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=HOSTILE, name=HOSTILE, sample=HOSTILE)
def test_hostile_strings_are_inert_bounded_and_isolated(
    tmp_path_factory: pytest.TempPathFactory, text: str, name: str, sample: str
) -> None:
    """Every field hostile at once: the replay draws, nothing is interpreted, every element is bounded."""
    root = os.fspath(tmp_path_factory.mktemp("hostile"))
    trace_id = _record(root, name, text + HUGE[:10], sample)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["path"] = os.path.join(root, "hostile", "run")
    at.query_params["trace_id"] = trace_id
    at.run()
    assert not at.exception, at.exception[0].message if at.exception else ""
    # An escaped character (backslash + punctuation) is literal: blank it out, then no fragment may be left whole.
    bodies = [re.sub(r"\\[!-/:-@\[-`{-~]", "\x00", b) for b in _markdown_bodies(at)]
    for fragment in FRAGMENTS:
        for body in bodies:
            assert fragment not in body, (fragment, body[:200])
    assert all(len(str(e.value)) <= safe.MAX_ELEMENT_CHARS for e in [*at.text, *at.code])
    assert any("Trajectory replay" in str(h.value) for h in at.header)
    assert len(at.metric) >= 8  # the rest of the page is there


def test_huge_text_is_cut_with_the_whole_offered(tmp_path: Any) -> None:
    """A message far over the bound is drawn cut, with a note saying so (and a download of all of it)."""
    trace_id = _record(os.fspath(tmp_path), "t", "plain", "0")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["path"] = os.fspath(tmp_path / "hostile" / "run")
    at.query_params["trace_id"] = trace_id
    at.run()
    assert not at.exception
    cut = [e.value for e in at.text if HUGE[:100] in e.value]
    assert cut and all(len(v) == safe.MAX_ELEMENT_CHARS for v in cut)
    assert any(f"of {len(HUGE):,} characters" in str(c.value) for c in at.caption)
    assert "plain" in " ".join(str(e.value) for e in [*at.text, *at.code])  # the other messages are drawn too


def test_escape_markdown_leaves_no_punctuation_bare() -> None:
    """Every ASCII punctuation character is escaped; control characters are spelled out."""
    out = D.escape_markdown("a@b.c www.x.y :smile: ^x^ ;,?/ \x1b[0m")
    assert "a\\@b\\.c" in out and "www\\.x\\.y" in out and "\\:smile\\:" in out
    assert "\x1b" not in out and "\\\\x1b" in out


def test_path_outside_the_served_directories_is_refused(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """?path=/ (or a link out of a served directory) is an error naming --allow-path, not a walk of the disk."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "escape").symlink_to("/")
    monkeypatch.setenv(D.ENV_VIEW_ALLOW, os.fspath(served))
    for outside in ("/", os.fspath(served / "escape" / "etc"), os.fspath(served / ".." / "other")):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params["path"] = outside
        at.run()
        assert not at.exception
        errors = " ".join(str(e.value) for e in at.error)
        assert "outside the directories this viewer serves" in errors and "allow\\-path" in errors
    assert D.check_allowed(os.fspath(served / "run"), D.allowed_roots([os.fspath(served)], {})) == os.fspath(
        served / "run"
    )


def test_host_names() -> None:
    """Host header values with ports and IPv6 brackets reduce to the name."""
    assert host_name("LocalHost:8501") == "localhost"
    assert host_name("[::1]:8501") == "::1"
    assert host_name("evil.example") == "evil.example"
    guard = HostGuard(None, ["localhost", "127.0.0.1"])
    assert guard.refused([(b"host", b"localhost:1")]) is None
    assert guard.refused([(b"host", b"evil.example:1")]) == "evil.example"
    assert guard.refused([(b"host", b"localhost:1"), (b"origin", b"http://evil.example")]) == "evil.example"
    assert guard.refused([]) == ""  # no Host at all is refused too


def _status_line(port: int, host: str, origin: str | None = None, websocket: bool = False) -> str:
    request = f"GET {'/_stcore/stream' if websocket else '/'} HTTP/1.1\r\nHost: {host}\r\n"
    if origin:
        request += f"Origin: {origin}\r\n"
    if websocket:
        request += (
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall((request + "\r\n").encode())
        return c.recv(200).split(b"\r\n")[0].decode()


@pytest.mark.slow
def test_server_refuses_other_hosts(tmp_path: Any) -> None:
    """A foreign Host or Origin gets 403, HTTP and websocket alike; localhost and --allow-host names are served."""
    run = os.fspath(tmp_path / "hostile")
    _record(os.fspath(tmp_path), "t", "x", "0")
    port = free_port()
    env = {**os.environ, ENV_BIND: "127.0.0.1", ENV_ALLOW_HOSTS: "viewer.lan"}
    cmd = streamlit_command(run, "127.0.0.1", port, python=sys.executable)
    with serving(cmd, tmp_path, f"http://127.0.0.1:{port}/_stcore/health", 120, env):
        own = f"127.0.0.1:{port}"
        assert " 200" in _status_line(port, own)
        assert " 101" in _status_line(port, own, f"http://localhost:{port}", websocket=True)
        assert " 101" in _status_line(port, f"viewer.lan:{port}", f"http://viewer.lan:{port}", websocket=True)
        assert " 403" in _status_line(port, "evil.example")
        assert " 403" in _status_line(port, f"evil.example:{port}", f"http://evil.example:{port}", websocket=True)
        assert " 403" in _status_line(port, own, "http://evil.example", websocket=True)

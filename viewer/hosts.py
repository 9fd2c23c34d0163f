"""Refuse requests addressed to another host: the viewer's guard against DNS rebinding.

A page on ``evil.example`` whose name is re-pointed at 127.0.0.1 reaches the
local server with ``Host: evil.example``; a cross-site websocket carries the
other site in ``Origin``. :class:`HostGuard`, an ASGI middleware in front of
Streamlit, answers both (plain HTTP and the websocket upgrade) with 403 unless
the name is this machine's loopback name, the bound address, or one given
with ``--allow-host``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

#: Names every viewer answers to.
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
#: Environment variable (comma-separated) naming further hosts, set by ``rollout-trace view --allow-host``.
ENV_ALLOW_HOSTS = "ROLLOUT_TRACE_VIEW_HOSTS"
#: Environment variable with the address the server binds, set by ``rollout-trace view``.
ENV_BIND = "ROLLOUT_TRACE_VIEW_BIND"
WILDCARD = frozenset({"0.0.0.0", "::", ""})


def host_name(value: str) -> str:
    """The host of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``), lower-cased."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:].split("]", 1)[0]
    if v.count(":") == 1:
        return v.split(":", 1)[0]
    return v


def allowed_hosts(bind: str | None, extra: Iterable[str]) -> frozenset[str]:
    """Loopback names, ``bind`` (unless a wildcard) and ``extra``."""
    names = set(LOOPBACK)
    if bind and bind not in WILDCARD:
        names.add(host_name(bind))
    names.update(host_name(e) for e in extra if e.strip())
    return frozenset(names)


def refusal(host: str) -> str:
    """Why a request for ``host`` is refused, and how to allow it."""
    return (
        f"403: this rollout-trace viewer does not serve the host {host!r}. "
        f"If you meant to reach it by that name, restart it with: rollout-trace view PATH --allow-host {host}\n"
    )


class HostGuard:
    """ASGI middleware: 403 for a request whose ``Host`` or ``Origin`` names a host not allowed."""

    def __init__(self, app: Any, hosts: Iterable[str] | None = None) -> None:
        self.app = app
        if hosts is None:
            extra = os.environ.get(ENV_ALLOW_HOSTS, "").split(",")
            self.hosts = allowed_hosts(os.environ.get(ENV_BIND), extra)
        else:
            self.hosts = frozenset(host_name(h) for h in hosts)

    def refused(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The host that makes these request headers refused, or None."""
        host = origin = None
        for k, v in headers:
            if k == b"host":
                host = v.decode("latin-1")
            elif k == b"origin":
                origin = v.decode("latin-1")
        name = host_name(host or "")
        if name not in self.hosts:
            return name
        if origin is not None and origin != "null":
            oname = (urlsplit(origin).hostname or origin).lower()
            if oname not in self.hosts:
                return oname
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        bad = self.refused(scope.get("headers") or [])
        if bad is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        body = refusal(bad).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

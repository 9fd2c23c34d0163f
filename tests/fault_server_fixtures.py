"""HTTP servers on 127.0.0.1 that fail as a test tells them: a proxy before a real server, an OTLP receiver.

Faults (:data:`FAULTS`): ``hang`` (read the request, never answer), ``5xx``
(answer 500), ``reset`` (close the connection with a TCP reset), and for the
OTLP receiver ``partial`` (answer 200 with ``partial_success`` rejecting some
or all spans). ``after`` requests are answered normally before the fault
starts, so a fault can hit the middle of an export, not only its start.
"""

from __future__ import annotations

import http.server
import socket
import struct
import threading
import urllib.error
import urllib.request
from typing import Any

#: The ways a destination fails that every exporter must report.
FAULTS = ("hang", "5xx", "reset")


class FaultyServer:
    """A threading HTTP server whose answer to each request is :meth:`answer`'s (override it), or the fault.

    Attributes:
        fault: None (answer normally), or one of :data:`FAULTS`.
        after: Requests answered normally before the fault applies.
        requests: Requests seen (``/health`` not counted).
    """

    def __init__(self, fault: str | None = None, after: int = 0) -> None:
        self.fault, self.after, self.requests = fault, after, 0
        self.released = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.serve(self, body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815 - http.server's names

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        """Answer one request: ``/health`` always, else the fault once ``after`` requests went through."""
        if handler.path.rstrip("/").endswith("/health"):
            self.reply(handler, 200, b"OK", "text/plain")
            return
        self.requests += 1
        fault = self.fault if self.requests > self.after else None
        if fault == "hang":
            self.released.wait()  # until close(): the client's own bound is what ends the wait
            return
        if fault == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        if fault == "5xx":
            self.reply(handler, 500, b'{"error_code": "INTERNAL_ERROR", "message": "injected"}', "application/json")
            return
        status, content, kind = self.answer(handler, body)
        self.reply(handler, status, content, kind)

    def answer(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        """The normal answer: 200, empty."""
        return 200, b"", "text/plain"

    @staticmethod
    def reply(handler: http.server.BaseHTTPRequestHandler, status: int, content: bytes, kind: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


class FaultyProxy(FaultyServer):
    """Forwards every request to ``upstream`` (a real server) until the fault starts."""

    def __init__(self, upstream: str, fault: str | None = None, after: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        super().__init__(fault, after)

    def answer(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        headers = {
            k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length", "connection")
        }
        req = urllib.request.Request(
            self.upstream + handler.path, data=body or None, method=handler.command, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "application/json")


class OtlpReceiver(FaultyServer):
    """An OTLP/HTTP receiver decoding each request; ``fault="partial"`` rejects ``reject`` spans of each (-1: all).

    Attributes:
        spans: Every span accepted, by (trace id hex, span id hex): name, parent, attributes, events.
    """

    def __init__(self, fault: str | None = None, after: int = 0, reject: int = -1) -> None:
        self.reject = reject
        self.spans: dict[tuple[str, str], dict[str, Any]] = {}
        self.resources: list[dict[str, Any]] = []
        super().__init__(None if fault == "partial" else fault, after)
        self.partial = fault == "partial"

    def answer(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = [(rs, sp) for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        rejected = 0
        if self.partial and self.requests > self.after:
            rejected = len(got) if self.reject < 0 else min(self.reject, len(got))
        for rs, sp in got[rejected:]:
            self.resources.append({kv.key: any_value(kv.value) for kv in rs.resource.attributes})
            self.spans[(sp.trace_id.hex(), sp.span_id.hex())] = {
                "name": sp.name,
                "parent": sp.parent_span_id.hex() or None,
                "kind": sp.kind,
                "attrs": {kv.key: any_value(kv.value) for kv in sp.attributes},
                "events": [(e.name, {kv.key: any_value(kv.value) for kv in e.attributes}) for e in sp.events],
            }
        resp = ExportTraceServiceResponse()
        if rejected:
            resp.partial_success.rejected_spans = rejected
            resp.partial_success.error_message = f"injected: {rejected} spans over quota"
        return 200, resp.SerializeToString(), "application/x-protobuf"


def any_value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as Python."""
    which = v.WhichOneof("value")
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None

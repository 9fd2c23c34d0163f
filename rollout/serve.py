"""A minimal OpenAI-compatible completions server over any rollout engine.

``python -m rollout.serve --engine hf --model DIR --port 8000`` serves
``POST /v1/completions`` (prompt as token ids or text) and ``GET /v1/models``
on 127.0.0.1 with the standard library's HTTP server, so ``--engine openai``
can be tried without vLLM. Responses carry ``token_ids`` and, in
``logprobs.tokens``, ``token_id:N`` strings, as vLLM does when asked. The
tests use it with the scripted and the hf engines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rollout.engines import Engine, SamplingParams


class CompletionServer:
    """Serves ``engine`` over HTTP on ``host:port`` (port 0: any free port).

    The engine runs on one event loop in a background thread, so concurrent
    requests reach it together (the hf engine batches them).
    """

    def __init__(
        self, engine: Engine, tokenizer: Any, host: str = "127.0.0.1", port: int = 0, model_name: str = "default"
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="rollout-serve-loop", daemon=True)
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, name="rollout-serve-http", daemon=True)

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> CompletionServer:
        """Start serving in background threads; return self."""
        self._loop_thread.start()
        self._http_thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the engine."""
        self.httpd.shutdown()
        self.httpd.server_close()
        asyncio.run_coroutine_threadsafe(self.engine.close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(10)

    def __enter__(self) -> CompletionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one completions request body."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=int(body.get("max_tokens", 16)),
            seed=body.get("seed"),
            logprobs=body.get("logprobs") is not None,
        )
        fut = asyncio.run_coroutine_threadsafe(self.engine.generate(prompt_ids, sampling), self._loop)
        out = fut.result()
        self.requests += 1
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(
                out.token_ids, skip_special_tokens=body.get("skip_special_tokens") is not False
            ),
            "finish_reason": out.finish_reason,
            "token_ids": out.token_ids,
            "logprobs": None,
        }
        if sampling.logprobs and out.logprobs is not None:
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in out.token_ids], "token_logprobs": out.logprobs}
        return {
            "id": f"cmpl-{self.requests}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out.token_ids),
                "total_tokens": len(prompt_ids) + len(out.token_ids),
            },
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                if self.path.rstrip("/") != "/v1/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}; use /v1/completions"}})
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    self._send(200, server.complete(body))
                except (ValueError, TypeError) as exc:
                    self._send(400, {"error": {"message": str(exc)}})
                except Exception as exc:
                    self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

        return Handler


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rollout.serve --engine {scripted,hf} [--model DIR] [--port N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout.serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["scripted", "hf"], default="scripted")
    parser.add_argument("--model", metavar="DIR", help="hf: a local model folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    from rollout.runner import load_problems
    from rollout.tokenizer import load_qwen_tokenizer

    if args.engine == "hf":
        if not args.model:
            print("error: --engine hf needs --model DIR", file=sys.stderr)
            return 2
        from transformers import AutoTokenizer

        from rollout.engines.hf import HFEngine

        tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        engine: Engine = HFEngine(args.model, tokenizer=tok)
    else:
        from rollout.engines.scripted import ScriptedEngine

        tok = load_qwen_tokenizer()
        engine = ScriptedEngine(tok, load_problems())
    server = CompletionServer(engine, tok, args.host, args.port, model_name=args.model or args.engine).start()
    print(f"serving {args.engine} at {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

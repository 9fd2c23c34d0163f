"""``rollout-trace view PATH``: serve the viewer app on this machine.

Registered through the ``rollout_trace.commands`` entry point (pyproject.toml).
Streamlit is imported only when the command runs, so ``rollout-trace --help``
works without the ``viewer`` extra.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

#: The app script ``streamlit run`` serves.
APP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "app.py")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


def streamlit_command(
    path: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    python: str | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """The ``streamlit run`` command line that serves the viewer over ``path``."""
    extra = ["--tokenizer", os.path.abspath(tokenizer)] if tokenizer else []
    return [
        python or sys.executable,
        "-m",
        "streamlit",
        "run",
        APP_PATH,
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--",
        "--path",
        os.path.abspath(path),
        *extra,
    ]


def _view(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        print("error: the viewer needs Streamlit; pip install 'rollout-trace[viewer]'", file=sys.stderr)
        return 2
    if not os.path.exists(args.path):
        print(
            f"error: trace path {args.path!r} does not exist; give a trace file or a directory of them", file=sys.stderr
        )
        return 2
    cmd = streamlit_command(args.path, args.host, args.port, tokenizer=args.tokenizer)
    print(f"rollout-trace viewer: http://{args.host}:{args.port}/  (Ctrl-C to stop)", file=sys.stderr)
    sys.stderr.flush()
    if os.name == "posix":
        # Become the server: Ctrl-C and kill reach Streamlit directly, no orphan is left behind.
        os.execv(cmd[0], cmd)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def register_view(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``view`` subcommand to ``rollout-trace``."""
    p = subparsers.add_parser("view", help="browse and replay recorded trajectories in a local web app")
    p.add_argument("path", help="a trace file or a directory tree of them (e.g. rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; 0.0.0.0 exposes your traces to the network)",
    )
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or its folder) to show the text of each token; default: the run's recorded tokenizer path",
    )
    p.set_defaults(func=_view)

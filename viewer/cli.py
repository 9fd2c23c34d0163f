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

from tracer import list_trace_files
from tracer.cli.errors import suggest_path
from tracer.extras import install_command
from viewer.hosts import ENV_ALLOW_HOSTS, ENV_BIND

#: The script ``streamlit run`` serves: the app (``app.py``) behind the host check (:mod:`viewer.hosts`).
APP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501

#: Shown at the end of ``rollout-trace view --help``.
VIEW_EXAMPLES = """examples:
  rollout-trace view rollout_traces/rollout-demo/scripted-20260101-120000   # one run (what the demo prints)
  rollout-trace view rollout_traces                                         # every run under a folder
  rollout-trace view sample_data/sample/qwen2.5-coder-0.5b-instruct --port 8600
  rollout-trace view rollout_traces/gsm8k/grpo-1 rollout_traces/gsm8k/grpo-2  # compare two runs
  rollout-trace view RUN --tokenizer ~/models/qwen/tokenizer.json          # when the run did not record a tokenizer path
  rollout-trace view RUN --follow --interval 5                             # while it trains: new steps appear on their own
"""


def streamlit_command(
    path: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    python: str | None = None,
    tokenizer: str | None = None,
    compare: str | None = None,
    allow_paths: list[str] | None = None,
    follow_s: float | None = None,
) -> list[str]:
    """The ``streamlit run`` command line that serves the viewer over ``path`` (compared with ``compare``).

    With ``follow_s``, pages open following the run, looking at its files every ``follow_s`` seconds.

    ``?path=`` may then open ``path``, ``compare`` and ``allow_paths`` only;
    the hosts the server answers come from :func:`server_env`.
    """
    extra = ["--tokenizer", os.path.abspath(tokenizer)] if tokenizer else []
    if compare:
        extra += ["--compare", os.path.abspath(compare)]
    if allow_paths:
        extra += ["--allow-path", os.pathsep.join(os.path.abspath(p) for p in allow_paths)]
    if follow_s is not None:
        extra += ["--follow", f"{follow_s:g}"]
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


def server_env(host: str, allow_hosts: list[str] | None = None) -> dict[str, str]:
    """The environment of the server process: the bound address and the extra host names it answers."""
    env = dict(os.environ)
    env[ENV_BIND] = host
    env[ENV_ALLOW_HOSTS] = ",".join(allow_hosts or [])
    return env


def _has_trace_files(path: str) -> bool:
    """Whether ``path`` is a trace file or a directory tree holding one (unreadable counts as none)."""
    try:
        return bool(list_trace_files(path))
    except (OSError, ValueError):
        return False


def _view(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        print(
            f"error: the viewer needs Streamlit, which is not installed: {install_command('viewer')}", file=sys.stderr
        )
        return 2
    for given in (args.path, args.compare):
        if given is not None and not os.path.exists(given):
            guess = suggest_path(given)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            print(
                f"error: trace path {given!r} does not exist{hint}; give a trace file or a directory of them",
                file=sys.stderr,
            )
            return 2
        if given is not None and not args.follow and not _has_trace_files(given):
            print(
                f"error: no trace files (*.arrow) under {given!r}; give a run directory "
                f"(what tracer.init printed, e.g. rollout_traces/PROJECT/EXPERIMENT), "
                f"or add --follow to wait for a run that is about to start there",
                file=sys.stderr,
            )
            return 2
    cmd = streamlit_command(
        args.path,
        args.host,
        args.port,
        tokenizer=args.tokenizer,
        compare=args.compare,
        allow_paths=args.allow_path,
        follow_s=args.interval if args.follow else None,
    )
    env = server_env(args.host, args.allow_host)
    print(f"rollout-trace viewer: http://{args.host}:{args.port}/  (Ctrl-C to stop)", file=sys.stderr)
    sys.stderr.flush()
    if os.name == "posix":
        # Become the server: Ctrl-C and kill reach Streamlit directly, no orphan is left behind.
        os.execve(cmd[0], cmd, env)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def port_number(text: str) -> int:
    """``--port``: a TCP port, 0-65535 (argparse turns the ValueError into a usage error, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; give 0-65535, e.g. {DEFAULT_PORT}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535); give e.g. {DEFAULT_PORT}")
    return port


#: ``--interval``'s default and bounds (the sidebar's, :mod:`viewer.state`, which imports Streamlit).
FOLLOW_INTERVAL_S = 3
FOLLOW_INTERVAL_BOUNDS = (1, 600)


def follow_seconds(text: str) -> int:
    """``--interval``: whole seconds, 1-600 (argparse turns the error into a usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds; give e.g. 3") from None
    lo, hi = FOLLOW_INTERVAL_BOUNDS
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{value} s is outside {lo}-{hi} s; give e.g. {FOLLOW_INTERVAL_S}")
    return value


def register_view(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``view`` subcommand to ``rollout-trace``."""
    p = subparsers.add_parser(
        "view",
        help="browse and replay recorded trajectories in a local web app",
        description="Serve the viewer (Streamlit) over a trace file or a directory tree of them.",
        epilog=VIEW_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a trace file or a directory tree of them (e.g. rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument(
        "compare",
        nargs="?",
        help="a second run: open the Compare page, PATH (run A) against this one (run B)",
    )
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; 0.0.0.0 exposes your traces to the network)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="also answer requests addressed to this host name (repeatable); by default only localhost, "
        "127.0.0.1, ::1 and the --host address are served, other Host or Origin headers get 403",
    )
    p.add_argument(
        "--allow-path",
        action="append",
        metavar="DIR",
        help="a further directory the ?path= URL parameter may open (repeatable); by default only PATH and COMPARE",
    )
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or its folder) to show the text of each token; default: the run's recorded tokenizer path",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="open pages following the run while it is written: new batches are read on their own, "
        "without losing your place (a toggle in the sidebar too)",
    )
    p.add_argument(
        "--interval",
        type=follow_seconds,
        default=FOLLOW_INTERVAL_S,
        help=f"with --follow: seconds between looks at the files (default {FOLLOW_INTERVAL_S})",
    )
    p.set_defaults(func=_view)

"""``rollout-trace upload``: upload the staged files that crashed writers left."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tracer.storage.upload import DESTINATION_FILE, ENV_STAGING_DIR, recover, staging_root


def register_upload(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "upload",
        help="upload trace files a crashed process left in its staging directory",
        description=(
            "Upload every staged trace file whose writer is no longer running (repairing a torn last "
            "batch first) to the URI recorded in its staging directory. Files of running writers are left alone."
        ),
    )
    p.add_argument(
        "staging",
        nargs="?",
        help=f"a staging directory or a root of them (default: ${ENV_STAGING_DIR} or {staging_root()})",
    )
    p.add_argument("--dest", help="upload here instead of the URI recorded in the staging directory")
    p.set_defaults(func=_upload_command)


def _upload_command(args: argparse.Namespace) -> int:
    root = args.staging or staging_root()
    if not os.path.isdir(root):
        print(f"rollout-trace upload: {root!r} is not a directory")
        return 2
    dirs = [d for d, _, files in os.walk(root) if DESTINATION_FILE in files]
    if not dirs:
        print(f"rollout-trace upload: no staging directories (with a {DESTINATION_FILE} file) under {root!r}")
        return 0 if args.staging is None else 2
    status = 0
    for d in sorted(dirs):
        uploaded, failed = recover(d, args.dest)
        for uri in uploaded:
            print(f"uploaded {uri}")
        for line in failed:
            print(f"FAILED {line}")
            status = 1
    return status

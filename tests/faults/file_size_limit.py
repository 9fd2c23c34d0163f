"""Disk full without root: RLIMIT_FSIZE caps every file this process writes; prints what flush() said, as JSON.

Usage: ``python file_size_limit.py OUTPUT_DIR LIMIT_BYTES``. SIGXFSZ is
ignored, so a write past the limit fails with EFBIG ("File too large") like a
full disk. Phases: record under the limit (flush ok), record past it (flush
fails), lift the limit (the "space returns"), record more (flush ok again).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys

import tracer

WARNINGS: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        WARNINGS.append(record.getMessage())


@tracer.rollout_trace_op(kind="tool")
def tool(i: int, text: str) -> str:
    return text[:10] + str(i)


def record(prefix: str, n: int) -> bool:
    """Record ``n`` trajectories; True if every call returned its value normally."""
    ok = True
    for i in range(n):
        with tracer.rollout_trace_attr(sample_index=f"{prefix}-{i}", step=0):
            text = os.urandom(1000).hex()  # does not compress: the file really grows
            ok &= tool(i, text) == text[:10] + str(i)
    return ok


def main() -> None:
    out, limit = sys.argv[1], int(sys.argv[2])
    logging.getLogger("rollout_trace").addHandler(_Collect(level=logging.WARNING))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    os.environ.pop(tracer.config.ENV_STRICT, None)  # storage failures are counted, not raised
    tracer.init(output_dir=out, flush_interval_s=60.0)
    phases = {}
    returned = record("small", 5)
    phases["small"] = tracer.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    for k in range(3):
        returned &= record(f"over{k}", 200)
        phases[f"over{k}"] = tracer.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    returned &= record("after", 20)
    phases["after"] = tracer.flush()
    tracer.shutdown()
    print(
        json.dumps(
            {
                "returned_normally": returned,
                "warnings": WARNINGS,
                "phases": {
                    k: {
                        "ok": r.ok,
                        "spans_failed": r.spans_failed,
                        "spans_written": r.spans_written,
                        "message": r.message,
                    }
                    for k, r in phases.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()

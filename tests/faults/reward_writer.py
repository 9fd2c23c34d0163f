"""A worker that records 4,000 trajectories (one tool span and a reward with advantage = 10 x reward each), then idles.

Usage: ``python reward_writer.py OUTPUT_DIR``. Prints ``READY`` after its first flush.
"""

from __future__ import annotations

import sys
import time

import tracer

TRAJECTORIES = 4000


@tracer.rollout_trace_op(kind="tool")
def tool(i: int) -> int:
    return i


def main() -> None:
    tracer.init(output_dir=sys.argv[1], flush_interval_s=0.01, project_name="faults", experiment_name="rewards")
    i = 0
    while i < TRAJECTORIES:
        with tracer.rollout_trace_attr(sample_index=str(i), step=0):
            tool(i)
            tracer.log_reward(float(i), advantage=float(i) * 10)
        i += 1
        if i % 50 == 0:
            tracer.flush()
            if i == 50:
                print("READY", flush=True)
    tracer.flush()
    while True:  # the test kills it
        time.sleep(1)


if __name__ == "__main__":
    main()

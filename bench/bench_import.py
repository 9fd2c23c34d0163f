"""The cost of ``import tracer``: wall and CPU time in fresh processes, median of ``--repeat``.

With ``--other DIR`` (a copy of another tree's ``tracer`` package's parent, e.g.
``git archive HEAD~1 tracer | tar -x -C DIR``) both trees are measured, taking
turns, and the ratio printed. Each process also says whether ``pyarrow.dataset``
was imported.

    python bench/bench_import.py [--repeat 5] [--other DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CODE = (
    "import sys, time\n"
    "t, c = time.perf_counter(), time.process_time()\n"
    "import tracer\n"
    "print(time.perf_counter() - t, time.process_time() - c, int('pyarrow.dataset' in sys.modules))\n"
)


def once(root: str) -> tuple[float, float, bool]:
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", CODE], cwd="/", env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1]), out[2] == "1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--other", default=None, help="another tree (the directory holding its tracer/) to compare")
    args = ap.parse_args()
    trees = {"this tree": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if args.other:
        trees["other"] = os.path.abspath(args.other)
    got: dict[str, list[tuple[float, float, bool]]] = {k: [] for k in trees}
    for i in range(args.repeat):
        for name in list(trees) if i % 2 == 0 else list(trees)[::-1]:
            got[name].append(once(trees[name]))
    wall = {k: statistics.median(w for w, _, _ in v) for k, v in got.items()}
    for name, runs in got.items():
        cpu = statistics.median(c for _, c, _ in runs)
        loaded = sorted({d for _, _, d in runs})
        print(f"{name}: import tracer {wall[name]:.3f} s wall, {cpu:.3f} s CPU; pyarrow.dataset imported: {loaded}")
    if args.other:
        print(f"this tree / other: {wall['this tree'] / wall['other']:.2f}x wall")


if __name__ == "__main__":
    main()

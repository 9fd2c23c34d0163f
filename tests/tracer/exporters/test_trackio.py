"""trackio exporter: runs from files, live, and from the verl drop-in, read back from trackio's local store offline.

trackio fixes its store's directory (``TRACKIO_DIR``) when first imported, so
each case runs in a fresh interpreter with its own store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trackio")

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests"


def _run(code: str, store: Path) -> Any:
    """Run ``code`` (which prints one line ``RESULT <json>``) with ``store`` as trackio's directory; return that JSON."""
    env = {
        **os.environ,
        "TRACKIO_DIR": str(store),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("ROLLOUT_TRACE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def test_exported_files_read_back_from_trackios_store(tmp_path: Path) -> None:
    """rollout-trace export --to trackio: every training trajectory a row with its reward, validation capped, metrics per step; verify agrees."""
    out = _run(
        f"""
        import json
        from export_fixtures import PROJECT, EXPERIMENT, record_run, reward_of
        from tracer.exporters import trackio as trackio_export
        traces = record_run({str(tmp_path / "traces")!r}, log_val_generations=2)
        report = trackio_export.export_files(traces, progress=False, verify=True)
        rows, metrics = trackio_export.read_back(PROJECT, EXPERIMENT)
        import tracer
        trajectories = tracer.read_trajectories(traces).to_pylist()
        print("RESULT " + json.dumps({{"details": report.details, "rows": rows, "metrics": [list(k) + [v] for k, v in metrics.items()],
            "train": {{t["trace_id"]: t["reward"] for t in trajectories if not t["validate"]}},
            "val": [t["trace_id"] for t in trajectories if t["validate"]]}}))
        """,
        tmp_path / "store",
    )
    assert out["train"] and all(out["rows"][t] == r for t, r in out["train"].items())
    assert len([t for t in out["val"] if t in out["rows"]]) == 3 * 2  # log_val_generations=2 a step
    steps = {s for s, k, _ in out["metrics"] if k == "rollout_trace/reward/mean"}
    assert steps == {1, 2, 3}
    assert any(d.startswith("verify") and "ok" in d.lower() for d in out["details"]), out["details"]


def test_live_recording_reaches_trackio(tmp_path: Path) -> None:
    """tracer.init(backend="trackio"): the files and the trackio run hold the same trajectories and rewards."""
    out = _run(
        f"""
        import json, tracer
        from export_fixtures import record_rollouts
        from tracer.exporters import trackio as trackio_export
        tracer.init(project_name="live", experiment_name="r1", output_dir={str(tmp_path / "traces")!r}, backend="trackio")
        record_rollouts(steps=(1, 2), val_per_step=0)
        tracer.shutdown()
        rows, _ = trackio_export.read_back("live", "r1")
        files = {{t["trace_id"]: t["reward"] for t in tracer.read_trajectories({str(tmp_path / "traces")!r}).to_pylist()}}
        print("RESULT " + json.dumps({{"rows": rows, "files": files}}))
        """,
        tmp_path / "store",
    )
    assert out["files"] and out["rows"] == out["files"]


def test_verl_backend_trackio_records_files_and_exports_to_trackio(tmp_path: Path) -> None:
    """verl's config backend=trackio through the drop-in: rollout-trace files, and the trajectory in a trackio run."""
    out = _run(
        f"""
        import asyncio, json, tracer
        from tracer.integrations.verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
        from tracer.exporters import trackio as trackio_export

        class Loop:
            @rollout_trace_op
            async def generate(self, prompt_ids):
                return {{"token_ids": [5, 6]}}

        tracer.init(output_dir={str(tmp_path / "traces")!r})
        RolloutTraceConfig.init(project_name="my-project", experiment_name="my-experiment", backend="trackio")
        with rollout_trace_attr(step=1, sample_index=2, rollout_n=3, name="agent_loop"):
            asyncio.run(Loop().generate([1, 2]))
        tracer.log_reward(0.5, step=1, sample_index=2, rollout_n=3)
        RolloutTraceConfig.reset()
        rows, metrics = trackio_export.read_back("my-project", "my-experiment")
        files = tracer.read_trajectories({str(tmp_path / "traces")!r}).to_pylist()
        print("RESULT " + json.dumps({{"rows": rows, "files": files, "backend_client": "ok"}}))
        """,
        tmp_path / "store",
    )
    (row,) = out["files"]
    assert (row["step"], row["sample_index"], row["rollout_n"]) == (1, "2", 3)
    assert out["rows"] == {row["trace_id"]: 0.5}

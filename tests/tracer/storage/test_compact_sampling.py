"""Compaction keeps the sampling decisions (tracer.storage.decisions): they live in batch metadata, which a merge drops."""

from __future__ import annotations

from typing import Any

import tracer
from tracer.record.sampling import read_sampling
from tracer.storage.compact import compact


@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids: list[int]) -> dict[str, Any]:
    return {"response_ids": [1, 2, 3], "finish_reason": "stop"}


def _record(trace_dir: str) -> str:
    """Three steps in two shards (two recorder sessions), each step's decision in its shard's batch metadata."""
    run_dir = ""
    for steps in ((0, 1), (2,)):
        cfg = tracer.init(output_dir=trace_dir, max_samples=2, sample_strategy="extremes")
        run_dir = cfg.run_dir
        for step in steps:
            for sample in range(5):
                for n in range(2):
                    with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                        generate([sample])
            for sample in range(5):
                for n in range(2):
                    tracer.log_reward(float(sample + n), step=step, sample_index=sample, rollout_n=n)
            tracer.flush()
        tracer.shutdown()
    return run_dir


def _without_file(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in d.items() if k != "file"} for d in decisions), key=repr)


def test_compaction_keeps_every_decision_with_its_source(trace_dir: str) -> None:
    """Decided in several shards, merged into one file: read_sampling returns the same decisions, naming their shard."""
    run_dir = _record(trace_dir)
    before = read_sampling(run_dir)
    assert {d["step"] for d in before} == {0, 1, 2}
    assert len(tracer.list_trace_files(run_dir)) == 2
    report = compact(run_dir)
    assert (report.files_in, report.files_out) == (2, 1)
    after = read_sampling(run_dir)
    assert _without_file(after) == _without_file(before)
    assert all(d["source_file"] != d["file"].rsplit("/", 1)[-1] for d in after)
    # And a second compaction (a compacted file among the inputs) keeps them too.
    compact(run_dir, target_bytes=1)
    assert _without_file(read_sampling(run_dir)) == _without_file(before)

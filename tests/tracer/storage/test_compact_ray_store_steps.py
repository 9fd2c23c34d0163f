"""Compaction of an s3:// run (no Ray needed): stopped at any request of its commit, nothing is lost or doubled."""

from __future__ import annotations

from typing import Any

import pytest

import tracer
from tracer import schema as S
from tracer.storage import compact as _compact
from tracer.storage.upload import ENV_STAGING_DIR

pytestmark = pytest.mark.slow


def _record_run(bucket: str, steps: int = 2) -> str:
    @tracer.rollout_trace_op(kind="tool")
    def tool(i: int) -> int:
        return i

    tracer.init(output_dir=bucket, project_name="p", experiment_name="e", max_file_bytes=1)
    for step in range(steps):
        for i in range(3):
            with tracer.rollout_trace_attr(sample_index=i, step=step):
                tool(i)
        tracer.flush()
    assert tracer.shutdown().ok
    return f"{bucket}/p/e"


def _span_ids(run: str) -> list[str]:
    return sorted(tracer.read_spans(run, columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist())


class Crash(BaseException):
    """Stands for the process dying at that request."""


@pytest.mark.parametrize("crash_at", [1, 2, 3, 5])  # index, copy, a delete, the last index write
def test_a_stop_at_any_request_loses_and_duplicates_nothing(
    bucket: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, crash_at: int
) -> None:
    """Stop at the n-th index write, copy or delete: readers see every span once; the next run finishes."""
    monkeypatch.setenv(ENV_STAGING_DIR, str(tmp_path))
    run = _record_run(bucket)
    before = _span_ids(run)
    assert len(tracer.list_trace_files(run)) == 2
    calls = {"n": 0}

    def counting(real: Any) -> Any:
        def op(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash()
            return real(*args, **kwargs)

        return op

    with monkeypatch.context() as patch:
        for method in ("save_index", "replace", "remove"):
            patch.setattr(_compact._Dir, method, counting(getattr(_compact._Dir, method)))
        with pytest.raises(Crash):
            _compact.compact(bucket, delete_after_s=0)
    assert _span_ids(run) == before
    report = _compact.compact(bucket, delete_after_s=0)
    assert report.failed == [] and _span_ids(run) == before
    assert [f.rsplit("/", 1)[1].startswith("compacted_") for f in tracer.list_trace_files(run)] == [True]

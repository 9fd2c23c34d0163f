"""Exporters count what the destination accepted: refusals, hangs, 5xx and resets are said, bounded and in the exit status.

Real components: an OTLP receiver decoding each request, a real ``mlflow
server`` behind a proxy the test makes hang, answer 500 or reset, a SwanLab
run on a full tmpfs, a live wandb run in offline mode exiting without
``tracer.shutdown()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_server_fixtures import FAULTS, FaultyProxy, OtlpReceiver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_fixtures import record_tool_run, recorded_spans

import tracer
from tracer.cli import main as rollout_trace_main
from tracer.exporters import export_files

pytest.importorskip("opentelemetry.proto")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two steps of 4 tool-using trajectories each."""
    return record_tool_run(tmp_path_factory.mktemp("fail-run"), "fail", steps=(1, 2))


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = rollout_trace_main(["export", *args, "--no-progress"])
    out = capsys.readouterr()
    return code, out.out + out.err


# -- OTLP --------------------------------------------------------------------------


def test_otlp_receiver_rejecting_every_span_fails_the_export(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A receiver whose partial_success rejects every span: exit 1, nothing counted as sent, its message named."""
    receiver = OtlpReceiver("partial")
    try:
        code, out = _cli(capsys, run, "--to", "otlp", "--endpoint", receiver.url)
    finally:
        receiver.close()
    assert code == 1, out
    assert "otlp: sent 0 trajectories" in out
    assert "the receiver rejected all its spans: injected" in out
    assert "8 trajectories refused by otlp" in out
    assert not receiver.spans


def test_otlp_partial_rejection_is_a_problem_with_the_count(run: str) -> None:
    """A receiver rejecting 3 spans of a request: the report is not complete and says 3 of how many."""
    receiver = OtlpReceiver("partial", reject=3)
    try:
        report = export_files(run, "otlp", endpoint=receiver.url, progress=False)
    finally:
        receiver.close()
    assert not report.complete
    assert len(report.problems) == 2  # one per step's request
    assert all("rejected 3 of " in p and "injected" in p for p in report.problems), report.problems


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    fault=st.sampled_from((*FAULTS, "partial", None)),
    after=st.integers(0, 2),
    reject=st.integers(-1, 5),
)
def test_otlp_any_fault_is_reported_never_success(run: str, fault: str | None, after: int, reject: int) -> None:
    """Whatever the receiver does from its ``after``-th request on, the export is complete only if it took every span."""
    receiver = OtlpReceiver(fault, after=after, reject=reject)
    try:
        try:
            report = export_files(run, "otlp", endpoint=receiver.url, timeout_s=1.0, progress=False)
        except (OSError, RuntimeError) as exc:  # 5xx, reset, no answer: the step's write raised
            assert fault in FAULTS and after < 2, exc
            assert receiver.url in str(exc), exc
            return
    finally:
        receiver.close()
    took_all = set(receiver.spans) == set(recorded_spans(run))
    assert report.complete == took_all, (fault, after, reject, report)
    assert report.trajectories_sent == 8 - report.trajectories_refused


# -- MLflow behind a failing proxy -------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 for the module."""
    pytest.importorskip("mlflow")
    from server_fixtures import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server.uri


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(fault=st.sampled_from(FAULTS), after=st.sampled_from((0, 3)))
def test_mlflow_api_failing_behind_a_healthy_proxy_is_said_and_bounded(
    run: str, mlflow_server: str, fault: str, after: int
) -> None:
    """/health answers, the API hangs, answers 500 or resets: the export exits 2 within its bound, naming what to do."""
    proxy = FaultyProxy(mlflow_server, fault, after=after)
    try:
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "rollout-trace"), "export", run, "--to", "mlflow", "--tracking-uri", proxy.url,
             "--experiment", f"fail-{fault}-{after}", "--timeout-s", "3", "--no-progress"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7"},
        )  # fmt: skip
    finally:
        proxy.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"mlflow failed: BackendTimeoutError: mlflow at {proxy.url}" in last, proc.stderr
    assert "no answer within 3 s" in last and "run the export again" in last, last


@pytest.mark.slow
def test_live_mlflow_on_a_hung_server_flush_says_so_and_exit_is_bounded(
    run: str, mlflow_server: str, tmp_path: Path
) -> None:
    """A live MLflow exporter whose server hangs: flush() is not ok and names it; a normal exit waits one shutdown_timeout_s."""
    proxy = FaultyProxy(mlflow_server, "hang", after=0)
    script = textwrap.dedent(
        f"""
        import atexit, json, time, tracer
        atexit.register(lambda: print("EXITED", time.monotonic(), flush=True))  # registered first: runs last
        tracer.init(output_dir={str(tmp_path)!r}, project_name="hung", experiment_name="e", backend=["arrow", "mlflow"],
                    backend_options={{"mlflow_tracking_uri": {proxy.url!r}, "mlflow_timeout_s": 60}},
                    flush_interval_s=0.05, shutdown_timeout_s=3)
        @tracer.rollout_trace_op(kind="tool")
        def tool(x): return x
        with tracer.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
            tool(1)
        r = tracer.flush(timeout=2)
        print(json.dumps({{"ok": r.ok, "message": r.message}}), flush=True)
        print("EXITING", time.monotonic(), flush=True)
        """
    )
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        proxy.close()
    import json

    lines = proc.stdout.splitlines()
    result = json.loads(lines[0])
    assert not result["ok"] and "mlflow exporter" in result["message"], result
    assert proc.returncode == 0, proc.stderr
    assert "gave up at the stop's deadline" in proc.stderr and "rollout-trace export" in proc.stderr, proc.stderr
    times = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    # One deadline for the flush, the writer and every driver: one shutdown_timeout_s (3 s), not one per stage.
    assert times["EXITED"] - times["EXITING"] < 2 * 3, times


# -- SwanLab on a full disk ---------------------------------------------------------------


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """29 steps of 16 trajectories: its SwanLab tables take about 550 KB."""
    return record_tool_run(tmp_path_factory.mktemp("big-run"), "big", steps=tuple(range(1, 30)), samples=8)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(size_k=st.integers(150, 700))
def test_swanlab_on_a_capped_disk_is_complete_only_when_its_files_hold_everything(big_run: str, size_k: int) -> None:
    """A tmpfs of 150-700 KB as SwanLab's log dir: exit 0 only when the run's files hold every row; else it names the disk."""
    pytest.importorskip("swanlab")
    from reliability_fixtures import small_disk

    from tracer.exporters.swanlab import read_back

    with small_disk(f"{size_k}k") as disk:
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "rollout-trace"), "export", big_run, "--to", "swanlab",
             "--log-dir", disk, "--mode", "offline", "--timeout-s", "20", "--no-progress"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        runs = [os.path.join(disk, d) for d in os.listdir(disk) if d.startswith("run-")]
        try:
            rows = read_back(runs[0])[0] if runs else {}
        except Exception:  # a torn file: not everything is there
            rows = {}
    said = [line for line in proc.stderr.splitlines() if line.startswith("rollout-trace export:")]
    if len(rows) == 29 * 16:
        assert proc.returncode == 0, said
    else:
        assert proc.returncode in (1, 2), (size_k, len(rows), proc.stdout[-500:], said)
        assert any(("full" in line or "No space left" in line) and "free" in line for line in said), said


# -- a live wandb run ending without tracer.shutdown() ------------------------------------------


@pytest.mark.slow
def test_live_wandb_closes_before_wandb_tears_down_at_exit(tmp_path: Path) -> None:
    """A live offline wandb exporter and a plain exit: no 'could not close', and the run's files hold every trajectory."""
    pytest.importorskip("wandb")
    from tracer.exporters.wandb import read_back

    env = {**os.environ, "WANDB_DIR": str(tmp_path)}
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SILENT"):
        env.pop(var, None)
    script = textwrap.dedent(
        f"""
        import tracer
        tracer.init(output_dir={str(tmp_path / "traces")!r}, project_name="wb", experiment_name="e",
                    backend=["wandb", "console"], backend_options={{"wandb_mode": "offline"}})
        @tracer.rollout_trace_op(kind="tool")
        def tool(x): return x
        for step in (1, 2):
            for n in range(3):
                with tracer.rollout_trace_attr(step=step, sample_index=0, rollout_n=n):
                    tool(n)
                tracer.log_reward(float(n), step=step, sample_index=0, rollout_n=n)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "could not close" not in proc.stderr and "wandb exporter" not in proc.stderr, proc.stderr
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    rows, _ = read_back(str(runs[0]))
    assert len(rows) == 6


# -- the bound itself ----------------------------------------------------------------------


def test_a_call_that_does_not_return_is_said_while_waiting_then_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """call_within: a line per report interval while waiting, then BackendTimeoutError naming the call; results pass."""
    import threading

    from tracer.exporters import bounded

    monkeypatch.setattr(bounded, "REPORT_EVERY_S", 0.2)
    said: list[str] = []
    never = threading.Event()
    with pytest.raises(bounded.BackendTimeoutError, match=r"mlflow at http://h: write of step 3: no answer within 1 s"):
        bounded.call_within(never.wait, "mlflow at http://h: write of step 3", 1.0, said.append)
    never.set()
    assert said and all("still waiting for an answer after" in s and "gives up after 1 s" in s for s in said)
    assert bounded.call_within(lambda: 42, "quick", 1.0, said.append) == 42
    with pytest.raises(KeyError):
        bounded.call_within(lambda: {}["x"], "raises", 1.0, said.append)


# -- one bad trajectory in a batch -------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(bad=st.integers(0, 7), span_id=st.sampled_from(["zz" * 8, "abc", "0x12345678901234", "é" * 16]))
def test_a_trajectory_whose_spans_cannot_be_sent_is_refused_alone(
    run: str, tmp_path_factory: pytest.TempPathFactory, bad: int, span_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file whose one trajectory has a span id OTLP cannot carry: that one is refused and named, the 7 others go, exit 1."""
    import pyarrow as pa

    from tracer import schema as S
    from tracer.read import list_trace_files, read_file_metadata
    from tracer.storage.writer import SpanWriter

    rows = tracer.read_spans(run).to_pylist()
    victim = sorted({r[S.TRACE_ID] for r in rows})[bad]
    for r in rows:
        if r[S.TRACE_ID] == victim and r[S.PARENT_SPAN_ID] is not None:
            r[S.SPAN_ID] = span_id
    out = tmp_path_factory.mktemp("bad-id")
    meta = read_file_metadata(list_trace_files(run)[0])
    writer = SpanWriter(str(out), {k: v for k, v in meta.items() if isinstance(k, str)})
    writer.write(pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA))
    writer.close()
    receiver = OtlpReceiver()
    try:
        code, said = _cli(capsys, str(out), "--to", "otlp", "--endpoint", receiver.url)
    finally:
        receiver.close()
    assert code == 1, said
    assert f"otlp: sent 7 trajectories ({len(receiver.spans)} spans)" in said  # the refused one's spans never counted
    assert f"refused by otlp, not sent: trajectory {victim}: its payload cannot be built" in said
    assert {tid for tid, _ in receiver.spans} == {r[S.TRACE_ID] for r in rows} - {victim}


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(fault=st.sampled_from(FAULTS), after=st.sampled_from((0, 1)))
def test_import_from_a_failing_mlflow_api_is_bounded_and_said(
    run: str, mlflow_server: str, tmp_path_factory: pytest.TempPathFactory, fault: str, after: int
) -> None:
    """import mlflow through a proxy whose API hangs, answers 500 or resets: BackendTimeoutError naming the server and what to do."""
    from tracer.exporters.bounded import BackendTimeoutError
    from tracer.exporters.mlflow import import_traces

    export_files(run, "mlflow", tracking_uri=mlflow_server, experiment="to-import", progress=False)
    proxy = FaultyProxy(mlflow_server, fault, after=after)
    try:
        with pytest.raises(BackendTimeoutError) as info:
            import_traces(proxy.url, "to-import", tmp_path_factory.mktemp("imp"), progress=False, timeout_s=3)
    finally:
        proxy.close()
    said = str(info.value)
    assert f"mlflow at {proxy.url}" in said and "no answer within 3 s" in said and "import again" in said, said

"""Fault injection: kill -9, full and unwritable disks, many writers, damaged files, a backend killed.

Run alone with ``pytest -m faults``. Each test adds its figures (faults
injected, spans acknowledged, spans recovered) to the terminal summary.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import random
import re
import signal
import time
from typing import Any

import pytest
from reliability_fixtures import FIGURES, read_quietly, start_fault_script
from storage_fixtures import copy_run

import tracer
from tracer.index import rollup

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("figures_report")]

KILLS = 24
KILL_SEED = 20261130
SPANS_PER_TRAJECTORY = 4  # tests/faults/writer.py: rollout, llm, tool, log_reward

#: What a reader may say about a file a killed writer left behind.
TORN_TAIL = re.compile(r"damaged after \d+ complete batch|empty file \(0 bytes\)|not a readable trace file")


def _wait_for_a_write(out: str, pid: int, limit_s: float = 10.0) -> None:
    """Return as soon as one of ``pid``'s trace files grows: a batch is being written right now."""
    import glob

    pattern = os.path.join(out, "faults", "kill9", f"*_{pid}_*.arrow")
    sizes: dict[str, int] = {}
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for path in glob.glob(pattern):
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if path in sizes and size != sizes[path]:
                return
            sizes[path] = size


def _kill_one(out: str, run: int, rng: random.Random) -> dict[str, Any]:
    """Start a writer, SIGKILL it at a random moment, return what it acknowledged.

    Moments: during start-up; at a random time while recording; or, after a
    random time, the instant one of its files grows (aiming inside a batch write).
    """
    moment = rng.choices(["startup", "recording", "writing"], weights=[0.15, 0.5, 0.35])[0]
    delay = rng.uniform(0.0, 3.0)
    proc = start_fault_script("writer.py", out, run, rng.randrange(2**31))
    assert proc.stdout is not None and proc.stderr is not None
    if moment != "startup":
        line = proc.stdout.readline()
        assert line.startswith("READY"), line + proc.stderr.read()
    time.sleep(delay)
    if moment == "writing":
        _wait_for_a_write(out, proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"writer {run} ended on its own ({proc.returncode}): {rest} {err}"
    assert "FAIL" not in rest, rest
    acks = [int(x) for x in re.findall(r"^ACK (\d+)$", rest, re.M)]
    return {"run": run, "acknowledged": max(acks, default=0), "moment": moment}


@pytest.mark.slow
def test_kill_dash_9_at_random_moments_loses_no_acknowledged_span(tmp_path: os.PathLike[str]) -> None:
    """24 writers killed with SIGKILL at seeded random moments: every span flush() acknowledged reads back."""
    out = os.path.join(os.fspath(tmp_path), "traces")
    rngs = [random.Random(KILL_SEED + run) for run in range(KILLS)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        runs = list(pool.map(lambda run: _kill_one(out, run, rngs[run]), range(KILLS)))

    spans, messages = read_quietly(tracer.read_spans, out, columns=["sample_index", "span_id", "trace_id"])
    per_sample = collections.Counter(spans["sample_index"].to_pylist())
    acknowledged = sum(r["acknowledged"] for r in runs) * SPANS_PER_TRAJECTORY
    for r in runs:
        missing = [i for i in range(r["acknowledged"]) if per_sample.get(f"{r['run']}-{i}") != SPANS_PER_TRAJECTORY]
        assert not missing, f"run {r['run']}: acknowledged {r['acknowledged']}, incomplete: {missing[:10]}"
    assert max(per_sample.values(), default=0) <= SPANS_PER_TRAJECTORY, "a span was read twice"
    ids = list(zip(spans["trace_id"].to_pylist(), spans["span_id"].to_pylist()))
    assert len(set(ids)) == len(ids)
    assert all(TORN_TAIL.search(m) for m in messages), messages
    files = tracer.list_trace_files(out)
    FIGURES["kill -9"] = {
        "kills": KILLS,
        "kills_during_startup": sum(r["moment"] == "startup" for r in runs),
        "kills_aimed_at_a_write": sum(r["moment"] == "writing" for r in runs),
        "spans_acknowledged": acknowledged,
        "spans_recovered": spans.num_rows,
        "files": len(files),
        "files_with_torn_tail": sum("damaged after" in m for m in messages),
        "files_without_a_batch": sum("damaged after" not in m for m in messages),
    }


# -- many writers, one directory ------------------------------------------------

PROCESSES = 3  # of each start method
THREADS = 4
PER_THREAD = 100


@pytest.mark.slow
def test_many_processes_and_threads_share_one_directory_without_collisions(trace_dir: str) -> None:
    """Spawned and forked processes with 4 threads each, plus the parent: every span is present exactly once."""
    import multiprocessing

    from faults import workers

    tracer.init(output_dir=trace_dir, project_name="faults", experiment_name="many", flush_interval_s=0.01)
    workers.record_trajectories("parent-before-fork", 20)
    procs = []
    for method in ("spawn", "fork"):
        ctx = multiprocessing.get_context(method)
        for p in range(PROCESSES):
            name = f"{method}{p}"
            out = trace_dir if method == "spawn" else None  # a forked child keeps the parent's config
            proc = ctx.Process(target=workers.record_in_threads, args=(name, THREADS, PER_THREAD, out), name=name)
            proc.start()
            procs.append(proc)
    workers.record_trajectories("parent", 200)
    assert tracer.shutdown().ok
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"

    spans = tracer.read_spans(trace_dir, columns=["trace_id", "span_id", "sample_index"])
    expected = {f"parent-before-fork-{i}" for i in range(20)} | {f"parent-{i}" for i in range(200)}
    for proc in procs:
        expected |= {f"{proc.name}-t{t}-{i}" for t in range(THREADS) for i in range(PER_THREAD)}
    per_sample = collections.Counter(spans["sample_index"].to_pylist())
    assert set(per_sample) == expected
    assert set(per_sample.values()) == {workers.SPANS_PER_TRAJECTORY}
    ids = list(zip(spans["trace_id"].to_pylist(), spans["span_id"].to_pylist()))
    assert len(set(ids)) == len(ids), "duplicate span ids"
    trace_of: dict[str, set[str]] = collections.defaultdict(set)
    for trace_id, sample in zip(spans["trace_id"].to_pylist(), spans["sample_index"].to_pylist()):
        trace_of[sample].add(trace_id)
    assert all(len(t) == 1 for t in trace_of.values()), "a trajectory's spans carry two trace ids"
    assert len({next(iter(t)) for t in trace_of.values()}) == len(expected), "two trajectories share a trace id"
    files = tracer.list_trace_files(trace_dir)
    owners: dict[str, set[str]] = {}
    for file, batch in tracer.iter_batches(trace_dir, ["sample_index"]):
        owners.setdefault(file, set()).update(s.rsplit("-", 1)[0].split("-t")[0] for s in batch.column(0).to_pylist())
    pids = [tracer.read_file_metadata(f)["rollout_trace.pid"] for f in files]
    assert all(len(o) == 1 or o <= {"parent", "parent-before-fork"} for o in owners.values()), owners
    assert len({os.path.basename(f).split("_")[1] for f in files}) == len(set(pids)) == 1 + 2 * PROCESSES
    FIGURES["many writers"] = {
        "processes": 1 + 2 * PROCESSES,
        "threads": 1 + 2 * PROCESSES * THREADS,
        "files": len(files),
        "spans_expected": len(expected) * workers.SPANS_PER_TRAJECTORY,
        "spans_read": spans.num_rows,
    }


def test_forked_child_that_never_flushes_still_writes_its_spans_at_exit(trace_dir: str) -> None:
    """A multiprocessing fork child records and returns without flush(): its spans are written at its exit (os._exit skips atexit)."""
    import multiprocessing

    from faults import workers

    tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    proc = multiprocessing.get_context("fork").Process(target=workers.record_and_return, args=("child", 40))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    tracer.shutdown()
    samples = tracer.read_spans(trace_dir, columns=["sample_index"])["sample_index"].to_pylist()
    assert len([s for s in samples if s.startswith("child-")]) == 40 * workers.SPANS_PER_TRAJECTORY


@pytest.mark.slow
def test_read_trajectories_while_writers_append_pairs_each_reward_with_its_own_extras(trace_dir: str) -> None:
    """Reading a directory two processes are appending to: every trajectory's reward_info belongs to its own reward."""
    import json

    procs = [start_fault_script("reward_writer.py", trace_dir) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        checked = 0
        for _ in range(10):
            table, _ = read_quietly(tracer.read_trajectories, trace_dir)
            for reward, info in zip(table["reward"].to_pylist(), table["reward_info"].to_pylist()):
                assert info is not None and json.loads(info)["advantage"] == reward * 10, (reward, info)
                checked += 1
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert checked > 0


# -- damaged files ----------------------------------------------------------------

BATCHES = 5
TRAJECTORIES_PER_BATCH = 10


@pytest.fixture(scope="module")
def damaged_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A recorded run (conversation convention) plus every kind of damaged file beside its good files."""
    from export_fixtures import record_run

    root = tmp_path_factory.mktemp("damaged")
    run_dir = record_run(root / "traces")
    good = tracer.read_spans(run_dir, columns=["span_id"]).num_rows
    good_trajectories = tracer.read_trajectories(run_dir).num_rows
    # A second writer's file, written one flush per batch, to be torn after a known number of batches.
    from faults import workers

    tracer.init(output_dir=os.fspath(root / "tear"), flush_interval_s=60.0)
    for b in range(BATCHES):
        workers.record_trajectories(f"tear{b}", TRAJECTORIES_PER_BATCH)
        assert tracer.flush().ok
    tracer.shutdown()
    (source,) = tracer.list_trace_files(os.fspath(root / "tear"))
    with open(source, "rb") as f:
        data = f.read()
    damaged = {
        "torn.arrow": data[: len(data) * 7 // 10],
        "header_only.arrow": data[:200],
        "zero.arrow": b"",
        "garbage.arrow": random.Random(7).randbytes(5000),
        "text.arrow": b"spans: none, this is a note someone saved with the wrong name\n" * 20,
    }
    for name, content in damaged.items():
        with open(os.path.join(run_dir, name), "wb") as f:
            f.write(content)
    os.symlink(os.path.join(run_dir, "no-such-target.arrow"), os.path.join(run_dir, "dangling.arrow"))
    _write_foreign_files(run_dir)
    return {"dir": run_dir, "good_spans": good, "good_trajectories": good_trajectories, "damaged": damaged}


def _write_foreign_files(run_dir: str) -> None:
    """An Arrow stream that is not a trace file, and a trace file from a future major format."""
    import pyarrow as pa

    table = pa.table({"x": [1, 2, 3]})
    with pa.OSFile(os.path.join(run_dir, "foreign.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    future = tracer.schema.SPAN_SCHEMA.with_metadata({"rollout_trace.schema_version": "99.0"})
    with pa.OSFile(os.path.join(run_dir, "future.arrow"), "wb") as f, pa.ipc.new_stream(f, future) as w:
        w.write_batch(pa.RecordBatch.from_pylist([], schema=future))


DAMAGED_NAMES = (
    "torn.arrow",
    "header_only.arrow",
    "zero.arrow",
    "garbage.arrow",
    "text.arrow",
    "dangling.arrow",
    "foreign.arrow",
    "future.arrow",
)


def _torn_recovered(messages: list[str]) -> int:
    # read_trajectories reads the files twice (reward attributes), so it may warn twice.
    (torn,) = {m for m in messages if "torn.arrow" in m}
    match = re.search(r"recovered (\d+) span", torn)
    assert match, torn
    return int(match.group(1))


def test_read_spans_keeps_the_rest_and_names_every_damaged_file(damaged_dir: dict[str, Any]) -> None:
    """read_spans over a directory with 8 kinds of damaged file: all good spans, whole batches of the torn file, one warning per damaged file."""
    spans, messages = read_quietly(tracer.read_spans, damaged_dir["dir"])
    for name in DAMAGED_NAMES:
        assert sum(name in m for m in messages) == 1, f"{name}: {messages}"
    recovered = _torn_recovered(messages)
    per_batch = TRAJECTORIES_PER_BATCH * 3
    assert recovered % per_batch == 0 and 0 < recovered < BATCHES * per_batch
    assert spans.num_rows == damaged_dir["good_spans"] + recovered


def test_read_trajectories_keeps_the_rest(damaged_dir: dict[str, Any]) -> None:
    """read_trajectories over the damaged directory returns every good trajectory and those of the torn file's whole batches."""
    table, messages = read_quietly(tracer.read_trajectories, damaged_dir["dir"])
    recovered = _torn_recovered(messages)
    assert table.num_rows == damaged_dir["good_trajectories"] + recovered // 3
    assert all(any(name in m for m in messages) for name in DAMAGED_NAMES), messages


def test_each_damaged_file_alone_reads_without_raising(damaged_dir: dict[str, Any]) -> None:
    """Every damaged file, read on its own by every reader, warns and returns (never raises)."""
    for name in DAMAGED_NAMES:
        path = os.path.join(damaged_dir["dir"], name)
        if not os.path.exists(path):  # the dangling link: a directory listing still names it
            continue
        for reader in (tracer.read_spans, tracer.read_trajectories):
            _, messages = read_quietly(reader, path)
            assert messages, f"{reader.__name__}({name}) said nothing"


def test_check_finds_the_damage_and_repair_keeps_every_readable_span(
    damaged_dir: dict[str, Any], tmp_path: os.PathLike[str]
) -> None:
    """`rollout-trace check` exits 1 on the damaged directory; after --repair it exits 0, readers warn no more, no span is lost."""
    import subprocess
    import sys

    run = os.path.join(os.fspath(tmp_path), "run")
    copy_run(damaged_dir["dir"], run, symlinks=True)
    before, messages = read_quietly(tracer.read_spans, run, columns=["span_id"])
    cli = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    check = subprocess.run([cli, "check", run], capture_output=True, text=True, timeout=300)
    assert check.returncode == 1, check.stdout + check.stderr
    for name in ("torn.arrow", "zero.arrow", "garbage.arrow", "text.arrow", "header_only.arrow"):
        assert name in check.stdout, check.stdout
    repair = subprocess.run([cli, "check", run, "--repair"], capture_output=True, text=True, timeout=300)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    after, messages_after = read_quietly(tracer.read_spans, run, columns=["span_id"])
    assert after.num_rows == before.num_rows
    FIGURES["check --repair"] = {
        "damaged_files": len(DAMAGED_NAMES),
        "reader_warnings_before": len(messages),
        "reader_warnings_after": len(messages_after),
        "spans_before": before.num_rows,
        "spans_after": after.num_rows,
    }


def test_wandb_export_skips_damaged_files_and_says_so(damaged_dir: dict[str, Any], tmp_path: os.PathLike[str]) -> None:
    """The wandb exporter (offline) exports every readable trajectory of the damaged directory and warns per damaged file."""
    wandb_export = pytest.importorskip("tracer.exporters.wandb", reason="wandb exporter not installed")
    pytest.importorskip("wandb")
    from export_fixtures import wandb_env

    with pytest.MonkeyPatch.context() as mp:
        wandb_env(mp, os.path.join(os.fspath(tmp_path), "wandb"))
        report, messages = read_quietly(wandb_export.export_files, damaged_dir["dir"], progress=False)
        import wandb

        wandb.teardown()
    recovered = _torn_recovered(messages)
    assert report.trajectories_sent + report.trajectories_skipped >= damaged_dir["good_trajectories"] + recovered // 3
    assert report.trajectories_sent > 0
    for name in DAMAGED_NAMES:
        assert any(name in m for m in messages), f"{name} not reported: {messages}"


def test_viewer_shows_the_rest_and_lists_the_damaged_files(damaged_dir: dict[str, Any]) -> None:
    """The viewer (Streamlit AppTest) over the damaged directory: no exception, every damaged file named, good trajectories counted."""
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit not installed")
    from reliability_fixtures import REPO

    app = os.path.join(REPO, "viewer", "app.py")
    if not os.path.exists(app):
        pytest.skip("viewer/app.py is not in this tree yet")
    at = testing.AppTest.from_file(app, default_timeout=120)
    at.query_params["path"] = damaged_dir["dir"]
    with warnings_suppressed():
        at.run()
    assert not at.exception, at.exception[0].message
    shown = " ".join(w.value.replace("\\", "") for w in at.warning)
    missing = [n for n in DAMAGED_NAMES if n not in shown]
    assert not missing, f"viewer did not name {missing}: {shown[:2000]}"
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["trajectories"]) >= damaged_dir["good_trajectories"]


def warnings_suppressed() -> Any:
    """TraceFileWarning is expected here; the viewer shows it on the page."""
    import warnings

    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore", tracer.TraceFileWarning)

    class _Exit:
        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            ctx.__exit__(*exc)

    return _Exit()


# -- full and unwritable disks ------------------------------------------------------


def _count_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.name == "rollout_trace" and r.levelno >= logging.WARNING)


def _record_checked(prefix: str, n: int) -> None:
    """Record ``n`` trajectories; the decorated function returns its value normally."""
    from faults import workers

    for i in range(n):
        with tracer.rollout_trace_attr(sample_index=f"{prefix}-{i}", step=0):
            out = workers.agent_loop(i)
        assert out["messages"][0]["content"] == str(i)


@pytest.fixture()
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage failures are the tracer's to count, not to raise: turn off the tests' strict mode."""
    monkeypatch.delenv(tracer.config.ENV_STRICT, raising=False)


def test_full_disk_keeps_the_rollout_running_reports_once_and_resumes(
    lenient: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A 2 MB tmpfs filled up: rollouts go on, one warning, flush() counts the failed spans; space back, recording resumes."""
    from reliability_fixtures import fill_disk, small_disk

    caplog.set_level(logging.WARNING, logger="rollout_trace")
    with small_disk("2m") as disk:
        tracer.init(output_dir=disk, project_name="faults", experiment_name="full", flush_interval_s=0.02)
        _record_checked("before", 50)
        assert tracer.flush().ok
        filler = fill_disk(disk)
        results = []
        for k in range(5):
            _record_checked(f"full{k}", 100)
            results.append(tracer.flush())
        assert all(not r.ok and "No space left on device" in r.message for r in results), results
        assert [r.spans_failed for r in results] == sorted({r.spans_failed for r in results}) and results[
            0
        ].spans_failed > 0
        assert _count_warnings(caplog) == 1
        os.remove(filler)
        _record_checked("after", 50)
        after = tracer.flush()
        assert after.ok and after.spans_failed == results[-1].spans_failed, after
        assert after.spans_written == results[-1].spans_written + 50 * 2
        tracer.shutdown()
        spans, messages = read_quietly(tracer.read_spans, disk, columns=["sample_index"])
        samples = collections.Counter(s.rsplit("-", 1)[0] for s in spans["sample_index"].to_pylist())
        assert samples["before"] == samples["after"] == 50 * 2
        assert all(TORN_TAIL.search(m) for m in messages), messages
        assert _count_warnings(caplog) == 1
    FIGURES["disk full"] = {
        "disk": "tmpfs 2 MiB",
        "spans_failed_while_full": results[-1].spans_failed,
        "warnings_logged": 1,
        "spans_written_after_space_returned": 100,
    }


def test_flush_is_ok_again_once_space_returns(lenient: None) -> None:
    """After a full disk is freed, a flush of newly recorded spans is ok again."""
    from reliability_fixtures import fill_disk, small_disk

    with small_disk("2m") as disk:
        tracer.init(output_dir=disk, flush_interval_s=0.02)
        filler = fill_disk(disk)
        _record_checked("full", 100)
        assert not tracer.flush().ok
        os.remove(filler)
        _record_checked("after", 10)
        result = tracer.flush()
        tracer.shutdown()
    assert result.ok, result


def test_file_size_limit_acts_like_a_full_disk_without_root(trace_dir: str) -> None:
    """RLIMIT_FSIZE (no root needed): rollouts go on, one warning, failures counted; limit lifted, recording resumes."""
    import json

    proc = start_fault_script("file_size_limit.py", trace_dir, 100_000)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    phases = report["phases"]
    assert report["returned_normally"] and len(report["warnings"]) == 1, report["warnings"]
    over = [phases[f"over{k}"] for k in range(3)]
    assert all(not p["ok"] and "File too large" in p["message"] for p in over), over
    assert 0 < over[0]["spans_failed"] < over[1]["spans_failed"] < over[2]["spans_failed"]
    assert phases["after"]["ok"] and phases["after"]["spans_written"] == phases["over2"]["spans_written"] + 40
    spans, messages = read_quietly(tracer.read_spans, trace_dir, columns=["sample_index"])
    samples = collections.Counter(s.rsplit("-", 1)[0] for s in spans["sample_index"].to_pylist())
    assert samples == {"small": 10, "after": 40}
    assert all(TORN_TAIL.search(m) for m in messages), messages


def test_output_dir_under_a_regular_file_keeps_the_rollout_running(
    lenient: None, tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An output directory that cannot exist (a path under a file): rollouts go on, one warning, flush() says why."""
    caplog.set_level(logging.WARNING, logger="rollout_trace")
    blocker = os.path.join(os.fspath(tmp_path), "a-file")
    # tracer.init refuses a path under a file (TraceConfigError); the file appears after it.
    tracer.init(output_dir=os.path.join(blocker, "traces"), flush_interval_s=0.02)
    with open(blocker, "w") as f:
        f.write("not a directory")
    for k in range(3):
        _record_checked(f"r{k}", 20)
        result = tracer.flush()
        assert not result.ok and result.spans_failed == (k + 1) * 40
        assert "Not a directory" in result.message and blocker in result.message
    assert _count_warnings(caplog) == 1


def test_read_only_filesystem_keeps_the_rollout_running_and_resumes(
    lenient: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk remounted read-only mid-run: rollouts go on, one warning; remounted read-write, recording resumes."""
    import subprocess

    from reliability_fixtures import small_disk

    caplog.set_level(logging.WARNING, logger="rollout_trace")
    with small_disk("4m") as disk:
        tracer.init(output_dir=disk, flush_interval_s=0.02, max_file_bytes=4096)
        _record_checked("before", 20)
        assert tracer.flush().ok
        rollup.wait_idle()  # the run's rollup, updated after each rotation: mount refuses while it writes
        subprocess.run(["mount", "-o", "remount,ro", disk], check=True)
        try:
            _record_checked("ro", 50)
            result = tracer.flush()
        finally:
            subprocess.run(["mount", "-o", "remount,rw", disk], check=True)
        assert not result.ok and result.spans_failed > 0 and "Read-only file system" in result.message
        _record_checked("after", 20)
        after = tracer.flush()
        assert after.ok and after.spans_failed == result.spans_failed
        tracer.shutdown()
        spans, _ = read_quietly(tracer.read_spans, disk, columns=["sample_index"])
        samples = collections.Counter(s.rsplit("-", 1)[0] for s in spans["sample_index"].to_pylist())
        assert samples["before"] == samples["after"] == 40
    assert _count_warnings(caplog) == 1

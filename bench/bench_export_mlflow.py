"""Benchmark: exporting trace files to MLflow (SQLite store), fast path vs MLflow's public span API.

Records a synthetic run with tracer's public API (agent-loop shaped: a rollout
root, 3 llm turns with token ids, 2 tool calls of which some fail, a reward),
then exports it with :func:`tracer.exporters.mlflow.export_files`:

- ``fast``: span entities built by the exporter, ``log_spans`` in batches of 100
  traces (the default on mlflow 3.17.x);
- ``public``: a loop over MLflow's public span API (``mlflow.start_span_no_context``
  / ``span.end`` with the original times), what works on every mlflow version.

Both into fresh SQLite stores (tables created before timing), in the same run.
Prints traces/s of each, the ratio, and checks that no span was lost (the
store's span count equals the files').

Usage::

    .venv/bin/python bench/bench_export_mlflow.py [--trajectories 1024] [--public-trajectories 128] [--repeat 2] [--server]
"""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import sys
import tempfile
import time

import tracer
from tracer.exporters import mlflow as mlflow_export

PROJECT = "bench"
EXPERIMENT = "export"
GROUP = 8


class _Tok:
    def batch_decode(self, batch: list[list[int]], **_: object) -> list[str]:
        return [" ".join(f"t{i}" for i in ids) for ids in batch]


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(prompt_ids: list[int], turn: int) -> dict:
    ids = list(range(1000 + turn, 1000 + turn + 120))
    return {"response_ids": ids, "logprobs": [-0.01] * len(ids), "finish_reason": "tool_calls" if turn < 2 else "stop"}


@tracer.rollout_trace_op(kind="tool", name="python")
def _tool(code: str) -> str:
    if "fail" in code:
        raise RuntimeError("tool failed: " + code)
    return "result " * 20


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _agent(question: str, n: int) -> dict:
    messages: list[dict] = [
        {"role": "system", "content": "You are a helpful agent. " * 10},
        {"role": "user", "content": question},
    ]
    for turn in range(3):
        _generate(list(range(200 + 40 * turn)), turn)
        if turn < 2:
            code = f"print({n} * {turn})" + (" fail" if (n + turn) % 5 == 0 else "")
            call = {"id": f"c{turn}", "type": "function", "function": {"name": "python", "arguments": code}}
            messages.append({"role": "assistant", "content": f"Turn {turn}: let me run code.", "tool_calls": [call]})
            try:
                out = _tool(code)
            except RuntimeError as exc:
                out = str(exc)
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "name": "python", "content": out})
        else:
            messages.append({"role": "assistant", "content": "The answer is 42. " * 5})
    return {"messages": messages, "answer": "42", "num_turns": 3}


def record(out_dir: str, trajectories: int) -> str:
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend="arrow",
        output_dir=out_dir,
        token2text=True,
        tokenizer=_Tok(),
        flush_interval_s=0.5,
    )
    for i in range(trajectories):
        step, sample, n = i // (GROUP * 16), (i // GROUP) % 16, i % GROUP
        with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
            _agent(f"Question {sample}: what is 6 * 7? " * 3, n)
            tracer.log_reward(float(n % 2), advantage=float(n % 2) - 0.5)
    tracer.shutdown(timeout=120)
    return cfg.run_dir


def _db(tmp: str, name: str) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    path = os.path.join(tmp, name + ".db")
    uri = "sqlite:///" + path
    MlflowClient(tracking_uri=uri).search_experiments()  # create the tables before timing
    return uri, path


def _stored_spans(db_path: str) -> int:
    with sqlite3.connect(db_path) as con:
        return int(con.execute("select count(*) from spans").fetchone()[0])


def run_one(
    run_dir: str, tmp: str, method: str, steps: list[int] | None, tag: str
) -> tuple[float, float, int, int, int]:
    uri, path = _db(tmp, f"{method}-{tag}")
    t0, c0 = time.perf_counter(), time.process_time()
    report = mlflow_export.export_files(run_dir, tracking_uri=uri, steps=steps, progress=False, method=method)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dt, cpu, report.trajectories_sent, report.spans_sent, _stored_spans(path)


def _bench_server(run_dir: str, tmp: str) -> None:
    """Export to `mlflow server --workers 1` on 127.0.0.1 (fast path: OTLP requests of 100 traces)."""
    import signal
    import socket
    import subprocess
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = os.path.join(tmp, "server.db")
    cmd = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--backend-store-uri", f"sqlite:///{db}"]
    cmd += [
        "--default-artifact-root",
        os.path.join(tmp, "art"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        t0 = time.perf_counter()
        report = mlflow_export.export_files(run_dir, tracking_uri=url, progress=False)
        dt = time.perf_counter() - t0
        print(
            f"  server fast path (OTLP): {report.trajectories_sent} traces, {report.spans_sent} spans in {dt:6.2f} s "
            f"= {report.trajectories_sent / dt:7.1f} traces/s; spans in store {_stored_spans(db)}"
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its job consumers can outlive SIGTERM
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=1024, help="trajectories for the fast path")
    ap.add_argument("--public-trajectories", type=int, default=128, help="trajectories for the public-API loop (slow)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--server", action="store_true", help="also export to a local `mlflow server` (OTLP endpoint)")
    args = ap.parse_args()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    import mlflow

    with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp:
        os.chdir(tmp)  # MLflow writes a SQLite store's trace artifacts under ./mlruns
        t0 = time.perf_counter()
        run_dir = record(os.path.join(tmp, "traces"), args.trajectories)
        traj = tracer.read_trajectories(run_dir)
        spans_per = traj["num_spans"].to_pylist()
        print(
            f"mlflow {mlflow.__version__}; recorded {traj.num_rows} trajectories, "
            f"{sum(spans_per) / len(spans_per):.1f} spans each (+1 reward row) in {time.perf_counter() - t0:.1f} s"
        )
        steps_all = sorted(set(traj["step"].to_pylist()))
        per_step = GROUP * 16
        public_steps = steps_all[: max(1, args.public_trajectories // per_step)]
        rates: dict[str, list[float]] = {"fast": [], "public": []}
        cpu_rates: dict[str, list[float]] = {"fast": [], "public": []}
        for r in range(args.repeat):
            for method, steps in (("fast", None), ("public", public_steps)):
                dt, cpu, sent, spans, stored = run_one(run_dir, tmp, method, steps, str(r))
                rate = sent / dt
                rates[method].append(rate)
                cpu_rates[method].append(sent / cpu)
                lost = spans - stored
                print(
                    f"  {method:6s} run {r}: {sent} traces, {spans} spans in {dt:6.2f} s = {rate:7.1f} traces/s "
                    f"({sent / cpu:6.1f} per CPU-second); "
                    f"spans in store {stored} ({'none lost' if lost == 0 else f'{lost} LOST'})"
                )
        if args.server:
            _bench_server(run_dir, tmp)
        best = {m: max(v) for m, v in rates.items()}
        best_cpu = {m: max(v) for m, v in cpu_rates.items()}
        print(
            f"best wall-clock: fast {best['fast']:.1f} traces/s, public API {best['public']:.1f} traces/s, "
            f"ratio {best['fast'] / best['public']:.1f}x; per CPU-second: fast {best_cpu['fast']:.1f}, "
            f"public {best_cpu['public']:.1f}, ratio {best_cpu['fast'] / best_cpu['public']:.1f}x; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

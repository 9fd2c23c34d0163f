"""OTLP export into a real Arize Phoenix server on 127.0.0.1, read back through Phoenix's own REST API.

Phoenix is an optional extra (``pip install -e '.[phoenix]'``): it adds 62 packages,
its server takes 80-150 s to start on the CI machine (BENCHMARKS.md), and it upgrades
graphql-core past what MLflow's graphene accepts, so CI's default install leaves it
out and this module skips, saying why. Set ``ROLLOUT_TRACE_PHOENIX`` to the
``phoenix`` executable of a venv of its own to run it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from otlp_fixtures import record_tool_run, recorded_spans  # noqa: E402
from server_fixtures import free_port, serving  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.cli import main as rollout_trace_main  # noqa: E402

pytestmark = pytest.mark.slow

#: Environment variable: a ``phoenix`` executable to start (else the one beside this Python).
ENV_PHOENIX = "ROLLOUT_TRACE_PHOENIX"
#: Longest wait for the server to answer, and for spans to be ingested.
START_TIMEOUT_S = 300
INGEST_TIMEOUT_S = 60
PROJECT = "phx"


def _phoenix_executable() -> str | None:
    given = os.environ.get(ENV_PHOENIX)
    if given:
        return given
    beside = Path(sys.executable).with_name("phoenix")
    return str(beside) if beside.exists() else shutil.which("phoenix")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix server with a fresh working directory; yields its base URL."""
    exe = _phoenix_executable()
    if exe is None:
        pytest.skip(
            f"arize-phoenix is not installed: set {ENV_PHOENIX} to the phoenix executable of a venv of its own "
            f"(python -m venv V && V/bin/pip install arize-phoenix), or pip install -e '.[phoenix]'"
        )
    root = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(root),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with serving([exe, "serve"], root, url + "/v1/projects", START_TIMEOUT_S, env):
        yield url


def _record(out: str, steps: tuple[int, ...]) -> str:
    return record_tool_run(out, PROJECT, steps, samples=1, advantage=False)


def _phoenix_spans(url: str) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
        page = _get(f"{url}/v1/projects/{PROJECT}/spans?{urllib.parse.urlencode(query)}")
        spans += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def _wait_for_traces(url: str, want: set[str]) -> list[dict[str, Any]]:
    """Phoenix ingests in the background: poll until every wanted trace has its root; return their spans."""
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    while True:
        try:
            spans = _phoenix_spans(url)
        except OSError:  # the project appears with its first span
            spans = []
        roots = {sp["context"]["trace_id"] for sp in spans if sp["parent_id"] is None}
        if want <= roots or time.monotonic() > deadline:
            return [sp for sp in spans if sp["context"]["trace_id"] in want]
        time.sleep(0.5)


def _export(run: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", run, "--to", "otlp", "--endpoint", f"{url}/v1/traces", "--content", "--no-progress"]
    assert rollout_trace_main(argv) == 0
    capsys.readouterr()


def _recorded_spans(run: str) -> dict[str, dict[str, Any]]:
    return {span_id: r for (_, span_id), r in recorded_spans(run).items()}


def test_cli_export_lands_in_phoenix_with_genai_and_trajectory_attributes(
    phoenix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every span arrives in the run's Phoenix project: ids, parents, gen_ai attributes, the trajectory on the root."""
    run = _record(str(tmp_path), steps=(1, 2))
    _export(run, phoenix, capsys)
    summaries = {s[S.TRACE_ID]: s for s in tracer.read_trajectories(run).to_pylist()}
    spans = _wait_for_traces(phoenix, set(summaries))
    recorded = _recorded_spans(run)
    got = {sp["context"]["span_id"]: sp for sp in spans}
    assert set(got) == set(recorded)
    for sid, sp in got.items():
        assert sp["parent_id"] == recorded[sid][S.PARENT_SPAN_ID]
        assert sp["context"]["trace_id"] == recorded[sid][S.TRACE_ID]
        assert sp["name"] == recorded[sid][S.NAME]
    roots = [sp for sp in spans if sp["parent_id"] is None]
    assert {sp["context"]["trace_id"] for sp in roots} == set(summaries)
    for root in roots:
        a, s = root["attributes"], summaries[root["context"]["trace_id"]]
        assert a["gen_ai.operation.name"] == "invoke_agent"
        assert (a["rollout_trace.step"], a["rollout_trace.sample_index"], a["rollout_trace.rollout_n"]) == (
            s[S.STEP],
            s[S.SAMPLE_INDEX],
            s[S.ROLLOUT_N],
        )
        assert a["rollout_trace.reward"] == s[S.REWARD]
        assert a["rollout_trace.validate"] is False
    llm = [sp for sp in spans if sp["attributes"].get("rollout_trace.kind") == "llm"]
    tools = [sp for sp in spans if sp["attributes"].get("rollout_trace.kind") == "tool"]
    assert len(llm) == 2 * len(tools) == 2 * len(summaries)
    for sp in llm:
        a = sp["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.usage.output_tokens"] == 2
        assert json.loads(a["gen_ai.output.messages"])[0]["role"] == "assistant"
    failed = [sp for sp in tools if sp["status_code"] == "ERROR"]
    assert len(failed) == len(tools) // 2
    assert all("division by zero" in sp["attributes"]["gen_ai.tool.call.result"] for sp in failed)


def test_reexport_into_phoenix_adds_no_duplicates(
    phoenix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exporting a run again, with one more step recorded since, leaves one copy of every span in Phoenix."""
    out = str(tmp_path)
    run = _record(out, steps=(10,))
    _export(run, phoenix, capsys)
    first = set(tracer.read_trajectories(run)[S.TRACE_ID].to_pylist())
    _wait_for_traces(phoenix, first)
    _record(out, steps=(11,))  # the same run grows by a step; its old spans are sent again with it
    _export(run, phoenix, capsys)
    every = set(tracer.read_trajectories(run)[S.TRACE_ID].to_pylist())
    assert len(every) == 2 * len(first)
    spans = _wait_for_traces(phoenix, every)
    ids = [sp["context"]["span_id"] for sp in spans]
    assert len(ids) == len(set(ids)) == len(_recorded_spans(run))

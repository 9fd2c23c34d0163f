"""Every consumer shows the same trajectory: tracer, the viewer, MLflow, wandb and swanlab agree.

One recorded run holds failing tools, a trajectory without a reward,
validation rollouts, rollouts returning messages (this project's rollout)
and rollouts that do not (verl's TokenOutput and ToolResponse shapes).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
from typing import Any

import pytest

import tracer
from tracer.summary import prompt_and_response, trajectory_turns
from viewer import data as D

replica = pytest.importorskip("verl.workers.rollout.replica")
schemas = pytest.importorskip("verl.tools.schemas")


class WordTokenizer:
    def batch_decode(self, batch: list[list[int]], **_: Any) -> list[str]:
        return [" ".join(f"w{i}" for i in ids) for ids in batch]


class VerlLike:
    """verl-shaped calls: TokenOutput replies, (ToolResponse, reward, metrics) tool results, no messages."""

    tokenizer = WordTokenizer()

    @tracer.rollout_trace_op(kind="llm", name="generate")
    async def generate(self, *, prompt_ids: list[int], turn: int) -> Any:
        return replica.TokenOutput(token_ids=[10 + turn, 20 + turn], log_probs=[-0.5, -0.5], stop_reason="completed")

    @tracer.rollout_trace_op(kind="tool", name="calculator")
    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> Any:
        if parameters["fail"]:
            raise ZeroDivisionError("division by zero")
        return schemas.ToolResponse(text="7"), 0.0, {}

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    async def run(self, fail: bool, **kwargs: Any) -> dict[str, Any]:
        await self.generate(prompt_ids=[1, 2], turn=0)
        try:
            await self.execute("i", {"fail": fail})
        except ZeroDivisionError:
            pass
        await self.generate(prompt_ids=[1, 2, 3], turn=1)
        return {"prompt_ids": [1, 2], "response_ids": [10, 20, 11, 21]}


class Ours:
    """This project's rollout shape: llm dicts with response_text, a root returning messages."""

    tokenizer = WordTokenizer()

    @tracer.rollout_trace_op(kind="llm", name="generate")
    async def generate(self, prompt_ids: list[int], text: str) -> dict[str, Any]:
        return {"response_text": text, "logprobs": [-0.1, -0.2], "finish_reason": "stop"}

    @tracer.rollout_trace_op(kind="tool", name="calculator")
    async def execute(self, arguments: dict[str, Any]) -> str:
        if arguments["fail"]:
            raise ZeroDivisionError("division by zero")
        return "7"

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    async def run(self, question: str, fail: bool) -> dict[str, Any]:
        await self.generate([1], "calling")
        try:
            result = await self.execute({"fail": fail})
        except ZeroDivisionError as exc:
            result = f"error: {exc}"
        answer = f"answer {result}"
        await self.generate([1, 2], answer)
        call = {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"fail": 0}'}}
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "calling", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": result},
            {"role": "assistant", "content": answer},
        ]
        return {"messages": messages}


async def _rollouts() -> None:
    for step in (1, 2):
        for n in range(4):
            agent: Any = Ours() if n % 2 else VerlLike()
            with tracer.rollout_trace_attr(sample_index=0, step=step, rollout_n=n):
                if isinstance(agent, Ours):
                    await agent.run(question=f"q{step}{n}", fail=n == 1)
                else:
                    await agent.run(fail=n == 2, raw_prompt=[{"role": "user", "content": f"q{step}{n}"}])
                if n != 3:  # one trajectory per step without a reward
                    tracer.log_reward(float(n), advantage=n - 1.0)
        with tracer.rollout_trace_attr(sample_index=9, step=step, rollout_n=0, validate=True):
            await Ours().run(question="val", fail=False)
            tracer.log_reward(1.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recorded run, with what tracer itself says of each trajectory."""
    root = tmp_path_factory.mktemp("consumers")
    cfg = tracer.init(output_dir=str(root / "traces"), project_name="consumers", experiment_name="e1", token2text=True)
    asyncio.run(_rollouts())
    tracer.shutdown()
    spans = tracer.read_spans(cfg.run_dir)
    turns = trajectory_turns(spans)
    expected = {}
    for row in tracer.read_trajectories(cfg.run_dir).to_pylist():
        _, response = prompt_and_response(turns[row["trace_id"]])
        expected[row["trace_id"]] = (row["reward"], row["status"], row["num_tool_calls"], response)
    return {"root": root, "dir": cfg.run_dir, "expected": expected}


def test_the_run_has_what_the_comparison_needs(run: dict[str, Any]) -> None:
    """The run holds tool errors, missing rewards, validation, and both output shapes."""
    table = tracer.read_trajectories(run["dir"])
    assert table.num_rows == 10
    assert None in table["reward"].to_pylist() and True in table["validate"].to_pylist()
    assert sum(table["num_tool_errors"].to_pylist()) == 4
    assert {v[3] for v in run["expected"].values()} >= {"w11 w21", "answer 7", "answer error: division by zero"}


def test_viewer_agrees(run: dict[str, Any]) -> None:
    """The viewer's replay summary and conversation of each trajectory say what tracer says."""
    for tid, (reward, status, tools, response) in run["expected"].items():
        spans = D.load_trajectory(run["dir"], tid).table
        row = D.trajectory_summary(spans)
        assert row is not None
        assert (row[D.REWARD], row[D.STATUS], row[D.NUM_TOOL_CALLS]) == (reward, status, tools)
        assert prompt_and_response(D.turns(spans))[1] == response
        assert [m for m in D.messages(spans) if m["role"] == "assistant"][-1]["content"] == response


def test_mlflow_agrees(run: dict[str, Any]) -> None:
    """The MLflow traces (SQLite store, read back with mlflow.search_traces) carry the same reward, status, tool calls and final reply."""
    pytest.importorskip("mlflow")
    import mlflow

    from tracer.exporters import mlflow as mlflow_export

    uri = f"sqlite:///{run['root'] / 'mlflow.db'}"
    mlflow_export.export_files(run["dir"], tracking_uri=uri, progress=False)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("consumers")
    traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list", max_results=100)
    assert len(traces) == len(run["expected"])
    for trace in traces:
        tags = trace.info.tags
        reward, status, tools, response = run["expected"][tags["rollout_trace.trace_id"]]
        assert (float(tags["reward"]) if "reward" in tags else None) == reward
        assert tags["status"] == status
        spans = trace.data.spans
        assert sum(1 for s in spans if s.span_type == "TOOL") == tools
        last_llm = max((s for s in spans if s.span_type == "CHAT_MODEL"), key=lambda s: s.start_time_ns)
        assert last_llm.outputs["choices"][0]["message"]["content"] == response


def _check_rows(rows: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert {r["trace_id"] for r in rows} == set(expected)
    for r in rows:
        reward, status, tools, response = expected[r["trace_id"]]
        assert (r["reward"], r["status"], r["tool_calls"], r["response"]) == (reward, status, tools, response)


def test_wandb_rows_agree(run: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb's offline table rows, read back from the run files, carry the same values."""
    pytest.importorskip("wandb")
    from export_fixtures import wandb_env

    from tracer.exporters import wandb as wandb_export

    wandb_env(monkeypatch, run["root"] / "wandb")
    report = wandb_export.export_files(run["dir"], progress=False)
    import wandb

    wandb.teardown()
    prefix = "wandb run files: "
    run_files = next(d[len(prefix) :] for d in report.details if d.startswith(prefix))
    rows = []
    for file in glob.glob(os.path.join(run_files, "files", "media", "table", "**", "*.table.json"), recursive=True):
        with open(file, encoding="utf-8") as f:
            table = json.load(f)
        rows.extend(dict(zip(table["columns"], row, strict=True)) for row in table["data"])
    _check_rows(rows, run["expected"])


def test_swanlab_rows_agree(run: dict[str, Any]) -> None:
    """swanlab's local table rows, read back from the run files, carry the same values."""
    pytest.importorskip("swanlab")
    from tracer.exporters import swanlab as swanlab_export

    log_dir = str(run["root"] / "swanlog")
    swanlab_export.export_files(run["dir"], mode="local", log_dir=log_dir, progress=False)
    (run_dir,) = glob.glob(os.path.join(log_dir, "run-*"))
    rows = []
    for file in glob.glob(os.path.join(run_dir, "media", "echarts", "*.json")):
        with open(file, encoding="utf-8") as f:
            rows.extend(json.load(f)["rowData"])
    _check_rows(rows, run["expected"])

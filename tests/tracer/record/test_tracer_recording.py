"""Recording: span trees under concurrency, inputs/outputs, errors, rewards, trajectories."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading

import pytest

import tracer


def spans_by_name(path: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in tracer.read_spans(path).to_pylist():
        out.setdefault(row["name"], []).append(row)
    return out


class Agent:
    """A verl-style agent loop: methods decorated, self not recorded."""

    def __init__(self) -> None:
        self.tokenizer = None

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling: dict) -> dict:
        await asyncio.sleep(0)
        return {"response_ids": [len(prompt_ids)]}

    @tracer.rollout_trace_op(kind="tool")
    def calculator(self, expression: str) -> str:
        return str(sum(int(x) for x in expression.split("+")))

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    async def run(self, question: str) -> dict:
        out = await self.generate([1, 2, 3], {"temperature": 1.0})
        a, b = await asyncio.gather(
            asyncio.to_thread(self.calculator, "1+2"),
            asyncio.create_task(self.generate([4], {"temperature": 0.0})),
        )
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            c = await loop.run_in_executor(pool, tracer.propagate(self.calculator), "3+4")
        return {
            "messages": [{"role": "user", "content": question}],
            "answer": a + c,
            "n": out["response_ids"][0] + len(b),
        }


def test_span_tree_survives_gather_tasks_threads_and_pools(trace_dir: str) -> None:
    """Children started via gather, create_task, to_thread and a thread pool point to their parent."""
    tracer.init(output_dir=trace_dir)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(4)))

    async def one(i: int) -> None:
        with tracer.rollout_trace_attr(sample_index=i, step=3, rollout_n=i % 2, validate=False, split="train"):
            await Agent().run(f"q{i}")

    asyncio.run(main())
    assert tracer.flush().ok
    spans = tracer.read_spans(trace_dir).to_pylist()
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert len(roots) == 4 and {r["name"] for r in roots} == {"agent_loop"}
    by_trace = {r["trace_id"]: r for r in roots}
    for s in spans:
        root = by_trace[s["trace_id"]]
        assert (s["step"], s["sample_index"], s["rollout_n"]) == (3, root["sample_index"], root["rollout_n"])
        if s is not root:
            assert s["parent_span_id"] == root["span_id"]
    assert sorted(s["name"].split(".")[-1] for s in spans if s["trace_id"] == roots[0]["trace_id"]) == [
        "agent_loop",
        "calculator",
        "calculator",
        "generate",
        "generate",
    ]
    assert json.loads(roots[0]["attributes"]) == {"split": "train"}
    assert all('"self"' not in (s["inputs"] or "") for s in spans)


def test_hundreds_of_concurrent_trajectories_from_threads_and_tasks(trace_dir: str) -> None:
    """300 trajectories at once, from 3 threads each running 100 tasks, keep their spans apart."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="tool")
    async def tool(tag: str) -> str:
        await asyncio.sleep(0.001)
        return tag

    @tracer.rollout_trace_op(kind="rollout")
    async def rollout(tag: str) -> list[str]:
        return [await tool(f"{tag}/{k}") for k in range(3)]

    async def worker(thread_no: int) -> None:
        async def one(i: int) -> None:
            with tracer.rollout_trace_attr(sample_index=f"t{thread_no}-{i}", step=1):
                await rollout(f"t{thread_no}-{i}")

        await asyncio.gather(*(one(i) for i in range(100)))

    threads = [threading.Thread(target=asyncio.run, args=(worker(t),)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tracer.flush().ok
    spans = tracer.read_spans(trace_dir).to_pylist()
    assert len(spans) == 300 * 4
    for s in spans:
        if s["kind"] == "tool":
            assert json.loads(s["inputs"])["tag"].split("/")[0] == s["sample_index"]
    trajectories = tracer.read_trajectories(trace_dir)
    assert trajectories.num_rows == 300 and set(trajectories["num_tool_calls"].to_pylist()) == {3}
    assert len(set(s["span_id"] for s in spans)) == len(spans)


def test_inputs_are_captured_at_call_time_and_outputs_at_return(trace_dir: str) -> None:
    """Mutating an argument or the returned object afterwards does not change the record."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op
    def step(history: list[dict], ids: list[int]) -> dict:
        return {"history": history}

    history = [{"role": "user", "content": "hi"}]
    ids = [1, 2, 3]
    out = step(history, ids=ids)
    history.append({"role": "assistant", "content": "later"})
    history[0]["content"] = "changed"
    ids.append(4)
    out["history"].append("mutated")
    tracer.flush()
    row = tracer.read_spans(trace_dir).to_pylist()[0]
    assert json.loads(row["inputs"]) == {"history": [{"role": "user", "content": "hi"}], "ids": [1, 2, 3]}
    assert json.loads(row["outputs"]) == {"history": [{"role": "user", "content": "hi"}]}


def test_exception_is_recorded_and_reraised_unchanged(trace_dir: str) -> None:
    """A raising op records status error with type, message and traceback; the same exception propagates."""
    tracer.init(output_dir=trace_dir)
    boom = KeyError("missing tool")

    @tracer.rollout_trace_op(kind="tool")
    async def tool() -> None:
        raise boom

    with pytest.raises(KeyError) as caught:
        asyncio.run(tool())
    assert caught.value is boom
    tracer.flush()
    row = tracer.read_spans(trace_dir).to_pylist()[0]
    err = json.loads(row["error"])
    assert row["status"] == "error" and err["type"] == "KeyError" and "missing tool" in err["message"]
    assert "raise boom" in err["traceback"]


def test_cancellation_is_recorded_as_cancelled_and_reraised(trace_dir: str) -> None:
    """A cancelled op is recorded with status cancelled and CancelledError propagates."""
    tracer.init(output_dir=trace_dir)
    started = asyncio.Event()

    @tracer.rollout_trace_op(kind="llm")
    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    async def main() -> None:
        task = asyncio.create_task(slow())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    tracer.flush()
    assert tracer.read_spans(trace_dir)["status"].to_pylist() == ["cancelled"]


def test_backend_none_passes_straight_through(trace_dir: str) -> None:
    """With backend=None decorators call through and nothing is written."""
    tracer.init(output_dir=trace_dir, backend=None)

    @tracer.rollout_trace_op
    def f(x: int) -> int:
        return x + 1

    with tracer.rollout_trace_attr(sample_index=0, step=0):
        assert f(1) == 2
        tracer.log_reward(1.0)
    assert tracer.flush().ok
    import os

    assert not os.path.exists(trace_dir)


def test_trace_false_turns_recording_off_inside(trace_dir: str) -> None:
    """rollout_trace_attr(trace=False) records nothing inside its block."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op
    def f() -> int:
        return 1

    with tracer.rollout_trace_attr(sample_index=0, step=0, trace=False):
        f()
    with tracer.rollout_trace_attr(sample_index=1, step=0):
        f()
    tracer.flush()
    assert set(tracer.read_spans(trace_dir)["sample_index"].to_pylist()) == {"1"}


def test_attr_block_without_rollout_op_gets_a_root_named_after_it(trace_dir: str) -> None:
    """As in verl, the rollout_trace_attr block itself is the trajectory root when no rollout op is."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="llm")
    def generate(prompt_ids: list[int]) -> list[int]:
        return [1]

    with tracer.rollout_trace_attr(sample_index="uuid-1", step=2, rollout_n=1, name="agent", validate=True):
        generate([5])
        generate([6])
    with tracer.rollout_trace_attr(sample_index="empty", step=2):
        pass  # nothing recorded: no root either
    tracer.flush()
    spans = spans_by_name(trace_dir)
    (root,) = spans["agent"]
    assert root["kind"] == "rollout" and root["parent_span_id"] is None and root["validate"] is True
    assert {
        s["parent_span_id"]
        for s in spans["test_attr_block_without_rollout_op_gets_a_root_named_after_it.<locals>.generate"]
    } == {root["span_id"]}
    assert tracer.read_trajectories(trace_dir).num_rows == 1


def test_log_reward_inside_and_after_the_rollout(trace_dir: str) -> None:
    """Rewards logged inside the context, after it by key, or by a reward op reach their trajectory."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="rollout")
    async def rollout(i: int) -> int:
        return i

    @tracer.rollout_trace_op(kind="reward")
    def score(answer: int) -> float:
        return 0.25

    async def main() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=5, rollout_n=0):
            await rollout(0)
            tracer.log_reward(1.0, advantage=0.5, ground_truth="72")
        with tracer.rollout_trace_attr(sample_index=0, step=5, rollout_n=1):
            await rollout(1)
        with tracer.rollout_trace_attr(sample_index=0, step=5, rollout_n=2):
            await rollout(2)
            score(2)

    asyncio.run(main())
    tracer.log_reward(0.0, step=5, sample_index=0, rollout_n=1, advantage=-0.5)
    # A trainer in another process knows only the keys: the reward joins by them.
    tracer.log_reward(0.75, step=5, sample_index="other", rollout_n=0)
    tracer.flush()
    rows = {r["rollout_n"]: r for r in tracer.read_trajectories(trace_dir).to_pylist()}
    assert rows[0]["reward"] == 1.0 and json.loads(rows[0]["reward_info"]) == {"advantage": 0.5, "ground_truth": "72"}
    assert rows[1]["reward"] == 0.0 and json.loads(rows[1]["reward_info"]) == {"advantage": -0.5}
    assert rows[2]["reward"] == 0.25
    assert all(r["num_spans"] in (1, 2) for r in rows.values())


def test_log_reward_rejects_bad_input() -> None:
    """A non-number reward, or no way to find the trajectory, is a clear error."""
    tracer.init(backend="arrow", output_dir="/tmp/unused-rt")
    with pytest.raises(TypeError, match="real number"):
        tracer.log_reward("high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample_index"):
        tracer.log_reward(1.0)


def test_tracer_failures_never_reach_user_code(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unserialisable, hostile arguments are recorded as placeholders; the call returns normally."""
    monkeypatch.delenv(tracer.config.ENV_STRICT)
    tracer.init(output_dir=trace_dir)

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    @dataclasses.dataclass
    class Model:
        def model_dump(self) -> dict:
            raise ValueError("broken dump")

    @tracer.rollout_trace_op
    def f(a: object, b: object) -> object:
        return a

    h = Hostile()
    assert f(h, Model()) is h
    result = tracer.flush()
    assert result.ok
    row = tracer.read_spans(trace_dir).to_pylist()[0]
    assert "repr failed" in row["inputs"] and "repr failed" in row["outputs"]


def test_storage_failure_is_reported_not_raised(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output dir that cannot be created any more: the rollout runs, flush reports it, later spans still try."""
    import os

    monkeypatch.delenv(tracer.config.ENV_STRICT)
    blocker = os.path.join(str(tmp_path), "file")
    tracer.init(output_dir=os.path.join(blocker, "traces"))  # creatable at init (checked there) ...
    open(blocker, "w").close()  # ... then a file takes its parent's place

    @tracer.rollout_trace_op
    def f(x: int) -> int:
        return x * 2

    assert [f(i) for i in range(5)] == [0, 2, 4, 6, 8]
    result = tracer.flush()
    assert not result.ok and result.spans_failed == 5 and "write failed" in result.message
    assert f(9) == 18
    assert tracer.flush().spans_failed == 6


def test_kind_must_be_known() -> None:
    """rollout_trace_op(kind=...) with an unknown kind names the valid kinds."""
    with pytest.raises(ValueError, match="'rollout', 'llm', 'tool'"):
        tracer.rollout_trace_op(kind="agent")


def test_flush_is_ok_again_after_storage_recovers(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """flush().ok reports failures since the previous flush; totals keep counting."""
    import os
    import shutil

    monkeypatch.delenv(tracer.config.ENV_STRICT)
    parent = os.path.join(str(tmp_path), "out")
    tracer.init(output_dir=parent)  # init checks the directory can be created ...
    open(parent, "w").close()  # ... then a file takes the directory's place

    @tracer.rollout_trace_op
    def f(x: int) -> int:
        return x

    f(1)
    assert not tracer.flush().ok
    os.remove(parent)
    os.makedirs(parent)
    f(2)
    result = tracer.flush()
    assert result.ok and result.spans_failed == 1 and result.spans_written == 1
    shutil.rmtree(parent)

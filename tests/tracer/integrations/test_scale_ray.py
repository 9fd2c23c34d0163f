"""Ray: actors and tasks record into one directory, each worker process writing its own files."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from scale_fixtures import need

import tracer

pytestmark = pytest.mark.slow

TRAJECTORIES_PER_ACTOR = 12


async def _record(worker: str, n: int, step: int = 1) -> None:
    """n concurrent trajectories of one LLM call and one tool call each."""
    import asyncio

    @tracer.rollout_trace_op(kind="llm")
    async def generate(prompt_ids: list[int]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"response_ids": [7, 8]}

    @tracer.rollout_trace_op(kind="tool")
    async def calculator(expression: str) -> str:
        return "4"

    @tracer.rollout_trace_op(kind="rollout")
    async def rollout(i: int) -> dict[str, Any]:
        await generate([1, 2, i])
        await calculator("2+2")
        return {"messages": [{"role": "user", "content": f"{worker}-{i}"}]}

    async def one(i: int) -> None:
        with tracer.rollout_trace_attr(sample_index=f"{worker}-{i}", step=step, rollout_n=0):
            await rollout(i)

    await asyncio.gather(*(one(i) for i in range(n)))


@pytest.fixture(scope="module")
def ray_dirs(ray_cluster: dict[str, str]) -> dict[str, str]:
    """The module's Ray cluster (tests/tracer/integrations/conftest.py): trace folders of its runtime environment."""
    return ray_cluster


def _rollout_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class RolloutWorker:
        """A rollout actor: configures tracing in its own process, then records."""

        def __init__(self, name: str, config: tracer.TraceConfig | None = None) -> None:
            self.name = name
            tracer.init(config)

        async def run(self, n: int) -> int:
            await _record(self.name, n)
            tracer.flush()
            return os.getpid()

        def close(self) -> None:
            tracer.shutdown()

        def verl_hook_installed(self) -> bool:
            from tracer.integrations import verl as drop_in

            return drop_in.installed()

    return RolloutWorker


def test_actors_take_config_from_runtime_env(ray_dirs: dict[str, str]) -> None:
    """Three actors recording at once, configured only by runtime_env, each write their own files; all read back once."""
    import ray

    actor_cls = _rollout_actor()
    actors = [actor_cls.remote(f"a{i}") for i in range(3)]
    pids = ray.get([a.run.remote(TRAJECTORIES_PER_ACTOR) for a in actors])
    ray.get([a.close.remote() for a in actors])
    run_dir = os.path.join(ray_dirs["env"], "ray", "env")
    trajs = tracer.read_trajectories(run_dir).to_pylist()
    names = sorted(t["sample_index"] for t in trajs)
    assert names == sorted(f"a{a}-{i}" for a in range(3) for i in range(TRAJECTORIES_PER_ACTOR))
    assert all(t["num_llm_calls"] == 1 and t["num_tool_calls"] == 1 and t["status"] == "ok" for t in trajs)
    file_pids = {int(re.split(r"_", os.path.basename(f))[1]) for f in tracer.list_trace_files(run_dir)}
    assert file_pids == set(pids) and len(set(pids)) == 3


def test_actor_takes_explicit_config(ray_dirs: dict[str, str]) -> None:
    """A TraceConfig passed to the actor wins over the runtime environment's."""
    import ray

    cfg = tracer.TraceConfig(output_dir=ray_dirs["explicit"], project_name="ray", experiment_name="explicit")
    actor = _rollout_actor().remote("x", cfg)
    ray.get(actor.run.remote(5))
    ray.get(actor.close.remote())
    run_dir = os.path.join(ray_dirs["explicit"], "ray", "explicit")
    assert tracer.read_trajectories(run_dir).num_rows == 5
    meta = tracer.read_file_metadata(tracer.list_trace_files(run_dir)[0])
    assert json.loads(meta["rollout_trace.config"])["experiment_name"] == "explicit"


def test_tasks_record_into_the_same_directory(ray_dirs: dict[str, str]) -> None:
    """Plain Ray tasks record too: init once per worker process, flush before returning."""
    import asyncio

    import ray

    @ray.remote(num_cpus=0.5)
    def task(i: int) -> int:
        if tracer.get_config() is None:
            tracer.init(experiment_name="tasks")
        asyncio.run(_record(f"t{i}", 2, step=2))
        assert tracer.flush().ok
        return os.getpid()

    ray.get([task.remote(i) for i in range(4)])
    run_dir = os.path.join(ray_dirs["env"], "ray", "tasks")
    trajs = tracer.read_trajectories(run_dir).to_pylist()
    assert sorted(t["sample_index"] for t in trajs) == sorted(f"t{i}-{j}" for i in range(4) for j in range(2))


def test_setup_hook_installs_verl_drop_in_in_workers(ray_dirs: dict[str, str]) -> None:
    """runtime_env's worker_process_setup_hook runs tracer.integrations.verl.install in every worker."""
    import ray

    actor = _rollout_actor().remote("h")
    assert ray.get(actor.verl_hook_installed.remote()) is True
    ray.get(actor.close.remote())


def test_verl_modules_in_a_ray_worker_record_our_files(ray_dirs: dict[str, str]) -> None:
    """In a worker set up by the hook, verl's RolloutTraceConfig.init (as verl's AgentLoopWorker calls it) and verl's BaseTool record our files."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    import ray

    @ray.remote(num_cpus=0, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_PLUGINS": "none"}})
    class AgentLoopWorker:
        """Does what verl's AgentLoopWorker does with the trace config, without GPUs."""

        def __init__(self) -> None:
            from verl.utils.rollout_trace import RolloutTraceConfig

            RolloutTraceConfig.init("verl", "ray", "arrow", False, None)

        async def generate_sequences(self, n: int) -> list[str]:
            from verl.tools.base_tool import BaseTool
            from verl.tools.schemas import OpenAIFunctionToolSchema
            from verl.utils.rollout_trace import rollout_trace_attr, rollout_trace_op

            schema = OpenAIFunctionToolSchema.model_validate(
                {
                    "type": "function",
                    "function": {
                        "name": "noop",
                        "description": "d",
                        "parameters": {"type": "object", "properties": {}, "required": []},
                    },
                }
            )

            class ToyAgentLoop:
                @rollout_trace_op
                async def run(self, sampling_params: dict[str, Any]) -> dict[str, Any]:
                    response, _, _ = await BaseTool({}, schema).execute("i", {})
                    return {"answer": response.text}

            for i in range(n):
                with rollout_trace_attr(step=5, sample_index=i, rollout_n=0, validate=False, name="agent_loop"):
                    await ToyAgentLoop().run({})
            tracer.shutdown()
            return [type(rollout_trace_op).__module__, rollout_trace_op.__module__]

    modules = ray.get(AgentLoopWorker.remote().generate_sequences.remote(3), timeout=600)
    assert modules[1] == "tracer.integrations.verl"
    spans = tracer.read_spans(os.path.join(ray_dirs["env"], "verl", "ray")).to_pylist()
    roots = sorted((s for s in spans if s["parent_span_id"] is None), key=lambda s: s["sample_index"])
    assert [(r["sample_index"], r["step"], r["kind"]) for r in roots] == [(str(i), 5, "rollout") for i in range(3)]
    # As in verl's own tracing, the rollout_trace_attr block is the root and the loop's run is its child.
    assert all(r["name"] == "agent_loop" for r in roots)
    runs = [s for s in spans if s["name"].endswith("<locals>.ToyAgentLoop.run")]
    assert sorted(s["parent_span_id"] for s in runs) == sorted(r["span_id"] for r in roots)
    assert sum(s["kind"] == "tool" and s["name"] == "BaseTool.execute" for s in spans) == 3

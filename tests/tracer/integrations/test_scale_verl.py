"""verl drop-in: verl's rollout_trace API records rollout-trace files."""

from __future__ import annotations

import json
import os

import pytest
from scale_fixtures import need, run_script

import tracer
from tracer.integrations import verl as drop_in


@pytest.fixture(autouse=True)
def _reset_verl_config() -> object:
    """verl's config is a per-process singleton: forget it around each test."""
    drop_in.RolloutTraceConfig.reset()
    yield
    drop_in.RolloutTraceConfig.reset()
    drop_in.uninstall()


class _Client:
    @drop_in.rollout_trace_op
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> dict:
        return {"token_ids": [5, 6], "log_probs": [-0.1, -0.2]}


class _Tool:
    @drop_in.rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict) -> tuple[str, float, dict]:
        if parameters.get("fail"):
            raise ValueError("bad expression")
        return "42", 0.0, {}


class MathAgentLoop:
    def __init__(self) -> None:
        self.client, self.tool = _Client(), _Tool()

    @drop_in.rollout_trace_op
    async def run(self, sampling_params: dict, fail: bool = False) -> dict:
        await self.client.generate("r", prompt_ids=[1, 2, 3], sampling_params=sampling_params)
        try:
            await self.tool.execute("i", {"fail": fail})
        except ValueError:
            pass
        return {"prompt_ids": [1, 2, 3], "response_ids": [5, 6]}


async def _run_step(step: int, n: int) -> None:
    for i in range(n):
        with drop_in.rollout_trace_attr(sample_index=i, step=step, rollout_n=0, name="agent_loop"):
            await MathAgentLoop().run({"temperature": 1.0}, fail=i == 0)


def test_span_kind_from_verl_method_names() -> None:
    """Agent loops' run is the root, generate an LLM call, execute a tool call, the rest plain spans."""
    assert drop_in.span_kind("ToolAgentLoop.run") == "rollout"
    assert drop_in.span_kind("LLMServerClient.generate") == "llm"
    assert drop_in.span_kind("BaseTool.execute") == "tool"
    assert drop_in.span_kind("HermesToolParser.extract_tool_calls") is None


def test_the_first_paths_give_the_same_objects() -> None:
    """tracer.verl_compat (in Ray hooks already written) and tracer.verl_plugin (in earlier installs' entry points)."""
    import importlib

    from tracer.integrations import verl_plugin

    first = importlib.import_module("tracer.verl_compat")
    assert {"install", "installed", "uninstall", *drop_in.PROVIDED} <= set(drop_in.__all__)
    assert all(getattr(first, name) is getattr(drop_in, name) for name in drop_in.__all__)
    assert importlib.import_module("tracer.verl_plugin").tracer.integrations.verl_plugin is verl_plugin
    assert "tracer.verl_compat.install" in verl_plugin.HOOKS


def test_verl_api_records_trajectories(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """RolloutTraceConfig.init + the verl decorators write one trajectory per rollout_trace_attr block."""
    import asyncio

    monkeypatch.setenv(tracer.ENV_TRACE_DIR, trace_dir)
    drop_in.RolloutTraceConfig.init("gsm8k", "grpo", "arrow")
    asyncio.run(_run_step(step=3, n=4))
    tracer.flush()
    trajs = tracer.read_trajectories(trace_dir).to_pylist()
    assert sorted(t["sample_index"] for t in trajs) == ["0", "1", "2", "3"]
    assert {t["name"] for t in trajs} == {"agent_loop"}  # verl's block is the root, as in verl's traces
    assert [t["num_tool_errors"] for t in sorted(trajs, key=lambda t: t["sample_index"])] == [1, 0, 0, 0]
    assert all(t["num_llm_calls"] == 1 and t["step"] == 3 for t in trajs)
    assert os.path.isdir(os.path.join(trace_dir, "gsm8k", "grpo"))


def test_init_only_once_like_verl(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second RolloutTraceConfig.init is ignored until reset, as in verl."""
    monkeypatch.setenv(tracer.ENV_TRACE_DIR, trace_dir)
    drop_in.RolloutTraceConfig.init("p1", "e1", "arrow", token2text=True, max_samples_per_step_per_worker=2)
    drop_in.RolloutTraceConfig.init("p2", "e2", None)
    inst = drop_in.RolloutTraceConfig.get_instance()
    assert (inst.project_name, inst.get_backend(), inst.enable_token2text()) == ("p1", "arrow", True)
    assert inst.max_samples_per_step_per_worker == 2
    assert drop_in.RolloutTraceConfig.get_client() is tracer
    cfg = tracer.get_config()
    assert cfg is not None and cfg.project_name == "p1" and cfg.max_samples_per_step_per_worker is None


def test_backend_none_records_nothing(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """backend=None (verl's default) leaves tracing off and the decorators call straight through."""
    import asyncio

    monkeypatch.setenv(tracer.ENV_TRACE_DIR, trace_dir)
    drop_in.RolloutTraceConfig.init("p", "e", None)
    asyncio.run(_run_step(step=0, n=2))
    assert tracer.get_config() is None
    assert not os.path.exists(trace_dir)


def test_unknown_backend_warns_with_the_choices_and_records_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A backend neither rollout-trace nor verl has: a warning naming the valid ones; tracing stays off, as in verl."""
    with caplog.at_level("WARNING", logger="rollout_trace"):
        drop_in.RolloutTraceConfig.init("p", "e", "tensorboardx")
    assert "'tensorboardx' is unknown" in caplog.text and "valid: arrow" in caplog.text
    assert tracer.get_config() is None and drop_in.RolloutTraceConfig.get_client() is None


def test_earlier_tracer_init_keeps_its_other_fields(trace_dir: str) -> None:
    """Fields verl lacks (max_tokens, output_dir) come from a tracer.init made before verl's init."""
    tracer.init(output_dir=trace_dir, max_tokens=7)
    drop_in.RolloutTraceConfig.init("p", "e", "arrow")
    cfg = tracer.get_config()
    assert cfg is not None and (cfg.output_dir, cfg.max_tokens, cfg.project_name) == (trace_dir, 7, "p")


@pytest.mark.slow
def test_real_verl_modules_record_after_install(trace_dir: str) -> None:
    """With install(), verl's own BaseTool.execute and a class decorated by verl's decorator record our files."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    out = run_script(
        """
        import asyncio, json, sys
        import tracer.integrations.verl
        tracer.integrations.verl.install()
        from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
        from verl.tools.base_tool import BaseTool
        from verl.tools.schemas import OpenAIFunctionToolSchema
        from verl.workers.rollout.llm_server import LLMServerClient

        class EchoAgentLoop:
            def __init__(self):
                schema = OpenAIFunctionToolSchema.model_validate(
                    {"type": "function", "function": {"name": "noop", "description": "d",
                      "parameters": {"type": "object", "properties": {}, "required": []}}})
                self.tool = BaseTool({}, schema)

            @rollout_trace_op
            async def run(self, sampling_params, **kwargs):
                response, reward, metrics = await self.tool.execute("inst-1", {"x": 1})
                return {"num_turns": 2, "answer": response.text}

        async def main():
            for i in range(3):
                with rollout_trace_attr(sample_index=i, step=1, rollout_n=0, name="agent_loop"):
                    await EchoAgentLoop().run({})

        RolloutTraceConfig.init("verl-proj", "verl-exp", "arrow")
        asyncio.run(main())
        import tracer
        tracer.shutdown()
        print(json.dumps({"generate_is_ours": getattr(LLMServerClient.generate, "__rollout_trace_verl__", False)}))
        """,
        env={tracer.ENV_TRACE_DIR: trace_dir, "VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    flags = json.loads(out.strip().splitlines()[-1])
    assert flags["generate_is_ours"] is True
    spans = tracer.read_spans(os.path.join(trace_dir, "verl-proj", "verl-exp")).to_pylist()
    tools = [s for s in spans if s["kind"] == "tool"]
    assert len(tools) == 3 and {s["name"] for s in tools} == {"BaseTool.execute"}
    assert "Updated the tool state." in tools[0]["outputs"]
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert sorted(r["sample_index"] for r in roots) == ["0", "1", "2"]
    assert {r["name"] for r in roots} == {"agent_loop"}  # the rollout_trace_attr block, as in verl


@pytest.mark.slow
def test_install_after_import_patches_names_and_warns(trace_dir: str) -> None:
    """install() after verl's module was imported swaps its names in place and logs a warning."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    out = run_script(
        """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        import verl.utils.rollout_trace as original
        import tracer.integrations.verl as compat
        compat.install()
        print("PATCHED", original.rollout_trace_op is compat.rollout_trace_op)
        """,
        env={"VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    assert "PATCHED True" in out
    assert "imported before tracer.integrations.verl.install()" in out


@pytest.mark.slow
def test_documented_overrides_reach_every_ray_worker() -> None:
    """docs/scale.md's verl overrides compose with verl's own config into the runtime_env verl passes to ray.init."""
    need("verl", "--no-deps verl tensordict 'pyvers<0.2' omegaconf hydra-core codetiming")
    out = run_script(
        """
        import json, os, verl
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

        config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose("ppo_trainer", overrides=[
                "trainer.project_name=gsm8k", "trainer.experiment_name=grpo-7",
                "actor_rollout_ref.rollout.trace.backend=arrow",
                "actor_rollout_ref.rollout.trace.token2text=True",
                "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracer.integrations.verl.install",
                "+ray_kwargs.ray_init.runtime_env.env_vars.ROLLOUT_TRACE_DIR=s3://my-bucket/traces",
                "+ray_kwargs.ray_init.runtime_env.env_vars.ROLLOUT_TRACE_CONFIG="
                + "'" + json.dumps({"max_tokens": 4096, "upload_interval_s": 300}) + "'",
            ])
        # What verl.trainer.main_ppo.run_ppo does before ray.init:
        ray_init_kwargs = cfg.ray_kwargs.get("ray_init", {})
        runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), ray_init_kwargs.get("runtime_env", {}))
        print(json.dumps({
            "runtime_env": OmegaConf.to_container(runtime_env),
            "trace": OmegaConf.to_container(cfg.actor_rollout_ref.rollout.trace, resolve=True),
        }))
        """,
        env={"VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["runtime_env"]["worker_process_setup_hook"] == "tracer.integrations.verl.install"
    assert got["runtime_env"]["env_vars"]["ROLLOUT_TRACE_DIR"] == "s3://my-bucket/traces"
    assert json.loads(got["runtime_env"]["env_vars"]["ROLLOUT_TRACE_CONFIG"]) == {
        "max_tokens": 4096,
        "upload_interval_s": 300,
    }
    trace = got["trace"]
    assert (trace["project_name"], trace["experiment_name"], trace["backend"], trace["token2text"]) == (
        "gsm8k",
        "grpo-7",
        "arrow",
        True,
    )

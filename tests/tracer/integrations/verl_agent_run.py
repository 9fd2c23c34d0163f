"""Run verl 0.9.1's real agent loop on CPU with a scripted LLM server (a script, not a test module).

``python verl_agent_run.py MODEL_DIR WORK_DIR MODE STEPS SAMPLES`` drives
``AgentLoopWorker.generate_sequences`` -> ``ToolAgentLoop`` ->
``LLMServerClient.generate`` -> :class:`CalculatorTool` (a real ``BaseTool``)
with verl's trace config ``backend=mlflow, token2text=True``. ``MODE`` is
``verl`` (verl's own ``rollout_trace``) or ``dropin`` (``tracer.integrations.verl``
installed first). The LLM server answers every first turn with a Hermes
``<tool_call>`` and every second turn with an answer. MLflow's tracking URI
and rollout-trace's directory come from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

# Only the script's own command line names a mode; imported (by a Ray worker,
# for the tool class), the module does not read sys.argv.
MODE = sys.argv[3] if __name__ == "__main__" and len(sys.argv) > 3 else "verl"
if MODE == "dropin":
    import tracer.integrations.verl

    tracer.integrations.verl.install()

import numpy as np  # noqa: E402
from verl.tools.base_tool import BaseTool  # noqa: E402
from verl.tools.schemas import ToolResponse  # noqa: E402
from verl.utils.rollout_trace import rollout_trace_op  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
ANSWER = "The answer is 42."


class CalculatorTool(BaseTool):
    """Evaluates an arithmetic expression (digits and + - * / only); traced as verl's own tools are."""

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        expression = str(parameters.get("expression", ""))
        if not set(expression) <= set("0123456789+-*/ ()"):
            return ToolResponse(text=f"error: bad expression {expression!r}"), 0.0, {}
        return ToolResponse(text=str(eval(expression))), 0.0, {"expression": expression}  # noqa: S307


class ScriptedServer:
    """Stands in for a vLLM server actor: ``generate.remote(...)`` returns a TokenOutput."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.generate = self  # server.generate.remote(...)

    async def remote(
        self, *, request_id: str, prompt_ids: list[int], sampling_params: dict, **kwargs: Any
    ) -> TokenOutput:
        await asyncio.sleep(0)
        text = self.tokenizer.decode(prompt_ids)
        reply = ANSWER if "<tool_response>" in text else TOOL_CALL
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


class ScriptedClient(LLMServerClient):
    """verl's LLM client with the load balancer replaced by one scripted server.

    The server is given, or built on first use from the tokenizer verl's
    AgentLoopWorker hands its client with token2text (in a Ray actor).
    """

    server: ScriptedServer | None = None

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        if self.server is None:
            self.server = ScriptedServer(self.tokenizer)  # type: ignore[attr-defined]
        return "server-0", self.server

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        return None


def compose_config(
    model_dir: str, work_dir: str, project: str = "verl-fidelity", experiment: str = "", backend: str = "mlflow"
) -> Any:
    """verl's ppo_trainer config with the overrides this run needs."""
    import verl
    from hydra import compose, initialize_config_dir

    tool_config = os.path.join(work_dir, "tools.yaml")
    with open(tool_config, "w") as f:
        json.dump(
            {
                "tools": [
                    {
                        "class_name": "verl_agent_run.CalculatorTool",
                        "config": {"type": "native"},
                        "tool_schema": {
                            "type": "function",
                            "function": {
                                "name": "calculator",
                                "description": "Evaluate an arithmetic expression.",
                                "parameters": {
                                    "type": "object",
                                    "properties": {"expression": {"type": "string", "description": "e.g. 6*7"}},
                                    "required": ["expression"],
                                },
                            },
                        },
                    }
                ]
            },
            f,
        )
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"trainer.project_name={project}",
                "trainer.experiment_name=" + (experiment or MODE),
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=512",
                "actor_rollout_ref.rollout.response_length=256",
                "actor_rollout_ref.rollout.multi_turn.enable=True",
                "actor_rollout_ref.rollout.multi_turn.format=hermes",
                "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
                f"actor_rollout_ref.rollout.trace.backend={backend}",
                "actor_rollout_ref.rollout.trace.token2text=True",
            ],
        )


def make_batch(step: int, samples: int, first: int = 0) -> Any:
    """One step's batch: ``samples`` questions (indices from ``first``), two rollouts each (GRPO-style)."""
    from verl.protocol import DataProto

    raw, index = [], []
    for i in range(first, first + samples):
        for _ in range(2):
            raw.append(np.array([{"role": "user", "content": f"What is 6*7? (question {i})"}], dtype=object))
            index.append(i)
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array(raw + [None], dtype=object)[:-1],
            "index": np.array(index),
            "agent_name": np.array(["tool_agent"] * len(raw), dtype=object),
        }
    )
    batch.meta_info = {"global_steps": step, "validate": False}
    return batch


async def run(model_dir: str, work_dir: str, steps: int, samples: int) -> dict[str, Any]:
    """Build the worker, run ``steps`` steps, return what verl gave back."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = compose_config(model_dir, work_dir)
    client = ScriptedClient(config)
    worker = AgentLoopWorker(config, client)
    client.server = ScriptedServer(worker.tokenizer)
    turns = []
    for step in range(1, steps + 1):
        out = await worker.generate_sequences(make_batch(step, samples))
        turns.append([int(t) for t in out.non_tensor_batch["__num_turns__"]])
    return {"num_turns": turns}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    result = asyncio.run(run(sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5])))
    if MODE == "verl":
        import mlflow

        mlflow.flush_trace_async_logging()
    else:
        import tracer

        tracer.shutdown()
    print("RESULT " + json.dumps(result))

"""A verl job on Ray: two of verl 0.9.1's real AgentLoopWorkers as actors (a script, not a test module).

``python verl_ray_run.py ADDRESS MODEL_DIR WORK_DIR STEPS SAMPLES WAIT_S`` joins
the Ray cluster at ``ADDRESS`` as a job of its own, with the runtime
environment docs/verl.md tells verl users to give
(``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracer.integrations.verl.install``,
``...env_vars.ROLLOUT_TRACE_DIR=...``), and starts two
``ray.remote(AgentLoopWorker)`` actors, as verl's ``AgentLoopManager`` does,
each with verl's config (``trace.backend=mlflow``, ``token2text=True``) and
the scripted LLM client of ``verl_agent_run.py``. Each step both workers run
``generate_sequences`` on their half of the batch (``SAMPLES`` questions, two
rollouts each); ``WAIT_S`` seconds after the last step the job calls
``ray.shutdown()``, which ends the actors without running anything in them;
rollout-trace's verl plugin (loaded by ``import verl`` here too) then ships
from the files what their live exporters had not, and logs how many
(``rollout_trace`` INFO lines on stderr).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid

import ray

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2


def main(address: str, model_dir: str, work_dir: str, steps: int, samples: int, wait_s: float) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("rollout_trace").setLevel(logging.INFO)
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl_agent_run import ScriptedClient, compose_config, make_batch

    config = compose_config(model_dir, work_dir, project="verl-ray", experiment="ray")
    ray.init(
        address=address,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "tracer.integrations.verl.install",
            "env_vars": {
                "ROLLOUT_TRACE_DIR": os.path.join(work_dir, "traces"),
                "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"],
                "VERL_USE_EXTERNAL_PLUGINS": "none",
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
        },
    )
    worker_class = ray.remote(num_cpus=0)(AgentLoopWorker)
    workers = [
        worker_class.options(name=f"agent_loop_worker_{i}_{uuid.uuid4().hex[:8]}").remote(
            config, ScriptedClient(config)
        )
        for i in range(WORKERS)
    ]
    turns = []
    for step in range(1, steps + 1):
        outs = ray.get(
            [w.generate_sequences.remote(make_batch(step, samples, first=i * samples)) for i, w in enumerate(workers)]
        )
        turns.append([int(t) for out in outs for t in out.non_tensor_batch["__num_turns__"]])
    print("RESULT " + json.dumps({"num_turns": turns}), flush=True)
    time.sleep(wait_s)
    t0 = time.monotonic()
    ray.shutdown()
    print(f"SHUTDOWN_S {time.monotonic() - t0:.2f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))

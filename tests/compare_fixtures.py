"""Two small recorded runs that differ, with token stats and a recorded training config (tracer's public API)."""

from __future__ import annotations

from viewer_fixtures import _agent_loop

import tracer

PROJECT = "compare-test"
#: Run A's and B's training configs: they differ in lr and in one key only B has.
CONFIG_A = {"actor": {"lr": 1e-6, "clip": 0.2}, "data": {"train_batch_size": 8}, "api_key": "sk-secretsecretsecret12"}
CONFIG_B = {"actor": {"lr": 3e-6, "clip": 0.2}, "data": {"train_batch_size": 8}, "seed": 7}
#: The rollout's logprobs are -0.05 * k (viewer_fixtures); the trainer's differ by this on token 2 of turn 0.
SPIKE = 2.5
SPIKE_TOKEN = 2


def record_compare_run(output_dir: str, experiment: str, run_config: dict, reward_of: object) -> str:
    """Two steps x 3 prompts x 2 rollouts; ``reward_of(step, sample, n)``; token stats on every rollout's turn 0."""
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=experiment,
        backend="arrow",
        output_dir=output_dir,
        max_tokens=8,
        flush_interval_s=0.2,
        run_config=run_config,
    )
    for step in (1, 2):
        for sample in range(3):
            for n in range(2):
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    _agent_loop(f"What is {sample} + {n}?", step, sample, n)
                    rollout = [-0.05 * k for k in range(8)]
                    trainer = [lp - (SPIKE if k == SPIKE_TOKEN else 0.01) for k, lp in enumerate(rollout)]
                    tracer.log_token_stats(
                        0,
                        old_logprobs=trainer,
                        entropy=[0.1 * k for k in range(8)],
                        loss_mask=[1, 1, 1, 1, 1, 1, 0, 0],
                    )
                    tracer.log_reward(float(reward_of(step, sample, n)))  # type: ignore[operator]
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir

"""A small recorded run for the MLflow exporter's tests, made with tracer's public API.

A few steps, groups of 4 rollouts per prompt, llm spans with prompt and
response token ids (decoded by a tiny tokenizer object), tool spans of which
one raises, rewards with advantages, a validation rollout per step, and one
reward logged from outside its trajectory (joined by step/sample/rollout).
"""

from __future__ import annotations

import os
from typing import Any

from export_fixtures import calculator_agent

import tracer

PROJECT = "mlflow-test"
EXPERIMENT = "grpo-1"
STEPS = 2
PROMPTS = 2
GROUP = 4


class WordTokenizer:
    """Decodes id ``k`` to the word ``w<k>``: enough for token2text."""

    def batch_decode(self, batch: list[list[int]], **_: Any) -> list[str]:
        return [" ".join(f"w{i}" for i in ids) for ids in batch]


#: The exporter fixtures' loop, with per-token logprobs (ids decoded by :class:`WordTokenizer`) and a longer turn-1 prompt.
_agent_loop = calculator_agent(100, lambda turn: {"logprobs": [-0.1 * k for k in range(6)]}, [1, 2, 3, 4, 5])


def record_run(
    output_dir: str | os.PathLike[str], steps: int = STEPS, prompts: int = PROMPTS, group: int = GROUP, **init: Any
) -> str:
    """Record a small run under ``output_dir`` and return the run's directory.

    Step ``s``, prompt ``p``, rollout ``n`` gets reward ``(n + s) % 2`` and its
    group-normalised advantage; each step also has one validation rollout.
    The reward of step 1, prompt 0, rollout 3 is logged outside its trajectory.
    ``init`` overrides :func:`tracer.init` fields (backend, backend_options).
    """
    fields: dict[str, Any] = {
        "project_name": PROJECT,
        "experiment_name": EXPERIMENT,
        "backend": "arrow",
        "output_dir": os.fspath(output_dir),
        "token2text": True,
        "tokenizer": WordTokenizer(),
        "flush_interval_s": 0.2,
    }
    cfg = tracer.init(**{**fields, **init})
    for step in range(1, steps + 1):
        for sample in range(prompts):
            rewards = [float((n + step) % 2) for n in range(group)]
            mean = sum(rewards) / group
            for n in range(group):
                outside = (step, sample, n) == (1, 0, 3)
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    _agent_loop(f"What is {sample} + {n}?", sample, n)
                    if not outside:
                        tracer.log_reward(rewards[n], advantage=rewards[n] - mean)
                if outside:
                    tracer.log_reward(
                        rewards[n], step=step, sample_index=sample, rollout_n=n, advantage=rewards[n] - mean
                    )
        with tracer.rollout_trace_attr(sample_index=100, step=step, rollout_n=0, validate=True):
            _agent_loop("Validation: what is 2 + 2?", 100, 0)
            tracer.log_reward(1.0)
    tracer.flush()
    tracer.shutdown(timeout=60)
    return cfg.run_dir


def record_late_reward(output_dir: str | os.PathLike[str], **init: Any) -> str:
    """Record one trajectory, flush (live exporters ship it), then log its reward from outside; shut down."""
    cfg = tracer.init(project_name=PROJECT, experiment_name=EXPERIMENT, output_dir=os.fspath(output_dir), **init)
    with tracer.rollout_trace_attr(sample_index=7, step=1, rollout_n=0):
        _agent_loop("What is 3 + 4?", 7, 0)
    tracer.flush()
    tracer.log_reward(1.0, step=1, sample_index=7, rollout_n=0, advantage=0.25)
    tracer.shutdown(timeout=60)
    return cfg.run_dir


def trajectory_count(steps: int = STEPS, prompts: int = PROMPTS, group: int = GROUP) -> int:
    """Trajectories :func:`record_run` records."""
    return steps * (prompts * group + 1)


def mlflow_traces(tracking_uri: str, experiment: str = PROJECT, **search: Any) -> list[Any]:
    """Every trace of an MLflow experiment (with spans), read with MLflow's public client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    out: list[Any] = []
    token = None
    while True:
        page = client.search_traces(locations=[exp.experiment_id], max_results=200, page_token=token, **search)
        out.extend(page)
        token = page.token
        if not token:
            return out


def comparable_spans(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All span rows under ``path``, JSON columns parsed, sorted by (trace_id, span_id)."""
    rows = tracer.read_spans(path).to_pylist()
    for row in rows:
        for col in ("inputs", "outputs", "attributes", "error"):
            row[col] = tracer.parse_json(row[col])
    return sorted(rows, key=lambda r: (r["trace_id"], r["span_id"]))


def empty_store(path: str | os.PathLike[str]) -> str:
    """Create an empty MLflow SQLite store file at ``path`` (its migrations take seconds) and return it."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{os.fspath(path)}").search_experiments()
    return os.fspath(path)

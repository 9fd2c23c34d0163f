"""TRL's GRPOTrainer recorded with tracer.integrations.trl: real trainer, tiny local model, CPU, offline."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import pandas as pd  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import tracer  # noqa: E402
from tracer.integrations.trl import record_grpo  # noqa: E402
from tracer.summary import trajectory_turns  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

GROUP = 4
WEIGHTS = [1.0, 0.5]


def length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Varies with each completion: a tenth of its characters."""
    return [len(c[0]["content"]) / 10 for c in completions]


async def vowel_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float | None]:
    """An async reward that reads a dataset column and sometimes has no value (None)."""
    out: list[float | None] = []
    for c, a in zip(completions, answer, strict=True):
        text = c[0]["content"]
        out.append(None if int(a) % 4 == 0 else float(sum(ch in "aeiou" for ch in text)))
    return out


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "answer": str(2 * i)} for i in range(n)]


def _config(out: Path, **over: Any) -> GRPOConfig:
    fields: dict[str, Any] = {
        "output_dir": str(out / "trl"),
        "per_device_train_batch_size": 2 * GROUP,
        "num_generations": GROUP,
        "max_completion_length": 8,
        "max_steps": 2,
        "report_to": [],
        "use_cpu": True,
        "logging_steps": 1,
        "log_completions": True,
        "save_strategy": "no",
        "reward_weights": WEIGHTS,
        "per_device_eval_batch_size": 2 * GROUP,
        "seed": 3,
    }
    fields.update(over)
    return GRPOConfig(**fields)


@pytest.fixture(scope="module")
def grpo_run(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two training steps and one evaluation of a recorded GRPOTrainer; TRL's own logged tables beside the traces."""
    out = tmp_path_factory.mktemp("grpo")
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir),
        reward_funcs=[length_reward, vowel_reward],
        args=_config(out),
        train_dataset=Dataset.from_list(_rows(8)),
        eval_dataset=Dataset.from_list(_rows(2)),
        processing_class=tok,
    )
    assert record_grpo(trainer, output_dir=str(out / "traces")) is not None
    tables = {}
    trainer.train()
    for step in (1, 2):
        tables[step] = pd.read_parquet(out / "trl" / "completions" / f"completions_{step:05d}.parquet")
    trainer.evaluate()
    eval_table = pd.read_parquet(out / "trl" / "completions" / "completions_00002.parquet")
    tracer.shutdown()
    return {"traces": out / "traces", "tables": tables, "eval": eval_table, "tokenizer": tok}


def _recorded(run: dict[str, Any], validate: bool) -> pd.DataFrame:
    frame = tracer.read_trajectories(run["traces"], validate=validate).to_pandas()
    frame["group"] = frame["sample_index"].astype(int)
    return frame.sort_values(["step", "group", "rollout_n"]).reset_index(drop=True)


def _close(a: Any, b: Any) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return b is not None and math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)


def _check_against_trl(recorded: pd.DataFrame, table: pd.DataFrame) -> None:
    assert len(recorded) == len(table)
    for (_, mine), (_, theirs) in zip(recorded.iterrows(), table.iterrows(), strict=True):
        info = json.loads(mine["reward_info"])
        for name in ("length_reward", "vowel_reward"):
            assert _close(info["rewards"][name], theirs[name]), (name, info, theirs)
        assert _close(info["advantage"], theirs["advantage"])
        present = [(theirs[n], w) for n, w in zip(("length_reward", "vowel_reward"), WEIGHTS, strict=True)]
        expected = math.fsum(v * w for v, w in present if not math.isnan(v))
        assert _close(mine["reward"], expected)


def test_training_groups_rewards_and_advantages_equal_trls_log(grpo_run: dict[str, Any]) -> None:
    """Each training step's completions: groups, every reward function, the total and the advantage as TRL logged them."""
    recorded = _recorded(grpo_run, validate=False)
    assert sorted(recorded["step"].unique()) == [1, 2]
    for step, table in grpo_run["tables"].items():
        mine = recorded[recorded["step"] == step].reset_index(drop=True)
        assert list(mine["rollout_n"]) == [n for _ in range(len(mine) // GROUP) for n in range(GROUP)]
        for row, (_, theirs) in enumerate(table.iterrows()):  # TRL's groups are runs of GROUP rows
            assert mine.loc[row, "group"] == row // GROUP
            prompt = json.loads(trajectory_prompt(grpo_run, mine.loc[row, "trace_id"]))
            assert prompt == [dict(m) for m in theirs["prompt"]]
        _check_against_trl(mine, table)
    logged = [v for t in grpo_run["tables"].values() for v in t["vowel_reward"]]
    assert any(math.isnan(v) for v in logged) and not all(math.isnan(v) for v in logged)  # None rewards went through


def trajectory_prompt(run: dict[str, Any], trace_id: str) -> str:
    spans = tracer.read_spans(run["traces"], trace_ids=trace_id).to_pylist()
    (llm,) = [s for s in spans if s["kind"] == "llm"]
    return json.dumps(json.loads(llm["inputs"])["messages"])


def test_completion_token_ids_decode_to_trls_completion(grpo_run: dict[str, Any]) -> None:
    """The llm span holds the completion's token ids, which decode to the completion TRL logged."""
    recorded = _recorded(grpo_run, validate=False)
    step1 = recorded[recorded["step"] == 1].reset_index(drop=True)
    spans = tracer.read_spans(grpo_run["traces"], trace_ids=list(step1["trace_id"]))
    turns = trajectory_turns(spans)
    for row, (_, theirs) in enumerate(grpo_run["tables"][1].iterrows()):
        (reply,) = [t for t in turns[step1.loc[row, "trace_id"]] if t.role == "assistant"]
        assert reply.token_ids
        decoded = grpo_run["tokenizer"].decode(reply.token_ids, skip_special_tokens=True)
        assert decoded == theirs["completion"][0]["content"] == reply.text


def test_evaluation_completions_are_marked_validate(grpo_run: dict[str, Any]) -> None:
    """Evaluation completions: validate=True at the trainer's step, grouped, equal to TRL's evaluation log."""
    recorded = _recorded(grpo_run, validate=True)
    assert set(recorded["step"]) == {2} and len(recorded) == 2 * GROUP
    _check_against_trl(recorded, grpo_run["eval"])


def _two_turn_rollout(tokenizer: Any, calls: list[int]) -> Any:
    """A rollout_func of two llm turns with a calculator tool between, each completion in its own trajectory."""
    import torch

    from tracer.integrations.trl import completion

    @tracer.rollout_trace_op(kind="llm")
    def generate(model: Any, prompt_ids: list[int]) -> dict[str, Any]:
        with torch.no_grad():
            full = model.generate(torch.tensor([prompt_ids]), max_new_tokens=4, do_sample=True)
        ids = full[0, len(prompt_ids) :].tolist()
        return {"response_ids": ids, "logprobs": [-1.0] * len(ids)}

    @tracer.rollout_trace_op(kind="tool")
    def calculator(arguments: str) -> str:
        return str(eval(arguments, {}, {}))  # a trusted literal from this test

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        calls.append(len(prompts))
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        for i, prompt in enumerate(prompts):
            with completion(i):
                ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False)
                first = generate(trainer.model, ids)
                result = calculator("2+2")
                tool_ids = tokenizer.encode(f"<tool_response>{result}</tool_response>", add_special_tokens=False)
                second = generate(trainer.model, ids + first["response_ids"] + tool_ids)
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(first["response_ids"] + tool_ids + second["response_ids"])
            out["logprobs"].append(first["logprobs"] + [0.0] * len(tool_ids) + second["logprobs"])
            out["env_mask"].append(
                [1] * len(first["response_ids"]) + [0] * len(tool_ids) + [1] * len(second["response_ids"])
            )
        return out

    return rollout


def test_multi_turn_tool_rollout_is_one_trajectory_per_completion(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """A rollout_func calling a tool between two llm turns: one trajectory per completion, its spans and TRL's rewards in it."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    calls: list[int] = []

    def token_reward(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [float(len(ids)) for ids in completion_ids]

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir),
        reward_funcs=[token_reward],
        args=_config(tmp_path, max_steps=1, reward_weights=None, log_completions=False),
        train_dataset=Dataset.from_list(_rows(4)),
        processing_class=tok,
        rollout_func=_two_turn_rollout(tok, calls),
    )
    record_grpo(trainer, output_dir=str(tmp_path / "traces"))
    trainer.train()
    tracer.shutdown()
    rows = tracer.read_trajectories(tmp_path / "traces").to_pylist()
    assert len(rows) == calls[0] == 2 * GROUP
    assert sorted((r["sample_index"], r["rollout_n"]) for r in rows) == [
        (str(g), n) for g in range(2) for n in range(GROUP)
    ]
    spans = tracer.read_spans(tmp_path / "traces").to_pylist()
    for row in rows:
        assert row["step"] == 1 and row["num_llm_calls"] == 2 and row["num_tool_calls"] == 1
        mine = [s for s in spans if s["trace_id"] == row["trace_id"]]
        (tool,) = [s for s in mine if s["kind"] == "tool"]
        assert json.loads(tool["outputs"]) == "4"
        info = json.loads(row["reward_info"])
        assert row["reward"] == info["rewards"]["token_reward"] > 0 and "advantage" in info


def test_a_trainer_without_groups_warns_and_trains_unrecorded(
    tiny_qwen3_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain transformers Trainer (no groups, no reward functions): one warning naming them; training goes on."""
    from transformers import Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    ids = tok("a b c d", return_tensors=None)["input_ids"]
    data = Dataset.from_list([{"input_ids": ids, "labels": ids}] * 2)
    args = TrainingArguments(str(tmp_path / "out"), max_steps=1, use_cpu=True, report_to=[], save_strategy="no")
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), args=args, train_dataset=data)
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        assert record_grpo(trainer, output_dir=str(tmp_path / "traces")) is None
    # The integration's own records: a thread left by an earlier test may log under the same logger.
    (warning,) = [r.getMessage() for r in caplog.records if r.pathname.endswith(os.path.join("integrations", "trl.py"))]
    assert "num_generations" in warning and "reward_funcs" in warning and "\n" not in warning
    assert trainer.train().global_step == 1
    assert tracer.get_config() is None  # nothing started


def test_a_batch_trls_log_does_not_hold_warns_and_training_goes_on(
    tiny_qwen3_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An evaluation batch larger than TRL's completion log keeps: its advantages are missing; one warning, training and the rest recorded."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir),
        reward_funcs=[length_reward],
        args=_config(
            tmp_path, per_device_train_batch_size=GROUP, per_device_eval_batch_size=2 * GROUP, reward_weights=None
        ),
        train_dataset=Dataset.from_list(_rows(4)),
        eval_dataset=Dataset.from_list(_rows(2)),
        processing_class=tok,
    )
    record_grpo(trainer, output_dir=str(tmp_path / "traces"))
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        trainer.train()
        metrics = trainer.evaluate()
    tracer.shutdown()
    assert "eval_reward" in metrics
    warnings = [r.getMessage() for r in caplog.records if r.name == "rollout_trace"]
    assert len(warnings) == 1 and "'advantages'" in warnings[0]
    rows = tracer.read_trajectories(tmp_path / "traces").to_pylist()
    assert len(rows) == 2 * GROUP and not any(r["validate"] for r in rows)


def test_trls_tool_loop_messages_become_llm_and_tool_spans(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """A completion of TRL's own tool loop (assistant call, tool result, answer): two llm spans and the tool's span, in order.

    The random tiny model never emits a tool call, so the batch is handed to the
    wrapped reward function as TRL's tool loop hands it, and TRL's log gets the
    rows TRL appends after scoring.
    """
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir),
        reward_funcs=[length_reward],
        args=_config(tmp_path, per_device_train_batch_size=GROUP, reward_weights=None),
        train_dataset=Dataset.from_list(_rows(4)),
        processing_class=AutoTokenizer.from_pretrained(tiny_qwen3_dir),
    )
    recorder = record_grpo(trainer, output_dir=str(tmp_path / "traces"))
    assert recorder is not None
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}
    turns = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]
    prompts = [[{"role": "user", "content": "What is 2+2?"}]] * GROUP
    rewards = trainer.reward_funcs[0](
        prompts=prompts, completions=[turns] * GROUP, completion_ids=[[1, 2, 3]] * GROUP, trainer_state=trainer.state
    )
    trainer._logs["prompt"].extend(prompts)
    trainer._logs["advantages"].extend([0.5, -0.5, 0.5, -0.5])
    recorder.close()
    tracer.shutdown()
    assert rewards == [0.0] * GROUP
    rows = tracer.read_trajectories(tmp_path / "traces").to_pylist()
    assert len(rows) == GROUP and all(r["num_llm_calls"] == 2 and r["num_tool_calls"] == 1 for r in rows)
    spans = tracer.read_spans(tmp_path / "traces", trace_ids=rows[0]["trace_id"])
    (turn_list,) = trajectory_turns(spans).values()
    assert [t.role for t in turn_list][-3:] == ["assistant", "tool", "assistant"]
    assert turn_list[-2].text == "4" and turn_list[-1].text == "It is 4."
    assert json.loads(rows[0]["reward_info"])["advantage"] == 0.5

"""Recorded trajectories as a training dataset (tracer.to_dataset, rollout-trace dataset)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.cli import main as rollout_trace_main
from tracer.data.dataset import DATASET_COLUMNS, DatasetOptionError, parse_steps
from tracer.summary import Turn, trajectory_tokens


def _llm_spans(run: str, trace_id: str) -> list[dict[str, Any]]:
    spans = tracer.read_spans(run, trace_ids=[trace_id]).to_pylist()
    return sorted((s for s in spans if s[S.KIND] == S.KIND_LLM), key=lambda s: s[S.START_NS])


def _root_output(run: str, trace_id: str) -> dict[str, Any]:
    spans = tracer.read_spans(run, trace_ids=[trace_id]).to_pylist()
    root = next(s for s in spans if s[S.PARENT_SPAN_ID] is None and s[S.KIND] == S.KIND_ROLLOUT)
    out: dict[str, Any] = json.loads(root[S.OUTPUTS])
    return out


def _model_tokens(row: dict[str, Any]) -> list[int]:
    return [t for t, m in zip(row["response_ids"], row["response_mask"], strict=True) if m == 1]


def _check_model_tokens(run: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        want = [t for s in _llm_spans(run, row["trace_id"]) for t in json.loads(s[S.OUTPUTS])["response_ids"]]
        assert _model_tokens(row) == want, row["trace_id"]
        assert len(row["logprobs"]) == len(row["response_ids"])


def test_columns_are_the_documented_ones(recorded_run: str) -> None:
    """The table has the documented columns, one row per trajectory."""
    table = tracer.to_dataset(recorded_run)
    assert tuple(table.column_names) == DATASET_COLUMNS
    assert table.num_rows == tracer.read_trajectories(recorded_run).num_rows


def test_mask_one_tokens_are_every_model_turn_in_order(recorded_run: str) -> None:
    """Tokens under mask 1 are exactly each llm call's reply tokens, turn after turn."""
    rows = tracer.to_dataset(recorded_run).to_pylist()
    assert any(r["num_turns"] >= 2 for r in rows)
    _check_model_tokens(recorded_run, rows)


def test_tokens_agree_with_the_agent_loop(recorded_run: str) -> None:
    """prompt_ids, response_ids and response_mask equal the agent loop's own token view."""
    for row in tracer.to_dataset(recorded_run).to_pylist():
        own = _root_output(recorded_run, row["trace_id"])
        assert row["prompt_ids"] == own["prompt_ids"]
        assert row["response_ids"] == own["response_ids"]
        assert row["response_mask"] == own["response_mask"]
        assert row["tokens_exact"] is True


def test_logprobs_under_mask_one_are_the_models(recorded_run: str) -> None:
    """Each model token carries its recorded logprob; spliced-in tokens carry none."""
    for row in tracer.to_dataset(recorded_run).to_pylist():
        lps = [json.loads(s[S.OUTPUTS])["logprobs"] for s in _llm_spans(recorded_run, row["trace_id"])]
        model = [lp for lp, m in zip(row["logprobs"], row["response_mask"], strict=True) if m == 1]
        assert model == pytest.approx([x for turn in lps for x in turn], rel=1e-6)
        assert all(lp is None for lp, m in zip(row["logprobs"], row["response_mask"], strict=True) if m == 0)


def test_tool_errors_are_in_the_messages(recorded_run: str) -> None:
    """A trajectory with a failed tool call keeps the tool's error message as a tool message."""
    summaries = tracer.read_trajectories(recorded_run).to_pylist()
    failed = {s["trace_id"] for s in summaries if s["num_tool_errors"]}
    assert failed, "the scripted policy's unknown-tool and buggy-code behaviours should fail a tool"
    rows = [r for r in tracer.to_dataset(recorded_run).to_pylist() if r["trace_id"] in failed]
    _check_model_tokens(recorded_run, rows)
    for row in rows:
        tools = [m for m in row["messages"] if m["role"] == "tool"]
        assert any(m["content"].startswith("Error") for m in tools)
        assert all(m["tool_call_id"] for m in tools)


def test_messages_are_openai_chat_with_tool_calls(recorded_run: str) -> None:
    """messages: system, user, then assistant turns whose tool calls are answered by tool messages."""
    for row in tracer.to_dataset(recorded_run).to_pylist():
        msgs = row["messages"]
        assert [m["role"] for m in msgs[:2]] == ["system", "user"]
        call_ids = [c["id"] for m in msgs if m["role"] == "assistant" for c in (m["tool_calls"] or ())]
        answered = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        assert answered == call_ids[: len(answered)]
        assert msgs == _root_messages(recorded_run, row["trace_id"])


def _root_messages(run: str, trace_id: str) -> list[dict[str, Any]]:
    out = []
    for m in _root_output(run, trace_id)["messages"]:
        out.append(
            {
                "role": m["role"],
                "content": m.get("content") or "",
                "tool_calls": m.get("tool_calls") or None,
                "tool_call_id": m.get("tool_call_id"),
                "name": m.get("name"),
            }
        )
    return out


def test_reward_and_advantage_are_the_logged_ones(recorded_run: str) -> None:
    """reward is the trajectory's reward; advantage the one log_reward recorded with it."""
    table = tracer.to_dataset(recorded_run)
    summaries = {s["trace_id"]: s for s in tracer.read_trajectories(recorded_run).to_pylist()}
    for row in table.to_pylist():
        s = summaries[row["trace_id"]]
        assert row["reward"] == s["reward"]
        assert row["advantage"] == json.loads(s["reward_info"])["advantage"]
        assert (row["step"], row["sample_index"], row["rollout_n"], row["validate"]) == (
            s["step"],
            s["sample_index"],
            s["rollout_n"],
            s["validate"],
        )


def test_budget_truncation_keeps_the_model_tokens(make_run: Callable[..., str]) -> None:
    """Replies cut by max_new_tokens and rollouts stopped by the response budget keep exact tokens."""
    run = make_run(steps=1, max_new_tokens=24, max_response_tokens=60)
    rows = tracer.to_dataset(run).to_pylist()
    finishes = [json.loads(s[S.OUTPUTS])["finish_reason"] for r in rows for s in _llm_spans(run, r["trace_id"])]
    assert "length" in finishes
    _check_model_tokens(run, rows)
    for row in rows:
        assert row["response_mask"] == _root_output(run, row["trace_id"])["response_mask"]


def test_tracer_truncation_is_flagged(make_run: Callable[..., str]) -> None:
    """Token lists cut by the tracer's max_tokens: mask-1 tokens are the kept ones; tokens_exact is False."""
    run = make_run(steps=1, max_tokens=16)
    rows = tracer.to_dataset(run).to_pylist()
    _check_model_tokens(run, rows)
    assert all(r["tokens_exact"] is False for r in rows)


def test_per_turn_rows(recorded_run: str) -> None:
    """per="turn": one row per model turn, the conversation up to it, that call's prompt and reply."""
    whole = {r["trace_id"]: r for r in tracer.to_dataset(recorded_run).to_pylist()}
    turns = tracer.to_dataset(recorded_run, per="turn").to_pylist()
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in turns:
        by_trace.setdefault(r["trace_id"], []).append(r)
    assert set(by_trace) == set(whole)
    for tid, rows in by_trace.items():
        assert [r["turn_index"] for r in rows] == list(range(whole[tid]["num_turns"]))
        assert [t for r in rows for t in r["response_ids"]] == _model_tokens(whole[tid])
        for r, span in zip(rows, _llm_spans(recorded_run, tid), strict=True):
            assert r["messages"][-1]["role"] == "assistant"
            assert r["prompt_ids"] == json.loads(span[S.INPUTS])["prompt_ids"]


def test_selection_by_steps_split_and_filter(recorded_run: str) -> None:
    """steps, split and filters select trajectories as their summaries say."""
    s = tracer.read_trajectories(recorded_run).to_pylist()
    got = tracer.to_dataset(recorded_run, steps="2-", split="train", filters=["reward>=1", "status==ok"])
    want = {
        r["trace_id"]
        for r in s
        if r["step"] >= 2 and not r["validate"] and r["reward"] is not None and r["reward"] >= 1 and r["status"] == "ok"
    }
    assert want and set(got["trace_id"].to_pylist()) == want
    few = tracer.to_dataset(recorded_run, filters="turns<=1")
    assert set(few["trace_id"].to_pylist()) == {r["trace_id"] for r in s if r["num_llm_calls"] <= 1}
    val = tracer.to_dataset(recorded_run, split="validation")
    assert val.num_rows == sum(1 for r in s if r["validate"]) > 0


def test_parse_steps() -> None:
    """Step specs: N, N,M, N-M, N-, last:K."""
    have = [1, 2, 3, 5]
    assert parse_steps("3", have) == [3]
    assert parse_steps("1,5", have) == [1, 5]
    assert parse_steps("2-4", have) == [2, 3]
    assert parse_steps("3-", have) == [3, 5]
    assert parse_steps("last:2", have) == [3, 5]
    with pytest.raises(DatasetOptionError, match="last:K"):
        parse_steps("latest", have)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"filters": "reward"}, "FIELD OP VALUE"),
        ({"filters": "score>1"}, "unknown field 'score'; fields are reward, status"),
        ({"filters": "reward>=high"}, "not a number"),
        ({"split": "test"}, "give train or validation"),
        ({"per": "span"}, "give trajectory or turn"),
        ({"format": "csv"}, "give parquet or jsonl"),
    ],
)
def test_bad_options_name_the_fix(recorded_run: str, kwargs: dict[str, Any], message: str) -> None:
    """Every bad option names what was wrong and the valid values."""
    with pytest.raises(DatasetOptionError, match=message):
        tracer.to_dataset(recorded_run, **kwargs)


def test_huggingface_datasets_loads_the_splits(recorded_run: str, tmp_path: Any) -> None:
    """datasets.load_dataset("parquet") reads train and validation with their messages and tokens."""
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "ds"
    table = tracer.to_dataset(recorded_run, out)
    ds = datasets.load_dataset("parquet", data_dir=str(out))
    assert set(ds) == {"train", "validation"}
    assert len(ds["train"]) + len(ds["validation"]) == table.num_rows
    first = ds["train"][0]
    want = next(r for r in table.to_pylist() if r["trace_id"] == first["trace_id"])
    assert first["messages"] == want["messages"]
    assert first["response_mask"] == want["response_mask"]
    files = datasets.load_dataset("parquet", data_files={"train": str(out / "train.parquet")})
    assert len(files["train"]) == len(ds["train"])


def test_cli_writes_jsonl_and_parquet(recorded_run: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """rollout-trace dataset RUN --out DIR writes the same rows as to_dataset, in either format."""
    want = tracer.to_dataset(recorded_run, split="train", filters="reward>=1", per="turn")
    out = tmp_path / "j"
    argv = ["dataset", recorded_run, "--out", str(out), "--split", "train", "--filter", "reward>=1", "--per", "turn"]
    assert rollout_trace_main([*argv, "--format", "jsonl"]) == 0
    lines = (out / "train.jsonl").read_text().splitlines()
    assert [json.loads(x)["trace_id"] for x in lines] == want["trace_id"].to_pylist()
    assert not os.path.exists(out / "validation.jsonl")
    assert rollout_trace_main([*argv, "--format", "parquet"]) == 0
    assert pq.read_table(out / "train.parquet").to_pylist() == want.to_pylist()
    assert f"{want.num_rows} rows" in capsys.readouterr().out


def test_cli_bad_filter_is_a_usage_error(recorded_run: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --filter exits 2 with the fix in the message."""
    assert rollout_trace_main(["dataset", recorded_run, "--out", str(tmp_path), "--filter", "reward"]) == 2
    assert "FIELD OP VALUE" in capsys.readouterr().err


# -- the token sequence of any turns -------------------------------------------------


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[list[Turn], list[int], list[int]]:
    """Turns whose prompts extend the previous prompt and reply; the expected ids and mask."""
    tok = st.integers(0, 1000)
    prompt = draw(st.lists(tok, max_size=5))
    seq = list(prompt)
    ids: list[int] = []
    mask: list[int] = []
    turns = []
    for k in range(draw(st.integers(1, 5))):
        if k:
            env = draw(st.lists(tok, max_size=4))
            seq += env
            ids += env
            mask += [0] * len(env)
        reply = draw(st.lists(tok, max_size=6))
        turns.append(Turn(role="assistant", prompt_ids=list(seq), token_ids=reply))
        if draw(st.booleans()):
            turns.append(Turn(role="tool", text="x"))
        seq += reply
        ids += reply
        mask += [1] * len(reply)
    return turns, ids, mask


@given(_conversations())
@settings(max_examples=200, deadline=None)
def test_token_sequence_property(case: tuple[list[Turn], list[int], list[int]]) -> None:
    """For any turns that extend each other: the spliced sequence and mask are exact."""
    turns, ids, mask = case
    got = trajectory_tokens(turns)
    assert got.response_ids == ids
    assert got.response_mask == mask
    assert got.exact


@given(_conversations(), st.integers(0, 4))
@settings(max_examples=200, deadline=None)
def test_retemplated_history_keeps_model_tokens(case: tuple[list[Turn], list[int], list[int]], k: int) -> None:
    """A prompt that does not extend the history: not exact, but mask-1 tokens are still every reply."""
    turns, _, _ = case
    llm = [i for i, t in enumerate(turns) if t.role == "assistant"]
    i = llm[k % len(llm)]
    history = list(turns[i].prompt_ids or ())
    prev = turns[llm[llm.index(i) - 1]] if i != llm[0] else None
    if prev is None or not history or not (list(prev.prompt_ids or ()) + list(prev.token_ids or ())):
        return  # nothing to disagree with: any prompt extends an empty history
    turns[i] = Turn(role="assistant", prompt_ids=[-1, *history], token_ids=turns[i].token_ids)
    got = trajectory_tokens(turns)
    replies = [t for turn in turns if turn.role == "assistant" for t in turn.token_ids or ()]
    assert [t for t, m in zip(got.response_ids, got.response_mask, strict=True) if m == 1] == replies
    assert not got.exact

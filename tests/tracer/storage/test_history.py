"""Multi-turn prompt_ids stored once: the writer keeps what is new, every reader returns the whole list (issue 13)."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import tempfile
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.storage.history import MIN_PREFIX, expand_history
from tracer.summary import span_turns


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int], response: list[int]) -> dict:
    return {"response_ids": response, "finish_reason": "stop"}


#: One turn: how the prompt is formed (extend the history, start afresh, or empty), new ids, the response.
TURN = st.tuples(
    st.sampled_from(["extend", "extend", "extend", "fresh", "empty", "retokenize"]),
    st.lists(st.integers(0, 2**31 - 1), max_size=40),
    st.lists(st.integers(0, 2**31 - 1), max_size=40),
)


async def agent(
    sample: int, turns: list[tuple[str, list[int], list[int]]], sent: list[tuple[list[int], list[int]]]
) -> None:
    """A multi-turn agent: each turn's prompt is (mostly) the previous prompt + response + new ids."""
    with tracer.rollout_trace_attr(sample_index=sample, step=0, rollout_n=0):
        history = list(range(MIN_PREFIX))
        for mode, new, response in turns:
            if mode == "extend":
                prompt = history + new
            elif mode == "retokenize":  # the last few ids of the history come back different
                prompt = history[:-3] + [1, 2, 3] + new
            elif mode == "fresh":
                prompt = list(range(5000, 5000 + MIN_PREFIX)) + new
            else:
                prompt = []
            sent.append((prompt, response))
            await generate(list(prompt), list(response))
            history = prompt + response
            await asyncio.sleep(0)


def record(out: str, agents: list[list[tuple[str, list[int], list[int]]]], **config: Any) -> list[list[tuple]]:
    tracer.init(output_dir=out, **config)
    sent: list[list[tuple]] = [[] for _ in agents]

    async def main() -> None:
        await asyncio.gather(*(agent(i, turns, sent[i]) for i, turns in enumerate(agents)))

    asyncio.run(main())
    assert tracer.flush().ok
    run_dir = tracer.get_config().run_dir
    tracer.shutdown()
    return sent, run_dir


def llm_by_sample(table: pa.Table) -> dict[str, list[dict]]:
    rows = sorted((r for r in table.to_pylist() if r[S.KIND] == S.KIND_LLM), key=lambda r: r[S.START_NS])
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r[S.SAMPLE_INDEX], []).append(r)
    return out


@settings(max_examples=25, deadline=None)
@given(
    agents=st.lists(st.lists(TURN, min_size=1, max_size=6), min_size=1, max_size=3),
    max_tokens=st.sampled_from([None, None, 60]),
    flush_every_turn=st.booleans(),
)
def test_any_turns_read_back_exactly_as_recorded(agents: list, max_tokens: int | None, flush_every_turn: bool) -> None:
    """Property: extending, fresh, empty, retokenized or truncated turns of concurrent agents read back identical."""
    with tempfile.TemporaryDirectory() as out:
        sent, run_dir = record(out, agents, max_tokens=max_tokens, flush_interval_s=0.001 if flush_every_turn else 5.0)
        got = llm_by_sample(tracer.read_spans(run_dir))
        for i, turns in enumerate(sent):
            rows = got[str(i)]
            assert len(rows) == len(turns)
            for row, (prompt, response) in zip(rows, turns):
                cut = slice(None, max_tokens)
                assert json.loads(row[S.INPUTS])["prompt_ids"] == prompt[cut]
                assert json.loads(row[S.OUTPUTS])["response_ids"] == response[cut]


def ten_turns() -> list[tuple[str, list[int], list[int]]]:
    return [
        ("extend", list(range(100 * t, 100 * t + 20)), list(range(7000 + 50 * t, 7050 + 50 * t))) for t in range(10)
    ]


def test_later_turns_store_only_the_new_ids_and_every_reader_returns_the_whole_list(trace_dir: str) -> None:
    """Raw rows hold a reference and the new ids; read_spans and the trajectory model return the full prompt."""
    sent, run_dir = record(trace_dir, [ten_turns()])
    raw = [r for _, b in tracer.iter_batches(run_dir) for r in b.to_pylist() if r[S.KIND] == S.KIND_LLM]
    raw.sort(key=lambda r: r[S.START_NS])
    first, later = json.loads(raw[0][S.INPUTS])["prompt_ids"], json.loads(raw[3][S.INPUTS])["prompt_ids"]
    assert isinstance(first, list)
    assert later[S.HISTORY_EXTENDS] == raw[2][S.SPAN_ID] and later[S.HISTORY_IDS] == list(range(300, 320))
    turns = [t for t in span_turns(tracer.read_spans(run_dir)) if t.role == "assistant"]
    assert [list(t.prompt_ids or []) for t in turns] == [p for p, _ in sent[0]]
    # Reading only inputs still rebuilds them (the reader fetches the columns it needs).
    only = tracer.read_spans(run_dir, columns=[S.INPUTS, S.KIND])
    prompts = [
        json.loads(v)["prompt_ids"] for v, k in zip(only[S.INPUTS].to_pylist(), only[S.KIND].to_pylist()) if k == "llm"
    ]
    assert sorted(map(len, prompts)) == sorted(len(p) for p, _ in sent[0])


def test_a_reference_whose_earlier_span_is_missing_stays_a_marked_reference(trace_dir: str) -> None:
    """Without the base span (a torn file, one file of a rotated run) the value is the reference and says why."""
    _, run_dir = record(trace_dir, [ten_turns()[:3]])
    spans = tracer.read_spans(run_dir)  # already expanded: take the raw rows instead
    raw = pa.Table.from_batches([b for _, b in tracer.iter_batches(run_dir)])
    llm = sorted((r for r in raw.to_pylist() if r[S.KIND] == S.KIND_LLM), key=lambda r: r[S.START_NS])
    without_first = pa.Table.from_pylist([r for r in raw.to_pylist() if r[S.SPAN_ID] != llm[0][S.SPAN_ID]], raw.schema)
    rows = {r[S.SPAN_ID]: r for r in expand_history(without_first).to_pylist()}
    for r in llm[1:]:  # turn 2 lost its base; turn 3's base is turn 2, which cannot be rebuilt
        value = json.loads(rows[r[S.SPAN_ID]][S.INPUTS])["prompt_ids"]
        assert isinstance(value, dict) and llm[0][S.SPAN_ID] in value[S.HISTORY_MISSING]
    assert spans.num_rows == raw.num_rows


def test_a_rotated_run_reads_back_whole_and_each_file_alone_is_never_wrong(trace_dir: str) -> None:
    """Across rotated files the run reads back exactly; one file read alone gives lists or marked references."""
    tracer.init(output_dir=trace_dir, max_file_bytes=1)
    run_dir = tracer.get_config().run_dir
    sent = []

    async def turns() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=0, rollout_n=0):
            history = list(range(100))
            for t in range(4):
                sent.append(list(history))
                await generate(list(history), [t])
                history += [t, 7]
                assert tracer.flush().ok  # one batch, so one file, per turn

    asyncio.run(turns())
    files = sorted(glob.glob(os.path.join(run_dir, "**", "*" + S.FILE_SUFFIX), recursive=True))
    assert len(files) == 4
    rows = llm_by_sample(tracer.read_spans(run_dir))["0"]
    assert [json.loads(r[S.INPUTS])["prompt_ids"] for r in rows] == sent
    for f in files:
        for row in llm_by_sample(tracer.read_spans(f)).get("0", []):
            value = json.loads(row[S.INPUTS])["prompt_ids"]
            assert value in sent or S.HISTORY_MISSING in value


def test_spans_outside_a_trajectory_are_never_references(trace_dir: str) -> None:
    """llm calls with no trajectory share no history: each keeps its whole prompt."""
    tracer.init(output_dir=trace_dir)
    base = list(range(100))
    asyncio.run(generate(base, [1, 2]))
    asyncio.run(generate(base + [1, 2, 3], [4]))
    assert tracer.flush().ok
    raw = [r for _, b in tracer.iter_batches(trace_dir) for r in b.to_pylist()]
    assert all(isinstance(json.loads(r[S.INPUTS])["prompt_ids"], list) for r in raw)


def test_after_a_failed_write_later_turns_do_not_refer_to_the_lost_spans(
    trace_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch lost to a write error is never a base: the turns after it read back whole."""
    from tracer.record import recorder

    monkeypatch.delenv(tracer.config.ENV_STRICT)  # the tracer's own errors are logged, not raised, as in production
    tracer.init(output_dir=trace_dir)
    writer = recorder.ACTIVE.writer
    real_write = writer.write
    sent = []

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    async def turns() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=0, rollout_n=0):
            history = list(range(100))
            for t in range(4):
                if t == 1:
                    monkeypatch.setattr(writer, "write", disk_full)
                sent.append(list(history))
                await generate(list(history), [t])
                history += [t, 7]
                tracer.flush()
                monkeypatch.setattr(writer, "write", real_write)

    asyncio.run(turns())
    rows = llm_by_sample(tracer.read_spans(trace_dir))["0"]
    assert [json.loads(r[S.INPUTS])["prompt_ids"] for r in rows] == [sent[0], sent[2], sent[3]]

"""Question-first pages: each trajectory named by its question and final answer, groups by their ground truth."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from apptest_fixtures import all_text, frame_with, open_app
from hypothesis import given
from hypothesis import strategies as st
from viewer_fixtures import record_run

import tracer
from rollout.agent_loop import FEW_SHOT_EXAMPLE
from tracer.cli import main as cli_main
from tracer.questions import describe_repeats, ground_truth, question_of, questions_and_answers, repeated_keys
from tracer.summary import Turn
from viewer.format import one_line, short_ids

PROBLEMS = os.path.join(os.path.dirname(__file__), "..", "..", "rollout", "data")


def _problems() -> dict[str, str]:
    """question -> answer of the problems the demo ships."""
    out = {}
    for name in os.listdir(PROBLEMS):
        if name.endswith(".jsonl"):
            with open(os.path.join(PROBLEMS, name), encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        p = json.loads(line)
                        out[p["question"]] = str(p["answer"])
    return out


def _in_order(node: Any) -> Iterator[Any]:
    """The page's elements in the order they are drawn."""
    children = getattr(node, "children", None)
    if children is None:
        yield node
        return
    for key in sorted(children):
        yield from _in_order(children[key])


def test_question_is_the_user_message_not_the_system_prompt_or_a_few_shot_example(demo_dir: str) -> None:
    """The question of a few-shot demo rollout is the problem asked, and the answer is the last reply."""
    qa = questions_and_answers(tracer.read_spans(demo_dir))
    problems = _problems()
    few_shot = FEW_SHOT_EXAMPLE[0]["content"]
    assert qa and all(q in problems for q, _ in qa.values())
    assert all(q != few_shot for q, _ in qa.values())
    assert all(a for _, a in qa.values())


def test_question_of_a_templated_prompt_is_its_last_user_block() -> None:
    """A prompt recorded as ChatML text gives the last user block, after the few-shot one."""
    text = (
        "<|im_start|>system\nBe careful.<|im_end|>\n<|im_start|>user\nexample?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert question_of([Turn(role="user", text=text)]) == "What is 6 * 7?"


def test_ground_truth_comes_from_log_reward_extras() -> None:
    """ground_truth reads the extra of that name; the rollout's own ``answer`` is not the ground truth."""
    assert ground_truth(json.dumps({"answer": "3", "ground_truth": 7})) == "7"
    assert ground_truth(json.dumps({"answer": "3"})) is None
    assert ground_truth("not json") is None


@given(st.sets(st.text(alphabet="0123456789abcdef", min_size=1, max_size=40), min_size=1, max_size=30))
def test_short_ids_tell_every_id_apart(ids: set[str]) -> None:
    """Short ids are distinct whenever the ids are, and each is a start or end of its id."""
    listed = sorted(ids)
    shorts = short_ids(listed)
    assert len(set(shorts)) == len(listed)
    for full, cut in zip(listed, shorts, strict=True):
        assert full.startswith(cut.rstrip("…")) or full.endswith(cut.lstrip("…"))


def test_list_shows_each_question_and_final_answer(demo_dir: str) -> None:
    """The trajectory list of a step shows each row's question and final answer, and a short distinct id."""
    at = open_app(demo_dir, step="2")
    df = at.dataframe(key="list_table").value
    qa = questions_and_answers(tracer.read_spans(demo_dir, steps=[2]))
    for _, row in df.iterrows():
        question, answer = qa[row["trace_id"]]
        assert row["question"] == " ".join(question.split())[:160]
        assert row["answer"] == " ".join(answer.split())[:160]
    assert len(set(df["id"])) == len(df) and all(len(i) < len(t) for i, t in zip(df["id"], df["trace_id"]))


def test_search_finds_a_question(demo_dir: str) -> None:
    """Searching for words of a question keeps the rollouts asked it."""
    qa = questions_and_answers(tracer.read_spans(demo_dir, steps=[1]))
    question = next(iter(qa.values()))[0]
    at = open_app(demo_dir, step="1")
    at.text_input(key="q").set_value(question[:40]).run()
    df = at.dataframe(key="list_table").value
    assert len(df) >= 1 and all(q.startswith(question[:40]) for q in df["question"])


def test_group_opens_with_question_and_ground_truth_above_the_cards(demo_dir: str) -> None:
    """The group page shows the prompt's question, then the ground truth, then the rollout cards."""
    traj = tracer.read_trajectories(demo_dir, steps=[1]).to_pylist()
    sample = traj[0]["sample_index"]
    truth = ground_truth(traj[0]["reward_info"])
    at = open_app(demo_dir, step="1", sample_index=sample, view="group")
    order = [str(getattr(e, "value", "")) for e in _in_order(at.main)]
    qa = questions_and_answers(tracer.read_spans(demo_dir, steps=[1]))
    question = qa[traj[0]["trace_id"]][0]
    first_card = next(i for i, v in enumerate(order) if v.startswith("rollout 0"))
    assert truth is not None and order.index(truth) < first_card
    assert order.index(question) < order.index(truth)
    table = frame_with(at, "answer")
    assert set(table["answer"]) == {" ".join(qa[t][1].split())[:160] for t in table["trace_id"]}


def test_zero_std_badge_and_fraction_match_a_hand_count(demo_dir: str) -> None:
    """The badge marks groups whose rewards are all equal; step_metrics and the page count them as by hand."""
    rows = [r for r in tracer.read_trajectories(demo_dir).to_pylist() if not r["validate"]]
    groups: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["step"], r["sample_index"]), []).append(r["reward"])
    metrics = tracer.step_metrics(tracer.read_trajectories(demo_dir))
    for step in sorted({s for s, _ in groups}):
        mine = [v for (s, _), v in groups.items() if s == step]
        same = sum(1 for v in mine if len(set(v)) == 1)
        assert metrics[(step, False)]["reward/zero_std_frac"] == pytest.approx(same / len(mine))
        at = open_app(demo_dir, step=str(step), view="group", validate="false")
        assert f"{same} of {len(mine)} groups at step {step} have all rewards equal" in all_text(at)
        for (s, sample), v in groups.items():
            if s != step:
                continue
            at = open_app(demo_dir, step=str(step), sample_index=sample, view="group", validate="false")
            badge = any("all rewards equal: no learning signal" in m.value for m in at.markdown)
            assert badge == (len(set(v)) == 1)


def test_zero_std_filter_keeps_only_those_groups(demo_dir: str) -> None:
    """The group filter offers only the samples whose rewards are all equal, or only the others."""
    rows = [r for r in tracer.read_trajectories(demo_dir, steps=[1]).to_pylist() if not r["validate"]]
    groups: dict[str, set[float]] = {}
    for r in rows:
        groups.setdefault(r["sample_index"], set()).add(r["reward"])
    at = open_app(demo_dir, step="1", view="group", validate="false")
    at.radio(key="group_filter").set_value("all rewards equal").run()
    labels = at.selectbox(key="sample_index").options if at.selectbox else []
    assert {label.split(" · ")[0] for label in labels} == {s for s, v in groups.items() if len(v) == 1}
    qa = questions_and_answers(tracer.read_spans(demo_dir, steps=[1]))
    questions = {r["sample_index"]: qa[r["trace_id"]][0] for r in rows}
    assert all(label.split(" · ", 1)[1] == one_line(questions[label.split(" · ")[0]], 90) for label in labels)


def test_overview_plots_the_zero_std_fraction(demo_dir: str) -> None:
    """The overview's per-step table has the fraction of zero-std groups that step_metrics gives."""
    at = open_app(demo_dir)
    table = frame_with(at, "reward/zero_std_frac")
    metrics = tracer.step_metrics(tracer.read_trajectories(demo_dir))
    for _, row in table[table["split"] == "train"].iterrows():
        assert row["reward/zero_std_frac"] == pytest.approx(metrics[(row["step"], False)]["reward/zero_std_frac"])


@pytest.fixture(scope="module")
def twice_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same small run recorded twice under the same names: every key held by two trajectories."""
    out = tmp_path_factory.mktemp("twice")
    record_run(out, steps=1, prompts=1, group=2)
    return record_run(out, steps=1, prompts=1, group=2)


def test_repeated_keys_are_named_and_kept_apart(twice_dir: str) -> None:
    """Keys recorded twice are listed with two attempts by two writers; the group page shows both attempts."""
    t = tracer.read_trajectories(twice_dir)
    repeats = repeated_keys(t)
    assert {(r["sample_index"], r["rollout_n"], r["attempts"], r["writers"]) for r in repeats if not r["validate"]} == {
        ("0", 0, 2, 2),
        ("0", 1, 2, 2),
    }
    assert "held by more than one trajectory" in describe_repeats(repeats)
    at = open_app(twice_dir, step="1", sample_index="0", view="group", validate="false")
    assert any("rollout 0 recorded 2 times" in w.value for w in at.warning)
    assert len(frame_with(at, "rollout")) == 4
    listed = open_app(twice_dir, step="1")
    assert any("held by more than one trajectory" in w.value for w in listed.warning)


@pytest.mark.parametrize("command", ["info", "check"])
def test_info_and_check_name_repeated_keys(twice_dir: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`info` and `check` of a run recorded twice under the same names say that keys repeat, and how often."""
    assert cli_main([command, twice_dir]) == 0
    out = capsys.readouterr().out
    assert "keys are held by more than one trajectory" in out
    assert "(step 1, sample 0, rollout 0) x2" in out


def test_view_of_an_empty_directory_exits_2_with_the_reason(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`rollout-trace view` of a directory without trace files exits 2 and says why, without starting a server."""
    assert cli_main(["view", os.fspath(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no trace files" in err and "--follow" in err


def test_group_cards_come_a_page_at_a_time(tmp_path: Any) -> None:
    """A group larger than a page draws the first cards and a "show more" that draws the next ones."""
    from viewer.views.group import CARDS_PER_PAGE

    run = record_run(tmp_path, steps=1, prompts=1, group=CARDS_PER_PAGE + 3)
    at = open_app(run, step="1", sample_index="0", view="group", validate="false")
    cards = [m for m in at.markdown if m.value.startswith("rollout ")]
    assert len(cards) == CARDS_PER_PAGE
    at.button(key="more_cards").click().run()
    assert len([m for m in at.markdown if m.value.startswith("rollout ")]) == CARDS_PER_PAGE + 3
    assert not [b for b in at.button if b.key == "more_cards"]


def test_two_demo_runs_with_other_seeds_show_the_difference(tmp_path: Any) -> None:
    """The demo records its flags as the run config: two seeds are a configuration difference on Compare."""
    import contextlib
    import io

    from rollout.cli import main as demo_main

    runs = []
    for seed in ("1", "2"):
        argv = ["--steps", "1", "--batch", "2", "--n", "2", "--val-every", "0", "--scripted-latency", "0"]
        argv += ["--seed", seed, "--out", os.fspath(tmp_path), "--experiment", f"s{seed}", "--quiet"]
        argv += ["--cache", os.fspath(tmp_path / "cache")]
        with contextlib.redirect_stdout(io.StringIO()):
            assert demo_main(argv) == 0
        runs.append(os.fspath(tmp_path / "rollout-demo" / f"s{seed}"))
    diff = frame_with(open_app(runs[0], view="compare", compare=runs[1]), "setting")
    assert {r["setting"]: (r["A"], r["B"]) for r in diff.to_dict("records")} == {"seed": ("1", "2")}

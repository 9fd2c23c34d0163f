"""The Compare page: run A against run B (or step against step), prompt by prompt, the biggest regression first.

Deep link: ``?view=compare&path=RUN_A&compare=RUN_B`` (``&step_a=10&step_b=200``
for two steps; ``compare`` may be the same run).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from tracer.compare import (
    DELTA,
    PASS_RATE_DELTA,
    PROMPT,
    QUESTION,
    STEPS_A,
    STEPS_B,
    TRACE_ID_A,
    TRACE_ID_B,
    default_steps,
)
from viewer import cache, safe, state
from viewer import data as D
from viewer.format import short

#: Rollouts of each side shown for the selected prompt.
MAX_SIDE_ROLLOUTS = 8
#: Session key: the default steps (the last step both runs have) were applied once.
SS_DEFAULTED = "_compare_defaulted"


def _step_choice(label: str, key: str, steps: list[int], col: Any) -> int | None:
    ss = st.session_state
    if ss.get(key) not in [None, *steps]:
        ss[key] = None
    return col.selectbox(
        label, [None, *steps], key=key, format_func=lambda s: state.ALL_STEPS if s is None else f"step {s}"
    )


def _run_b(root: str, root_sig: tuple, path_a: str) -> str:
    """Run B: one of the other runs under the viewer's path, or any path typed in."""
    ss = st.session_state
    runs = D.run_dirs(root_sig)
    if len(runs) > 1:
        names = [os.path.relpath(d, root) for d in runs]
        current = ss.get(state.SS_COMPARE) or ""
        options = names if current in names or not current else [*names, current]
        if current not in options:
            ss[state.SS_COMPARE] = next((n for n in names if os.path.join(root, n) != path_a), names[0])
        choice = st.selectbox("Run B", options, key=state.SS_COMPARE, help="runs under the viewer's path")
        return choice if os.path.isabs(choice) else os.path.join(root, choice)
    typed = st.text_input(
        "Run B (a run directory; this run's path again compares two of its steps)",
        key=state.SS_COMPARE,
        placeholder="rollout_traces/PROJECT/EXPERIMENT",
    )
    return os.path.expanduser(typed.strip()) if typed.strip() else path_a


def _on_select() -> None:
    sel = st.session_state.get("compare_table")
    rows = getattr(getattr(sel, "selection", None), "rows", None) or (sel or {}).get("selection", {}).get("rows", [])
    st.session_state["compare_row"] = rows[0] if rows else None


def draw(path: str, sig: tuple, root: str, root_sig: tuple) -> None:
    """Draw the comparison of run A (``path``) with run B."""
    ss = st.session_state
    st.header("Compare runs")
    path_b = _run_b(root, root_sig, path)
    try:
        D.check_allowed(path_b, state.ROOTS)
        sig_b = D.file_signature(path_b)
    except D.ViewerPathError as exc:
        st.error(safe.md(str(exc), 2000))
        return
    steps_a = cache.steps(path, sig).table.column(D.STEP).to_pylist()
    steps_b = cache.steps(path_b, sig_b).table.column(D.STEP).to_pylist()
    default_a, default_b, default_how = default_steps(steps_a, steps_b)
    if not ss.get(SS_DEFAULTED):
        ss[SS_DEFAULTED] = True
        if ss.get(state.SS_STEP_A) is None and ss.get(state.SS_STEP_B) is None:
            ss[state.SS_STEP_A], ss[state.SS_STEP_B] = default_a, default_b
    c1, c2 = st.columns(2)
    step_a = _step_choice("Steps of A", state.SS_STEP_A, steps_a, c1)
    step_b = _step_choice("Steps of B", state.SS_STEP_B, steps_b, c2)
    if (step_a, step_b) == (default_a, default_b):
        how = default_how
    elif step_a is None and step_b is None:
        how = "every step of each run, pooled per prompt"
    else:
        how = "the steps chosen above"
    st.markdown(
        D.escape_markdown(
            f"Compared at {how}. A: {path}{' (all steps)' if step_a is None else f' (step {step_a})'}  ·  "
            f"B: {path_b}{' (all steps)' if step_b is None else f' (step {step_b})'}"
        )
    )
    st.subheader("Configuration differences")
    diff = cache.config_differences(path, sig, path_b, sig_b)
    if diff:
        st.dataframe(pd.DataFrame(diff), hide_index=True, key="config_diff")
    else:
        st.caption("No difference in the recorded training config (runs record it with tracer.init(run_config=...)).")
    loaded = cache.comparison(path, sig, path_b, sig_b, step_a, step_b)
    cache.warn(loaded.warnings)
    rows = D.comparison_rows(loaded.table)
    if not rows:
        st.info("Neither run has trajectories with a sample index for these steps.")
        return
    st.subheader("Per prompt, the biggest regression first")
    regressed = sum(1 for r in rows if r[DELTA] is not None and r[DELTA] < 0)
    improved = sum(1 for r in rows if r[DELTA] is not None and r[DELTA] > 0)
    st.caption(f"{len(rows):,} prompts · {regressed:,} worse in B · {improved:,} better in B. Select a row to compare.")
    df = pd.DataFrame(rows).drop(columns=[TRACE_ID_A, TRACE_ID_B, PROMPT])
    st.dataframe(
        df,
        hide_index=True,
        key="compare_table",
        on_select=_on_select,
        selection_mode="single-row",
        column_config={
            QUESTION: st.column_config.TextColumn(QUESTION, width="large", help="the prompt's last user message"),
            STEPS_A: st.column_config.TextColumn("step A", width="small"),
            STEPS_B: st.column_config.TextColumn("step B", width="small"),
            **{
                c: st.column_config.NumberColumn(c, format="%.4g")
                for c in df.columns
                if c.startswith(("reward_", "pass_rate_")) or c in (DELTA, PASS_RATE_DELTA)
            },
        },
    )
    pick = ss.get("compare_row")
    if pick is None or pick >= len(rows):
        return
    full_prompt = loaded.table.column(PROMPT)[pick].as_py()
    picked = {**rows[pick], QUESTION: loaded.table.column(QUESTION)[pick].as_py()}
    _side_by_side(path, sig, path_b, sig_b, step_a, step_b, picked, full_prompt)


def _side(
    path: str, sig: tuple, step: int | None, r: dict[str, Any], col: Any, label: str, here: bool
) -> dict[str, str]:
    trajectories = cache.table(path, sig, step)
    mine = D.prompt_rollouts(trajectories, r[D.SAMPLE_INDEX], bool(r[D.VALIDATE]))
    listed = D.list_rows(mine.slice(0, MAX_SIDE_ROLLOUTS))
    ids = tuple(x[D.TRACE_ID] for x in listed)
    answers: dict[str, str] = {}
    if ids:
        spans = cache.group_spans(path, sig, ids, step)
        cache.warn(spans["warnings"])
        for table in spans["by_trace"].values():
            answers.update(D.final_answers(table))
    with col:
        st.markdown(f"**{label}**: {mine.num_rows} rollout(s)")  # no model text here
        for x in listed:
            with st.container(border=True), safe.isolated("rollout"):
                st.caption(
                    D.escape_markdown(
                        f"step {x[D.STEP]} · rollout {x['rollout']} · reward {short(x[D.REWARD])} · {x[D.STATUS]}"
                    )
                )
                safe.text(answers.get(x[D.TRACE_ID]) or "(no answer)", f"ans_{label}_{x[D.TRACE_ID]}", "answer")
                if here:
                    st.button(
                        "Replay",
                        key=f"cmp_{label}_{x[D.TRACE_ID]}",
                        on_click=state.open_trajectory,
                        args=(x[D.TRACE_ID], x[D.STEP]),
                    )
                else:
                    st.link_button("Replay (opens run B)", replay_link(path, x[D.TRACE_ID]))
    return answers


def replay_link(path: str, trace_id: str) -> str:
    """A deep link replaying ``trace_id`` of the run at ``path``."""
    return "?" + urlencode({state.QP_VIEW: "replay", state.QP_PATH: path, state.QP_TRACE_ID: trace_id})


def _side_by_side(
    path: str,
    sig: tuple,
    path_b: str,
    sig_b: tuple,
    step_a: int | None,
    step_b: int | None,
    r: dict[str, Any],
    prompt: str | None,
) -> None:
    st.subheader(safe.md(f"Sample {r[D.SAMPLE_INDEX]} · step A {r[STEPS_A] or '-'} · step B {r[STEPS_B] or '-'}"))
    st.caption("question")
    safe.text(r[QUESTION] or "(no user message found)", "cmp_question", "question")
    with st.expander("the whole prompt"):
        safe.text(prompt or "", "cmp_prompt", "prompt")
    a, b = st.columns(2)
    answers_a = _side(path, sig, step_a, r, a, "A", True)
    answers_b = _side(path_b, sig_b, step_b, r, b, "B", os.path.samefile(path, path_b))
    first_a = answers_a.get(r[TRACE_ID_A] or "", "")
    first_b = answers_b.get(r[TRACE_ID_B] or "", "")
    st.caption("final answers, A's first rollout against B's")
    safe.code(D.answer_diff(first_a, first_b), "cmp_diff", "diff", language="diff")

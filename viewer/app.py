"""rollout-trace viewer: a Streamlit app that replays recorded trajectories.

Run it with ``rollout-trace view PATH`` (or ``streamlit run viewer/app.py --
--path PATH``). The trace path comes from the ``path`` query parameter, the
``--path`` script argument, or ``ROLLOUT_TRACE_DIR``.

Deep links: ``?step=3`` opens step 3's trajectory list, ``?step=3&sample_index=7``
that prompt's group, ``?trace_id=...`` the trajectory's replay; ``view=``
(overview, trajectories, replay, group) picks a page explicitly.

Everything a model wrote is shown as text (``st.text``, ``st.code``, data
frames, chart labels) or escaped Markdown; nothing is rendered as HTML.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import altair as alt
import pandas as pd
import pyarrow.compute as pc
import streamlit as st

from viewer import data as D

VIEWS = ("Overview", "Trajectories", "Replay", "Group")
SPLITS = ("both", "train", "validation")
PAGE_SIZES = (25, 50, 100, 250)
#: The run selector's "every run together" choice.
ALL_RUNS = "all runs (mixed)"
#: The step selector's "no step" choice.
ALL_STEPS = "all steps"
#: Charts drawn in the browser stay small: at most this many waterfall rows and token cells.
MAX_WATERFALL_SPANS = 300
MAX_TOKEN_CELLS = 4096
#: Below this many bytes of trace files the group view compares the sample across steps by itself.
ACROSS_STEPS_AUTO_BYTES = 8 * 1024 * 1024
#: Rollouts per row in the group view.
GROUP_COLUMNS = 4
#: Cache sizes: whole-run tables are few and large, trajectories many and small.
RUN_CACHE_ENTRIES = 4
STEP_CACHE_ENTRIES = 16
#: From this many trace files on, a trace id -> file index is built once so a
#: trajectory is read from its own file(s) only (a run of many rollout workers).
INDEX_MIN_FILES = 3
SEARCH_CACHE_ENTRIES = 16
TRAJECTORY_CACHE_ENTRIES = 64

ROLE_AVATARS = {"system": ":material/settings:", "tool": ":material/build:"}


# -- cached readers ------------------------------------------------------------
# st.cache_resource hands back the same immutable Arrow tables without
# pickling them on every rerun (st.cache_data would copy them each time).


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Listing steps...")
def _steps(path: str, sig: tuple) -> D.Loaded:
    return D.list_steps(path)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading every trajectory of the run...")
def _run_base(path: str, sig: tuple) -> D.Loaded:
    return D.load_trajectories(path)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the tools of every trajectory...")
def _run(path: str, sig: tuple) -> D.Loaded:
    base = _run_base(path, sig)
    tools = D.tools_by_trajectory(path)
    return D.Loaded(D.with_tools(base.table, tools.table), D.merge_warnings(base.warnings, tools.warnings))


@st.cache_resource(max_entries=STEP_CACHE_ENTRIES, show_spinner="Reading the step's trajectories...")
def _step_table(path: str, sig: tuple, step: int) -> D.Loaded:
    return D.load_step(path, step)


@st.cache_resource(max_entries=SEARCH_CACHE_ENTRIES, show_spinner="Searching conversations...")
def _search(path: str, sig: tuple, text: str, step: int | None) -> D.Loaded:
    return D.search_trace_ids(path, text, None if step is None else [step])


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Indexing which file holds which trajectory...")
def _trace_index(path: str, sig: tuple) -> D.Loaded:
    return D.trace_file_index(path)


def _files_for(path: str, sig: tuple, trace_ids: tuple[str, ...]) -> list[str] | None:
    """The files holding these trajectories, for runs of many files; None (read all) for small runs."""
    if len(sig) < INDEX_MIN_FILES:
        return None
    return D.files_of(_trace_index(path, sig).table, trace_ids)


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the trajectory...")
def _trajectory(path: str, sig: tuple, trace_id: str, step: int | None) -> D.Loaded:
    return D.load_trajectory(path, trace_id, step, _files_for(path, sig, (trace_id,)))


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the group...")
def _group_spans(path: str, sig: tuple, trace_ids: tuple[str, ...], step: int | None) -> dict[str, Any]:
    loaded = D.load_group_spans(path, trace_ids, step, _files_for(path, sig, trace_ids))
    return {"by_trace": D.split_by_trace(loaded.table), "warnings": loaded.warnings}


# -- state and deep links ------------------------------------------------------


def _script_arg(argv: list[str], name: str) -> list[str]:
    """The value of ``--name`` among the script's arguments, as a one-item list (or empty)."""
    flag = f"--{name}"
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return [argv[i + 1]]
        if a.startswith(flag + "="):
            return [a.split("=", 1)[1]]
    return []


@st.cache_resource(max_entries=4, show_spinner="Loading the tokenizer...")
def _decoder(tokenizer_path: str) -> Any:
    return D.load_token_decoder(tokenizer_path)


def _token_decoder(path: str) -> Any:
    """Per-token text for the token view: ?tokenizer=, --tokenizer, or the run's recorded tokenizer path."""
    chosen = st.query_params.get("tokenizer") or next(iter(_script_arg(sys.argv[1:], "tokenizer")), None)
    chosen = chosen or D.run_tokenizer_path(path)
    if not chosen:
        return None
    try:
        return _decoder(chosen)
    except Exception as exc:  # a missing or broken tokenizer leaves ids in the view
        st.caption(D.escape_markdown(f"Token text unavailable ({type(exc).__name__}: {exc}); showing token ids."))
        return None


def _int_or_none(text: Any) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _init_state() -> None:
    """Seed the widgets' state from the URL once per session (deep links)."""
    ss = st.session_state
    if ss.get("_init"):
        return
    qp = st.query_params
    ss["_init"] = True
    step = _int_or_none(qp.get("step"))
    ss["step_sel"] = ALL_STEPS if step is None else step
    ss["trace_id"] = qp.get("trace_id") or ""
    ss["sample_index"] = qp.get("sample_index")
    val = str(qp.get("validate", "")).lower()
    ss["split"] = "validation" if val in ("1", "true") else "train" if val in ("0", "false") else "both"
    view = str(qp.get("view", "")).capitalize()
    if view not in VIEWS:
        if ss["trace_id"]:
            view = "Replay"
        elif ss["sample_index"] is not None and step is not None:
            view = "Group"
        elif step is not None:
            view = "Trajectories"
        else:
            view = "Overview"
    ss["view"] = view


def _sync_query_params(path_from_url: str | None) -> None:
    """Write the current view into the URL so it can be shared."""
    ss = st.session_state
    qp: dict[str, str] = {"view": ss["view"].lower()}
    if path_from_url:
        qp["path"] = path_from_url
    if st.query_params.get("tokenizer"):
        qp["tokenizer"] = st.query_params["tokenizer"]
    if ss.get("run_sel"):
        qp["run"] = ss["run_sel"]
    if _step() is not None:
        qp["step"] = str(_step())
    if ss.get("split") != "both":
        qp["validate"] = "true" if ss.get("split") == "validation" else "false"
    if ss["view"] == "Replay" and ss.get("trace_id"):
        qp["trace_id"] = ss["trace_id"]
    if ss["view"] == "Group" and ss.get("sample_index") is not None:
        qp["sample_index"] = str(ss["sample_index"])
    if dict(st.query_params.to_dict()) != qp:
        st.query_params.from_dict(qp)


def _open_trajectory(trace_id: str, step: int | None = None) -> None:
    """Button callback: show ``trace_id``'s replay."""
    st.session_state["trace_id"] = trace_id
    if step is not None:
        st.session_state["step_sel"] = step
    st.session_state["view"] = "Replay"


def _open_group(step: int, sample_index: str) -> None:
    """Button callback: show the group of (step, sample_index)."""
    st.session_state["step_sel"] = step
    st.session_state["sample_index"] = sample_index
    st.session_state["view"] = "Group"


def _open_picked() -> None:
    """Button callback: open the trajectory chosen in the list's selectbox."""
    tid = st.session_state.get("pick")
    if tid:
        _open_trajectory(tid, None)


def _on_list_select() -> None:
    sel = st.session_state.get("list_table")
    rows = getattr(getattr(sel, "selection", None), "rows", None) or (sel or {}).get("selection", {}).get("rows", [])
    ids = st.session_state.get("_page_ids") or []
    if rows and rows[0] < len(ids):
        tid, step = ids[rows[0]]
        _open_trajectory(tid, None)


def _show_warnings(box: Any) -> None:
    for m in _WARNINGS:
        box.warning(
            "Trace file read up to its last complete batch (damaged, or still being written): " + D.escape_markdown(m)
        )


def _step() -> int | None:
    """The chosen step, None for all steps."""
    s = st.session_state.get("step_sel", ALL_STEPS)
    return None if s == ALL_STEPS else s


def _split_value() -> bool | None:
    return {"both": None, "train": False, "validation": True}[st.session_state.get("split", "both")]


#: Readers' warnings about damaged files seen during this script run, shown once at the top.
_WARNINGS: list[str] = []


def _warn(messages: list[str]) -> None:
    for m in messages:
        if m not in _WARNINGS:
            _WARNINGS.append(m)


def _table(path: str, sig: tuple, step: int | None) -> Any:
    """The trajectories of ``step`` (cached per step), or of the whole run when None."""
    loaded = _run(path, sig) if step is None else _step_table(path, sig, step)
    _warn(loaded.warnings)
    return loaded.table


# -- views ---------------------------------------------------------------------


def _view_overview(path: str, sig: tuple) -> None:
    st.header("Run overview")
    loaded = _run_base(path, sig)
    _warn(loaded.warnings)
    traj = D.select(loaded.table, None, _split_value())
    totals = D.run_totals(traj)
    cols = st.columns(len(totals))
    for col, (k, v) in zip(cols, totals.items()):
        col.metric(k, f"{v:.1%}" if k == "tool error rate" else f"{v:,}")
    rows = D.overview(traj)
    if not rows:
        st.info("No trajectories recorded yet.")
        return
    df = pd.DataFrame(rows)
    df["reward/lo"] = df["reward/mean"] - df["reward/std"]
    df["reward/hi"] = df["reward/mean"] + df["reward/std"]
    base = alt.Chart(df).encode(x=alt.X("step:Q", title="step"), color=alt.Color("split:N"))
    band = base.mark_area(opacity=0.2).encode(y="reward/lo:Q", y2="reward/hi:Q")
    line = base.mark_line(point=True).encode(
        y=alt.Y("reward/mean:Q", title="reward (mean ± std)"),
        tooltip=["step", "split", "reward/mean", "reward/std", "reward/min", "reward/max", "trajectories"],
    )
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("Reward per step")
        st.altair_chart(band + line, width="stretch")
    with c2:
        st.subheader("Turns and tool calls per trajectory")
        long = df.melt(id_vars=["step", "split"], value_vars=["turns/mean", "tool_calls/mean"], var_name="metric")
        st.altair_chart(
            alt.Chart(long)
            .mark_line(point=True)
            .encode(
                x="step:Q",
                y=alt.Y("value:Q", title="mean"),
                color="metric:N",
                strokeDash="split:N",
                tooltip=["step", "split", "metric", "value"],
            ),
            width="stretch",
        )
    c3, c4 = st.columns(2)
    with c3:
        st.subheader("Tool error rate")
        st.altair_chart(
            alt.Chart(df)
            .mark_bar()
            .encode(
                x="step:O",
                xOffset="split:N",
                y=alt.Y("tool_error_rate:Q", axis=alt.Axis(format="%")),
                color="split:N",
                tooltip=["step", "split", "tool_error_rate"],
            ),
            width="stretch",
        )
    with c4:
        st.subheader("Latency (s)")
        lat = df.melt(id_vars=["step", "split"], value_vars=["latency_s/p50", "latency_s/p95"], var_name="metric")
        st.altair_chart(
            alt.Chart(lat)
            .mark_line(point=True)
            .encode(
                x="step:Q",
                y=alt.Y("value:Q", title="seconds"),
                color="metric:N",
                strokeDash="split:N",
                tooltip=["step", "split", "metric", "value"],
            ),
            width="stretch",
        )
    st.subheader("Per step")
    st.dataframe(df.drop(columns=["reward/lo", "reward/hi"]), hide_index=True, key="overview_table")


def _min_max(column: Any) -> tuple[Any, Any]:
    mm = pc.min_max(column)
    return mm["min"].as_py(), mm["max"].as_py()


def _keep_known(ss: Any, key: str, options: list[str]) -> None:
    """Drop choices a previous step offered that this one does not (Streamlit refuses unknown values)."""
    if key in ss:
        ss[key] = [v for v in ss[key] if v in options]


def _keep_in_range(ss: Any, key: str, lo: Any, hi: Any) -> None:
    """Reset a range slider whose remembered range lies outside this step's values."""
    value = ss.get(key)
    if value is not None and not (lo <= value[0] <= hi and lo <= value[1] <= hi):
        del ss[key]


def _row_label(r: dict[str, Any]) -> str:
    return f"step {r['step']} · sample {r['sample']} · rollout {r['rollout']} · reward {_fmt(r['reward'])} · {r['trace_id']}"


def _view_list(path: str, sig: tuple) -> None:
    ss = st.session_state
    step = _step()
    st.header("Trajectories" + (f" of step {step}" if step is not None else " (all steps)"))
    base = D.select(_table(path, sig, step), None, _split_value())
    if base.num_rows == 0:
        st.info("No trajectories for this step and split.")
        return
    c1, c2, c3 = st.columns([2, 1, 1])
    query = c1.text_input(
        "Search the conversations", key="q", placeholder="text in any prompt, response, tool call or result"
    )
    statuses = sorted(s for s in pc.unique(base.column(D.STATUS)).to_pylist() if s)
    _keep_known(ss, "f_status", statuses)
    chosen_status = c2.multiselect("Status", statuses, key="f_status")
    tools = D.tool_names(base)
    _keep_known(ss, "f_tools", tools)
    chosen_tools = c3.multiselect("Tool used", tools, key="f_tools")
    c4, c5, c6, c7 = st.columns(4)
    r_lo, r_hi = _min_max(base.column(D.REWARD))
    reward_range = None
    if r_lo is not None and r_lo < r_hi:
        _keep_in_range(ss, "f_reward", float(r_lo), float(r_hi))
        reward_range = c4.slider("Reward", float(r_lo), float(r_hi), (float(r_lo), float(r_hi)), key="f_reward")
    t_lo, t_hi = _min_max(base.column(D.NUM_LLM_CALLS))
    turns_range = None
    if t_lo is not None and t_lo < t_hi:
        _keep_in_range(ss, "f_turns", int(t_lo), int(t_hi))
        turns_range = c5.slider("Turns", int(t_lo), int(t_hi), (int(t_lo), int(t_hi)), key="f_turns")
    sort = c6.selectbox("Sort by", list(D.SORT_COLUMNS), key="sort")
    desc = c7.toggle("Descending", key="desc")
    filters = D.Filters(statuses=chosen_status, tools=chosen_tools)
    if reward_range is not None and reward_range != (r_lo, r_hi):
        filters.reward_min, filters.reward_max = reward_range
    if turns_range is not None:
        filters.turns_min, filters.turns_max = turns_range
    if query.strip():
        found = _search(path, sig, query.strip(), step)
        _warn(found.warnings)
        filters.trace_ids = found.table.column(D.TRACE_ID).combine_chunks()
    filtered = D.apply_filters(base, filters)
    p1, p2, p3 = st.columns([1, 1, 2])
    page_size = p1.selectbox("Rows per page", PAGE_SIZES, key="page_size")
    pages = max(1, -(-filtered.num_rows // page_size))
    if ss.get("page", 1) > pages:
        ss["page"] = pages
    page = p2.number_input("Page", min_value=1, max_value=pages, step=1, key="page")
    p3.caption(f"{filtered.num_rows:,} of {base.num_rows:,} trajectories match; page {page} of {pages:,}")
    shown, _ = D.sort_and_page(filtered, sort, desc, int(page) - 1, page_size)
    rows = D.list_rows(shown)
    ss["_page_ids"] = [(r["trace_id"], r["step"]) for r in rows]
    if not rows:
        st.info("No trajectory matches these filters.")
        return
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        key="list_table",
        on_select=_on_list_select,
        selection_mode="single-row",
        column_config={
            "reward": st.column_config.NumberColumn(format="%.3f"),
            "advantage": st.column_config.NumberColumn(format="%.3f"),
            "latency_s": st.column_config.NumberColumn("latency (s)", format="%.3f"),
        },
    )
    o1, o2 = st.columns([3, 1])
    labels = {r["trace_id"]: _row_label(r) for r in rows}
    o1.selectbox(
        "Open a trajectory (or select a row above)", list(labels), format_func=lambda t: labels.get(t, t), key="pick"
    )
    o2.button("Open", key="open_pick", on_click=_open_picked, type="primary")


def _render_message(msg: dict[str, Any]) -> None:
    role = str(msg.get("role", "assistant"))
    with st.chat_message(role, avatar=ROLE_AVATARS.get(role)):
        label = role + (f" · {msg['name']}" if role == "tool" and msg.get("name") else "")
        st.caption(D.escape_markdown(label))
        text = D.content_text(msg.get("content"))
        if role == "tool":
            st.code(text, language=None, wrap_lines=True)
        elif text:
            st.text(text)
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            st.caption(D.escape_markdown(f"tool call: {fn.get('name', '?')} (id {call.get('id', '?')})"))
            st.code(D.pretty_json(fn.get("arguments", "")), language="json", wrap_lines=True)


def _waterfall_height(rows: list[dict[str, Any]]) -> int:
    return max(120, 28 * len(rows) + 50)


def _token_height(turn: D.TokenTurn) -> int:
    return 28 * (max(1, -(-min(turn.kept, MAX_TOKEN_CELLS) // D.TOKENS_PER_ROW))) + 20


# The replay's charts are plain Vega-Lite specs: Altair's schema validation
# cost ~0.3 s per trajectory here, more than reading it.


def _waterfall_spec(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "mark": {"type": "bar"},
        "height": _waterfall_height(rows),
        "encoding": {
            "x": {"field": "start_ms", "type": "quantitative", "title": "ms since the trajectory started"},
            "x2": {"field": "end_ms"},
            "y": {
                "field": "span",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelOverlap": False, "labelLimit": 300},
            },
            "color": {"field": "kind", "type": "nominal"},
            "stroke": {"condition": {"test": "datum.status === 'error'", "value": "red"}, "value": None},
            "tooltip": [
                {"field": "name", "type": "nominal"},
                {"field": "kind", "type": "nominal"},
                {"field": "status", "type": "nominal"},
                {"field": "duration_ms", "type": "quantitative", "format": ".3f"},
                {"field": "start_ms", "type": "quantitative", "format": ".3f"},
            ],
        },
    }


def _token_spec(turn: D.TokenTurn, has_logprobs: bool) -> dict[str, Any]:
    color: dict[str, Any] = (
        {
            "field": "logprob",
            "type": "quantitative",
            "title": "logprob",
            "scale": {"scheme": "redyellowgreen", "domain": [-5, 0], "clamp": True},
        }
        if has_logprobs
        else {"value": "#dde"}
    )
    return {
        "height": _token_height(turn),
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "axis": None},
            "y": {"field": "row", "type": "ordinal", "axis": None},
            "tooltip": [
                {"field": "pos", "type": "quantitative"},
                {"field": "token", "type": "nominal"},
                {"field": "token_id", "type": "quantitative"},
                {"field": "logprob", "type": "quantitative", "format": ".4f"},
                {"field": "prob", "type": "quantitative", "format": ".3f"},
            ],
        },
        "layer": [
            {"mark": {"type": "rect", "stroke": "white"}, "encoding": {"color": color}},
            {"mark": {"type": "text", "fontSize": 10}, "encoding": {"text": {"field": "label", "type": "nominal"}}},
        ],
    }


def _view_replay(path: str, sig: tuple) -> None:
    ss = st.session_state
    st.header("Trajectory replay")
    st.text_input("Trace id", key="trace_id", placeholder="paste a trace id, or open one from the Trajectories view")
    tid = (ss.get("trace_id") or "").strip()
    if not tid:
        st.info("Pick a trajectory in the Trajectories view, or paste its trace id above.")
        return
    loaded = _trajectory(path, sig, tid, None)
    _warn(loaded.warnings)
    spans = loaded.table
    row = D.trajectory_summary(spans)
    if row is None:
        st.error(D.escape_markdown(f"No trajectory with trace id {tid} under {path}. Check the id, or the path."))
        return
    if row[D.REWARD] is None and row[D.STEP] is not None:
        # A reward logged from another process carries no trace id: the step's table joins it.
        row = D.find_trajectory(_table(path, sig, row[D.STEP]), tid) or row
    m = st.columns(7)
    m[0].metric("step", row[D.STEP])
    m[1].metric("sample", row[D.SAMPLE_INDEX])
    m[2].metric("rollout", row[D.ROLLOUT_N])
    m[3].metric("reward", "—" if row[D.REWARD] is None else f"{row[D.REWARD]:.4g}")
    m[4].metric("advantage", "—" if row.get(D.ADVANTAGE_COL) is None else f"{row[D.ADVANTAGE_COL]:.4g}")
    m[5].metric("status", row[D.STATUS])
    m[6].metric("latency", f"{row[D.LATENCY_COL]:.3f} s")
    st.caption(
        D.escape_markdown(
            f"trace {tid} · {'validation' if row[D.VALIDATE] else 'train'} · {row[D.NUM_SPANS]} spans · {row[D.NUM_LLM_CALLS]} turns · {row[D.NUM_TOOL_CALLS]} tool calls ({row[D.NUM_TOOL_ERRORS]} failed)"
        )
    )
    if row[D.STEP] is not None and row[D.SAMPLE_INDEX] is not None:
        st.button(
            "Show this prompt's group", key="to_group", on_click=_open_group, args=(row[D.STEP], row[D.SAMPLE_INDEX])
        )
    if row.get(D.REWARD_INFO):
        with st.expander("Reward details"):
            st.code(D.pretty_json(row[D.REWARD_INFO]), language="json")
    for err in D.span_errors(spans):
        st.error(D.escape_markdown(f"{err['kind']} span {err['name']} failed: {err['type']}: {err['message']}"))
        if err["traceback"]:
            with st.expander(f"Traceback of {err['name']}"):
                st.code(err["traceback"], language="python")
    tab_conv, tab_tools, tab_time, tab_tokens, tab_spans = st.tabs(
        ["Conversation", "Tool calls", "Timing", "Tokens", "Spans"]
    )
    with tab_conv:
        msgs = D.messages(spans)
        if not msgs:
            st.info("This trajectory recorded no conversation (no messages on its root span and no llm spans).")
        for msg in msgs:
            _render_message(msg)
    with tab_tools:
        calls = D.tool_spans(spans)
        if not calls:
            st.caption("No tool calls.")
        for i, call in enumerate(calls):
            status = "ok" if call["status"] == "ok" else f"{call['status']}"
            st.markdown(D.escape_markdown(f"{i + 1}. {call['name']} — {status} — {call['duration_ms']:.2f} ms"))
            a, b = st.columns(2)
            a.caption("arguments")
            a.code(call["arguments"], language="json", wrap_lines=True)
            if call["error"]:
                b.caption("error")
                b.code(
                    f"{call['error'].get('type', '')}: {call['error'].get('message', '')}",
                    language=None,
                    wrap_lines=True,
                )
            else:
                b.caption("result")
                b.code(call["result"], language=None, wrap_lines=True)
    with tab_time:
        rows = D.waterfall(spans)
        if len(rows) > MAX_WATERFALL_SPANS:
            st.caption(f"Showing the first {MAX_WATERFALL_SPANS} of {len(rows):,} spans; the Spans tab lists them all.")
            rows = rows[:MAX_WATERFALL_SPANS]
        if rows:
            st.vega_lite_chart(
                pd.DataFrame(rows), _waterfall_spec(rows), width="stretch", height=_waterfall_height(rows)
            )
    with tab_tokens:
        turns = D.token_turns(spans, _token_decoder(path))
        if not turns:
            st.caption("No llm spans.")
        for turn in turns:
            kept = turn.kept
            if turn.truncated:
                of = f" of {turn.recorded}" if turn.recorded is not None else ""
                head = f"Turn {turn.index + 1}: {turn.name} — {kept} token(s) kept{of}"
            else:
                head = f"Turn {turn.index + 1}: {turn.name} — {kept} token(s)"
            if turn.prompt_tokens is not None:
                head += f" · prompt {turn.prompt_tokens} tokens"
            if turn.finish_reason:
                head += f" · finish {turn.finish_reason}"
            st.markdown("**" + D.escape_markdown(head) + "**")
            if turn.truncated:
                st.warning(
                    D.escape_markdown(
                        f"Truncated: the engine produced {turn.recorded if turn.recorded is not None else 'more'} tokens; the record keeps the first {kept} (tracer max_tokens)."
                    )
                )
            if turn.logprobs is None:
                st.caption("No per-token logprobs recorded.")
            cells = turn.cells()
            if len(cells) > MAX_TOKEN_CELLS:
                st.caption(f"Token grid: the first {MAX_TOKEN_CELLS:,} of {len(cells):,} tokens.")
                cells = cells[:MAX_TOKEN_CELLS]
            if cells:
                df = pd.DataFrame(cells)
                st.vega_lite_chart(
                    df,
                    _token_spec(turn, bool(df["logprob"].notna().any())),
                    width="stretch",
                    height=_token_height(turn),
                )
            if turn.text:
                st.text(turn.text)
    with tab_spans:
        st.dataframe(pd.DataFrame(D.waterfall(spans)), hide_index=True, key="span_table")


def _view_group(path: str, sig: tuple) -> None:
    ss = st.session_state
    st.header("Group: the rollouts of one prompt")
    step = _step()
    if step is None:
        st.info("Choose a step in the sidebar to see its groups.")
        return
    traj = _table(path, sig, step)
    in_step = D.select(traj, None, _split_value())
    samples = sorted(
        {s for s in in_step.column(D.SAMPLE_INDEX).to_pylist() if s is not None}, key=lambda s: (len(s), s)
    )
    if not samples:
        st.info("No trajectories at this step.")
        return
    if ss.get("sample_index") not in samples:
        ss["sample_index"] = samples[0]
    sample = st.selectbox("Sample (prompt)", samples, key="sample_index")
    g = D.group(traj, step, sample, _split_value())
    rows = D.list_rows(g)
    st.caption(f"step {step} · sample {sample} · {len(rows)} rollout(s)")
    df = pd.DataFrame(rows)
    if not df.empty:
        st.dataframe(
            df[
                [
                    "rollout",
                    "reward",
                    "advantage",
                    "status",
                    "turns",
                    "tool calls",
                    "tool errors",
                    "tools",
                    "latency_s",
                    "trace_id",
                ]
            ],
            hide_index=True,
            key="group_table",
        )
        long = df.melt(id_vars=["rollout"], value_vars=["reward", "advantage"], var_name="metric").dropna()
        if not long.empty:
            st.altair_chart(
                alt.Chart(long)
                .mark_bar()
                .encode(
                    x="rollout:O",
                    xOffset="metric:N",
                    y="value:Q",
                    color="metric:N",
                    tooltip=["rollout", "metric", "value"],
                ),
                width="stretch",
            )
    loaded = _group_spans(path, sig, tuple(r["trace_id"] for r in rows), step)
    _warn(loaded["warnings"])
    by_trace = loaded["by_trace"]
    for start in range(0, len(rows), GROUP_COLUMNS):
        cols = st.columns(GROUP_COLUMNS)
        for col, r in zip(cols, rows[start : start + GROUP_COLUMNS]):
            with col, st.container(border=True):
                st.markdown(
                    D.escape_markdown(f"rollout {r['rollout']}")
                    + f" · reward **{_fmt(r['reward'])}** · advantage **{_fmt(r['advantage'])}**"
                )
                st.caption(
                    D.escape_markdown(
                        f"{r['status']} · {r['turns']} turns · {r['tool calls']} tool calls ({r['tool errors']} failed)"
                    )
                )
                spans = by_trace.get(r["trace_id"])
                msgs = D.messages(spans) if spans is not None else []
                final = next((m for m in reversed(msgs) if m.get("role") == "assistant"), None)
                st.caption("final answer")
                st.text(D.content_text(final.get("content")) if final else "(none)")
                with st.expander("conversation"):
                    for m in msgs:
                        st.caption(D.escape_markdown(str(m.get("role"))))
                        st.text(D.content_text(m.get("content")) or "(tool call)")
                st.button(
                    "Replay", key=f"replay_{r['trace_id']}", on_click=_open_trajectory, args=(r["trace_id"], r["step"])
                )
    st.subheader("The same sample across steps")
    # Needs every trajectory of the run: automatic for small runs, one click for big ones.
    small = sum(size for _, size, _ in sig) < ACROSS_STEPS_AUTO_BYTES
    if not st.toggle("Compare with every step (reads the whole run)", value=small, key="across_on"):
        return
    across = D.sample_across_steps(_run_base(path, sig).table, sample, _split_value())
    if across:
        adf = pd.DataFrame(across)
        st.dataframe(adf, hide_index=True, key="across_table")
        if len(adf) > 1:
            base = alt.Chart(adf).encode(x="step:Q")
            st.altair_chart(
                base.mark_area(opacity=0.2).encode(y="reward min:Q", y2="reward max:Q")
                + base.mark_line(point=True).encode(y=alt.Y("reward mean:Q", title="reward (mean, min-max)")),
                width="stretch",
            )


def _fmt(x: Any) -> str:
    return "—" if x is None else f"{x:.3g}"


# -- page ----------------------------------------------------------------------


def _choose_run(path: str, sig: tuple) -> tuple[str, tuple]:
    """When PATH holds several runs (directories of trace files), pick one: newest by default, or ?run=."""
    dirs = D.run_dirs(sig)
    if len(dirs) < 2:
        return path, sig
    ss = st.session_state
    names = [os.path.relpath(d, path) for d in dirs]
    if ss.get("run_sel") not in [*names, ALL_RUNS]:
        wanted = st.query_params.get("run")
        ss["run_sel"] = wanted if wanted in names or wanted == ALL_RUNS else names[0]
    choice = st.sidebar.selectbox("Run", [*names, ALL_RUNS], key="run_sel", help="runs under PATH, newest first")
    if choice == ALL_RUNS:
        return path, sig
    chosen = os.path.join(path, choice)
    return chosen, D.file_signature(chosen)


def main() -> None:
    """Draw the app."""
    st.set_page_config(page_title="rollout-trace viewer", layout="wide")
    _init_state()
    ss = st.session_state
    url_path = st.query_params.get("path")
    path = D.resolve_path(url_path, _script_arg(sys.argv[1:], "path"))
    st.sidebar.title("rollout-trace")
    if path is None:
        st.info(
            "No trace path given. Start the viewer with `rollout-trace view PATH`, add `?path=PATH` to the URL, "
            "or set ROLLOUT_TRACE_DIR."
        )
        return
    st.sidebar.caption(D.escape_markdown(path))
    try:
        sig = D.file_signature(path)
    except D.ViewerPathError as exc:
        st.error(D.escape_markdown(str(exc)))
        return
    path, sig = _choose_run(path, sig)
    warn_box = st.container()
    steps_loaded = _steps(path, sig)
    _warn(steps_loaded.warnings)
    steps = steps_loaded.table.column(D.STEP).to_pylist()
    if not steps and _run_base(path, sig).table.num_rows == 0:
        _show_warnings(warn_box)
        st.info(D.escape_markdown(f"The trace files under {path} hold no readable trajectories yet."))
        return
    if ss.get("step_sel") not in steps:
        ss["step_sel"] = ALL_STEPS
    st.sidebar.radio("View", VIEWS, key="view")
    st.sidebar.selectbox(
        "Step", [ALL_STEPS, *steps], format_func=lambda s: s if s == ALL_STEPS else f"step {s}", key="step_sel"
    )
    st.sidebar.radio("Split", SPLITS, key="split", horizontal=True)
    st.sidebar.button(
        "Reload files", on_click=st.cache_resource.clear, help="Drop cached tables and re-read the trace files"
    )
    view = ss["view"]
    try:
        if view == "Overview":
            _view_overview(path, sig)
        elif view == "Trajectories":
            _view_list(path, sig)
        elif view == "Replay":
            _view_replay(path, sig)
        else:
            _view_group(path, sig)
    except Exception as exc:  # one broken record must not take the page down
        st.error(D.escape_markdown(f"Could not draw this view: {type(exc).__name__}: {exc}"))
        with st.expander("details"):
            st.code(traceback.format_exc(), language="python")
    _show_warnings(warn_box)
    _sync_query_params(url_path)


main()

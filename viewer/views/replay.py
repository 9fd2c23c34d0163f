"""The Replay page: one trajectory's conversation, tool calls, timing, tokens (with the trainer's per-token stats) and spans."""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
import pyarrow as pa
import streamlit as st

from viewer import cache, charts, safe, state
from viewer import data as D
from viewer.format import metric_value, seconds

MAX_WATERFALL_SPANS = 300
#: Messages of the conversation drawn at first, and added by each "show more".
MESSAGES_PER_PAGE = 40
#: Session key prefix (then the trace id): how many messages the conversation shows.
SS_MESSAGES_SHOWN = "messages_shown"
#: Tokens the "worst tokens" table lists per turn.
WORST_TOKENS = 10
ROLE_AVATARS = {"system": ":material/settings:", "tool": ":material/build:"}


def token_decoder(path: str) -> Any:
    """Per-token text for the token view: ?tokenizer=, --tokenizer, or the run's recorded tokenizer path."""
    chosen = state.parse_param(st.query_params.get(state.QP_TOKENIZER), str) or state.script_arg(
        sys.argv[1:], "tokenizer"
    )
    chosen = chosen or D.run_tokenizer_path(path)
    if not chosen:
        return None
    try:
        return cache.decoder(chosen)
    except Exception as exc:  # a missing or broken tokenizer leaves ids in the view
        st.caption(safe.md(f"Token text unavailable ({type(exc).__name__}: {exc}); showing token ids."))
        return None


def trajectory_row(path: str, sig: tuple, trace_id: str) -> tuple[dict[str, Any] | None, Any]:
    """The trajectory's summary row and spans (the reward joined from its step when logged elsewhere)."""
    loaded = cache.trajectory(path, sig, trace_id, None)
    cache.warn(loaded.warnings)
    spans = loaded.table
    row = D.trajectory_summary(spans)
    if row is not None and row[D.REWARD] is None and row[D.STEP] is not None:
        # A reward logged from another process carries no trace id: the step's table joins it.
        row = D.find_trajectory(cache.table(path, sig, row[D.STEP]), trace_id) or row
    return row, spans


def _calls_of(msg: dict[str, Any]) -> list[Any]:
    """A message's tool calls as a list, whatever shape the record gave them (a string is one call)."""
    calls = msg.get("tool_calls")
    if not calls:
        return []
    return list(calls) if isinstance(calls, (list, tuple)) else [calls]


def render_message(msg: dict[str, Any], key: str = "msg") -> None:
    """One chat message, as text: every string inert and bounded."""
    role = safe.clip(msg.get("role") or "assistant", 40)
    with st.chat_message(role if role.strip() else "assistant", avatar=ROLE_AVATARS.get(role)):
        label = role + (f" · {msg['name']}" if role == "tool" and msg.get("name") else "")  # OpenAI message keys
        st.caption(safe.md(label))
        text = D.content_text(msg.get("content"))
        if role == "tool":
            safe.code(text, f"{key}_tool", "tool output")
        elif text:
            safe.text(text, f"{key}_text", "message")
        for j, call in enumerate(_calls_of(msg)):
            with safe.isolated("tool call"):
                c = call if isinstance(call, dict) else {"function": {"arguments": call}}
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {"arguments": fn}
                st.caption(safe.md(f"tool call: {fn.get('name', '?')} (id {c.get('id', '?')})"))
                safe.code(D.pretty_json(fn.get("arguments", "")), f"{key}_call{j}", "tool call", language="json")


def draw(path: str, sig: tuple) -> None:
    """Draw the replay of the trajectory in the session's trace id."""
    ss = st.session_state
    st.header("Trajectory replay")
    st.text_input(
        "Trace id", key=state.SS_TRACE, placeholder="paste a trace id, or open one from the Trajectories view"
    )
    tid = (ss.get(state.SS_TRACE) or "").strip()
    if not tid:
        st.info("Pick a trajectory in the Trajectories view, or paste its trace id above.")
        return
    row, spans = trajectory_row(path, sig, tid)
    if row is None:
        st.error(safe.md(f"No trajectory with trace id {tid} under {path}. Check the id, or the path."))
        return
    m = st.columns(4)
    m[0].metric("step", metric_value(row[D.STEP]))
    m[1].metric("sample", safe.md(metric_value(row[D.SAMPLE_INDEX]), 40))
    m[2].metric("rollout", metric_value(row[D.ROLLOUT_N]))
    m[3].metric("status", safe.md(metric_value(row[D.STATUS]), 40))
    m = st.columns(4)
    m[0].metric("reward", metric_value(row[D.REWARD]))
    m[1].metric("advantage", metric_value(row.get(D.ADVANTAGE_COL)))
    m[2].metric("latency", seconds(row[D.LATENCY_COL]))
    m[3].metric("turns", metric_value(row[D.NUM_LLM_CALLS]))
    st.caption(
        safe.md(
            f"trace {tid} · {'validation' if row[D.VALIDATE] else 'train'} · {row[D.NUM_SPANS]} spans · "
            f"{row[D.NUM_LLM_CALLS]} turns · {row[D.NUM_TOOL_CALLS]} tool calls ({row[D.NUM_TOOL_ERRORS]} failed)"
        )
    )
    if row[D.STEP] is not None and row[D.SAMPLE_INDEX] is not None:
        st.button(
            "Show this prompt's group",
            key="to_group",
            on_click=state.open_group,
            args=(row[D.STEP], row[D.SAMPLE_INDEX]),
        )
    with safe.isolated("reward sources"):
        _reward_sources(spans)
    if row.get(D.REWARD_INFO):
        with st.expander("Reward details"):
            safe.code(D.pretty_json(row[D.REWARD_INFO]), "reward_info", "reward details", language="json")
    for i, err in enumerate(D.span_errors(spans)):
        with safe.isolated("span error"):
            st.error(safe.md(f"{err[D.KIND]} span {err[D.NAME]} failed: {err['type']}: {err['message']}", 2000))
            if err["traceback"]:
                with st.expander(safe.md(f"Traceback of {err[D.NAME]}")):
                    safe.code(err["traceback"], f"tb{i}", "traceback", language="python")
    tab_conv, tab_tools, tab_time, tab_tokens, tab_spans = st.tabs(
        ["Conversation", "Tool calls", "Timing", "Tokens", "Spans"]
    )
    with tab_conv:
        msgs = D.messages(spans)
        if not msgs:
            st.info("This trajectory recorded no conversation (no messages on its root span and no llm spans).")
        shown_key = f"{SS_MESSAGES_SHOWN}_{tid}"
        shown = st.session_state.get(shown_key, MESSAGES_PER_PAGE)
        for i, msg in enumerate(msgs[:shown]):
            with safe.isolated("message"):
                render_message(msg, f"msg{i}")
        if len(msgs) > shown:
            st.button(
                f"show more ({len(msgs) - shown} more messages)",
                key="more_messages",
                on_click=lambda: st.session_state.update({shown_key: shown + MESSAGES_PER_PAGE}),
            )
    with tab_tools, safe.isolated("list of tool calls"):
        _tool_calls(spans)
    with tab_time, safe.isolated("timing chart"):
        rows = _chart_rows(D.waterfall(spans))
        if len(rows) > MAX_WATERFALL_SPANS:
            st.caption(f"Showing the first {MAX_WATERFALL_SPANS} of {len(rows):,} spans; the Spans tab lists them all.")
            rows = rows[:MAX_WATERFALL_SPANS]
        if rows:
            st.caption("Bars are coloured by span kind; a failed span has a red outline.")
            st.vega_lite_chart(
                pd.DataFrame(rows), charts.waterfall_spec(rows), width="stretch", height=charts.waterfall_height(rows)
            )
    with tab_tokens, safe.isolated("token view"):
        _tokens(path, sig, tid, row, spans)
    with tab_spans, safe.isolated("span table"):
        st.dataframe(pd.DataFrame(_chart_rows(D.waterfall(spans))), hide_index=True, key="span_table")


def _reward_sources(spans: Any) -> None:
    """Where the reward came from; every source with its value and time on request."""
    sources = D.reward_sources(spans)
    if not sources:
        return
    latest = sources[-1]
    st.caption(
        safe.md(f"reward {metric_value(latest[D.REWARD])} from {latest[D.REWARD_SOURCE]} ({len(sources)} source(s))")
    )
    with st.expander(f"Reward sources ({len(sources)})"):
        for r in sources:
            r[D.REWARD_SOURCE] = safe.clip(r[D.REWARD_SOURCE])
        st.dataframe(pd.DataFrame(sources), hide_index=True, key="reward_sources")


def _chart_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Waterfall rows with names cut to a label's length: a huge span name cannot stall the chart."""
    for r in rows:
        for k in ("span", D.NAME, D.KIND, D.STATUS):
            if isinstance(r.get(k), str):
                r[k] = safe.clip(r[k])
    return rows


def _tool_calls(spans: Any) -> None:
    calls = D.tool_spans(spans)
    if not calls:
        st.caption("No tool calls.")
    for i, call in enumerate(calls):
        with safe.isolated("tool call"):
            status = "ok" if call[D.STATUS] == "ok" else f"{call[D.STATUS]}"
            st.markdown(safe.md(f"{i + 1}. {call[D.NAME]} — {status} — {call['duration_ms']:.2f} ms"))
            a, b = st.columns(2)
            with a:
                st.caption("arguments")
                safe.code(call["arguments"], f"tc{i}_args", "tool arguments", language="json")
            with b:
                err = call[D.ERROR]
                if err:
                    st.caption("error")
                    err = err if isinstance(err, dict) else {"message": err}
                    safe.code(f"{err.get('type', '')}: {err.get('message', '')}", f"tc{i}_err", "tool error")
                else:
                    st.caption("result")
                    safe.code(call["result"], f"tc{i}_result", "tool result")


def _tokens(path: str, sig: tuple, tid: str, row: dict[str, Any], spans: Any) -> None:
    loaded = cache.trajectory_token_stats(path, sig, tid, row[D.STEP])
    stats = None
    if loaded is not None:
        cache.warn(loaded.warnings)
        key = (row[D.STEP], row[D.SAMPLE_INDEX], row[D.ROLLOUT_N], row[D.VALIDATE])
        stats = D.turn_stats(loaded.table, tid, key)
    turns = D.token_turns(spans, token_decoder(path), stats)
    if not turns:
        st.caption("No llm spans.")
    for turn in turns:
        with safe.isolated("turn"):
            _draw_turn(turn, _advantage(row))


def _advantage(row: dict[str, Any]) -> float | None:
    """The trajectory's advantage: the list's column, else ``log_reward``'s extra."""
    if row.get(D.ADVANTAGE_COL) is not None:
        return float(row[D.ADVANTAGE_COL])
    got = D.advantages(pa.chunked_array([[row.get(D.REWARD_INFO)]], pa.string())).to_pylist()
    return got[0] if got else None


def _draw_turn(turn: Any, advantage: float | None = None) -> None:
    """One turn of the token view: header, warnings, the mismatch, the token grid and table, worst tokens, its text."""
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
    st.markdown("**" + safe.md(head) + "**")
    if turn.truncated:
        st.warning(
            safe.md(
                f"Truncated: the engine produced {turn.recorded if turn.recorded is not None else 'more'} tokens; "
                f"the record keeps the first {kept} (tracer max_tokens)."
            )
        )
    if turn.logprobs is None:
        st.caption("No per-token logprobs recorded.")
    cells = turn.cells()
    if len(cells) > charts.MAX_TOKEN_CELLS:
        st.caption(f"Token grid: the first {charts.MAX_TOKEN_CELLS:,} of {len(cells):,} tokens.")
        cells = cells[: charts.MAX_TOKEN_CELLS]
    options = turn.color_fields()
    color_by = None
    if len(options) > 1:
        color_by = st.selectbox(
            "Colour tokens by",
            options,
            index=options.index(D.COLOR_MISMATCH) if D.COLOR_MISMATCH in options else 0,
            key=f"color_by_{turn.index}",
            help="mismatch = rollout logprob - trainer logprob; grey tokens are outside the loss mask (not counted)",
        )
    elif options:
        color_by = options[0]
    if turn.stats:
        mean, counted = turn.mismatch()
        label = "synthetic trainer stats" if turn.synthetic else "trainer stats"
        if mean is not None:
            st.markdown(
                safe.md(f"mean |rollout - trainer logprob| over the {counted} token(s) in the loss mask: {mean:.4g}")
                + (" · :orange-badge[synthetic trainer stats]" if turn.synthetic else "")
            )
        st.caption(safe.md(f"From {label}: {turn.stats_source or 'source not given'}"))
    if cells:
        df = pd.DataFrame(D.paint(cells, color_by))
        extra = [f for f in options if f not in (D.COLOR_LOGPROB,)]
        if color_by is not None and not df[color_by].notna().any():
            color_by = None
        st.vega_lite_chart(
            df, charts.token_spec(turn, color_by, extra), width="stretch", height=charts.token_height(turn)
        )
    if turn.kept and st.toggle("table: one row per token", key=f"token_table_{turn.index}"):
        rows = turn.token_rows(advantage)[: charts.MAX_TOKEN_CELLS]
        st.dataframe(
            pd.DataFrame(rows, columns=list(D.TOKEN_TABLE_COLUMNS)),
            hide_index=True,
            key=f"tokens_{turn.index}",
            column_config={c: st.column_config.NumberColumn(format="%.4f") for c in D.TOKEN_TABLE_COLUMNS[2:-1]},
        )
    if turn.stats:
        by = D.COLOR_MISMATCH if D.COLOR_MISMATCH in options else D.COLOR_LOGPROB
        worst = D.worst_tokens(turn, by, WORST_TOKENS)
        if worst:
            st.caption(
                f"Worst tokens of this turn (by {'|mismatch|' if by == D.COLOR_MISMATCH else 'lowest logprob'}; "
                f"tokens outside the loss mask last)"
            )
            st.dataframe(pd.DataFrame(worst), hide_index=True, key=f"worst_{turn.index}")
    if turn.text:
        safe.text(turn.text, f"turn{turn.index}", "turn text")

"""The viewer's data layer: what each page shows, computed from tracer's public readers.

Nothing here imports Streamlit. ``viewer.data.runs`` holds run-level tables
(paths, steps, the trajectory list, groups), ``viewer.data.trajectory`` one
trajectory (turns, timing, tool calls), ``viewer.data.tokens`` the token view
and ``viewer.data.compare`` the comparison of two runs, ``viewer.data.live`` a run
followed while it is written. The names are
re-exported here, so ``from viewer import data as D`` reaches them all,
with the schema constants the pages use.
"""

from __future__ import annotations

from tracer.schema import (
    END_NS as END_NS,
)
from tracer.schema import (
    ERROR as ERROR,
)
from tracer.schema import (
    INPUTS as INPUTS,
)
from tracer.schema import (
    KIND as KIND,
)
from tracer.schema import (
    KIND_TOOL as KIND_TOOL,
)
from tracer.schema import (
    META_CONFIG as META_CONFIG,
)
from tracer.schema import (
    NAME as NAME,
)
from tracer.schema import (
    NUM_LLM_CALLS as NUM_LLM_CALLS,
)
from tracer.schema import (
    NUM_SPANS as NUM_SPANS,
)
from tracer.schema import (
    NUM_TOOL_CALLS as NUM_TOOL_CALLS,
)
from tracer.schema import (
    NUM_TOOL_ERRORS as NUM_TOOL_ERRORS,
)
from tracer.schema import (
    OUTPUTS as OUTPUTS,
)
from tracer.schema import (
    PARENT_SPAN_ID as PARENT_SPAN_ID,
)
from tracer.schema import (
    REWARD as REWARD,
)
from tracer.schema import (
    REWARD_INFO as REWARD_INFO,
)
from tracer.schema import (
    ROLLOUT_N as ROLLOUT_N,
)
from tracer.schema import (
    SAMPLE_INDEX as SAMPLE_INDEX,
)
from tracer.schema import (
    SPAN_ID as SPAN_ID,
)
from tracer.schema import (
    START_NS as START_NS,
)
from tracer.schema import (
    STATUS as STATUS,
)
from tracer.schema import (
    STATUS_ERROR as STATUS_ERROR,
)
from tracer.schema import (
    STATUS_OK as STATUS_OK,
)
from tracer.schema import (
    STEP as STEP,
)
from tracer.schema import (
    TRACE_ID as TRACE_ID,
)
from tracer.schema import (
    VALIDATE as VALIDATE,
)
from viewer.data.compare import (
    COMPARE_TRACE_IDS as COMPARE_TRACE_IDS,
)
from viewer.data.compare import (
    PROMPT_CHARS as PROMPT_CHARS,
)
from viewer.data.compare import (
    answer_diff as answer_diff,
)
from viewer.data.compare import (
    comparison_rows as comparison_rows,
)
from viewer.data.compare import (
    config_differences as config_differences,
)
from viewer.data.compare import (
    final_answers as final_answers,
)
from viewer.data.compare import (
    load_comparison as load_comparison,
)
from viewer.data.compare import (
    prompt_rollouts as prompt_rollouts,
)
from viewer.data.live import (
    RUNNING_S as RUNNING_S,
)
from viewer.data.live import (
    LiveCounts as LiveCounts,
)
from viewer.data.live import (
    LiveRun as LiveRun,
)
from viewer.data.runs import (
    ADVANTAGE as ADVANTAGE,
)
from viewer.data.runs import (
    ADVANTAGE_COL as ADVANTAGE_COL,
)
from viewer.data.runs import (
    ANSWER_COL as ANSWER_COL,
)
from viewer.data.runs import (
    CELL_TEXT_CHARS as CELL_TEXT_CHARS,
)
from viewer.data.runs import (
    ENV_VIEW_ALLOW as ENV_VIEW_ALLOW,
)
from viewer.data.runs import (
    FILE_COL as FILE_COL,
)
from viewer.data.runs import (
    LATENCY_COL as LATENCY_COL,
)
from viewer.data.runs import (
    LIGHT_SPAN_COLUMNS as LIGHT_SPAN_COLUMNS,
)
from viewer.data.runs import (
    QUESTION_COL as QUESTION_COL,
)
from viewer.data.runs import (
    SHORT_ID_COL as SHORT_ID_COL,
)
from viewer.data.runs import (
    SORT_COLUMNS as SORT_COLUMNS,
)
from viewer.data.runs import (
    TOOLS_COL as TOOLS_COL,
)
from viewer.data.runs import (
    ZERO_STD_COL as ZERO_STD_COL,
)
from viewer.data.runs import (
    Filters as Filters,
)
from viewer.data.runs import (
    Loaded as Loaded,
)
from viewer.data.runs import (
    ViewerPathError as ViewerPathError,
)
from viewer.data.runs import (
    advantages as advantages,
)
from viewer.data.runs import (
    allowed_roots as allowed_roots,
)
from viewer.data.runs import (
    apply_filters as apply_filters,
)
from viewer.data.runs import (
    check_allowed as check_allowed,
)
from viewer.data.runs import (
    file_signature as file_signature,
)
from viewer.data.runs import (
    files_of as files_of,
)
from viewer.data.runs import (
    group as group,
)
from viewer.data.runs import (
    list_rows as list_rows,
)
from viewer.data.runs import (
    list_steps as list_steps,
)
from viewer.data.runs import (
    load_group_spans as load_group_spans,
)
from viewer.data.runs import (
    load_run as load_run,
)
from viewer.data.runs import (
    load_step as load_step,
)
from viewer.data.runs import (
    load_step_partials as load_step_partials,
)
from viewer.data.runs import (
    load_trajectories as load_trajectories,
)
from viewer.data.runs import (
    merge_warnings as merge_warnings,
)
from viewer.data.runs import (
    overview as overview,
)
from viewer.data.runs import (
    overview_of as overview_of,
)
from viewer.data.runs import (
    partials_of as partials_of,
)
from viewer.data.runs import (
    repeated_rollouts as repeated_rollouts,
)
from viewer.data.runs import (
    resolve_path as resolve_path,
)
from viewer.data.runs import (
    run_dirs as run_dirs,
)
from viewer.data.runs import (
    run_totals as run_totals,
)
from viewer.data.runs import (
    sample_across_steps as sample_across_steps,
)
from viewer.data.runs import (
    search_trace_ids as search_trace_ids,
)
from viewer.data.runs import (
    select as select,
)
from viewer.data.runs import (
    select_partials as select_partials,
)
from viewer.data.runs import (
    sort_and_page as sort_and_page,
)
from viewer.data.runs import (
    split_by_trace as split_by_trace,
)
from viewer.data.runs import (
    steps_of as steps_of,
)
from viewer.data.runs import (
    tool_names as tool_names,
)
from viewer.data.runs import (
    tools_by_trajectory as tools_by_trajectory,
)
from viewer.data.runs import (
    totals_of as totals_of,
)
from viewer.data.runs import (
    trace_file_index as trace_file_index,
)
from viewer.data.runs import (
    with_tools as with_tools,
)
from viewer.data.runs import (
    with_zero_std as with_zero_std,
)
from viewer.data.tokens import (
    CELL_CHARS as CELL_CHARS,
)
from viewer.data.tokens import (
    COLOR_LOGPROB as COLOR_LOGPROB,
)
from viewer.data.tokens import (
    COLOR_MISMATCH as COLOR_MISMATCH,
)
from viewer.data.tokens import (
    CONFIG_TOKENIZER as CONFIG_TOKENIZER,
)
from viewer.data.tokens import (
    IN_LOSS as IN_LOSS,
)
from viewer.data.tokens import (
    MISMATCH as MISMATCH,
)
from viewer.data.tokens import (
    TOKEN_TABLE_COLUMNS as TOKEN_TABLE_COLUMNS,
)
from viewer.data.tokens import (
    TOKENS_PER_ROW as TOKENS_PER_ROW,
)
from viewer.data.tokens import (
    TokenTurn as TokenTurn,
)
from viewer.data.tokens import (
    has_token_stats as has_token_stats,
)
from viewer.data.tokens import (
    load_token_decoder as load_token_decoder,
)
from viewer.data.tokens import (
    load_token_stats as load_token_stats,
)
from viewer.data.tokens import (
    paint as paint,
)
from viewer.data.tokens import (
    run_tokenizer_path as run_tokenizer_path,
)
from viewer.data.tokens import (
    synthetic_sources as synthetic_sources,
)
from viewer.data.tokens import (
    token_turns as token_turns,
)
from viewer.data.tokens import (
    turn_stats as turn_stats,
)
from viewer.data.tokens import (
    worst_tokens as worst_tokens,
)
from viewer.data.trajectory import (
    REWARD_LATEST as REWARD_LATEST,
)
from viewer.data.trajectory import (
    REWARD_SOURCE as REWARD_SOURCE,
)
from viewer.data.trajectory import (
    REWARD_TIME as REWARD_TIME,
)
from viewer.data.trajectory import (
    content_text as content_text,
)
from viewer.data.trajectory import (
    escape_markdown as escape_markdown,
)
from viewer.data.trajectory import (
    find_trajectory as find_trajectory,
)
from viewer.data.trajectory import (
    load_trajectory as load_trajectory,
)
from viewer.data.trajectory import (
    messages as messages,
)
from viewer.data.trajectory import (
    pretty_json as pretty_json,
)
from viewer.data.trajectory import (
    reward_sources as reward_sources,
)
from viewer.data.trajectory import (
    span_errors as span_errors,
)
from viewer.data.trajectory import (
    tool_spans as tool_spans,
)
from viewer.data.trajectory import (
    trajectory_summary as trajectory_summary,
)
from viewer.data.trajectory import (
    turns as turns,
)
from viewer.data.trajectory import (
    waterfall as waterfall,
)

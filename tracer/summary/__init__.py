"""The trajectory model: one summary row and one list of turns per trajectory.

Every consumer (the viewer, each exporter, the console) reads trajectories through this module:
:func:`summarize` gives rows of :data:`tracer.schema.TRAJECTORY_SCHEMA`, :func:`trajectory_turns` each
trajectory's :class:`Turn` list (:func:`trajectory_messages` in OpenAI chat format).

The definitions, once:

* A **trajectory** is every trace id of the spans (log_reward rows with a
  trace id included; one with only those has no spans and no root).
* The **root** is a span without a parent (a ``kind="rollout"`` one first,
  then the earliest; never a ``log_reward`` row). The **first row** is the
  root, else the earliest span, else the earliest ``log_reward`` row (ties:
  the earlier row); step, sample, rollout and validate come from it.
* **Status** is the root's; ``"incomplete"`` when there is no root (spans
  are written when they end, so a root that never ended is absent).
* **Reward**: the latest ``log_reward`` row (by end time, ties: the later
  row) with the trajectory's trace id; else the latest ``log_reward`` row
  without a trace id whose ``(step, sample_index, rollout_n, validate)``
  equals the trajectory's (a reward logged by another process; nulls equal
  nulls, a null validate is False); else the last ``kind="reward"`` op with a
  reward. ``reward_info`` is the chosen ``log_reward`` row's attributes.
* Counts and times cover every span but ``log_reward`` rows (times: those
  rows' when there is nothing else).

The output shapes agent code returns (this project's rollout, verl's ``TokenOutput``, ``AgentLoopOutput`` and
tool results, OpenAI chat completions, vLLM ``RequestOutput`` dicts, strings) are recognised in
:mod:`tracer.summary.turns` only.
"""

from __future__ import annotations

from tracer.summary.metrics import (
    ADVANTAGES,
    ENTROPY,
    GROUP_METRICS,
    LOSS_MASK,
    REF_LOGPROBS,
    ROLLOUT_LOGPROBS,
    TOKEN_STATS_KEY_COLUMNS,
    TOKEN_STATS_SOURCE,
    TRAINER_LOGPROBS,
    TURN,
    VALUE_COLUMNS,
    merge_step_partials,
    partial_metrics,
    step_counts,
    step_metrics,
    step_partials,
    step_values,
    token_stat_metrics,
    with_value_metrics,
    zero_std_fractions,
    zero_std_groups,
)
from tracer.summary.rewards import (
    REWARD_SOURCE_KEY,
    SOURCE_OP,
    SOURCE_RECORDED,
    RewardRecord,
    log_reward_row,
    reward_source,
    trajectory_rewards,
)
from tracer.summary.rows import (
    SMALL_SUMMARY_SPANS,
    SUMMARY_SPAN_COLUMNS,
    summarize,
)
from tracer.summary.tokens import (
    MASK_ENV,
    MASK_MODEL,
    TrajectoryTokens,
    trajectory_tokens,
)
from tracer.summary.turns import (
    RESPONSE_ID_KEYS,
    ROLE_ASSISTANT,
    ROLE_SYSTEM,
    ROLE_TOOL,
    ROLE_USER,
    TURN_SPAN_COLUMNS,
    ToolCall,
    Turn,
    content_text,
    is_log_reward,
    prompt_and_response,
    render_turns,
    root_span,
    span_turn,
    span_turns,
    text_field_name,
    token_offsets_field_name,
    token_texts_field_name,
    trajectory_messages,
    trajectory_turns,
)

__all__ = [
    "GROUP_METRICS",
    "zero_std_fractions",
    "zero_std_groups",
    "ADVANTAGES",
    "ENTROPY",
    "LOSS_MASK",
    "MASK_ENV",
    "MASK_MODEL",
    "REF_LOGPROBS",
    "RESPONSE_ID_KEYS",
    "REWARD_SOURCE_KEY",
    "ROLE_ASSISTANT",
    "ROLE_SYSTEM",
    "ROLE_TOOL",
    "ROLE_USER",
    "ROLLOUT_LOGPROBS",
    "RewardRecord",
    "SMALL_SUMMARY_SPANS",
    "SOURCE_OP",
    "SOURCE_RECORDED",
    "SUMMARY_SPAN_COLUMNS",
    "TOKEN_STATS_KEY_COLUMNS",
    "TOKEN_STATS_SOURCE",
    "TRAINER_LOGPROBS",
    "TURN",
    "TURN_SPAN_COLUMNS",
    "ToolCall",
    "TrajectoryTokens",
    "Turn",
    "VALUE_COLUMNS",
    "content_text",
    "is_log_reward",
    "log_reward_row",
    "merge_step_partials",
    "partial_metrics",
    "prompt_and_response",
    "render_turns",
    "reward_source",
    "root_span",
    "span_turn",
    "span_turns",
    "step_counts",
    "step_metrics",
    "step_partials",
    "step_values",
    "summarize",
    "text_field_name",
    "token_offsets_field_name",
    "token_stat_metrics",
    "token_texts_field_name",
    "trajectory_messages",
    "trajectory_rewards",
    "trajectory_tokens",
    "trajectory_turns",
    "with_value_metrics",
]

"""The trajectory model: one summary row and one list of turns per trajectory, read by every consumer.

:func:`summarize` gives rows of :data:`tracer.schema.TRAJECTORY_SCHEMA`, :func:`trajectory_turns` each
trajectory's :class:`Turn` list (:func:`trajectory_messages`: OpenAI chat format); the output shapes agent code
returns (verl's, OpenAI's, vLLM's, this project's rollout) are recognised in :mod:`tracer.summary.turns` only.

* A **trajectory** is every trace id of the spans (one with only ``log_reward`` rows has no spans and no root).
* The **root** is a span without a parent (``kind="rollout"`` first, then the earliest; never a ``log_reward``
  row). The **first row** is the root, else the earliest span, else the earliest ``log_reward`` row (ties: the
  earlier row); step, sample, rollout and validate come from it.
* **Status** is the root's; ``"incomplete"`` without a root (spans are written when they end).
* **Reward**: the latest ``log_reward`` row (by end time, ties: the later row) with the trajectory's trace id;
  else the latest one without a trace id whose ``(step, sample_index, rollout_n, validate)`` equals the
  trajectory's (a reward logged by another process; nulls equal nulls, a null validate is False); else the last
  ``kind="reward"`` op with a reward. ``reward_info`` is the chosen ``log_reward`` row's attributes.
* Counts and times cover every span but ``log_reward`` rows (times: those rows' when there is nothing else).
"""

from __future__ import annotations

from tracer.summary.metrics import ADVANTAGES as ADVANTAGES
from tracer.summary.metrics import ENTROPY as ENTROPY
from tracer.summary.metrics import GROUP_METRICS as GROUP_METRICS
from tracer.summary.metrics import LOSS_MASK as LOSS_MASK
from tracer.summary.metrics import REF_LOGPROBS as REF_LOGPROBS
from tracer.summary.metrics import ROLLOUT_LOGPROBS as ROLLOUT_LOGPROBS
from tracer.summary.metrics import TOKEN_STATS_KEY_COLUMNS as TOKEN_STATS_KEY_COLUMNS
from tracer.summary.metrics import TOKEN_STATS_SOURCE as TOKEN_STATS_SOURCE
from tracer.summary.metrics import TRAINER_LOGPROBS as TRAINER_LOGPROBS
from tracer.summary.metrics import TURN as TURN
from tracer.summary.metrics import merge_step_partials as merge_step_partials
from tracer.summary.metrics import partial_metrics as partial_metrics
from tracer.summary.metrics import step_counts as step_counts
from tracer.summary.metrics import step_metrics as step_metrics
from tracer.summary.metrics import step_partials as step_partials
from tracer.summary.metrics import step_values as step_values
from tracer.summary.metrics import token_stat_metrics as token_stat_metrics
from tracer.summary.metrics import with_value_metrics as with_value_metrics
from tracer.summary.metrics import zero_std_fractions as zero_std_fractions
from tracer.summary.metrics import zero_std_groups as zero_std_groups
from tracer.summary.rewards import REWARD_SOURCE_KEY as REWARD_SOURCE_KEY
from tracer.summary.rewards import SOURCE_OP as SOURCE_OP
from tracer.summary.rewards import SOURCE_RECORDED as SOURCE_RECORDED
from tracer.summary.rewards import RewardRecord as RewardRecord
from tracer.summary.rewards import log_reward_row as log_reward_row
from tracer.summary.rewards import reward_source as reward_source
from tracer.summary.rewards import trajectory_rewards as trajectory_rewards
from tracer.summary.rows import SUMMARY_SPAN_COLUMNS as SUMMARY_SPAN_COLUMNS
from tracer.summary.rows import summarize as summarize
from tracer.summary.tokens import MASK_ENV as MASK_ENV
from tracer.summary.tokens import MASK_MODEL as MASK_MODEL
from tracer.summary.tokens import TrajectoryTokens as TrajectoryTokens
from tracer.summary.tokens import trajectory_tokens as trajectory_tokens
from tracer.summary.turns import RESPONSE_ID_KEYS as RESPONSE_ID_KEYS
from tracer.summary.turns import ROLE_ASSISTANT as ROLE_ASSISTANT
from tracer.summary.turns import ROLE_SYSTEM as ROLE_SYSTEM
from tracer.summary.turns import ROLE_TOOL as ROLE_TOOL
from tracer.summary.turns import ROLE_USER as ROLE_USER
from tracer.summary.turns import TURN_SPAN_COLUMNS as TURN_SPAN_COLUMNS
from tracer.summary.turns import ToolCall as ToolCall
from tracer.summary.turns import Turn as Turn
from tracer.summary.turns import content_text as content_text
from tracer.summary.turns import is_log_reward as is_log_reward
from tracer.summary.turns import prompt_and_response as prompt_and_response
from tracer.summary.turns import render_turns as render_turns
from tracer.summary.turns import root_span as root_span
from tracer.summary.turns import span_turn as span_turn
from tracer.summary.turns import span_turns as span_turns
from tracer.summary.turns import text_field_name as text_field_name
from tracer.summary.turns import token_offsets_field_name as token_offsets_field_name
from tracer.summary.turns import token_texts_field_name as token_texts_field_name
from tracer.summary.turns import trajectory_messages as trajectory_messages
from tracer.summary.turns import trajectory_turns as trajectory_turns

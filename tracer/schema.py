"""The span record and its Arrow schema, the one place that names the columns (no other module spells one as a
string literal). Every trace file is a zstd Arrow IPC file (``.arrow``) of :data:`SPAN_SCHEMA` rows (docs/format.md)."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

#: Version of the on-disk format: the major changes with anything an older reader would misread; readers refuse
#: a newer major and read every older one (1.x wrote IPC streams, 2.0 IPC files).
SCHEMA_VERSION = "2.0"

#: File suffix of trace files.
FILE_SUFFIX = ".arrow"

# Keys of the schema-level metadata written into every file.
META_SCHEMA_VERSION = "rollout_trace.schema_version"
META_CONFIG = "rollout_trace.config"
META_PROJECT = "rollout_trace.project_name"
META_EXPERIMENT = "rollout_trace.experiment_name"
META_HOST = "rollout_trace.host"
META_PID = "rollout_trace.pid"
META_CREATED_NS = "rollout_trace.created_ns"
#: JSON of the sampling strategy and its parameters (``tracer.record.sampling``); absent when nothing is sampled.
META_SAMPLING = "rollout_trace.sampling"

# Keys of the per-batch metadata: running totals of this writer's process.
BATCH_META_SPANS_WRITTEN = "rollout_trace.spans_written"
BATCH_META_SPANS_DROPPED = "rollout_trace.spans_dropped"
BATCH_META_INTERNAL_ERRORS = "rollout_trace.internal_errors"
#: JSON list of the sampling decisions made or changed since the previous batch (one per step and validate);
#: ``tracer.record.sampling.read_sampling`` reads them.
BATCH_META_SAMPLING = "rollout_trace.sampling_decisions"

# Column names.
TRACE_ID = "trace_id"
SPAN_ID = "span_id"
PARENT_SPAN_ID = "parent_span_id"
NAME = "name"
KIND = "kind"
START_NS = "start_ns"
END_NS = "end_ns"
STATUS = "status"
ERROR = "error"
STEP = "step"
SAMPLE_INDEX = "sample_index"
ROLLOUT_N = "rollout_n"
VALIDATE = "validate"
REWARD = "reward"
INPUTS = "inputs"
OUTPUTS = "outputs"
ATTRIBUTES = "attributes"

# Span kinds.
KIND_ROLLOUT = "rollout"
KIND_LLM = "llm"
KIND_TOOL = "tool"
KIND_REWARD = "reward"
KIND_SPAN = "span"
KINDS = (KIND_ROLLOUT, KIND_LLM, KIND_TOOL, KIND_REWARD, KIND_SPAN)

# Span statuses.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_CANCELLED = "cancelled"
#: Trajectory status when its root span never ended (the writer was killed).
STATUS_INCOMPLETE = "incomplete"

#: Name of the span :func:`tracer.log_reward` writes.
REWARD_SPAN_NAME = "log_reward"

#: Attribute key under which truncated fields record their original length.
ATTR_TRUNCATED = "rollout_trace.truncated"
#: Attribute key holding the length of every token id list found in a span.
ATTR_TOKENS = "tokens"

# Multi-turn history stored once (tracer/storage/history.py): ``prompt_ids`` may be an object with these keys.
#: The span id of the earlier llm span (same trajectory) whose context the prompt extends.
HISTORY_EXTENDS = "rollout_trace.extends"
#: How many ids of that context (its full prompt_ids, then its response ids) come first.
HISTORY_PREFIX = "prefix"
#: The earlier span's ``outputs`` key holding its response ids (null: none).
HISTORY_RESPONSE = "response"
#: The ids that follow the prefix.
HISTORY_IDS = "ids"
#: Set by readers when the earlier span was not found: why the list could not be rebuilt.
HISTORY_MISSING = "rollout_trace.missing"

#: One entry per column: (name, type, nullable, description); ``docs/format.md``'s column table comes from it.
SPAN_FIELDS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    (TRACE_ID, pa.string(), False, "Trajectory id (32 hex chars); one per rollout."),
    (SPAN_ID, pa.string(), False, "Span id (16 hex chars), unique within its trajectory."),
    (PARENT_SPAN_ID, pa.string(), True, "Parent span id; null for the trajectory's root."),
    (NAME, pa.string(), False, "Span name: the function's qualified name unless given."),
    (KIND, pa.string(), False, "One of rollout, llm, tool, reward, span."),
    (START_NS, pa.int64(), False, "Start time, nanoseconds since the Unix epoch."),
    (END_NS, pa.int64(), False, "End time, nanoseconds since the Unix epoch."),
    (STATUS, pa.string(), False, "ok, error or cancelled."),
    (ERROR, pa.string(), True, 'JSON {"type", "message", "traceback"} when status is error.'),
    (STEP, pa.int64(), True, "Training step from rollout_trace_attr."),
    (SAMPLE_INDEX, pa.string(), True, "Prompt (sample) id from rollout_trace_attr, as text."),
    (ROLLOUT_N, pa.int64(), True, "Index of the rollout within its prompt's group."),
    (VALIDATE, pa.bool_(), True, "True for validation rollouts."),
    (REWARD, pa.float64(), True, "Reward, on reward spans (log_reward or a kind=reward op)."),
    (INPUTS, pa.string(), True, "JSON of the call's arguments (after token2text, truncation)."),
    (OUTPUTS, pa.string(), True, "JSON of the return value (after token2text, truncation)."),
    (ATTRIBUTES, pa.string(), True, "JSON of extra attributes (rollout_trace_attr extras, ...)."),
)

#: Column names in file order.
SPAN_COLUMNS: tuple[str, ...] = tuple(f[0] for f in SPAN_FIELDS)

#: The Arrow schema of every trace file (without its file metadata).
SPAN_SCHEMA = pa.schema([pa.field(name, typ, nullable=nullable) for name, typ, nullable, _ in SPAN_FIELDS])

# Trajectory columns that are not span columns (see TRAJECTORY_FIELDS).
REWARD_INFO = "reward_info"
NUM_SPANS = "num_spans"
NUM_LLM_CALLS = "num_llm_calls"
NUM_TOOL_CALLS = "num_tool_calls"
NUM_TOOL_ERRORS = "num_tool_errors"
NUM_ERRORS = "num_errors"

#: Columns of :func:`tracer.read_trajectories`, one row per trajectory.
TRAJECTORY_FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    (TRACE_ID, pa.string(), "Trajectory id."),
    (NAME, pa.string(), "Name of the root span."),
    (STEP, pa.int64(), "Training step (this and the next three: the root's, else the earliest span's)."),
    (SAMPLE_INDEX, pa.string(), "Prompt (sample) id."),
    (ROLLOUT_N, pa.int64(), "Rollout index within the group."),
    (VALIDATE, pa.bool_(), "Validation rollout."),
    (
        REWARD,
        pa.float64(),
        "Reward of the latest log_reward (by trace id, else by step/sample/rollout/validate), "
        "else of the last kind=reward op; null if none.",
    ),
    (REWARD_INFO, pa.string(), "JSON of the extras given to log_reward (advantage, ...)."),
    (STATUS, pa.string(), "Root span status, or 'incomplete' when the root never ended."),
    (START_NS, pa.int64(), "Earliest span start."),
    (END_NS, pa.int64(), "Latest span end."),
    (NUM_SPANS, pa.int64(), "Spans recorded in the trajectory."),
    (NUM_LLM_CALLS, pa.int64(), "Spans of kind llm."),
    (NUM_TOOL_CALLS, pa.int64(), "Spans of kind tool."),
    (NUM_TOOL_ERRORS, pa.int64(), "Tool spans whose status is not ok."),
    (NUM_ERRORS, pa.int64(), "Spans whose status is error."),
)
TRAJECTORY_COLUMNS: tuple[str, ...] = tuple(f[0] for f in TRAJECTORY_FIELDS)
TRAJECTORY_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in TRAJECTORY_FIELDS])

# The shard index (tracer/index/shard.py, docs/format.md): one file beside each closed shard.
#: Column of the shard index: the record batches of the shard holding the row's trace id.
INDEX_BATCHES = "index_batches"
#: Column of the shard index: every span of the trace id has the same step and validate flag.
INDEX_UNIFORM = "index_uniform"
#: Column of the shard index: a 64-bit hash of the row's trace id (null for rows without one), so files
#: whose trace id ranges overlap are compared on numbers (and on the ids only where two hashes agree).
INDEX_TRACE_HASH = "index_trace_hash"
#: Column of the shard index: the rewards of its trajectories sorted per (step, validate) group, groups in the
#: order of the stored per-step aggregates (:data:`META_STEPS_VALUE_COUNTS` says how many each), nulls after.
#: Not aligned with the other columns of a row: a column of the same length that holds the values.
INDEX_SORTED_REWARDS = "index_sorted_rewards"
#: Column of the shard index: the latencies in seconds, laid out as :data:`INDEX_SORTED_REWARDS`.
INDEX_SORTED_LATENCIES = "index_sorted_latencies_s"
META_INDEX_VERSION = "rollout_trace.index_version"
META_INDEX_OF = "rollout_trace.index_of"
META_INDEX_SIZE = "rollout_trace.index_size"
META_INDEX_FOOTER = "rollout_trace.index_footer"
META_INDEX_BATCH_ROWS = "rollout_trace.index_batch_rows"
META_INDEX_BATCH_STEPS = "rollout_trace.index_batch_steps"
META_INDEX_BUCKETS = "rollout_trace.index_buckets"
#: Shard index metadata key: the distinct span names of the shard (a JSON list), absent when too many.
META_INDEX_NAMES = "rollout_trace.index_names"
#: Metadata of the shard index: its per-step aggregates (:data:`STEP_PARTIALS_SCHEMA`), an Arrow IPC stream in base64.
META_INDEX_STEPS = "rollout_trace.index_steps"
#: Metadata of those aggregates' stream: JSON ``[least, greatest]`` trace id of the shard's trajectories.
META_STEPS_TRACE_RANGE = "rollout_trace.trace_id_range"
#: Metadata of those aggregates' stream: JSON list of the steps of spans without a trace id (absent: none).
META_STEPS_LOOSE = "rollout_trace.loose_steps"
#: Metadata of those aggregates' stream: JSON ``[[rewards...], [latencies...]]``, how many values of each
#: aggregate row :data:`INDEX_SORTED_REWARDS` and :data:`INDEX_SORTED_LATENCIES` hold, in row order.
META_STEPS_VALUE_COUNTS = "rollout_trace.value_counts"

# Per-step aggregates (tracer.summary.step_partials): what the run overview shows, without every trajectory row.
#: Column of the per-step aggregates: trajectories of the (step, validate) group.
PART_TRAJECTORIES = "trajectories"
#: Column of the per-step aggregates: trajectories whose status is not ok (a null status counts).
PART_NOT_OK = "not_ok"
#: Column of the per-step aggregates: the group's rewards, ascending (trajectories without one left out).
PART_REWARDS = "rewards"
#: Column of the per-step aggregates: the group's latencies (end - start) in seconds, ascending (nulls left out).
PART_LATENCIES = "latencies_s"
#: One row per (step, validate) of some trajectories: counts and sums of the summary rows, and the values
#: whose order statistics the overview shows. Rows of several tables merge into the rows of their union
#: (tracer.summary.merge_step_partials); validate is never null (a null one is False).
STEP_PARTIALS_SCHEMA = pa.schema(
    [
        pa.field(STEP, pa.int64()),
        pa.field(VALIDATE, pa.bool_()),
        *(pa.field(c, pa.int64()) for c in (PART_TRAJECTORIES, NUM_SPANS, NUM_LLM_CALLS, NUM_TOOL_CALLS)),
        *(pa.field(c, pa.int64()) for c in (NUM_TOOL_ERRORS, PART_NOT_OK)),
        *(pa.field(c, pa.list_(pa.float64())) for c in (PART_REWARDS, PART_LATENCIES)),
    ]
)

#: The step metrics that come from each group's values (``tracer.summary.partial_metrics`` computes them),
#: stored beside merged aggregates by a run rollup (:data:`ROLLUP_SCHEMA`).
VALUE_METRICS = ("reward/mean", "reward/std", "reward/min", "reward/max", "latency_s/p50", "latency_s/p95")

#: A run rollup's table (``tracer.index.rollup``): merged :data:`STEP_PARTIALS_SCHEMA` rows and, per row,
#: its :data:`VALUE_METRICS` as computed from its values.
ROLLUP_SCHEMA = pa.schema([*STEP_PARTIALS_SCHEMA, *(pa.field(m, pa.float64()) for m in VALUE_METRICS)])

# Staleness of asynchronous rollouts (tracer.integrations.staleness).
#: A trajectory's ``rollout_trace_attr`` extra (on its root span's attributes) and an llm span's output key:
#: the weight (policy) version that generated it; trainer step minus this version is its staleness.
ATTR_WEIGHT_VERSION = "weight_version"
#: Column of the staleness table: the distinct weight versions that generated the trajectory, ascending.
WEIGHT_VERSIONS = "weight_versions"
#: Column of the staleness table: the trajectory's step minus its oldest weight version.
STALENESS = "staleness"
#: Column of the staleness table: True when more than one weight version generated the trajectory.
MIXED_VERSIONS = "mixed_versions"
#: One row per trajectory that carries a weight version (:func:`tracer.integrations.staleness.read_staleness`).
STALENESS_SCHEMA = pa.schema(
    [
        pa.field(TRACE_ID, pa.string()),
        pa.field(STEP, pa.int64()),
        pa.field(VALIDATE, pa.bool_()),
        pa.field(WEIGHT_VERSIONS, pa.list_(pa.int64())),
        pa.field(STALENESS, pa.int64()),
        pa.field(MIXED_VERSIONS, pa.bool_()),
    ]
)


def parse_json_or_text(value: Any) -> Any:
    """A JSON column's value parsed; a string that is not JSON, or a value that is not a string, as it is."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value

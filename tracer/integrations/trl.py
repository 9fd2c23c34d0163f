"""TRL's ``GRPOTrainer`` recorded by rollout-trace: one line in the user's script, no edit of TRL.

::

    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=..., train_dataset=...)
    record_grpo(trainer, output_dir="traces")  # the one line
    trainer.train()

Every completion becomes one trajectory: its step, its prompt's group
(``sample_index``, ``rollout_n`` 0..num_generations-1), the prompt and the
completion (token ids, and sampling logprobs where TRL has them), each reward
function's value, the weighted total and TRL's advantage; evaluation
completions are marked ``validate=True``.

What TRL exposes, and so what this module uses (it replaces no method of TRL):

- TRL calls each reward function with the generation batch's prompts,
  completions, completion ids, dataset columns and ``trainer_state``. The
  trainer's reward functions are wrapped (same names, same sync or async kind,
  the value returned unchanged), so every completion and every function's
  value is seen as TRL uses it.
- A ``rollout_func`` returns prompt ids, completion ids and sampling
  logprobs; it is wrapped the same way. Inside it, :func:`completion` opens
  one completion's trajectory, so the llm and tool spans of a multi-turn
  rollout land under it.
- A ``TrainerCallback`` (``trainer.add_callback``) hears when each step and
  each evaluation batch ends: the batch seen is written then.
- The advantage is handed to no callback and no reward function: TRL keeps it
  only in the rows its ``log_completions`` table shows (``trainer._logs``).
  That one attribute is read, never written; a TRL without it gets a warning
  and nothing recorded.

A trainer this module cannot read gets a one-line warning naming what is
missing, and trains on unrecorded; a failure of the recording later does the
same. The user's reward functions and ``rollout_func`` always run and
return as without it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from transformers import TrainerCallback

import tracer
from tracer.config import ENV_STRICT

logger = logging.getLogger("rollout_trace")

#: Name of each completion's trajectory (its root span).
TRAJECTORY_NAME = "grpo_completion"
#: Name of the llm span holding a completion's prompt and reply.
LLM_SPAN_NAME = "generate"
#: Key of ``log_reward``'s extras holding each reward function's value by name.
REWARDS_KEY = "rewards"
#: Key of ``log_reward``'s extras holding TRL's advantage.
ADVANTAGE_KEY = "advantage"

#: What a trainer needs for its completions to be recorded: attribute -> what it is.
REQUIRED_ATTRIBUTES = {
    "num_generations": "the size of each prompt's group",
    "reward_funcs": "the reward functions",
    "reward_func_names": "the reward columns' names",
    "reward_weights": "the weights of the total reward",
    "state": "the trainer's global step",
}
#: TRL's table of logged completions (the rows ``log_completions`` shows), and its columns read here.
TRL_LOG_ATTRIBUTE = "_logs"
TRL_LOG_PROMPTS = "prompt"
TRL_LOG_REWARDS = "rewards"
TRL_LOG_ADVANTAGES = "advantages"
#: Key of a chat message (tool message, tool call) holding the tool's name.
CHAT_NAME = "name"

# The batch a wrapped rollout_func is generating, for completion().
_GENERATING: contextvars.ContextVar[GenerationBatch | None] = contextvars.ContextVar(
    "rollout_trace_trl_batch", default=None
)


def record_grpo(trainer: Any, **init_fields: Any) -> GrpoRecorder | None:
    """Record ``trainer`` (a TRL ``GRPOTrainer``): call once, after building it and before ``train()``.

    When tracing is not on yet, it is started with ``tracer.init(**init_fields)``
    (``output_dir``, ``project_name``, ...; the experiment name defaults to
    the trainer's ``run_name``). A trainer that lacks what recording needs
    gets a one-line warning naming it, and None is returned: it trains on,
    unrecorded.
    """
    missing = [f"{name} ({what})" for name, what in REQUIRED_ATTRIBUTES.items() if not hasattr(trainer, name)]
    logs = getattr(trainer, TRL_LOG_ATTRIBUTE, None)
    if not isinstance(logs, Mapping) or TRL_LOG_ADVANTAGES not in logs or TRL_LOG_PROMPTS not in logs:
        missing.append(f"{TRL_LOG_ATTRIBUTE}[{TRL_LOG_ADVANTAGES!r}] (TRL's logged advantages)")
    if missing:
        logger.warning(
            "rollout-trace: %s is not recorded: it has no %s; training goes on unrecorded",
            type(trainer).__name__,
            ", no ".join(missing),
        )
        return None
    if tracer.get_config() is None:
        run_name = getattr(getattr(trainer, "args", None), "run_name", None)
        if run_name and "experiment_name" not in init_fields:
            init_fields["experiment_name"] = str(run_name)
        tracer.init(**init_fields)
    recorder = GrpoRecorder(trainer)
    recorder.attach()
    return recorder


@contextlib.contextmanager
def completion(index: int) -> Iterator[tracer.rollout_trace_attr | None]:
    """Inside a ``rollout_func``: completion ``index``'s trajectory (its row in the returned lists).

    The llm and tool spans recorded inside (``tracer.rollout_trace_op``) go
    under that completion's trajectory, with its step and group; the rewards
    and advantage are added when TRL has computed them. Outside a recorded
    ``rollout_func`` it records nothing.
    """
    batch = _GENERATING.get()
    if batch is None:
        yield None
        return
    sample_index, rollout_n = batch.keys(index)
    batch.opened.add(index)
    with tracer.rollout_trace_attr(
        sample_index, batch.step, rollout_n, name=TRAJECTORY_NAME, validate=batch.validate
    ) as block:
        yield block


@dataclasses.dataclass
class GenerationBatch:
    """One generation batch of this process, from generation to its advantages."""

    step: int
    validate: bool
    group_size: int
    first_sample: int
    rows_before: int
    prompts: list[Any] | None = None
    completions: list[Any] | None = None
    completion_ids: list[Any] | None = None
    rewards: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    rollout: Mapping[str, Any] | None = None
    opened: set[int] = dataclasses.field(default_factory=set)

    def keys(self, row: int) -> tuple[int, int]:
        """(sample_index, rollout_n) of this process's ``row``: TRL's groups are runs of ``group_size`` rows."""
        r = self.rows_before + row
        return self.first_sample + r // self.group_size, r % self.group_size


class GrpoRecorder(TrainerCallback):
    """Records one ``GRPOTrainer``'s completions; made by :func:`record_grpo`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.batch: GenerationBatch | None = None
        self.groups: dict[tuple[int, bool], int] = {}
        self.stopped = False
        self.warned: set[str] = set()
        self._reply: Any = None

    def attach(self) -> None:
        """Wrap the trainer's reward functions and ``rollout_func``, and add this callback."""
        t = self.trainer
        t.reward_funcs = [self._wrap_reward(f, n) for f, n in zip(t.reward_funcs, t.reward_func_names, strict=True)]
        if getattr(t, "rollout_func", None) is not None:
            t.rollout_func = self._wrap_rollout(t.rollout_func)
        t.add_callback(self)

    # -- TRL's callback events: a batch seen is complete once a step or an evaluation batch ends.

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()
        if not self.stopped:
            tracer.flush()

    # -- wrappers

    def _wrap_reward(self, func: Any, name: str) -> Any:
        torch = sys.modules.get("torch")
        if not callable(func) or (torch is not None and isinstance(func, torch.nn.Module)):
            return func  # a reward model: its values are read from TRL's log
        from trl.trainer.utils import is_async_callable

        if is_async_callable(func):

            @functools.wraps(func)
            async def observed_async(*args: Any, **kwargs: Any) -> Any:
                values = await func(*args, **kwargs)
                self._guarded("reading a reward", self._observe, name, kwargs, values)
                return values

            return observed_async

        @functools.wraps(func)
        def observed(*args: Any, **kwargs: Any) -> Any:
            values = func(*args, **kwargs)
            self._guarded("reading a reward", self._observe, name, kwargs, values)
            return values

        return observed

    def _wrap_rollout(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def generating(prompts: list[Any], trainer: Any) -> Any:
            batch = self._guarded("starting a batch", self._start, len(prompts))
            token = _GENERATING.set(batch)
            try:
                output = func(prompts, trainer)
            finally:
                _GENERATING.reset(token)
            if batch is not None and isinstance(output, Mapping):
                batch.rollout = output
            return output

        return generating

    # -- the batch

    def _start(self, rows: int) -> GenerationBatch | None:
        """Close the batch before and open the next one, of ``rows`` rows of this process."""
        self.close()
        if self.stopped:
            return None
        t = self.trainer
        validate = not bool(getattr(t.model, "training", True))
        group = getattr(t, "num_generations_eval", None) if validate else None
        group = int(group or t.num_generations)
        step = int(t.state.global_step) + (0 if validate else 1)  # the step TRL's completions table shows it at
        accelerator = getattr(t, "accelerator", None)
        processes = int(getattr(accelerator, "num_processes", 1))
        index = int(getattr(accelerator, "process_index", 0))
        first = self.groups.get((step, validate), 0)
        self.groups[(step, validate)] = first + -(-rows * processes // group)
        self.batch = GenerationBatch(step, validate, group, first, index * rows)
        return self.batch

    def _observe(self, name: str, kwargs: Mapping[str, Any], values: Sequence[Any]) -> None:
        prompts = kwargs.get("prompts")
        if self.stopped or not isinstance(prompts, list):
            return
        batch = self.batch
        if batch is None or (batch.prompts is not None and batch.prompts is not prompts):
            batch = self._start(len(prompts))
        if batch is None:
            return
        if batch.prompts is None:
            batch.prompts = prompts
            batch.completions = kwargs.get("completions")
            batch.completion_ids = kwargs.get("completion_ids")
        batch.rewards[name] = [None if v is None else float(v) for v in values]

    def close(self) -> None:
        """Write the batch seen so far (its advantages are in TRL's log by now)."""
        batch, self.batch = self.batch, None
        if batch is not None and batch.prompts is not None and not self.stopped:
            self._guarded("writing a batch", self._write, batch)

    def _write(self, batch: GenerationBatch) -> None:
        t = self.trainer
        assert batch.prompts is not None
        rows = len(batch.prompts)
        names = [str(n) for n in t.reward_func_names]
        weights = [float(w) for w in t.reward_weights]
        advantages = self._logged(batch, TRL_LOG_ADVANTAGES)
        if advantages is None:
            return
        logged_rewards = self._logged(batch, TRL_LOG_REWARDS)
        values: dict[str, list[Any]] = {}
        for name in names:
            seen = batch.rewards.get(name)
            if seen is None and isinstance(logged_rewards, Mapping):
                seen = list(logged_rewards.get(name) or [None] * rows)
            values[name] = seen if seen is not None else [None] * rows
        for i in range(rows):
            per_function = {n: _finite(values[n][i]) for n in names}
            total = weighted_total(list(per_function.values()), weights)
            info: dict[str, Any] = {REWARDS_KEY: per_function, ADVANTAGE_KEY: float(advantages[i])}
            sample_index, rollout_n = batch.keys(i)
            if i in batch.opened:  # its spans were recorded inside the rollout_func: join by keys
                tracer.log_reward(
                    total,
                    step=batch.step,
                    sample_index=sample_index,
                    rollout_n=rollout_n,
                    validate=batch.validate,
                    **info,
                )
                continue
            with tracer.rollout_trace_attr(
                sample_index, batch.step, rollout_n, name=TRAJECTORY_NAME, validate=batch.validate
            ):
                self._record_completion(batch, i)
                tracer.log_reward(total, **info)

    def _logged(self, batch: GenerationBatch, column: str) -> Any:
        """This batch's rows of a column of TRL's completion log (the latest rows; other processes' left out).

        None, with a warning that stops recording, when the log does not hold them.
        """
        assert batch.prompts is not None
        rows = len(batch.prompts)
        logs = getattr(self.trainer, TRL_LOG_ATTRIBUTE, None)
        held = logs.get(column) if isinstance(logs, Mapping) else None
        prompts = logs.get(TRL_LOG_PROMPTS) if isinstance(logs, Mapping) else None
        if column == TRL_LOG_REWARDS and isinstance(held, Mapping):
            return {k: self._tail(list(v), batch, rows) for k, v in held.items()}
        if held is None or prompts is None:
            self._stop(f"TRL's completion log has no {column!r} column")
            return None
        mine = self._tail(list(held), batch, rows)
        if mine is None or self._tail(list(prompts), batch, rows) != batch.prompts:
            self._warn(f"TRL's completion log does not hold a batch's {rows} rows of {column!r}; that batch")
            return None
        return mine

    def _tail(self, column: list[Any], batch: GenerationBatch, rows: int) -> list[Any] | None:
        accelerator = getattr(self.trainer, "accelerator", None)
        total = rows * int(getattr(accelerator, "num_processes", 1))
        if len(column) < total:
            return None
        latest = column[len(column) - total :]
        return latest[batch.rows_before : batch.rows_before + rows]

    def _record_completion(self, batch: GenerationBatch, i: int) -> None:
        """One completion's llm span (and, for TRL's own tool loop, its tool spans)."""
        assert batch.prompts is not None
        prompt = batch.prompts[i]
        done = batch.completions[i] if batch.completions is not None else None
        rollout = batch.rollout or {}
        ids = _row(rollout.get("completion_ids"), i) or _row(batch.completion_ids, i)
        reply: dict[str, Any] = {"response_ids": _plain(ids), "logprobs": _plain(_row(rollout.get("logprobs"), i))}
        messages = done if isinstance(done, list) else None
        if messages is None or len(messages) <= 1:
            reply["text"] = _text(messages[0] if messages else done)
            self._llm(prompt, _plain(_row(rollout.get("prompt_ids"), i)), reply)
            return
        # TRL's tool loop: the completion is assistant and tool messages; each becomes its span, in order.
        history = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": _text(prompt)}]
        first = True
        for message in messages:
            role = message.get("role") if isinstance(message, Mapping) else None
            if role == "tool":
                self._tool(str(message.get(CHAT_NAME) or "tool"), _call_arguments(history, message), message)
            else:
                out = {"text": _text(message), "tool_calls": _plain(message.get("tool_calls"))}
                if first:
                    out.update(reply)
                    out["text"] = _text(message)
                self._llm(list(history), None, out)
                first = False
            history.append(message)

    def _llm(self, prompt: Any, prompt_ids: Any, reply: dict[str, Any]) -> None:
        self._reply = {k: v for k, v in reply.items() if v is not None}
        if isinstance(prompt, list):
            self._generate(messages=prompt, prompt_ids=prompt_ids)
        else:
            self._generate(prompt=_text(prompt), prompt_ids=prompt_ids)

    @tracer.rollout_trace_op(name=LLM_SPAN_NAME, kind="llm")
    def _generate(self, **prompt: Any) -> Any:
        return self._reply

    def _tool(self, name: str, arguments: Any, message: Mapping[str, Any]) -> None:
        self._reply = {"content": message.get("content")}
        _tool_span(name)(self, arguments=arguments)

    # -- never break training

    def _guarded(self, what: str, func: Callable[..., Any], *args: Any) -> Any:
        if self.stopped:
            return None
        try:
            return func(*args)
        except Exception as exc:
            if os.environ.get(ENV_STRICT, "") not in ("", "0"):
                raise  # under tests the tracer's own bugs surface
            self._stop(f"{what} failed ({type(exc).__name__}: {exc})")
            return None

    def _warn(self, why: str) -> None:
        if why not in self.warned:
            self.warned.add(why)
            logger.warning("rollout-trace: %s is not recorded; training goes on", why)

    def _stop(self, why: str) -> None:
        if not self.stopped:
            logger.warning(
                "rollout-trace: stopped recording %s: %s; training goes on", type(self.trainer).__name__, why
            )
        self.stopped = True


@functools.lru_cache(maxsize=256)
def _tool_span(name: str) -> Callable[..., Any]:
    """A tool span named ``name``: records its arguments, returns the tool message's content."""

    def call(recorder: GrpoRecorder, arguments: Any) -> Any:
        return recorder._reply

    return tracer.rollout_trace_op(name=name, kind="tool")(call)


def weighted_total(values: Sequence[float | None], weights: Sequence[float]) -> float:
    """TRL's total reward of one completion: the weighted sum of the values present; NaN when none is."""
    present = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
    if not present:
        return math.nan
    return math.fsum(v * w for v, w in present)


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _row(column: Any, i: int) -> Any:
    if column is None:
        return None
    try:
        return column[i]
    except (IndexError, KeyError, TypeError):
        return None


def _plain(value: Any) -> Any:
    """Token ids or logprobs as plain lists (TRL may hand tensors)."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        content = value.get("content")
        if isinstance(content, list):  # typed content blocks
            return "".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
        return None if content is None else str(content)
    return str(value)


def _call_arguments(history: list[Any], message: Mapping[str, Any]) -> Any:
    """The arguments of the tool call a tool message answers (the last assistant message's call of that name)."""
    for earlier in reversed(history):
        calls = earlier.get("tool_calls") if isinstance(earlier, Mapping) else None
        for call in calls or ():
            function = call.get("function", call) if isinstance(call, Mapping) else {}
            if function.get(CHAT_NAME) == message.get(CHAT_NAME):
                return function.get("arguments")
    return None

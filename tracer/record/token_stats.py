"""Per-token arrays a trainer computes for a turn (:func:`log_token_stats`): one span row per call, its ``inputs``
``{"turn": i, "arrays": {name: [...]}}``; :func:`tracer.read_token_stats` reads them back.
"""

from __future__ import annotations

from typing import Any

from tracer import schema as S  # noqa: N812 - the schema module, short as elsewhere
from tracer.record import recorder as _recorder
from tracer.record.capture import capture
from tracer.record.context import append_instant, named_trajectory
from tracer.record.spec import OpSpec
from tracer.summary import TOKEN_STATS_KEY_COLUMNS

#: Name of the span row one :func:`log_token_stats` call writes.
TOKEN_STATS_SPAN_NAME = "log_token_stats"
#: Keys of that row's ``inputs`` JSON.
TOKEN_STATS_TURN_KEY = "turn"
TOKEN_STATS_ARRAYS_KEY = "arrays"
TOKEN_STATS_SOURCE_KEY = "source"

TOKEN_STATS_SPEC = OpSpec(None, TOKEN_STATS_SPAN_NAME, S.KIND_SPAN)


def log_token_stats(
    turn: int,
    *,
    step: int | None = None,
    sample_index: int | str | None = None,
    rollout_n: int | None = None,
    validate: bool | None = None,
    source: str | None = None,
    **arrays: Any,
) -> None:
    """Attach per-token arrays to turn ``turn`` (0-based llm call) of a trajectory, named as for ``log_reward``.

    Conventional names: ``old_logprobs`` (the trainer's), ``rollout_logprobs`` (default: the turn's recorded
    ones), ``ref_logprobs``, ``entropy``, ``advantages``, ``loss_mask`` (1: trained on); any other is kept.
    ``source`` says where the numbers came from. TypeError: ``turn`` not an int, an array not a sequence;
    ValueError: no arrays, one not 1-D, or no trajectory named outside one.
    """
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise TypeError(f"log_token_stats: turn must be the 0-based index of the llm call, got {turn!r}")
    if source is not None and not isinstance(source, str):
        raise TypeError(f"log_token_stats: source must be a string naming where the arrays came from, got {source!r}")
    if not arrays:
        raise ValueError("log_token_stats: give at least one array, e.g. log_token_stats(0, old_logprobs=[...])")
    for name, value in arrays.items():
        if name in TOKEN_STATS_KEY_COLUMNS:
            raise ValueError(f"log_token_stats: {name!r} is a key column of the stats table; rename that array")
        ndim = getattr(value, "ndim", None)
        if ndim is not None and ndim != 1:
            raise ValueError(
                f"log_token_stats: {name} has {ndim} dimensions; give one value per response token of this turn "
                f"(for a batch tensor, the row of this trajectory, masked to its response: t[i, :length])"
            )
        if ndim is None and (isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__")):
            raise TypeError(
                f"log_token_stats: {name} must be a sequence of numbers (list, numpy array, tensor), "
                f"got {type(value).__name__}"
            )
    rec = _recorder.ACTIVE
    if rec is None:
        return
    try:
        traj = named_trajectory(rec, "log_token_stats", step, sample_index, rollout_n, validate)
        if not traj.recording:
            return
        payload = {TOKEN_STATS_TURN_KEY: turn, TOKEN_STATS_SOURCE_KEY: source, TOKEN_STATS_ARRAYS_KEY: capture(arrays)}
        append_instant(rec, traj, TOKEN_STATS_SPEC, None, payload)
    except ValueError:
        raise
    except Exception as exc:
        rec.internal_error("logging token stats", exc)

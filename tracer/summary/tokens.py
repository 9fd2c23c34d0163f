"""A trajectory's token sequence: its turns' ids, logprobs and response mask, end to end."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tracer.summary.turns import ROLE_ASSISTANT, Turn

#: Response-mask value of a token the model produced.
MASK_MODEL = 1
#: Response-mask value of a token spliced in between model turns (tool results, chat template).
MASK_ENV = 0


@dataclasses.dataclass(frozen=True)
class TrajectoryTokens:
    """A multi-turn trajectory as one token sequence, as an RL trainer sees it.

    Attributes:
        prompt_ids: The first model call's prompt ids (None when not recorded).
        response_ids: Each model turn's tokens, and between them the tokens the next call's prompt shows (tool
            results, template). ``response_mask``: :data:`MASK_MODEL` or :data:`MASK_ENV` per response id.
        logprobs: Per response id: the model's logprob (None where unknown and for spliced-in tokens).
        exact: False when a token list was cut by ``max_tokens`` or a call's prompt does not extend the previous
            prompt and reply (its spliced-in tokens are then left out); mask 1 tokens are all recorded either way.
    """

    prompt_ids: list[int] | None
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float | None]
    exact: bool


def trajectory_tokens(turns: Sequence[Turn]) -> TrajectoryTokens:
    """The token sequence of a trajectory's assistant turns with token ids (:func:`span_turns` or turns): turn
    ``k+1``'s prompt is expected to extend turn ``k``'s prompt and reply; the rest is spliced in, masked 0."""
    model = [t for t in turns if t.role == ROLE_ASSISTANT and t.token_ids is not None]
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float | None] = []
    if not model:
        return TrajectoryTokens(None, ids, mask, lps, True)
    prompt = None if model[0].prompt_ids is None else list(model[0].prompt_ids)
    seq: list[int] | None = list(prompt) if prompt is not None else None
    exact = prompt is not None
    for k, turn in enumerate(model):
        cut = turn.prompt_ids is not None and len(turn.prompt_ids) < (turn.prompt_token_count or 0)
        exact = exact and not (turn.truncated or cut)
        if k > 0:
            p = list(turn.prompt_ids) if turn.prompt_ids is not None else None
            if seq is not None and p is not None and p[: len(seq)] == seq:
                env = p[len(seq) :]
                ids.extend(env)
                mask.extend([MASK_ENV] * len(env))
                lps.extend([None] * len(env))
                seq = p
            else:
                exact = False
                seq = None
        own = [int(x) for x in turn.token_ids or ()]
        got = list(turn.logprobs) if turn.logprobs is not None else []
        ids.extend(own)
        mask.extend([MASK_MODEL] * len(own))
        lps.extend(got[: len(own)] + [None] * (len(own) - len(got)))
        if seq is not None:
            seq = seq + own
    return TrajectoryTokens(prompt, ids, mask, lps, exact)

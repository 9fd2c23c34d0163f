"""The trainer's side of the token view: per-token stats the demo logs for each model turn.

An RL trainer recomputes the logprob of every rollout token with its own
forward pass; where its numbers and the inference engine's differ
(precision, kernels, batch shapes), the importance ratio drifts. The demo
has no trainer, so it logs one of two stand-ins, labelled by ``source``:

- :class:`ForwardPass` (``rollout-trace demo --engine hf --trainer-dtype
  float32``): a second forward pass of the same weights in another dtype over
  the whole sequence, prompt and response (tool observations included) as a
  trainer sees it; its logprobs and entropies of each model token are real,
  and the mismatch is the one between the rollout's dtype and the trainer's.
- :func:`synthetic_stats` (every other engine): the engine's own logprobs plus
  seeded noise.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import tracer

#: How far the demo's synthetic "trainer" logprobs stray from the engine's (a standard deviation, in nats).
SYNTHETIC_LOGPROB_NOISE = 0.02
#: The demo's stand-in trainer is off by this much on about one token in this many.
SYNTHETIC_SPIKE, SYNTHETIC_SPIKE_EVERY = 1.5, 50
#: ``source`` of the synthetic stats: the demo has no trainer, the numbers are made up.
SYNTHETIC_SOURCE = "synthetic (rollout-demo has no trainer: engine logprobs plus seeded noise)"


class TrainerStats(Protocol):
    """Per-token stats of one rollout's model tokens, as a trainer would compute them."""

    source: str

    def __call__(self, out: dict[str, Any], seed: int) -> dict[str, list[float]]:
        """``old_logprobs`` and ``entropy`` (and any other array) for the tokens where ``response_mask`` is 1."""
        ...


def model_turns(mask: list[int]) -> list[list[int]]:
    """Positions in the response of each model turn: the runs of ``mask == 1``."""
    turns: list[list[int]] = []
    previous = 0
    for i, m in enumerate(mask):
        if m == 1:
            if previous != 1:
                turns.append([])
            turns[-1].append(i)
        previous = m
    return turns


def log_turn_stats(
    out: dict[str, Any], trainer: TrainerStats, step: int, sample_index: int, rollout_n: int, validate: bool, seed: int
) -> None:
    """Log ``trainer``'s stats of each model turn of the rollout output ``out`` (``tracer.log_token_stats``)."""
    mask, logprobs = out.get("response_mask"), out.get("response_logprobs")
    if not isinstance(mask, list) or not isinstance(logprobs, list) or len(mask) != len(logprobs):
        return
    stats = trainer(out, seed)
    for turn, positions in enumerate(model_turns(mask)):
        arrays = {name: [values[p] for p in positions] for name, values in stats.items()}
        tracer.log_token_stats(
            turn,
            step=step,
            sample_index=sample_index,
            rollout_n=rollout_n,
            validate=validate,
            source=trainer.source,
            loss_mask=[1] * len(positions),
            **arrays,
        )


class SyntheticStats:
    """The engine's logprobs plus seeded noise (and a rare large miss); ``entropy`` ~ -logprob.

    An engine without logprobs (the scripted one) gets made-up
    ``rollout_logprobs`` too.
    """

    source = SYNTHETIC_SOURCE

    def __call__(self, out: dict[str, Any], seed: int) -> dict[str, list[float]]:
        rng = random.Random(seed)
        recorded = out["response_logprobs"]
        stats: dict[str, list[float]] = {}
        if any(lp is None for m, lp in zip(out["response_mask"], recorded, strict=True) if m == 1):
            recorded = [float(lp) if lp is not None else -abs(rng.gauss(0.2, 0.6)) for lp in recorded]
            stats["rollout_logprobs"] = recorded
        lps = [float(lp) if lp is not None else 0.0 for lp in recorded]
        stats["old_logprobs"] = [
            min(0.0, lp + rng.gauss(0.0, SYNTHETIC_LOGPROB_NOISE))
            - (SYNTHETIC_SPIKE if rng.randrange(SYNTHETIC_SPIKE_EVERY) == 0 else 0.0)
            for lp in lps
        ]
        stats["entropy"] = [-lp for lp in lps]
        return stats


class ForwardPass:
    """A second forward pass of the rollout's model in ``dtype``: each response token's logprob and entropy.

    Args:
        model: The model folder the rollout's engine loaded.
        dtype: The trainer's dtype (``float32`` against a ``bfloat16``
            rollout is the common case).
        rollout_dtype: The engine's dtype, named in ``source``.
        device: Where the pass runs.
    """

    def __init__(self, model: str, dtype: str = "float32", rollout_dtype: str | None = None, device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=getattr(torch, dtype))
        self.model.to(device).eval()
        self.device = device
        rollout = f"{rollout_dtype} generate" if rollout_dtype else "the engine's generate"
        self.source = f"trainer: {dtype} forward pass of the same weights (rollout: {rollout})"

    def __call__(self, out: dict[str, Any], seed: int) -> dict[str, list[float]]:
        torch = self._torch
        prompt, response = list(out["prompt_ids"]), list(out["response_ids"])
        ids = torch.tensor([prompt + response], device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, torch.tensor(response, device=self.device).unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return {"old_logprobs": chosen.tolist(), "entropy": entropy.tolist()}

"""rollout-trace's reference rollout: a multi-turn tool-calling agent loop, traced.

The code an RL engineer would write (verl-style agent loop, GRPO groups,
tools, a GSM8K-style reward), decorated with :mod:`tracer`. Run it with
``rollout-trace demo``; see ``docs/rollout.md``.

Modules: :mod:`rollout.agent_loop` (the loop), :mod:`rollout.runner` (steps,
groups, rewards), :mod:`rollout.engines` (scripted, hf, openai, vllm),
:mod:`rollout.tools`, :mod:`rollout.parsing`, :mod:`rollout.reward`,
:mod:`rollout.chat`, :mod:`rollout.tokenizer`, :mod:`rollout.cli`.
"""

import logging as _logging


class _NoTorchBannerFilter(_logging.Filter):
    """Drops transformers' "PyTorch was not found" banner, and only it.

    The demo's scripted engine needs transformers for its tokenizer alone, so
    without torch that banner is a false alarm on every run; a missing torch
    for a real model is reported by the engine that needs it, with its pip line.
    """

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


# transformers logs through its library logger "transformers", created at its first import.
_logging.getLogger("transformers").addFilter(_NoTorchBannerFilter())

"""rollout-trace's reference rollout: a multi-turn tool-calling agent loop, traced.

The code an RL engineer would write (verl-style agent loop, GRPO groups,
tools, a GSM8K-style reward), decorated with :mod:`tracer`. Run it with
``rollout-trace demo``; see ``docs/rollout.md``.

Modules: :mod:`rollout.agent_loop` (the loop), :mod:`rollout.runner` (steps,
groups, rewards), :mod:`rollout.engines` (scripted, hf, openai, vllm),
:mod:`rollout.tools`, :mod:`rollout.parsing`, :mod:`rollout.reward`,
:mod:`rollout.chat`, :mod:`rollout.tokenizer`, :mod:`rollout.cli`.
"""

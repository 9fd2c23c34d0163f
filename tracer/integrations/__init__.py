"""Recorders for trainers that do not go through rollout-trace's decorators.

Each module records one trainer from the outside, with one line in the
user's script and no edit of the trainer's code:
:mod:`tracer.integrations.trl` records TRL's ``GRPOTrainer``; :mod:`tracer.integrations.verl`
stands in for verl's ``rollout_trace`` and :mod:`tracer.integrations.verl_plugin` is verl's plugin.
Importing this package imports no trainer library.
"""

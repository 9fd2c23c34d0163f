"""Recorders for trainers that do not go through rollout-trace's decorators.

Each module records one trainer from the outside, with one line in the
user's script and no edit of the trainer's code:
:mod:`tracer.integrations.trl` records TRL's ``GRPOTrainer``. Importing this
package imports no trainer library.
"""

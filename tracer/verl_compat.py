"""The verl drop-in's first path, kept for Ray hooks already written (``tracer.verl_compat.install``).

The code is :mod:`tracer.integrations.verl`; this module re-exports its public names.
"""

from tracer.integrations.verl import *  # noqa: F403

"""``python -m rollout``: the same as ``rollout-trace demo``."""

import sys

from rollout.cli import main

sys.exit(main())

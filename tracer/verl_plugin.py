"""The verl plugin's first path, kept for entry points of earlier installs: importing it registers the plugin."""

import tracer.integrations.verl_plugin  # noqa: F401

"""rollout-trace's viewer: a Streamlit app that replays, diagnoses and compares recorded trajectories.

``viewer.app`` is the Streamlit script (``rollout-trace view PATH [RUN_B]``
serves it) and its routing; ``viewer.state`` the URL and session state;
``viewer.cache`` the cached readers; ``viewer.charts`` the charts;
``viewer.views`` one module per page; ``viewer.data`` the data layer (no
Streamlit import; the benchmark and tests call it directly); ``viewer.cli``
the ``view`` subcommand; ``viewer.screenshots`` the headless-Chromium driver
that regenerates the documentation's screenshots. The viewer reads trace
files only through :mod:`tracer`'s public readers and its trajectory model.
"""

"""rollout-trace's viewer: a Streamlit app that replays recorded trajectories.

``viewer.app`` is the Streamlit script (``rollout-trace view PATH`` serves it),
``viewer.data`` the data layer it draws from (no Streamlit import; the
benchmark and tests call it directly), ``viewer.cli`` the ``view``
subcommand. The viewer reads trace files only through :mod:`tracer`'s public
readers.
"""

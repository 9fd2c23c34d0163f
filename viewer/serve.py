"""The script ``rollout-trace view`` serves: the viewer app behind :class:`viewer.hosts.HostGuard`.

``streamlit run viewer/serve.py`` finds the ``st.App`` below and serves it
(Streamlit's ASGI mode), so every request, websocket upgrade included, passes
the host check before Streamlit sees it.
"""

from __future__ import annotations

import os

import streamlit as st
from starlette.middleware import Middleware

from viewer.hosts import HostGuard

app = st.App(os.path.join(os.path.dirname(os.path.abspath(__file__)), "app.py"), middleware=[Middleware(HostGuard)])

"""The dashboard's entry point: ``streamlit run dashboard/serve.py`` (``make run``).

Serves ``dashboard/app.py`` as an ``st.App`` so that :class:`HostGuardMiddleware` sees every
request before Streamlit does. ``st.App(middleware=...)`` is Streamlit's supported way to add
ASGI middleware: ``streamlit run`` finds the ``app`` object below and serves it with its own
uvicorn runner, with the same .streamlit/config.toml and command-line flags as before
(http://127.0.0.1:8501). The allow-list is ``Settings.allowed_hosts`` (MOEBENCH_ALLOWED_HOSTS).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run dashboard/serve.py` puts dashboard/ on sys.path, not the project root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from dashboard.host_guard import HostGuardMiddleware  # noqa: E402
from engines.settings import get_settings  # noqa: E402

app = st.App(
    Path(__file__).with_name("app.py"),
    middleware=[Middleware(HostGuardMiddleware, allowed_hosts=get_settings().allowed_hosts)],
)

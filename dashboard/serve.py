"""The dashboard's entry point: ``streamlit run dashboard/serve.py`` (``make run``).

Serves ``dashboard/app.py`` as an ``st.App`` so that :class:`HostGuardMiddleware` sees every
request before Streamlit does. ``st.App(middleware=...)`` is Streamlit's supported way to add
ASGI middleware: ``streamlit run`` finds the ``app`` object below and serves it with its own
uvicorn runner, with the same .streamlit/config.toml and command-line flags as before
(http://127.0.0.1:8501). The allow-list is ``Settings.allowed_hosts`` (MOEBENCH_ALLOWED_HOSTS);
the access token ``MOEBENCH_ACCESS_TOKEN`` (or ``_FILE``) is required beyond loopback.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run dashboard/serve.py` puts dashboard/ on sys.path, not the project root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import os  # noqa: E402

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from dashboard.host_guard import LOOPBACK, HostGuardMiddleware  # noqa: E402
from engines.settings import get_settings  # noqa: E402


def _secret_or_exit() -> str | None:
    """The access token; exits with one line when serving beyond loopback without one."""
    from streamlit import config

    try:
        secret = get_settings().dashboard_secret()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    address = str(config.get_option("server.address") or "0.0.0.0").strip("[]")
    if secret is None and address not in LOOPBACK:
        print(
            f"error: the dashboard would listen on {address}, beyond this machine, without an access token: set "
            "MOEBENCH_ACCESS_TOKEN (or MOEBENCH_ACCESS_TOKEN_FILE), or serve on 127.0.0.1",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)
    return secret


_secret = _secret_or_exit()
os.environ["MOEBENCH_GUARDED"] = "1"  # app.py, run in this process, knows the guard is in front of it
app = st.App(
    Path(__file__).with_name("app.py"),
    middleware=[Middleware(HostGuardMiddleware, allowed_hosts=get_settings().allowed_hosts, token=_secret)],
)

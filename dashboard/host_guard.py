"""The dashboard's guard against DNS rebinding: only allowed Host and Origin headers get in.

A web page the operator visits can rebind its own name (``evil.example``) to 127.0.0.1 and
then reach the dashboard as if it were same-origin: the browser sends
``Host: evil.example:8501`` and, on the WebSocket, ``Origin: http://evil.example:8501``.
Streamlit's XSRF and CORS checks compare the Origin with the Host, so they let it through,
and its ``server.allowedHosts`` option covers the WebSocket only. This ASGI middleware checks
the Host of every HTTP request and the Host and Origin of every WebSocket handshake against
one allow-list of host names (``Settings.allowed_hosts``, env ``MOEBENCH_ALLOWED_HOSTS``;
any port). A refused HTTP request gets a one-line 403; a refused WebSocket is never
accepted. ``dashboard/serve.py`` installs it through ``st.App(middleware=...)``.

With an access token (``MOEBENCH_ACCESS_TOKEN`` or ``MOEBENCH_ACCESS_TOKEN_FILE``) every HTTP
request and WebSocket also needs the ``moebench_access`` cookie (HttpOnly, SameSite=Strict),
set once by opening any page with ``?token=SECRET`` (or through the login form a request
without it gets, HTTP 401); a WebSocket without it is refused. Only the liveness paths
(:data:`OPEN_PATHS`) answer without it. ``serve.py`` refuses to start on an address beyond
loopback without a token.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from starlette.websockets import WebSocketClose
from streamlit.logger import get_logger

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

_LOGGER = get_logger(__name__)

ANY_HOST = "*"
TOKEN_COOKIE = "moebench_access"
TOKEN_PARAM = "token"
OPEN_PATHS = ("/_stcore/health", "/healthz")  # liveness only: no data behind them
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_LOGIN = """<!doctype html><html><head><meta charset="utf-8"><title>MoE Bench: sign in</title>
<style>body{font-family:sans-serif;margin:12vh auto;max-width:26rem;color:#1F2937}
input{font-size:1rem;padding:.5rem;width:100%;box-sizing:border-box;margin:.5rem 0}
button{font-size:1rem;padding:.5rem 1rem;background:#4F46E5;color:#fff;border:0;border-radius:.3rem}</style>
</head><body><h2>MoE Bench</h2><p>This dashboard needs its access token (MOEBENCH_ACCESS_TOKEN).</p>
<form method="get" action="/"><input type="password" name="token" autocomplete="current-password"
placeholder="access token" autofocus><button type="submit">Sign in</button></form></body></html>"""
_HOST_REFUSED = "Forbidden: this dashboard does not answer to that Host (see MOEBENCH_ALLOWED_HOSTS).\n"
_ORIGIN_REFUSED = "Forbidden: WebSocket Origin is not an allowed host (see MOEBENCH_ALLOWED_HOSTS).\n"


def _normalize(name: str) -> str:
    """A host name as compared: lower case, no IPv6 brackets, no trailing dot."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.rstrip(".")


def parse_allowed_hosts(raw: str) -> frozenset[str]:
    """The allow-list from its comma-separated form (``"127.0.0.1,localhost"``).

    Raises ``ValueError`` when it names no host: an empty list would refuse every request.
    """
    names = frozenset(n for n in (_normalize(part) for part in raw.split(",")) if n)
    if not names:
        raise ValueError(
            "MOEBENCH_ALLOWED_HOSTS names no host: list the names the dashboard is reached by "
            f"(e.g. 127.0.0.1,localhost), or {ANY_HOST} to accept any"
        )
    return names


def host_name(host_header: str | None) -> str | None:
    """The host name in a ``Host`` header (port dropped), or None when it is missing or malformed."""
    if not host_header:
        return None
    try:
        parts = urlsplit(f"//{host_header}")
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return _normalize(parts.hostname)


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a ``Host`` header names an allowed host (any port); a missing one is refused."""
    if ANY_HOST in allowed:
        return True
    name = host_name(host_header)
    return name is not None and name in allowed


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """Whether a WebSocket ``Origin`` is an http(s) origin on an allowed host.

    A missing Origin is allowed: browsers always send one on a WebSocket handshake, so only
    non-browser clients (which DNS rebinding cannot drive) leave it out.
    """
    if origin is None or ANY_HOST in allowed:
        return True
    try:
        parts = urlsplit(origin)
        _ = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    return _normalize(parts.hostname) in allowed


class HostGuardMiddleware:
    """ASGI middleware: 403 for a foreign Host; a WebSocket with a foreign Host or Origin is refused."""

    def __init__(self, app: ASGIApp, allowed_hosts: str, token: str | None = None) -> None:
        self.app = app
        self.allowed = parse_allowed_hosts(allowed_hosts)
        self.token = token or None
        if ANY_HOST in self.allowed:
            _LOGGER.warning(
                "MOEBENCH_ALLOWED_HOSTS contains %s: the Host/Origin check is off, so a web page "
                "you visit can reach this dashboard through DNS rebinding",
                ANY_HOST,
            )

    def refusal(self, scope: Scope) -> str | None:
        """The one-line reason to refuse this request, or None to let it through."""
        headers = Headers(scope=scope)
        hosts = headers.getlist("host")
        # Two Host headers could be read differently by two layers: refuse rather than pick one.
        if len(hosts) != 1 or not host_allowed(hosts[0], self.allowed):
            return _HOST_REFUSED
        if scope["type"] == "websocket":
            origins = headers.getlist("origin")
            if len(origins) > 1 or not origin_allowed(origins[0] if origins else None, self.allowed):
                return _ORIGIN_REFUSED
        return None

    def _has_token(self, scope: Scope) -> bool:
        assert self.token is not None
        cookies = Headers(scope=scope).get("cookie") or ""
        for part in cookies.split(";"):
            name, _, value = part.strip().partition("=")
            if name == TOKEN_COOKIE and hmac.compare_digest(value.encode(), self.token.encode()):
                return True
        return False

    async def _token_gate(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """With an access token set: True when the request may go on; else it has been answered
        (a login page, a redirect that sets the cookie, or a refused WebSocket)."""
        if self.token is None or scope.get("path") in OPEN_PATHS or self._has_token(scope):
            return True
        if scope["type"] == "websocket":
            _LOGGER.warning("Refused a WebSocket without the access token")
            await WebSocketClose(code=1008)(scope, receive, send)
            return False
        query = QueryParams(scope.get("query_string", b"").decode("latin-1"))
        given = query.get(TOKEN_PARAM)
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            rest = "&".join(f"{k}={v}" for k, v in query.multi_items() if k != TOKEN_PARAM)
            target = (scope.get("path") or "/") + (f"?{rest}" if rest else "")
            resp = RedirectResponse(target, status_code=303)
            secure = scope.get("scheme") == "https"
            resp.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict", secure=secure, path="/")
            await resp(scope, receive, send)
            return False
        await HTMLResponse(_LOGIN, status_code=401)(scope, receive, send)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        reason = self.refusal(scope)
        if reason is None:
            if await self._token_gate(scope, receive, send):
                await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        _LOGGER.warning(
            "Refused %s %s: Host %.100r, Origin %.100r (allowed hosts: %s)",
            scope["type"],
            scope.get("path", ""),
            headers.get("host"),
            headers.get("origin"),
            ",".join(sorted(self.allowed)),
        )
        if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
            # A WebSocket handshake can be answered with a plain HTTP 403 where the server
            # supports the denial-response extension (uvicorn does).
            await PlainTextResponse(reason, status_code=403)(scope, receive, send)
        else:
            # Closing before accepting makes the server answer the handshake with 403.
            await WebSocketClose(code=1008)(scope, receive, send)

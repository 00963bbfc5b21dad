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
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocketClose
from streamlit.logger import get_logger

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

_LOGGER = get_logger(__name__)

ANY_HOST = "*"
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

    def __init__(self, app: ASGIApp, allowed_hosts: str) -> None:
        self.app = app
        self.allowed = parse_allowed_hosts(allowed_hosts)
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        reason = self.refusal(scope)
        if reason is None:
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

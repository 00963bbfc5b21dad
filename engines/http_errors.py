"""HTTP client errors as one-line project exceptions, for both clients (httpx and aiohttp).

A timeout, a dropped connection or a refused connect becomes :class:`RequestFailed` or
:class:`ServerUnreachable` with the URL and a short reason; :func:`error_message` pulls
the human part out of an OpenAI-style error body.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from engines.errors import RequestFailed, ServerUnreachable, one_line


@contextlib.contextmanager
def http_errors(url: str, who: str = "the server") -> Iterator[None]:
    """Turn httpx's errors while talking to ``url`` into one-line :class:`RequestFailed`."""
    import httpx

    try:
        yield
    except httpx.TimeoutException as exc:
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except httpx.RemoteProtocolError as exc:
        raise RequestFailed(f"connection dropped by {who}: {one_line(exc, 200)}") from exc
    except httpx.ConnectError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {one_line(exc, 200)}") from exc
    except httpx.HTTPError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {one_line(exc, 200)}") from exc


@contextlib.contextmanager
def aiohttp_errors(url: str, who: str = "the server") -> Iterator[None]:
    """:func:`http_errors` for the asynchronous client (aiohttp)."""
    import aiohttp

    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise RequestFailed(f"connection dropped by {who}: {one_line(exc, 200)}") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {one_line(exc, 200)}") from exc
    except aiohttp.ClientError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {one_line(exc, 200)}") from exc


def error_message(body: bytes) -> str:
    """The human part of an OpenAI-style error body (``{"error": {"message": ...}}`` and variants)."""
    text = body.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return one_line(text, 200) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if err.get(key):
                    return one_line(err[key], 200)
        elif isinstance(err, str):
            return one_line(err, 200)
        if obj.get("detail"):
            return one_line(json.dumps(obj["detail"]), 200)
    return one_line(text, 200)

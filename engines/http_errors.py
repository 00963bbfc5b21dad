"""HTTP client errors as one-line project exceptions, for both clients (httpx and aiohttp),
and the time limits of one request (:class:`RequestDeadline`).

A timeout, a dropped connection or a refused connect becomes :class:`RequestFailed` or
:class:`ServerUnreachable` with the URL and a short reason; :func:`error_message` pulls
the human part out of an OpenAI-style error body.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from engines.errors import RequestFailed, ServerUnreachable, one_line

CONNECT_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
# Bodies are read with a cap on the *decoded* bytes (a gzip body of 10 MB can inflate to 10 GB):
ERROR_BODY_MAX = 64 * 1024  # an error answer: only its message is shown, the rest is not read
JSON_BODY_MAX = 16 * 2**20  # a JSON answer (a model list, server info, a tokenization)
# a Prometheus page: a vLLM or DCGM page is 0.1-0.3 MB; parsing one 4 MiB page costs about 4 s of CPU
# in the process that measures, so a bigger page is refused rather than parsed
METRICS_BODY_MAX = 4 * 2**20


class BodyTooLarge(RequestFailed):
    """An answer bigger than the cap MoE Bench reads for its kind."""


def _full(out: bytearray, cap: int, what: str, truncate: bool) -> bool:
    """Whether a body read so far into ``out`` has reached ``cap`` (then cut to it with
    ``truncate``); over it without ``truncate``: :class:`BodyTooLarge`."""
    if len(out) <= cap:
        return False
    if not truncate:
        raise BodyTooLarge(f"{what} is over {cap / 2**20:g} MiB: not read")
    del out[cap:]
    return True


def read_capped(chunks: Iterable[bytes], cap: int, what: str, truncate: bool = False) -> bytes:
    """The body from its (decoded) chunks, at most ``cap`` bytes: with ``truncate`` the rest is
    not read (an error message needs its start only), else :class:`BodyTooLarge`."""
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if _full(out, cap, what, truncate):
            break
    return bytes(out)


async def aread_capped(resp: Any, cap: int, what: str, truncate: bool = False) -> bytes:
    """:func:`read_capped` for an aiohttp response (decompressed as it is read)."""
    out = bytearray()
    async for chunk in resp.content.iter_chunked(2**16):
        out += chunk
        if _full(out, cap, what, truncate):
            break
    return bytes(out)


# --- a total deadline on the threaded client (httpx) -------------------------------------------
# httpx bounds each socket read, not a request: a server that sends its headers a byte at a
# time stays under any read timeout for ever. Every socket of a client made by
# :func:`httpx_client` checks, on each read and write, the absolute deadline its thread set
# with :func:`total_deadline` and gives up (``httpcore.ReadTimeout``) when it has passed.

_DEADLINE = threading.local()


@contextlib.contextmanager
def total_deadline(seconds: float | None, end: float | None = None) -> Iterator[None]:
    """Bound every read and write of this thread's httpx requests (clients from
    :func:`httpx_client`) to end ``seconds`` from now (or at monotonic ``end``)."""
    before = getattr(_DEADLINE, "end", None)
    mine = end if end is not None else (time.monotonic() + seconds if seconds is not None else None)
    _DEADLINE.end = mine if before is None or mine is None else min(before, mine)
    try:
        yield
    finally:
        _DEADLINE.end = before


@functools.lru_cache(maxsize=1)
def _backend() -> Any:  # stateless: one for every client
    import httpcore

    class DeadlineStream(httpcore.NetworkStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def _limit(self, timeout: float | None) -> float | None:
            end = getattr(_DEADLINE, "end", None)
            if end is None:
                return timeout
            left = end - time.monotonic()
            if left <= 0:
                raise httpcore.ReadTimeout("the request's total deadline passed")
            return left if timeout is None else min(timeout, left)

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, self._limit(timeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, self._limit(timeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
            return DeadlineStream(self.inner.start_tls(ssl_context, server_hostname, self._limit(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class DeadlineBackend(httpcore.SyncBackend):
        def connect_tcp(self, *args: Any, **kw: Any) -> Any:
            end = getattr(_DEADLINE, "end", None)
            if end is not None and kw.get("timeout") is not None:
                kw["timeout"] = max(0.001, min(kw["timeout"], end - time.monotonic()))
            return DeadlineStream(super().connect_tcp(*args, **kw))

    return DeadlineBackend()


def httpx_client(**kw: Any) -> Any:
    """An ``httpx.Client`` whose sockets honour :func:`total_deadline` (``kw`` as for httpx)."""
    import httpx

    transport = kw.pop("transport", None) or httpx.HTTPTransport(limits=kw.pop("limits", httpx.Limits()))
    # httpcore's pool takes a network backend; httpx 0.28 does not pass one through, so it is
    # set on the pool it built (tests/hostile/test_round_two.py fails if this stops working).
    transport._pool._network_backend = _backend()
    return httpx.Client(transport=transport, **kw)


class CappedResponse:
    """What :func:`http_get` read: the status, the headers and at most a capped body."""

    def __init__(self, status_code: int, headers: Any, content: bytes) -> None:
        self.status_code, self.headers, self.content = status_code, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


def http_get(client: Any, url: str, cap: int = JSON_BODY_MAX, method: str = "GET", **kw: Any) -> CappedResponse:
    """``client.request`` (httpx) with the body read through :func:`read_capped`: an error
    answer (400+) is cut at :data:`ERROR_BODY_MAX`, any other over ``cap`` raises
    :class:`BodyTooLarge`; the whole exchange ends within ``timeout`` (a number) or 30 s, on a
    client from :func:`httpx_client`, however slowly the server sends."""
    timeout = kw.get("timeout")
    total = float(timeout) if isinstance(timeout, int | float) else 30.0
    with total_deadline(total), client.stream(method, url, **kw) as resp:
        if resp.status_code >= 400:
            body = read_capped(resp.iter_bytes(), ERROR_BODY_MAX, url, truncate=True)
        else:
            body = read_capped(resp.iter_bytes(), cap, f"the answer of {url}")
        return CappedResponse(resp.status_code, resp.headers, body)


class RequestDeadline:
    """The time limits of one streamed request, started when it is sent.

    ``total_s`` bounds the whole request (``MOEBENCH_REQUEST_TIMEOUT_S``, or the engine's
    ``timeout_s`` option), however the server trickles bytes (an SSE keep-alive comment every
    2 s does not keep it alive). ``first_byte_s`` (``MOEBENCH_FIRST_BYTE_TIMEOUT_S``) bounds
    the wait for the response headers, and any silence while the body streams. The httpx
    client checks the total on every received chunk; aiohttp enforces it itself
    (``ClientTimeout.total``).
    """

    def __init__(self, total_s: float, first_byte_s: float, total_source: str = "MOEBENCH_REQUEST_TIMEOUT_S") -> None:
        self.total_s = total_s
        self.first_byte_s = first_byte_s
        self.total_source = total_source
        self.end = time.monotonic() + total_s
        self.answered = False  # the response headers arrived

    @property
    def read_s(self) -> float:
        """The longest wait for any one read: the headers, or the next bytes of the body."""
        return min(self.first_byte_s, self.total_s)

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def exceeded(self) -> RequestFailed:
        return RequestFailed(f"request exceeded its {self.total_s:g} s deadline ({self.total_source})")

    def read_timed_out(self, url: str) -> RequestFailed:
        """The reason for a read that waited :attr:`read_s` in vain."""
        if self.first_byte_s >= self.total_s or self.expired():
            return self.exceeded()
        limit = f"{self.first_byte_s:g} s (MOEBENCH_FIRST_BYTE_TIMEOUT_S)"
        if not self.answered:
            return RequestFailed(f"no response from {url} within {limit}")
        return RequestFailed(f"{url} sent nothing for {limit}")

    def checked(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks``, failing with :meth:`exceeded` at the first one received after the deadline."""
        for chunk in chunks:
            if time.monotonic() >= self.end:
                raise self.exceeded()
            yield chunk

    def httpx_timeout(self) -> Any:
        import httpx

        return httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=self.read_s, write=WRITE_TIMEOUT_S, pool=None)

    def aiohttp_timeout(self) -> Any:
        import aiohttp

        return aiohttp.ClientTimeout(total=self.total_s, connect=CONNECT_TIMEOUT_S, sock_read=self.read_s)


@contextlib.contextmanager
def http_errors(url: str, who: str = "the server", deadline: RequestDeadline | None = None) -> Iterator[None]:
    """Turn httpx's errors while talking to ``url`` into one-line :class:`RequestFailed`
    (a read timeout says which of ``deadline``'s limits passed)."""
    import httpx

    try:
        yield
    except httpx.ReadTimeout as exc:
        if deadline is None:
            raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
        raise deadline.read_timed_out(url) from exc
    except httpx.TimeoutException as exc:
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except httpx.RemoteProtocolError as exc:
        raise RequestFailed(f"connection dropped by {who}: {one_line(exc, 200)}") from exc
    except httpx.ConnectError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {one_line(exc, 200)}") from exc
    except httpx.HTTPError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {one_line(exc, 200)}") from exc


@contextlib.contextmanager
def aiohttp_errors(url: str, who: str = "the server", deadline: RequestDeadline | None = None) -> Iterator[None]:
    """:func:`http_errors` for the asynchronous client (aiohttp)."""
    import aiohttp

    try:
        yield
    except TimeoutError as exc:
        if deadline is not None and deadline.expired():
            raise deadline.exceeded() from exc
        if deadline is not None and isinstance(exc, aiohttp.SocketTimeoutError):
            raise deadline.read_timed_out(url) from exc
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise RequestFailed(f"connection dropped by {who}: {one_line(exc, 200)}") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {one_line(exc, 200)}") from exc
    except aiohttp.ClientError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {one_line(exc, 200)}") from exc


def redacted(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@``."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    if "@" in host:
        host = "***@" + host.rsplit("@", 1)[1]
    return f"{scheme}{sep}{host}{slash}{path}" if sep else url


def status_failure(status: int, url: str, location: str | None, body: bytes) -> RequestFailed | None:
    """The request's one-line failure for an HTTP status that is not a stream: an error
    (400+) with the server's message, or a redirect (3xx). Redirects are not followed: one
    could take the request, and its API key, to another host; the user gives the final URL."""
    if 300 <= status < 400:
        to = f" to {redacted(location)}" if location else ""
        return RequestFailed(
            f"HTTP {status} redirect from {url}{to}: redirects are not followed (they could carry the "
            "API key to another host); give the final URL as the base URL"
        )
    if status >= 400:
        return RequestFailed(f"HTTP {status} from {url}: {error_message(body)}")
    return None


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

"""Server-sent events: an incremental, spec-following decoder from bytes to ``data`` payloads.

Used by every engine that streams over HTTP (the OpenAI-compatible ones, Triton's
``generate_stream``). Lines and events are bounded (:data:`MAX_SSE_EVENT_BYTES`), so a
server that never ends a line cannot fill the client's memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from engines.errors import RequestFailed, one_line

MAX_SSE_EVENT_BYTES = 4 * 2**20  # one SSE line or event; a real completion event is far smaller
# With skip_oversize, the payload given in place of an event over the cap (the event itself is
# read past and dropped, up to SKIP_LIMIT_FACTOR times the cap, then the stream is refused).
OVERSIZE_EVENT = "\x00oversize-event"
SKIP_LIMIT_FACTOR = 4
# A stream that brings this many times the event cap without completing one event (blank lines,
# comments: a compressed stream of newlines inflates to gigabytes) is refused.
IDLE_LIMIT_FACTOR = 4


class SSEError(RequestFailed):
    """The server's event stream was malformed or ended early."""


class SSEDecoder:
    """An incremental server-sent-event decoder: bytes in, complete ``data`` payloads out.

    Follows the SSE rules that matter here: ``data:`` lines of one event are joined
    with newlines, a blank line ends an event, ``:`` lines are comments, other fields
    (``event``, ``id``, ``retry``) are ignored; :meth:`close` gives a payload still
    pending at the end (some servers omit the last blank line). Lines end with LF, CRLF
    or a bare CR; they are split on bytes before decoding, which is safe because neither
    occurs inside a UTF-8 multi-byte sequence, and cheaper per chunk than an incremental
    text decoder.
    """

    def __init__(self, max_event_bytes: int | None = None, skip_oversize: bool = False) -> None:
        self._pending = b""
        self._data: list[str] = []
        self._data_bytes = 0
        self._held_cr = False  # the pending bytes end with a CR whose LF may come next
        self._cr_split = False  # normalising CRs produced a line break in the pending bytes
        self.max_event_bytes = max_event_bytes or MAX_SSE_EVENT_BYTES
        # skip_oversize: an event over the cap is dropped (its bytes read past, not kept) and
        # OVERSIZE_EVENT given in its place, so the reader decides; else the stream is refused.
        self.skip_oversize = skip_oversize
        self._skipping = False  # inside an oversize event: drop lines until the blank line ending it
        self._mid_line = False  # the pending bytes dropped were part of a line whose end is still to come
        self._skipped = 0  # bytes dropped in the current oversize event
        self._since_event = 0  # bytes read since the last payload

    def _oversize(self, what: str, dropped: int) -> str:
        """Start (or go on) dropping an oversize event; OVERSIZE_EVENT when it starts."""
        if not self.skip_oversize:
            raise self._too_big(what)
        self._skipped += dropped
        if self._skipped > SKIP_LIMIT_FACTOR * self.max_event_bytes:
            raise self._too_big(f"{what} (even to skip it)")
        self._data, self._data_bytes = [], 0
        if self._skipping:
            return ""
        self._skipping = True
        return OVERSIZE_EVENT

    def _too_big(self, what: str) -> SSEError:
        n = self.max_event_bytes
        size = f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"
        return SSEError(f"an SSE {what} over {size}: stopped reading (a completion event is a few hundred bytes)")

    def line(self, raw: str) -> str | None:
        """Take one line; the event's payload when this line ends one."""
        line = raw.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            payload, self._data, self._data_bytes = "\n".join(self._data), [], 0
            return payload
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if not sep:
            name, value = line, ""
        elif value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_bytes += len(line) + 1  # the whole line and its end: 4 MiB of "data:" lines is 4 MiB
            if self._data_bytes > self.max_event_bytes:
                return self._oversize("event", self._data_bytes) or None
            self._data.append(value)
        return None

    def _skip_line(self, raw: bytes) -> bool:
        """While dropping an oversize event: whether this line is dropped (a blank line ends it)."""
        if not self._skipping:
            return False
        if self._mid_line:  # the end of a line whose start was dropped
            self._mid_line = False
            self._skipped += len(raw)
            return True
        if raw:
            self._oversize("event", len(raw) + 1)
            return True
        self._skipping, self._skipped = False, 0  # the blank line: the event is over
        return True

    def feed(self, chunk: bytes) -> list[str]:
        """Take the next bytes of the stream; the payloads of the events they complete."""
        if not chunk:
            return []
        self._since_event += len(chunk)
        if self._since_event > IDLE_LIMIT_FACTOR * self.max_event_bytes + len(chunk):
            n = self.max_event_bytes * IDLE_LIMIT_FACTOR
            raise SSEError(f"{n / 2**20:g} MiB of the event stream without one event: stopped reading")
        self._pending += chunk
        if b"\r" in chunk or self._held_cr:
            self._normalise_cr()
        if b"\n" not in chunk and not self._cr_split:
            if len(self._pending) > self.max_event_bytes or (self._skipping and len(self._pending) > 2**16):
                started = self._oversize("line", len(self._pending))  # raises unless skip_oversize
                self._pending, self._mid_line = b"", True
                return [started] if started else []
            return []
        self._cr_split = False
        *lines, self._pending = self._pending.split(b"\n")
        out = []
        for raw in lines:
            if self._skip_line(raw):
                continue
            if len(raw) > self.max_event_bytes:
                started = self._oversize("line", len(raw))
                if started:
                    out.append(started)
                continue
            payload = self.line(raw.decode("utf-8", errors="replace"))
            if payload is not None:
                out.append(payload)
        if out:
            self._since_event = 0
        return out

    def _normalise_cr(self) -> None:
        """CRLF and a bare CR end a line too (the SSE spec): make them LF. A CR that ends the
        pending bytes is held back, since the next chunk may start with its LF."""
        pending = self._pending
        hold = pending.endswith(b"\r")
        if hold:
            pending = pending[:-1]
        self._held_cr = hold
        normal = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._cr_split = b"\n" in normal
        self._pending = normal + (b"\r" if hold else b"")

    def close(self) -> list[str]:
        """The stream ended: the payload still pending, if any."""
        out = []
        if self._pending.endswith(b"\r"):
            self._pending = self._pending[:-1]
        if self._skipping:
            self._pending = b""
        if self._pending:
            payload = self.line(self._pending.decode("utf-8", errors="replace"))
            self._pending = b""
            if payload is not None:
                out.append(payload)
        if self._data:
            out.append("\n".join(self._data))
            self._data = []
        return out


def sse_payloads(
    chunks: Iterable[bytes], skip_oversize: bool = False, max_event_bytes: int | None = None
) -> Iterator[str]:
    """The ``data`` payloads of a server-sent event stream given as byte chunks."""
    decoder = SSEDecoder(max_event_bytes, skip_oversize=skip_oversize)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


async def asse_payloads(
    chunks: AsyncIterator[bytes], skip_oversize: bool = False, max_event_bytes: int | None = None
) -> AsyncIterator[str]:
    """:func:`sse_payloads` for an asynchronous byte stream (aiohttp's ``content.iter_any()``)."""
    decoder = SSEDecoder(max_event_bytes, skip_oversize=skip_oversize)
    async for chunk in chunks:
        for payload in decoder.feed(chunk):
            yield payload
    for payload in decoder.close():
        yield payload


def sse_object(payload: str, source: str = "") -> dict[str, Any]:
    """One SSE ``data`` payload as a JSON object; :class:`SSEError` names what was wrong."""
    where = f" from {source}" if source else ""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep to read
        raise SSEError(f"malformed SSE event{where} (not JSON): {one_line(payload, 120)}") from exc
    if not isinstance(obj, dict):
        raise SSEError(f"malformed SSE event{where} (not an object): {one_line(payload, 120)}")
    return obj

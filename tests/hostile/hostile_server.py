"""A hostile OpenAI-compatible server, written for the tests in ``tests/hostile/``.

It speaks enough of the OpenAI API for ``python -m bench run --engine openai`` to run
against it: ``GET /v1/models`` (lists :data:`MODEL`), ``POST /v1/completions`` and
``POST /v1/chat/completions`` streamed as server-sent events (one ``data: {...}`` event per
token, a usage event, ``data: [DONE]``). ``/tokenize`` and ``/metrics`` are absent (404),
so the client counts one token per event.

How it answers a completion is chosen per request, so one run can mix good requests
and hostile ones:
- a prompt (or chat message) holding ``hostile:<mode>`` gets that mode;
- else the URL's first path segment does: ``http://127.0.0.1:PORT/<mode>/v1``;
- else the request is answered well (mode ``good``).
``/models`` is always answered well, so the engine starts whatever the mode.

The modes (:data:`MODES`):
- ``good``: ``max_tokens`` events of one word each, as a real server streams them;
- ``huge_event``: one event of 100 MB of text, sent as many ``data:`` lines of 256 KiB
  (each line short, the event huge), generated piece by piece: the server never holds it;
- ``huge_event_empty_lines``: one event of 60 MB of empty ``data:`` lines (six bytes each,
  each adding a line to the event's data), then a blank line and ``[DONE]``;
- ``huge_routing``: a good completion, then a response-level event (SGLang's ``sglext``) whose
  ``routed_experts`` is 100 MB of base64 text in one line, then the usage event and ``[DONE]``;
- ``gzip_error``: HTTP 500 whose body, ``Content-Encoding: gzip``, inflates to :data:`BOMB_BYTES`
  of spaces (about 2 MB on the wire);
- ``gzip_newlines``: a 200 event stream, gzip, inflating to :data:`BOMB_BYTES` of newlines (no event);
- ``gzip_models``: ``GET /v1/models`` answered with a gzip body inflating to :data:`BOMB_BYTES`
  (the mode from the URL only: ``/gzip_models/v1``);
- ``usage_nan``, ``usage_text``, ``usage_huge``, ``usage_negative``: a good completion whose usage
  event says ``NaN``, ``"many"``, ``1e29`` or ``-1000000`` for both counts (and per chunk);
- ``surrogate``: a good completion whose second token's text is a lone surrogate (JSON ``"\\ud800"``);
- ``usage_over_cap``: a good completion whose final usage says ``completion_tokens`` 999,999,999
  (a whole number under the "not a count" bound, far over the request's ``max_tokens``);
- ``usage_under_streamed``: a good completion whose final usage says 1 completion token;
- ``reasoning_not_text``: three chat deltas whose ``reasoning_content`` is a number, a list and an
  object (no text), then a good completion;
- ``routing_unsigned``, ``routing_huge_header``, ``routing_rows``, ``routing_top_k``: a good completion,
  then SGLang's response-level ``sglext.routed_experts`` event holding (:func:`routing_payload`)
  an ``.npy`` of uint64 ids (in range, one row a token), an ``.npy`` whose header declares shape
  (2**40, 2, 2) over 32 bytes, 1 MB of base64 ``AAAA`` (int32 zeros: ~10,000 rows of the tiny
  model for a request of ~10 tokens), or an ``.npy`` of top-500 ids (the tiny model routes to 2);
- ``pass_choices_object``, ``pass_choices_number``, ``pass_unsigned``, ``pass_huge_header``,
  ``pass_nested``: streamed, a good completion; not streamed (``"stream": false``, the openai
  engine's ``routing_pass``), an answer whose ``choices`` is ``{"x": 1}`` or ``5``, whose
  ``routed_experts`` is an ``.npy`` of uint64 ids or of a (2**40, 2, 2) header, or JSON nested
  100,000 deep;
- ``huge_line_no_newline``: ``data: yyyy...`` without a newline (100 MB, then the connection ends);
- ``endless``: valid one-token events, never ``[DONE]``: 60 MB of them (:data:`ENDLESS_BYTES`),
  then the connection ends, so a client that keeps reading is seen (:attr:`bytes_sent`);
- ``trickle``: the SSE comment ``: keep-alive`` every 0.2 s forever, never an event;
- ``redirect``: ``307`` to the same endpoint (``/v1/...``, without a mode) on
  :attr:`HostileServer.redirect_to` (another server, on another port);
- ``error_formula``: HTTP 500 whose error message is :data:`FORMULA`;
- ``slow_first_byte``: no status line or headers until the client gives up.

Every endless mode ends when the client hangs up (or after :data:`HANG_GUARD_S`, or after
sending its bytes, so a client that never gives up cannot keep the test process busy for ever). The server counts
what it saw (:attr:`HostileServer.hits`, :attr:`HostileServer.bytes_sent`,
:attr:`HostileServer.auth_headers`), so a test can check what the client did, not only
what it said.

    with HostileServer() as server:
        url = server.url("endless")  # http://127.0.0.1:PORT/endless/v1
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import threading
import time
from typing import Any

MODEL = "m"
MODES = (
    "good",
    "huge_event",
    "huge_event_empty_lines",
    "huge_routing",
    "gzip_error",
    "gzip_newlines",
    "gzip_models",
    "usage_nan",
    "usage_text",
    "usage_huge",
    "usage_negative",
    "surrogate",
    "usage_over_cap",
    "usage_under_streamed",
    "reasoning_not_text",
    "routing_unsigned",
    "routing_huge_header",
    "routing_rows",
    "routing_top_k",
    "pass_choices_object",
    "pass_choices_number",
    "pass_unsigned",
    "pass_huge_header",
    "pass_nested",
    "huge_line_no_newline",
    "endless",
    "trickle",
    "redirect",
    "error_formula",
    "slow_first_byte",
)
FORMULA = '=HYPERLINK("http://evil","x")'
WORD = " a"
HUGE_EVENT_BYTES = 100 * 10**6  # the text of the huge event
HUGE_PIECE_BYTES = 256 * 1024  # one data: line of it
# The empty data: lines of mode huge_event_empty_lines (~10 M lines). Large beside what a client that
# stops at its 4 MiB limit leaves in flight: the loopback sockets' buffers grow to several MB (one
# run here saw 10.3 MB written for a 4 MiB read), so half of this stays a clear line between a client
# that hung up and one that read on.
EMPTY_LINES_EVENT_BYTES = 60 * 10**6
ENDLESS_BYTES = 60 * 10**6  # mode endless gives up after this much (~450 k events), so a client that
# never stops reading ends instead of hanging the test; a client that stops at its cap reads ~10 kB (the
# sockets' buffers, several MB on loopback, stay far below half of this)
TRICKLE_EVERY_S = 0.2
BOMB_BYTES = 2 * 10**9  # what the gzip modes inflate to


def gzip_bomb(fill: bytes) -> bytes:
    """:data:`BOMB_BYTES` of ``fill`` repeated, gzip-compressed (made once per fill, ~2 MB)."""
    import zlib

    if fill not in _BOMBS:
        enc = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
        block = fill * (2**20 // len(fill))
        parts = [enc.compress(block) for _ in range(BOMB_BYTES // len(block))]
        _BOMBS[fill] = b"".join(parts) + enc.flush()
    return _BOMBS[fill]


_BOMBS: dict[bytes, bytes] = {}
HANG_GUARD_S = 300.0  # the longest any endless mode goes on when the client never hangs up
_DIRECTIVE = re.compile(r"hostile:([a-z_]+)")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(chat: bool, text: str, finish: str | None = None) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "cmpl-hostile", "object": kind, "created": 0, "model": MODEL, "choices": [choice]}


def _prompt_text(body: dict[str, Any]) -> str:
    """The prompt of a completion, or the messages' text of a chat completion."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts = []
    for m in body.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            parts.append(m["content"])
    return "\n".join(parts)


TINY_MOE_LAYERS, TINY_TOP_K = 2, 2  # the tiny model's MoE layers and experts per token (engines.models)
ROUTING_ROWS_B64_BYTES = 10**6  # mode routing_rows: base64 "AAAA" of this length


def _npy(arr: Any) -> bytes:
    import io

    import numpy as np

    with io.BytesIO() as buf:
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue()


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    """An .npy whose header declares ``shape`` of int32, followed by 32 bytes only."""
    import io

    import numpy as np

    with io.BytesIO() as buf:
        np.lib.format.write_array_header_1_0(buf, {"descr": "<i4", "fortran_order": False, "shape": shape})
        return buf.getvalue() + bytes(32)


def routing_payload(mode: str, rows: int) -> str:
    """The base64 ``routed_experts`` of a ``routing_*`` or ``pass_*`` mode for a request of ``rows`` tokens."""
    import base64

    import numpy as np

    kind = mode.split("_", 1)[1]
    if kind == "rows":
        return "A" * ROUTING_ROWS_B64_BYTES
    if kind == "unsigned":
        raw = _npy(np.arange(rows * TINY_MOE_LAYERS * TINY_TOP_K, dtype=np.uint64).reshape(rows, -1, TINY_TOP_K) % 8)
    elif kind == "huge_header":
        raw = _npy_header_only((2**40, TINY_MOE_LAYERS, TINY_TOP_K))
    elif kind == "top_k":
        raw = _npy(np.zeros((rows, TINY_MOE_LAYERS, 500), dtype=np.int32))
    else:
        raise ValueError(f"mode {mode} sends no routed_experts")
    return base64.b64encode(raw).decode("ascii")


def pass_answer(mode: str, body: dict[str, Any]) -> bytes:
    """The non-streamed answer of a ``pass_*`` mode."""
    n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    prompt_tokens = len(_prompt_text(body).split())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    if mode == "pass_nested":
        return b"[" * 100_000 + b"]" * 100_000
    choices: Any = {"pass_choices_object": {"x": 1}, "pass_choices_number": 5}.get(mode)
    if choices is None:
        field = routing_payload(mode, prompt_tokens + n - 1)
        choices = [{"index": 0, "text": WORD * n, "finish_reason": "length", "routed_experts": field}]
    obj = {"id": "cmpl-hostile", "object": "text_completion", "model": MODEL, "choices": choices, "usage": usage}
    return json.dumps(obj).encode()


class HostileServer:
    """The server (see the module docstring), on a free port of 127.0.0.1, in a daemon thread.

    ``redirect_to``: the root (``http://127.0.0.1:PORT``) that mode ``redirect`` sends
    clients to; default: a port nobody listens on. ``directives`` False: prompts do not
    choose the mode (a redirect target answers a redirected hostile prompt well).
    """

    def __init__(self, redirect_to: str | None = None, directives: bool = True) -> None:
        self.redirect_to = redirect_to or "http://127.0.0.1:9"
        self.directives = directives
        self.port = 0
        self.hits: collections.Counter[str] = collections.Counter()  # completions answered, per mode
        self.bytes_sent: collections.Counter[str] = collections.Counter()  # body bytes written, per mode
        self.auth_headers: list[str] = []  # every Authorization header received, any path
        self.paths: list[str] = []  # every request path received
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # --- lifecycle --------------------------------------------------------------------
    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, mode: str | None = None) -> str:
        """The OpenAI base URL whose completions are answered in ``mode`` (None: good)."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        return f"{self.root}/{mode}/v1" if mode else f"{self.root}/v1"

    def start(self) -> HostileServer:
        self._thread = threading.Thread(target=self._run, name="hostile-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the hostile server did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the hostile server failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start() through _error
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from aiohttp import web

        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        # handler_cancellation: a handler waiting for ever stops when its client hangs up.
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            await runner.cleanup()

    # --- requests ---------------------------------------------------------------------
    async def _dispatch(self, request: Any) -> Any:
        from aiohttp import web

        with self._lock:
            self.paths.append(request.path)
            if "Authorization" in request.headers:
                self.auth_headers.append(request.headers["Authorization"])
        segments = [s for s in request.path.split("/") if s]
        path_mode = segments[0] if segments and segments[0] in MODES else None
        rest = segments[1:] if path_mode else segments
        if request.method == "GET" and rest == ["v1", "models"] and path_mode == "gzip_models":
            body = await asyncio.to_thread(gzip_bomb, b" ")
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            return web.Response(body=body, headers=headers)
        if request.method == "GET" and rest == ["v1", "models"]:
            return web.json_response(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "hostile"}]}
            )
        if request.method == "POST" and rest in (["v1", "completions"], ["v1", "chat", "completions"]):
            path = "/" + "/".join(rest)
            return await self._completion(request, path, chat=rest[-2] == "chat", path_mode=path_mode or "good")
        return web.json_response({"error": {"message": f"no route {request.path}", "code": 404}}, status=404)

    async def _completion(self, request: Any, path: str, chat: bool, path_mode: str) -> Any:
        from aiohttp import web

        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "the request body is not JSON"}}, status=400)
        found = _DIRECTIVE.search(_prompt_text(body)) if self.directives else None
        mode = found.group(1) if found and found.group(1) in MODES else path_mode
        with self._lock:
            self.hits[mode] += 1
        if mode == "redirect":
            raise web.HTTPTemporaryRedirect(f"{self.redirect_to}{path}")  # the same endpoint, without the mode
        if mode == "gzip_error":
            body = await asyncio.to_thread(gzip_bomb, b" ")
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            return web.Response(status=500, body=body, headers=headers)
        if mode == "gzip_newlines":
            resp = web.StreamResponse(headers={**SSE_HEADERS, "Content-Encoding": "gzip"})
            await resp.prepare(request)
            bomb = await asyncio.to_thread(gzip_bomb, b"\n")
            with contextlib.suppress(ConnectionError):
                for i in range(0, len(bomb), 2**16):
                    await self._send(resp, mode, bomb[i : i + 2**16])
                await resp.write_eof()
            return resp
        if mode == "error_formula":
            err = {"error": {"message": FORMULA, "type": "InternalServerError", "code": 500}}
            return web.json_response(err, status=500)
        if mode == "slow_first_byte":
            await asyncio.sleep(HANG_GUARD_S)  # cancelled when the client hangs up
            mode = "good"
        if mode.startswith("pass_") and body.get("stream") is False:
            return web.Response(body=pass_answer(mode, body), content_type="application/json")
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        if mode.startswith("pass_"):
            writer = self._write_good
        elif mode.startswith("routing_"):
            writer = self._write_routing
        else:
            writer = getattr(self, f"_write_{mode}")
        with contextlib.suppress(ConnectionError):  # the client hung up: what these modes wait for
            await writer(resp, mode, chat, body)
            await resp.write_eof()
        return resp

    async def _send(self, resp: Any, mode: str, data: bytes) -> None:
        await resp.write(data)  # waits while the client's socket is full: nothing piles up here
        with self._lock:
            self.bytes_sent[mode] += len(data)

    async def _write_good(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        for i in range(n):
            await self._send(resp, mode, _event(_chunk(chat, WORD, "length" if i == n - 1 else None)))
        prompt_tokens = len(_prompt_text(body).split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await self._send(resp, mode, _event({**_chunk(chat, ""), "choices": [], "usage": usage}))
        await self._send(resp, mode, DONE)

    async def _write_with_usage(self, resp: Any, mode: str, chat: bool, body: dict[str, Any], bad: Any) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        for i in range(n):
            text = "\ud800" if mode == "surrogate" and i == 1 else WORD
            event = {**_chunk(chat, text, "length" if i == n - 1 else None)}
            if bad is not None:
                event["usage"] = {"prompt_tokens": bad, "completion_tokens": bad}
            await self._send(resp, mode, _event(event))
        prompt_tokens = len(_prompt_text(body).split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        if bad is not None:
            usage = {"prompt_tokens": bad, "completion_tokens": bad, "total_tokens": bad}
        await self._send(resp, mode, _event({**_chunk(chat, ""), "choices": [], "usage": usage}))
        await self._send(resp, mode, DONE)

    async def _write_usage_nan(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_with_usage(resp, mode, chat, body, float("nan"))

    async def _write_usage_text(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_with_usage(resp, mode, chat, body, "many")

    async def _write_usage_huge(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_with_usage(resp, mode, chat, body, 1e29)

    async def _write_usage_negative(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_with_usage(resp, mode, chat, body, -1_000_000)

    async def _write_surrogate(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_with_usage(resp, mode, chat, body, None)

    async def _write_final_usage(
        self, resp: Any, mode: str, chat: bool, body: dict[str, Any], completion_tokens: int
    ) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        for i in range(n):
            await self._send(resp, mode, _event(_chunk(chat, WORD, "length" if i == n - 1 else None)))
        usage = {"prompt_tokens": 16, "completion_tokens": completion_tokens, "total_tokens": 16 + completion_tokens}
        await self._send(resp, mode, _event({**_chunk(chat, ""), "choices": [], "usage": usage}))
        await self._send(resp, mode, DONE)

    async def _write_usage_over_cap(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_final_usage(resp, mode, chat, body, 999_999_999)

    async def _write_usage_under_streamed(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._write_final_usage(resp, mode, chat, body, 1)

    async def _write_reasoning_not_text(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        for value in (5, ["think"], {"text": "think"}):
            event = _chunk(True, "")
            event["choices"][0]["delta"] = {"reasoning_content": value}
            await self._send(resp, mode, _event(event))
        await self._write_good(resp, mode, chat, body)

    async def _write_huge_event(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        head = json.dumps(_chunk(chat, "@@"), separators=(",", ":")).split("@@")[0]
        await self._send(resp, mode, f"data: {head}\n".encode())
        line = b"data: " + b"x" * (HUGE_PIECE_BYTES - 7) + b"\n"
        for _ in range(HUGE_EVENT_BYTES // HUGE_PIECE_BYTES):
            await self._send(resp, mode, line)
        await self._send(resp, mode, b'data: "}]}\n\n' + DONE)

    async def _write_huge_routing(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        for i in range(n):
            await self._send(resp, mode, _event(_chunk(chat, WORD, "length" if i == n - 1 else None)))
        await self._send(resp, mode, b'data: {"choices":[],"sglext":{"routed_experts":"')
        piece = b"A" * HUGE_PIECE_BYTES
        for _ in range(HUGE_EVENT_BYTES // HUGE_PIECE_BYTES):
            await self._send(resp, mode, piece)
        await self._send(resp, mode, b'"}}\n\n')
        prompt_tokens = len(_prompt_text(body).split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await self._send(resp, mode, _event({**_chunk(chat, ""), "choices": [], "usage": usage}))
        await self._send(resp, mode, DONE)

    async def _write_routing(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        for i in range(n):
            await self._send(resp, mode, _event(_chunk(chat, WORD, "length" if i == n - 1 else None)))
        prompt_tokens = len(_prompt_text(body).split())
        field = await asyncio.to_thread(routing_payload, mode, prompt_tokens + n - 1)
        await self._send(resp, mode, _event({"choices": [], "sglext": {"routed_experts": field}}))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await self._send(resp, mode, _event({**_chunk(chat, ""), "choices": [], "usage": usage}))
        await self._send(resp, mode, DONE)

    async def _write_huge_event_empty_lines(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        piece = b"data:\n" * (64 * 1024 // 6)
        for _ in range(EMPTY_LINES_EVENT_BYTES // len(piece)):
            await self._send(resp, mode, piece)
        await self._send(resp, mode, b"\n" + DONE)

    async def _write_huge_line_no_newline(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        await self._send(resp, mode, b"data: ")
        piece = b"y" * (64 * 1024)
        for _ in range(HUGE_EVENT_BYTES // len(piece)):
            await self._send(resp, mode, piece)

    async def _write_endless(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        event = _event(_chunk(chat, WORD))
        for _ in range(ENDLESS_BYTES // len(event)):
            await self._send(resp, mode, event)

    async def _write_trickle(self, resp: Any, mode: str, chat: bool, body: dict[str, Any]) -> None:
        end = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < end:
            await self._send(resp, mode, b": keep-alive\n\n")
            await asyncio.sleep(TRICKLE_EVERY_S)


def main() -> None:
    """Serve in the foreground until Ctrl-C (to try a client against it by hand)."""
    with HostileServer() as server:
        print(f"hostile server on {server.root}; modes: {', '.join(MODES)} (as /<mode>/v1 or hostile:<mode>)")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)


if __name__ == "__main__":
    main()

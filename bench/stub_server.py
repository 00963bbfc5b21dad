"""A zero-compute OpenAI-compatible streaming server, for measuring benchmark *clients*.

It answers ``/v1/completions`` and ``/v1/chat/completions`` (streamed or not), ``/v1/models``
and ``/health`` without any model: a request with ``max_tokens`` N gets N server-sent events,
each one completion chunk whose text is one short word (``" a"``), the last with
``finish_reason: "length"``; then a usage chunk when ``stream_options.include_usage`` is set;
then ``data: [DONE]``. Prompt tokens are ``len(prompt.split())`` (or the length of a
token-id list), not a tokenizer's count: a client that reports input tokens from the
server's ``usage`` (vllm bench serve does) shows fewer than it sent. Any model name is
accepted and echoed; ``/v1/models`` lists ``--model``.

Per-event work is kept small: the event bytes are encoded once per (endpoint, model) and
each event is written with its own ``await resp.write(...)`` (one HTTP chunk, one send),
as a real server sends one event per token. With no ``--itl-ms`` the events of one request
are written back to back, so TCP may coalesce several into one segment and the client may
read them in one ``recv``: that is the same for every client measured against it, and only
``--itl-ms`` > 0 spaces them like a decoding server. ``--ttft-ms`` delays the first event.

Capacity. One process is one asyncio loop on one core; ``--processes N`` starts N-1 more
processes on the same port (``SO_REUSEPORT``: the kernel spreads connections across them).
Measured 2026-12-03 on the 2-core development machine, shared with other jobs (load
average 1-3.5), random dataset, 32 in / 32 out, 2000 prompts, concurrency 256, request rate
inf, stub runs alternating 1, 2, 2, 1, 1, 2 processes; req/s of each run, then the mean:

    load generator                      1 stub process          2 stub processes
    vllm bench serve (.venv-vllm)       476 430 407 -> 438      451 371 359 -> 394
    MoE Bench CLI, --workers 2          776 1015 825 -> 872     725 638 845 -> 736

A second server process does not raise either client's rate (on 2 cores it only takes CPU
from the client), so the single process is not the limit. The stub was busy 31-36 % of one
core under vllm bench and 48-57 % under MoE Bench's two senders; it spends 500-900 us of CPU
per request (34 events; in one split, 460 us in Python, mostly aiohttp's path of each write,
and 155 us in the kernel), so one process saturates one core only at about 1,100-2,000 req/s.
For comparison, the clients' own CPU per request (from runs of 200 and 2000 requests):
vllm bench serve 2.0 ms, MoE Bench 1.8 ms (one sender) / 1.9 ms (two).
``studies/client_capacity.py`` prints the stub's busy share for every run: if it
nears 100 % the stub is close to being the limit.

    python -m bench stub --port 8000 [--processes 2] [--itl-ms 5] [--model NAME]

Routed experts (``--routed-experts sglang|vllm``, layout ``--routing-shape H,D,E,K``: hidden
layers, dense layers first, experts, top-k; default the tiny model's 3,1,8,2): a request with
``return_routed_experts`` gets each forwarded token's expert ids (prompt + output - 1 rows) as
the servers encode them: ``sglang``: base64 of raw int32 [rows, H, K] (dense layers' columns
0), in a response-level ``sglext`` event after the last token (and in the non-streamed
answer); ``vllm``: base64 of an ``.npy`` [rows, MoE layers, K] in the non-streamed choice only
(vLLM 0.32 does not stream it). The ids are planted, not computed: slot 0 is always expert 0
(the hot expert: E/K times the mean load per layer), slot s > 0 expert 1 + (row + layer + s)
mod (E - 1) (:func:`planted_ids`).

Several tokens per chunk (``--tokens-per-chunk K``), as a server with speculative decoding
or MTP streams them: each event carries up to K tokens (``" a" * k``, with ``token_ids``: the
exact count), so N tokens come in ceil(N / K) events ``--itl-ms`` apart. ``/metrics`` then
exports vLLM's speculative-decoding counters as if every event were one decoding step with a
draft of K - 1 tokens of which k - 1 were accepted (``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total{position="p"}``: positions below k - 1 accepted), counted
over this process's streams since it started.

Reasoning (``--reasoning-tokens R``, chat endpoint): the first min(R, N) tokens of each answer
stream as ``delta.reasoning_content`` (DeepSeek-R1 style), the rest as ``content``; the usage
chunk reports ``completion_tokens_details.reasoning_tokens`` as R (``--reasoning-usage exact``),
0 (``zero``: a server that miscounts) or not at all (``none``).

From code: ``url, proc = start_stub_server(model="tiny-deepseek-v3")`` launches it as a
managed subprocess on a free port (``url`` ends in ``/v1``); ``proc.stop()`` ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_MODEL = "tiny-deepseek-v3"
WORD = " a"  # the text of every generated "token"
DEFAULT_MAX_TOKENS = 16
STUB_TOKEN_ID = 64  # the id token_ids carry (any id: only their number is read)
_CACHE_LIMIT = 64  # distinct model names whose events are kept pre-encoded

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Events:
    """The pre-encoded events of one (endpoint, model): role (chat only), token, last token."""

    def __init__(self, chat: bool, model: str) -> None:
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.base: dict[str, Any] = {
            "id": "chatcmpl-stub" if chat else "cmpl-stub",
            "object": kind,
            "created": int(time.time()),
            "model": model,
        }

        self.chat = chat
        self.first = self.chunk("", None, role=True) if chat else b""
        self.token = self.chunk(WORD, None)
        self.last = self.chunk(WORD, "length")

    def chunk(self, text: str, finish: str | None, role: bool = False, k: int = 0, reasoning: bool = False) -> bytes:
        """One event; ``k`` > 0 adds ``token_ids`` (k of them: the exact count of the chunk)."""
        choice: dict[str, Any]
        if self.chat:
            field = "reasoning_content" if reasoning else "content"
            delta = {"role": "assistant", field: text} if role else {field: text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if k:
            choice["token_ids"] = [STUB_TOKEN_ID] * k
        return _event({**self.base, "choices": [choice]})


_EVENTS: dict[tuple[bool, str], Events] = {}


def events_for(chat: bool, model: str) -> Events:
    """The cached :class:`Events` of (endpoint, model); built on first use."""
    key = (chat, model)
    ev = _EVENTS.get(key)
    if ev is None:
        ev = Events(chat, model)
        if len(_EVENTS) < _CACHE_LIMIT:
            _EVENTS[key] = ev
    return ev


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], str):  # a batch of prompts: the first one
            return len(prompt[0].split())
        if prompt and isinstance(prompt[0], list):
            return len(prompt[0])
        return len(prompt)  # token ids
    return 0


def _chat_prompt_tokens(messages: Any) -> int:
    n = 0
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content.split())
        elif isinstance(content, list):  # content parts
            n += sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return n


ROUTING_SHAPE = (3, 1, 8, 2)  # the tiny model: hidden layers, dense layers first, experts, top-k


def planted_ids(rows: int, shape: tuple[int, int, int, int] = ROUTING_SHAPE) -> Any:
    """The stub's expert ids [rows, MoE layers, top-k] (see the module docstring)."""
    import numpy as np

    hidden, dense, experts, top_k = shape
    layers = hidden - dense
    r = np.arange(rows).reshape(-1, 1, 1)
    j = np.arange(layers).reshape(1, -1, 1)
    k = np.arange(top_k).reshape(1, 1, -1)
    ids = 1 + (r + j + k) % (experts - 1)
    ids = np.where(k == 0, 0, ids)
    return np.broadcast_to(ids, (rows, layers, top_k)).astype(np.int32)


@functools.lru_cache(maxsize=512)
def encode_routed(style: str, rows: int, shape: tuple[int, int, int, int] = ROUTING_SHAPE) -> str:
    """:func:`planted_ids` as ``style`` (sglang or vllm) sends them: base64 text (kept per row
    count, so the stub's own CPU stays off the measurement of a client's)."""
    import base64
    import io

    import numpy as np

    ids = planted_ids(rows, shape)
    if style == "sglang":
        full = np.zeros((rows, shape[0], shape[3]), dtype=np.int32)
        full[:, shape[1] :, :] = ids
        return base64.b64encode(full.tobytes()).decode("ascii")
    with io.BytesIO() as buf:
        np.save(buf, ids.astype(np.int16), allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode("ascii")


def make_app(
    model: str = DEFAULT_MODEL,
    itl_ms: float = 0.0,
    ttft_ms: float = 0.0,
    load_ms: float = 0.0,
    routed_experts: str | None = None,
    routing_shape: tuple[int, int, int, int] = ROUTING_SHAPE,
    tokens_per_chunk: int = 1,
    reasoning_tokens: int = 0,
    reasoning_usage: str = "exact",
) -> Any:
    """The aiohttp application (see the module docstring).

    ``load_ms``: a server that slows with load, as a batching one does: the first event and
    every gap wait ``load_ms`` more for each other stream in flight (in this process).
    ``routed_experts``: None, ``sglang`` or ``vllm`` (see the module docstring)."""
    from aiohttp import web

    itl_s, ttft_s, load_s = itl_ms / 1000.0, ttft_ms / 1000.0, load_ms / 1000.0
    in_flight = 0
    per_chunk = max(1, int(tokens_per_chunk))
    spec = _SpecCounters(model, per_chunk)

    models_body = json.dumps(
        {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": int(time.time()), "owned_by": "moe-bench-stub"}],
        }
    ).encode()

    def error(status: int, message: str) -> Any:
        body = {"error": {"message": message, "type": "BadRequestError", "code": status}}
        return web.json_response(body, status=status)

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=b"")

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=models_body, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=spec.text() if per_chunk > 1 else "", content_type="text/plain")

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body, n, prompt_tokens = _read_request(await request.read(), chat)
        except ValueError as exc:
            return error(400, str(exc))
        name = str(body.get("model") or model)
        ev = events_for(chat, name)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        thinking = min(reasoning_tokens, n) if chat else 0
        if thinking and reasoning_usage != "none":
            usage["completion_tokens_details"] = {"reasoning_tokens": thinking if reasoning_usage == "exact" else 0}
        routed = (
            encode_routed(routed_experts, prompt_tokens + n - 1, routing_shape)
            if routed_experts and body.get("return_routed_experts")
            else None
        )
        if not body.get("stream"):
            return web.json_response(_whole_answer(ev, chat, n, usage, routed, routed_experts))
        nonlocal in_flight
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        in_flight += 1
        try:
            if ttft_s > 0 or load_s > 0:
                await asyncio.sleep(ttft_s + load_s * (in_flight - 1))
            if ev.first:
                await resp.write(ev.first)
            token, write = ev.token, resp.write
            if per_chunk > 1 or thinking:
                events = _shaped_events(ev, n, per_chunk, thinking, spec.count_step if per_chunk > 1 else None)
                for i, event in enumerate(events):
                    await write(event)
                    if i < len(events) - 1 and (itl_s > 0 or load_s > 0):
                        await asyncio.sleep(itl_s + load_s * (in_flight - 1))
            else:
                for _ in range(n - 1):
                    await write(token)
                    if itl_s > 0 or load_s > 0:
                        await asyncio.sleep(itl_s + load_s * (in_flight - 1))
                await write(ev.last)
        finally:
            in_flight -= 1
        if routed is not None and routed_experts == "sglang":
            await write(_event({**ev.base, "choices": [], "sglext": {"routed_experts": routed}}))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await write(_event({**ev.base, "choices": [], "usage": usage}))
        await write(DONE)
        await resp.write_eof()
        return resp

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


class _SpecCounters:
    """The speculative-decoding counters a stub that sends several tokens per chunk exports on
    /metrics, as vLLM names them (see the module docstring)."""

    def __init__(self, model: str, per_chunk: int) -> None:
        self.model, self.per_chunk = model, per_chunk
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.pos = [0] * max(0, per_chunk - 1)

    def count_step(self, k: int) -> None:
        """One decoding step that sent ``k`` tokens: one draft of per_chunk - 1, k - 1 accepted."""
        self.counts["drafts"] += 1
        self.counts["draft_tokens"] += self.per_chunk - 1
        self.counts["accepted"] += k - 1
        for p in range(k - 1):
            self.pos[p] += 1

    def text(self) -> str:
        lab = f'engine="0",model_name="{self.model}"'
        lines = []
        for key, name in (
            ("drafts", "num_drafts"),
            ("draft_tokens", "num_draft_tokens"),
            ("accepted", "num_accepted_tokens"),
        ):
            lines += [
                f"# TYPE vllm:spec_decode_{name} counter",
                f"vllm:spec_decode_{name}_total{{{lab}}} {float(self.counts[key])}",
            ]
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for p, v in enumerate(self.pos):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {float(v)}')
        return "\n".join(lines) + "\n"


def _read_request(raw: bytes, chat: bool) -> tuple[dict[str, Any], int, int]:
    """A completion request's body, its output tokens (max_tokens) and its prompt's tokens;
    ValueError with the one-line reason a server would answer 400 with."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise ValueError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the request body is not a JSON object")
    if chat:
        raw_n = body.get("max_completion_tokens") or body.get("max_tokens")
        prompt_tokens = _chat_prompt_tokens(body.get("messages"))
    else:
        raw_n = body.get("max_tokens")
        prompt_tokens = _prompt_tokens(body.get("prompt"))
    try:
        n = DEFAULT_MAX_TOKENS if raw_n is None else int(raw_n)
    except (TypeError, ValueError):
        raise ValueError(f"max_tokens must be an integer, got {raw_n!r}") from None
    if n < 1:
        raise ValueError("max_tokens must be at least 1")
    return body, n, prompt_tokens


def _whole_answer(
    ev: Events, chat: bool, n: int, usage: dict[str, Any], routed: Any, routed_experts: str | None
) -> dict[str, Any]:
    """A non-streamed answer of ``n`` tokens (routed experts where asked: vLLM's in the choice,
    SGLang's in ``sglext``)."""
    text = WORD * n
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        if chat
        else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    )
    obj = {**ev.base, "object": "chat.completion" if chat else "text_completion"}
    if routed is not None and routed_experts == "vllm":
        choice["routed_experts"] = routed
    elif routed is not None:
        obj["sglext"] = {"routed_experts": routed}
    return {**obj, "choices": [choice], "usage": usage}


def _shaped_events(ev: Events, n: int, per_chunk: int, thinking: int, step: Any) -> list[bytes]:
    """The events of an answer of ``n`` tokens: the first ``thinking`` as reasoning, then content,
    each event up to ``per_chunk`` tokens (never mixing the two), the last with its finish reason;
    ``step(k)`` counts each event as a decoding step of k tokens (speculative decoding)."""
    sizes: list[tuple[int, bool]] = []
    for part, reasoning in ((thinking, True), (n - thinking, False)):
        while part > 0:
            k = min(per_chunk, part)
            sizes.append((k, reasoning))
            part -= k
    out = []
    for i, (k, reasoning) in enumerate(sizes):
        finish = "length" if i == len(sizes) - 1 else None
        out.append(ev.chunk(WORD * k, finish, k=k, reasoning=reasoning))
        if step is not None:
            step(k)
    return out


async def _watch_parent(parent: int) -> None:
    """A child server ends when the process that started it is gone."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    os._exit(0)


def _serve_one(
    host: str,
    port: int,
    model: str,
    itl_ms: float,
    ttft_ms: float,
    parent: int | None,
    load_ms: float = 0.0,
    routed_experts: str | None = None,
    routing_shape: tuple[int, int, int, int] = ROUTING_SHAPE,
    shape: dict[str, Any] | None = None,
) -> None:
    from aiohttp import web

    async def main() -> None:
        app = make_app(model, itl_ms, ttft_ms, load_ms, routed_experts, routing_shape, **(shape or {}))
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        # A large backlog: a client opening 1000+ connections at once must not see refusals.
        site = web.TCPSite(runner, host, port, reuse_port=True, backlog=4096)
        await site.start()
        try:
            if parent is not None:
                await _watch_parent(parent)
            else:
                await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def serve(
    port: int,
    *,
    host: str = "127.0.0.1",
    model: str = DEFAULT_MODEL,
    processes: int = 1,
    itl_ms: float = 0.0,
    ttft_ms: float = 0.0,
    load_ms: float = 0.0,
    routed_experts: str | None = None,
    routing_shape: tuple[int, int, int, int] = ROUTING_SHAPE,
    shape: dict[str, Any] | None = None,
) -> None:
    """Serve until interrupted: this process, plus ``processes - 1`` forked ones on the same port.
    ``shape``: make_app's tokens_per_chunk, reasoning_tokens, reasoning_usage."""
    children = []
    if processes > 1:
        ctx = multiprocessing.get_context("fork")  # before any event loop exists: safe
        for _ in range(processes - 1):
            args = (host, port, model, itl_ms, ttft_ms, os.getpid(), load_ms, routed_experts, routing_shape, shape)
            child = ctx.Process(target=_serve_one, args=args, daemon=True)
            child.start()
            children.append(child)
    try:
        _serve_one(host, port, model, itl_ms, ttft_ms, None, load_ms, routed_experts, routing_shape, shape)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.join(5.0)


def start_stub_server(
    *,
    model: str = DEFAULT_MODEL,
    processes: int = 1,
    itl_ms: float = 0.0,
    ttft_ms: float = 0.0,
    load_ms: float = 0.0,
    routed_experts: str | None = None,
    tokens_per_chunk: int = 1,
    reasoning_tokens: int = 0,
    reasoning_usage: str = "exact",
    port: int | None = None,
    python: str | None = None,
    timeout: float = 30.0,
    log_path: Path | None = None,
) -> tuple[str, Any]:
    """Launch the stub as a managed subprocess on a free port and wait until it is healthy.

    Returns ``(base_url, process)``: ``base_url`` is ``http://127.0.0.1:PORT/v1``; the
    :class:`~engines.launch.ManagedProcess` stops the server (and its children) with ``stop()``.
    """
    from engines.launch import ManagedProcess, free_port
    from engines.settings import PROJECT_ROOT

    port = port or free_port()
    argv = [
        python or sys.executable,
        "-m",
        "bench.stub_server",
        "--port",
        str(port),
        "--model",
        model,
        "--processes",
        str(processes),
        "--itl-ms",
        str(itl_ms),
        "--ttft-ms",
        str(ttft_ms),
        "--load-ms",
        str(load_ms),
        *(["--routed-experts", routed_experts] if routed_experts else []),
        *(["--tokens-per-chunk", str(tokens_per_chunk)] if tokens_per_chunk != 1 else []),
        *(
            ["--reasoning-tokens", str(reasoning_tokens), "--reasoning-usage", reasoning_usage]
            if reasoning_tokens
            else []
        ),
    ]
    proc = ManagedProcess(argv, name="stub-server", cwd=PROJECT_ROOT, log_path=log_path).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout, interval=0.1)
    except BaseException:
        proc.stop()
        raise
    return f"http://127.0.0.1:{port}/v1", proc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench stub", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model name /v1/models lists (any name is accepted)")
    p.add_argument("--processes", type=int, default=1, help="server processes on the port (SO_REUSEPORT)")
    p.add_argument("--itl-ms", type=float, default=0.0, help="delay between events of a stream, ms")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first event, ms")
    p.add_argument(
        "--load-ms", type=float, default=0.0, help="extra delay per other stream in flight (first event, each gap), ms"
    )
    p.add_argument(
        "--routed-experts", choices=("sglang", "vllm"), default=None, help="answer return_routed_experts as this server"
    )
    p.add_argument(
        "--routing-shape",
        default=",".join(map(str, ROUTING_SHAPE)),
        help="hidden layers, dense layers first, experts, top-k of the routed experts sent (default: the tiny model)",
    )
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per event, as speculative decoding sends")
    p.add_argument(
        "--reasoning-tokens", type=int, default=0, help="chat: the first R tokens stream as reasoning_content"
    )
    p.add_argument(
        "--reasoning-usage",
        choices=("exact", "zero", "none"),
        default="exact",
        help="what usage.completion_tokens_details.reasoning_tokens reports: R, 0 or nothing",
    )
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be at least 1")
    if not 1 <= args.tokens_per_chunk <= 64 or args.reasoning_tokens < 0:
        p.error("--tokens-per-chunk must be 1..64 and --reasoning-tokens at least 0")
    try:
        shape = tuple(int(x) for x in args.routing_shape.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or shape[0] <= shape[1] or shape[2] < 2 or not 0 < shape[3] <= shape[2]:
        p.error(f"--routing-shape {args.routing_shape!r}: give hidden,dense,experts,top-k, e.g. 3,1,8,2")
    print(
        f"stub server on http://{args.host}:{args.port}/v1 (model {args.model}, {args.processes} process(es), "
        f"itl {args.itl_ms} ms, ttft {args.ttft_ms} ms)",
        flush=True,
    )
    serve(
        args.port,
        host=args.host,
        model=args.model,
        processes=args.processes,
        itl_ms=args.itl_ms,
        ttft_ms=args.ttft_ms,
        load_ms=args.load_ms,
        routed_experts=args.routed_experts,
        routing_shape=shape,  # type: ignore[arg-type]
        shape={
            "tokens_per_chunk": args.tokens_per_chunk,
            "reasoning_tokens": args.reasoning_tokens,
            "reasoning_usage": args.reasoning_usage,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

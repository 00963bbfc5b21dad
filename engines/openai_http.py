"""The ``openai`` engine: any OpenAI-compatible HTTP server (vLLM, SGLang, LMDeploy, TGI, ...).

Requests go to ``/v1/completions`` (default) or ``/v1/chat/completions`` with
``stream: true`` and ``stream_options.include_usage``; every server-sent event becomes
one :class:`~engines.base.StreamChunk`, so :func:`engines.base.timed_stream` stamps
chunks as they arrive (as ``vllm bench serve`` does).

Token counts per chunk, best source first:
1. the server's own count: ``token_ids`` in the choice, or the growth of a per-chunk
   ``usage`` (vLLM's ``stream_options.continuous_usage_stats``, option ``server_token_counts``);
2. the client tokenizer (``options.tokenizer``, default the model's own when ``model`` is a
   preset or a local folder, else the server's ``/tokenize`` where it has one; ``"server"``
   asks for the server's): the number of tokens in the delta text;
3. one token per chunk that carries text.
The final ``usage`` chunk is passed on as ``StreamChunk(final=True)`` with the server's
prompt and output counts, so the store can compare them with the client's.

``ignore_eos`` and ``min_tokens`` (vLLM/SGLang extensions) are sent when sampling asks
for exact lengths (option ``exact_lengths``).

The pieces this engine is built from live in their own modules: :mod:`engines.http_client`
(the client, options and API-key rule every HTTP engine shares), :mod:`engines.sse` (the
event-stream decoder), :mod:`engines.http_errors` (client errors as one-line reasons),
:mod:`engines.tokens` (client-side token counts); :mod:`engines.managed` holds the base of
the engines that launch their own server (vllm, triton, lmdeploy).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engines.base import EngineOptions, GenerationRequest, ProgressFn, StreamChunk, register_engine
from engines.errors import EngineUnavailable, RequestFailed, one_line
from engines.http_client import HTTPEngine, HTTPOptions, api_key_for
from engines.http_errors import CONNECT_TIMEOUT_S, aiohttp_errors, error_message, status_failure
from engines.sse import SSEError, asse_payloads, sse_object, sse_payloads
from engines.tokens import SERVER_TOKENIZER, ServerTokenizer, TextCounter


class OpenAIOptions(HTTPOptions):
    """Options of an OpenAI-compatible endpoint. ``model`` is the name the server serves."""

    kind: Literal["openai"] = "openai"  # type: ignore[assignment]
    base_url: str = Field(  # type: ignore[assignment]
        "http://127.0.0.1:8000/v1", description="The server's OpenAI API root, e.g. http://host:8000/v1"
    )
    exact_lengths: bool = Field(
        True, description="Send ignore_eos (and min_tokens) so every output is exactly the requested length"
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions (raw prompt) or /v1/chat/completions (chat template)"
    )
    send_min_tokens: bool = Field(True, description="Send min_tokens too, for servers that ignore ignore_eos")
    server_token_counts: bool = Field(
        False, description="Ask the server for per-chunk token counts (vLLM: per-chunk usage or token ids)"
    )
    check_model: bool = Field(True, description="At start, check that the server lists the model under /models")
    async_client: bool = Field(
        True,
        description="Send a run's requests from one asyncio loop (aiohttp), as vllm bench serve does; "
        "off: one thread per in-flight request (httpx)",
    )
    sglang_expert_distribution_dir: str | None = Field(
        None,
        description="SGLang server: record its expert distribution over each run and read the dump from this "
        "folder (the server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR, reachable from here); the server needs "
        "--expert-distribution-recorder-mode stat",
    )


def _carries_token(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice stands for a generated token even when its text is empty.

    A token whose text is not visible yet (a special token, or part of a UTF-8 character)
    still arrives as its own chunk with empty text; a role-only chat chunk or one without
    content (``"delta": {}`` with a finish_reason) stands for none.
    """
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") is not None and "role" not in delta
    return choice.get("text") is not None


@register_engine
class OpenAIEngine(HTTPEngine):
    """An OpenAI-compatible server over HTTP; see the module docstring."""

    kind = "openai"
    label = "OpenAI-compatible HTTP server"
    options_model = OpenAIOptions
    opts: OpenAIOptions

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.served_models: list[str] = []
        self._asession: Any = None  # aiohttp session between aopen() and aclose()
        self._context_len: int | None = None  # from /models, when the server lists it
        self._reported_shape: dict[str, Any] | None = None  # the deployment the server reports (SGLang)
        self._experts: Any = None  # engines.sglang.ExpertDistribution, when asked for

    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        report = progress or (lambda msg, frac: None)
        self._load_tokenizer(report)
        if self._client is None:
            self._client = self._make_client()
        report(f"connecting to {self.base_url}", 0.8)
        self._check_server()
        self.use_server_tokenizer()
        self._read_server_info()
        self.started = True
        report("ready", 1.0)

    def use_server_tokenizer(self) -> None:
        """Without a local tokenizer, count tokens with the server's ``/tokenize`` when it has one."""
        if self._tokenizer is not None or self._client is None:
            return
        root = self.base_url.rstrip("/").removesuffix("/v1")
        remote = ServerTokenizer(self._client, root, self.served_name)
        if remote.available():
            self._tokenizer = remote
            self.tokenizer_path = f"{root}/tokenize"
        elif self.opts.tokenizer == SERVER_TOKENIZER:
            raise EngineUnavailable(f"{root} has no /tokenize endpoint; give a local tokenizer folder instead")

    def _read_server_info(self) -> None:
        """The deployment shape the server reports (SGLang's server_info), and its expert
        distribution recorder when ``sglang_expert_distribution_dir`` asks for it."""
        from engines.sglang import ExpertDistribution, deployment_from_info, server_info

        root = self.base_url.rstrip("/").removesuffix("/v1")
        info = server_info(self._client, root)
        self._reported_shape = deployment_from_info(info) if info is not None else None
        folder = getattr(self.opts, "sglang_expert_distribution_dir", None)
        if not folder:
            return
        if info is None:
            raise EngineUnavailable(
                f"{root} is not an SGLang server (no /get_server_info): sglang_expert_distribution_dir needs one"
            )
        if not info.get("expert_distribution_recorder_mode"):
            raise EngineUnavailable(
                "the SGLang server records no expert distribution: start it with "
                "--expert-distribution-recorder-mode stat"
            )
        if not Path(folder).is_dir():
            raise EngineUnavailable(f"sglang_expert_distribution_dir {folder} is not a folder on this machine")
        self._experts = ExpertDistribution(self._client, root, folder, self._top_k())

    def _top_k(self) -> int | None:
        """Experts per token, from the local tokenizer folder's config.json where it has one."""
        folder = self.tokenizer_path if isinstance(self.tokenizer_path, str) else None
        config = Path(folder) / "config.json" if folder else None
        if config is None or not config.is_file():
            return None
        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("num_experts_per_tok")
        except (OSError, ValueError):
            return None
        return int(value) if isinstance(value, int) and value > 0 else None

    def reset_expert_routing(self) -> None:
        if self._experts is not None:
            self._experts.start()

    def expert_routing(self) -> dict[str, Any] | None:
        return self._experts.collect() if self._experts is not None else None

    def _check_server(self) -> None:
        """GET /models: the server answers, and serves ``model`` (when it lists models)."""
        import httpx

        url = f"{self.base_url}/models"
        try:
            resp = self._client.get(url, timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(
                f"cannot reach the OpenAI-compatible server at {self.base_url}: {type(exc).__name__}: "
                f"{one_line(exc, 200) or 'no answer'}"
            ) from exc
        if resp.status_code in (401, 403):
            _, key = api_key_for(self.base_url)
            fix = (
                f"the API key is {key}"
                if key.startswith("withheld")
                else "set MOEBENCH_OPENAI_API_KEY or OPENAI_API_KEY"
            )
            raise EngineUnavailable(
                f"{url} refused the credentials (HTTP {resp.status_code}): {fix}; {error_message(resp.content)}"
            )
        if resp.status_code == 404:
            return  # no /models on this server: nothing to check
        if resp.status_code != 200:
            raise EngineUnavailable(f"{url} answered HTTP {resp.status_code}: {error_message(resp.content)}")
        try:
            data = resp.json().get("data", [])
            self.served_models = [str(m.get("id")) for m in data if isinstance(m, dict)]
            # vLLM (and servers like it) list each model's context as max_model_len
            lens = [m.get("max_model_len") for m in data if isinstance(m, dict) and m.get("id") == self.served_name]
            if lens and isinstance(lens[0], int) and not isinstance(lens[0], bool) and lens[0] > 0:
                self._context_len = lens[0]
        except (ValueError, AttributeError) as exc:
            raise EngineUnavailable(f"{url} did not answer an OpenAI model list: {one_line(resp.text, 120)}") from exc
        if self.opts.check_model and self.served_models and self.served_name not in self.served_models:
            raise EngineUnavailable(
                f"model '{self.served_name}' is not served at {self.base_url}; it serves: "
                f"{', '.join(self.served_models)}"
            )

    def context_length(self) -> int | None:
        """The served model's context as the server's /models lists it (vLLM's max_model_len), if it does."""
        return self._context_len

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(endpoint=self.opts.endpoint, served_models=self.served_models)
        if self._reported_shape is not None:
            info["deployment"] = self._reported_shape
        if self._context_len is not None:
            info["context_length"] = self._context_len
        return info

    # --- requests ---------------------------------------------------------------------
    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body for one request."""
        sp = request.sampling
        body: dict[str, Any] = {
            "model": self.served_name,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.opts.server_token_counts:
            body["stream_options"]["continuous_usage_stats"] = True
        if self.opts.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
            body["max_completion_tokens"] = sp.max_tokens
        else:
            body["prompt"] = request.prompt
            body["max_tokens"] = sp.max_tokens
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.ignore_eos and self.opts.exact_lengths:
            body["ignore_eos"] = True
            if self.opts.send_min_tokens:
                body["min_tokens"] = sp.max_tokens
        return body

    def _url_for_endpoint(self) -> str:
        return self.base_url + ("/chat/completions" if self.opts.endpoint == "chat" else "/completions")

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        parser = CompletionStream(self._tokenizer)
        with self.post_stream(self._url_for_endpoint(), self.request_body(request)) as chunks:
            for payload in sse_payloads(chunks):
                if cancel is not None and cancel.is_set():
                    return  # leaving the with-block closes the response
                yield from parser.feed(payload)
                if parser.done:
                    break
        parser.check_complete(cancel)

    # --- the asynchronous path: one event loop for every request of a run -------------
    def async_capable(self) -> bool:
        import importlib.util

        return self.opts.async_client and importlib.util.find_spec("aiohttp") is not None

    async def aopen(self) -> None:
        import aiohttp

        read, headers, n = self._http_settings()
        # aiohttp sets TCP_NODELAY itself. Each request sets its own deadline (astream).
        connector = aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=read)
        self._asession = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)
        # One round trip before the clock starts, as vllm bench serve's test request goes through
        # its session: the first request of a fresh session pays for aiohttp's lazy set-up (the
        # resolver's thread pool, first-use imports: ~250 ms seen), which would land on the
        # first wave as send lag.
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._asession.get(f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                await resp.read()

    async def aconnect(self, n: int) -> None:
        # Concurrent cheap requests open the connections; they stay pooled (keep-alive) for
        # the first wave. A server with a short keep-alive may close some before the clock
        # starts: those requests then open theirs, as without this.
        import asyncio

        import aiohttp

        session = self._asession
        if session is None or n <= 1:
            return

        async def one() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    await resp.read()

        await asyncio.gather(*(one() for _ in range(min(n, self.opts.max_connections))))

    async def aclose(self) -> None:
        session, self._asession = self._asession, None
        if session is not None:
            await session.close()

    async def astream(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> AsyncIterator[StreamChunk]:
        session = self._asession
        if session is None:
            raise EngineUnavailable(f"the {self.kind} engine has no open asynchronous session (aopen)")
        url = self._url_for_endpoint()
        parser = CompletionStream(self._tokenizer)
        deadline = self.request_deadline()
        with aiohttp_errors(url, deadline=deadline):
            async with session.post(
                url, json=self.request_body(request), timeout=deadline.aiohttp_timeout(), allow_redirects=False
            ) as resp:
                deadline.answered = True
                failure = status_failure(
                    resp.status, url, resp.headers.get("Location"), await resp.read() if resp.status >= 400 else b""
                )
                if failure is not None:
                    raise failure
                async for payload in asse_payloads(resp.content.iter_any()):
                    if cancel is not None and cancel.is_set():
                        return  # leaving the async-with block closes the response
                    for chunk in parser.feed(payload):
                        yield chunk
                    if parser.done:
                        break
        parser.check_complete(cancel)


class CompletionStream:
    """The events of one streamed OpenAI completion (or chat completion) -> :class:`StreamChunk`.

    Token counts per chunk, best source first: the choice's ``token_ids``, the growth of a
    per-chunk ``usage``, the client tokenizer (:class:`TextCounter`), one per chunk with
    text. Shared by the threaded and the asynchronous client, so both count alike.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.done = False  # [DONE] seen
        self.usage_out = 0  # running completion_tokens from per-chunk usage
        self.content_count = TextCounter(tokenizer)
        self.reasoning_count = TextCounter(tokenizer)

    def feed(self, payload: str) -> list[StreamChunk]:
        """The chunks one ``data`` payload stands for; raises on an error or a malformed event."""
        if payload.strip() == "[DONE]":
            self.done = True
            return []
        obj = sse_object(payload)
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed(f"server error mid-stream: {one_line(msg, 200)}")
        usage = obj.get("usage") or None
        choices = obj.get("choices") or []
        if not choices:
            if usage is None:
                return []
            return [
                StreamChunk(
                    text="",
                    tokens=0,
                    final=True,
                    prompt_tokens=usage.get("prompt_tokens"),
                    usage_output_tokens=usage.get("completion_tokens"),
                )
            ]
        choice = choices[0]
        if not isinstance(choice, dict):
            raise SSEError(f"malformed SSE event (bad choice): {one_line(payload, 120)}")
        text, reasoning = _choice_text(choice)
        server_n: int | None = None
        if isinstance(choice.get("token_ids"), list):
            server_n = len(choice["token_ids"])
        elif usage is not None and usage.get("completion_tokens") is not None:
            server_n = int(usage["completion_tokens"]) - self.usage_out
            self.usage_out = int(usage["completion_tokens"])
        out = []
        guess = self.content_count.tokenizer is None  # no tokenizer: one token per chunk
        if reasoning:
            n = self.reasoning_count.add(reasoning, True)
            exact = server_n is not None and not text
            if exact:
                n = server_n  # type: ignore[assignment]
            out.append(StreamChunk(text=reasoning, tokens=n, reasoning=True, estimated=guess and not exact))
            if not text:
                return out
        # The server's count, when it gives one, spares the client tokenizer's CPU (which
        # a client shares with the server it measures on a small machine).
        n = server_n if server_n is not None else self.content_count.add(text, _carries_token(choice))
        if text or n:
            out.append(StreamChunk(text=text, tokens=n, estimated=guess and server_n is None))
        return out

    def check_complete(self, cancel: threading.Event | None) -> None:
        """Raise :class:`SSEError` when the stream ended before ``[DONE]`` without a cancel."""
        if not self.done and not (cancel is not None and cancel.is_set()):
            raise SSEError("the event stream ended before [DONE] (connection dropped?)")


def _choice_text(choice: dict[str, Any]) -> tuple[str, str]:
    """(content text, reasoning text) of one streamed choice."""
    if "delta" in choice:
        delta = choice.get("delta") or {}
        content = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        return str(content), str(reasoning)
    return str(choice.get("text") or ""), ""

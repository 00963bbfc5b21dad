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
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engines.base import EngineOptions, GenerationRequest, ProgressFn, StreamChunk, register_engine
from engines.errors import EngineUnavailable, RequestFailed, one_line
from engines.http_client import HTTPEngine, HTTPOptions, api_key_for
from engines.http_errors import (
    CONNECT_TIMEOUT_S,
    ERROR_BODY_MAX,
    BodyTooLarge,
    aiohttp_errors,
    aread_capped,
    error_message,
    http_get,
    read_capped,
    status_failure,
)
from engines.routing import read_routed, routed_counts, routed_rows_max
from engines.sse import OVERSIZE_EVENT, SSEError, asse_payloads, sse_object, sse_payloads
from engines.tokens import SERVER_TOKENIZER, ServerTokenizer, TextCounter


class OpenAIOptions(HTTPOptions):
    """Options of an OpenAI-compatible endpoint. ``model`` is the name the server serves."""

    kind: Literal["openai"] = "openai"  # type: ignore[assignment]
    base_url: str = Field(  # type: ignore[assignment]
        "http://127.0.0.1:8000/v1",
        description="The server's OpenAI API root, e.g. http://host:8000/v1",
        title="Server URL (empty: MoE Bench starts one)",
        json_schema_extra={"group": "connect"},
    )
    exact_lengths: bool = Field(
        True,
        description="Send ignore_eos (and min_tokens) so every output is exactly the requested length",
        title="Exact output length (ignore EOS)",
        json_schema_extra={"group": "connect"},
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions",
        description="/v1/completions (raw prompt) or /v1/chat/completions (chat template)",
        title="API endpoint",
        json_schema_extra={"group": "connect"},
    )
    send_min_tokens: bool = Field(
        True,
        description="Send min_tokens too, for servers that ignore ignore_eos",
        title="Also send a minimum length (min tokens)",
        json_schema_extra={"group": "advanced"},
    )
    server_token_counts: bool = Field(
        False,
        description="Ask the server for per-chunk token counts (vLLM: per-chunk usage or token ids)",
        title="Per-chunk token counts from the server",
        json_schema_extra={"group": "advanced"},
    )
    check_model: bool = Field(
        True,
        description="At start, check that the server lists the model under /models",
        title="Check the model is served at start",
        json_schema_extra={"group": "advanced"},
    )
    async_client: bool = Field(
        True,
        description="Send a run's requests from one asyncio loop (aiohttp), as vllm bench serve does; "
        "off: one thread per in-flight request (httpx)",
        title="Asynchronous HTTP client",
        json_schema_extra={"group": "advanced"},
    )
    routed_experts: bool = Field(
        False,
        description="Ask for each request's routed experts (return_routed_experts) and count them into the run's "
        "routing: SGLang sends them at the end of the stream (server flag --enable-return-routed-experts); vLLM "
        "0.32 sends them only on non-streamed responses (use routing_pass). Needs the model's config.json (a "
        "preset, a local folder, or tokenizer=FOLDER)",
        title="Ask for each request's routed experts (SGLang)",
        json_schema_extra={"group": "connect"},
    )
    routing_pass: int = Field(
        0,
        ge=0,
        le=10000,
        description="After the measured window, send up to this many of the run's requests again, not streamed, "
        "asking for routed experts, and count those as the run's routing (untimed; vLLM returns routed_experts "
        "only on non-streamed responses; its server needs --enable-return-routed-experts). 0: off",
        title="Routing pass: requests re-sent, not streamed, for routed experts (vLLM)",
        json_schema_extra={"group": "connect"},
    )
    sglang_expert_distribution_dir: str | None = Field(
        None,
        description="SGLang server: record its expert distribution over each run and read the dump from this "
        "folder (the server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR, reachable from here); the server needs "
        "--expert-distribution-recorder-mode stat",
        title="SGLang: expert distribution dump folder",
        json_schema_extra={"group": "connect"},
    )


def _carries_token(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice stands for a generated token even when its text is empty.

    A token whose text is not visible yet (a special token, or part of a UTF-8 character)
    still arrives as its own chunk with empty text; a role-only chat chunk or one without
    content (``"delta": {}`` with a finish_reason) stands for none.
    """
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return isinstance(delta.get("content"), str) and "role" not in delta
    return isinstance(choice.get("text"), str)


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
        self._served_by: str | None = None  # the model list's owned_by: which server answers
        self._reported_shape: dict[str, Any] | None = None  # the deployment the server reports (SGLang)
        self._experts: Any = None  # engines.sglang.ExpertDistribution, when asked for
        self._layout: dict[str, Any] | None = None  # the model's routing layout, when routing is asked for
        self._pass_requests: list[GenerationRequest] = []  # the run's first requests (prepare), for routing_pass
        self._pass_lock = threading.Lock()

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
        self._read_routing_layout()
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

    def _read_routing_layout(self, folder: str | None = None) -> None:
        """The model's MoE layout from the config.json in ``folder`` (default: the tokenizer's),
        when routed experts are asked for."""
        if not (self.opts.routed_experts or self.opts.routing_pass):
            return
        from engines.routing import layout_from_config

        if folder is None:
            folder = self.tokenizer_path if isinstance(self.tokenizer_path, str) else None
        config = Path(folder) / "config.json" if folder else None
        cfg: Any = None
        if config is not None and config.is_file():
            with contextlib.suppress(OSError, ValueError):
                cfg = json.loads(config.read_text(encoding="utf-8"))
        layout = layout_from_config(cfg, "") if isinstance(cfg, dict) else None
        if layout is None:
            raise EngineUnavailable(
                "routed_experts/routing_pass need the model's config.json with its MoE sizes: give model as a preset "
                "or a local folder, or tokenizer=FOLDER"
            )
        how = (
            f"routed_experts of a non-streamed pass over up to {self.opts.routing_pass} of the run's requests, "
            "after the measured window (untimed)"
            if self.opts.routing_pass
            else "routed_experts the server sent with each request"
        )
        self._layout = {**layout, "source": f"{how}; {self.base_url}"}

    def routing_layout(self) -> dict[str, Any] | None:
        return self._layout if self.opts.routed_experts and not self.opts.routing_pass else None

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

    def prepare(
        self, requests: Sequence[GenerationRequest], concurrency: int, progress: Callable[[str], None] | None = None
    ) -> str | None:
        """Keep the run's first ``routing_pass`` requests for the pass after the measured window."""
        if self.opts.routing_pass:
            with self._pass_lock:
                self._pass_requests = list(requests[: self.opts.routing_pass])
        return None

    def reset_expert_routing(self) -> None:
        if self._experts is not None:
            self._experts.start()

    def expert_routing(self) -> dict[str, Any] | None:
        if self._experts is not None:
            return self._experts.collect()
        if self.opts.routing_pass and self._layout is not None:
            with self._pass_lock:
                requests, self._pass_requests = self._pass_requests, []
            return self._routing_pass(requests) if requests else None
        return None

    def sender_spec(self) -> dict[str, Any] | None:
        spec = super().sender_spec()
        if spec is not None:
            spec["routing_layout"] = self._layout
        return spec

    def attach_sender(self, spec: dict[str, Any]) -> None:
        super().attach_sender(spec)
        self._layout = spec.get("routing_layout")

    def _routing_pass(self, requests: list[GenerationRequest]) -> dict[str, Any]:
        """Send ``requests`` again, not streamed, asking for routed experts; their summed routing
        as the run's record (engines.routing.served_record, no time windows: the pass is not the run)."""
        import numpy as np

        from engines.routing import ROUTED_EXPERTS_MAX_B64, served_record

        layout = self._layout or {}
        total: Any = None
        counted, first_error = 0, None
        for request in requests:
            body = {**self.request_body(request), "stream": False, "return_routed_experts": True}
            body.pop("stream_options", None)
            counts, why = None, None
            try:
                with self.post_stream(self._url_for_endpoint(), body) as chunks:
                    raw = read_capped(chunks, ROUTED_EXPERTS_MAX_B64 + 2**20, "the answer")
                field, prompt, start, why = pass_answer(raw, request.prompt_tokens)
                if field is not None:
                    max_rows = routed_rows_max(prompt, request.sampling.max_tokens)
                    counts, why = routed_counts(field, layout, prompt, start, max_rows)
            except RequestFailed as exc:
                why = one_line(exc, 200)
            if counts is None:
                first_error = first_error or f"request {request.request_id}: {why}"
                continue
            total = counts.astype(np.int64) if total is None else total + counts
            counted += 1
        if total is None:
            return {"error": f"routing pass over {len(requests)} requests: none gave routing; {first_error}"}
        record = served_record(np.asarray(total), layout, {}, counted)
        record["pass_requests"] = counted
        if first_error:
            missing = len(requests) - counted
            record["error"] = f"{missing} of {len(requests)} pass requests gave no routing; {first_error}"
        return record

    def _check_server(self) -> None:
        """GET /models: the server answers, and serves ``model`` (when it lists models)."""
        import httpx

        url = f"{self.base_url}/models"
        try:
            resp = http_get(self._client, url, timeout=10.0)
        except BodyTooLarge as exc:
            raise EngineUnavailable(f"{url} did not answer an OpenAI model list: {exc}") from exc
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
            # who serves it, as the server says (vLLM: "vllm", LMDeploy: "lmdeploy", SGLang: "sglang")
            owners = [m.get("owned_by") for m in data if isinstance(m, dict) and m.get("id") == self.served_name]
            if owners and isinstance(owners[0], str) and owners[0].strip():
                self._served_by = one_line(owners[0], 40)
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
        if self._served_by is not None:
            info["served_by"] = self._served_by
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
        if self.opts.routed_experts and not self.opts.routing_pass:
            body["return_routed_experts"] = True
        return body

    def _stream_parser(self, request: GenerationRequest) -> CompletionStream:
        streamed = self.opts.routed_experts and not self.opts.routing_pass
        return CompletionStream(
            self._tokenizer, self._layout if streamed else None, request.prompt_tokens, request.sampling.max_tokens
        )

    def _url_for_endpoint(self) -> str:
        return self.base_url + ("/chat/completions" if self.opts.endpoint == "chat" else "/completions")

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        parser = self._stream_parser(request)
        with self.post_stream(self._url_for_endpoint(), self.request_body(request)) as chunks:
            for payload in sse_payloads(chunks, *parser.event_limits()):
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
                await aread_capped(resp, ERROR_BODY_MAX, "a model list", truncate=True)

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
                    await aread_capped(resp, ERROR_BODY_MAX, "a model list", truncate=True)

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
        parser = self._stream_parser(request)
        deadline = self.request_deadline()
        with aiohttp_errors(url, deadline=deadline):
            async with session.post(
                url, json=self.request_body(request), timeout=deadline.aiohttp_timeout(), allow_redirects=False
            ) as resp:
                deadline.answered = True
                failure = status_failure(
                    resp.status,
                    url,
                    resp.headers.get("Location"),
                    await aread_capped(resp, ERROR_BODY_MAX, url, truncate=True) if resp.status >= 400 else b"",
                )
                if failure is not None:
                    raise failure
                async for payload in asse_payloads(resp.content.iter_any(), *parser.event_limits()):
                    if cancel is not None and cancel.is_set():
                        return  # leaving the async-with block closes the response
                    for chunk in parser.feed(payload):
                        yield chunk
                    if parser.done:
                        break
        parser.check_complete(cancel)


def pass_answer(raw: bytes, prompt_tokens: int | None) -> tuple[Any, int | None, int, str | None]:
    """A non-streamed answer of the routing pass: (its ``routed_experts`` field, the prompt's
    tokens (the server's usage where it says, else ``prompt_tokens``), the prompt rows the server
    left out, None), or (None, ..., one-line reason). Every part is checked for its type: an
    answer whose ``choices`` is an object or a number, or JSON nested too deep to read, is that
    request's routing left out, never an error of the run."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, prompt_tokens, 0, f"the answer is not JSON ({type(exc).__name__}: {one_line(exc, 80)})"
    if not isinstance(obj, dict):
        return None, prompt_tokens, 0, f"the answer is a JSON {type(obj).__name__}, not an object"
    choices = obj.get("choices")
    if choices is not None and not isinstance(choices, list):
        return None, prompt_tokens, 0, f"the answer's choices is a {type(choices).__name__}, not a list"
    choice = choices[0] if choices else {}
    if not isinstance(choice, dict):
        return None, prompt_tokens, 0, f"the answer's first choice is a {type(choice).__name__}, not an object"
    field = choice.get("routed_experts")
    ext = obj.get("sglext")
    if field is None and isinstance(ext, dict):
        field = ext.get("routed_experts")
    usage = _usage(obj.get("usage"))
    prompt = usage["prompt_tokens"] if usage is not None and usage["prompt_tokens"] is not None else prompt_tokens
    start = choice.get("routed_experts_prompt_start")
    start = start if isinstance(start, int) and not isinstance(start, bool) and start > 0 else 0
    if field is None:
        why = "no routed_experts in the answer (is the server started with --enable-return-routed-experts?)"
        return None, prompt, start, why
    return field, prompt, start, None


class CompletionStream:
    """The events of one streamed OpenAI completion (or chat completion) -> :class:`StreamChunk`.

    Token counts per chunk, best source first: the choice's ``token_ids``, the growth of a
    per-chunk ``usage``, the client tokenizer (:class:`TextCounter`), one per chunk with
    text. Shared by the threaded and the asynchronous client, so both count alike.
    """

    def __init__(
        self,
        tokenizer: Any,
        routing_layout: dict[str, Any] | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.done = False  # [DONE] seen
        self.max_tokens = max_tokens  # the request's cap: a usage count above it is not believed
        # the fewest tokens the stream stood for: the server's own count of an event where it gave
        # one, else one per event with text (a usage count below it is not believed)
        self.streamed_floor = 0
        self.usage_out = 0  # running completion_tokens from per-chunk usage
        self.content_count = TextCounter(tokenizer)
        self.reasoning_count = TextCounter(tokenizer)
        # routed experts asked for (OpenAIOptions.routed_experts): the model's layout to decode them
        self.routing_layout = routing_layout
        self.prompt_tokens = prompt_tokens  # the workload's count, until the server's usage says
        self.finished = False  # a choice with a finish_reason seen: the completion's tokens are all in
        self._routed: Any = None  # the routed_experts field, decoded once the prompt's length is known
        self._routing_reason: str | None = None  # why this request's routing is left out
        self._routing_given = False

    def event_limits(self) -> tuple[bool, int | None]:
        """(skip_oversize, max_event_bytes) for this stream's SSE decoder: with routed experts
        asked for, an event may hold one request's routing (SGLang: ~2.5 KB of base64 per token
        of a 58-layer top-8 model), up to the decoder's cap; one over it is skipped, the
        request kept and its routing left out with the reason."""
        if self.routing_layout is None:
            return False, None
        from engines.routing import ROUTED_EXPERTS_MAX_B64

        return True, ROUTED_EXPERTS_MAX_B64 + 2**16

    def _routing(self) -> Any | None:
        """This request's routing for its last chunk: its ids (:class:`engines.routing.RoutedIds`,
        counted in batches by the recorder) or counts [2, layers, experts], a one-line reason why
        it is left out (a str: the recorder notes it), or None when not asked for."""
        if self.routing_layout is None or self._routing_given:
            return None
        self._routing_given = True
        if self._routing_reason is not None:
            return self._routing_reason
        if self._routed is None:
            return "the server sent no routed_experts (is it started with --enable-return-routed-experts?)"
        max_rows = routed_rows_max(self.prompt_tokens, self.max_tokens)
        value, why = read_routed(self._routed, self.routing_layout, self.prompt_tokens, max_rows=max_rows)
        self._routed = None
        return why if value is None else value

    def feed(self, payload: str) -> list[StreamChunk]:
        """The chunks one ``data`` payload stands for; raises on an error or a malformed event."""
        if payload is OVERSIZE_EVENT:
            if self.routing_layout is None or not self.finished:
                raise SSEError("an SSE event over the size cap: stopped reading (a completion event is small)")
            self._routing_reason = "an SSE event over the size cap after the completion (its routed_experts): left out"
            return []
        if payload.strip() == "[DONE]":
            self.done = True
            routing = self._routing()
            return [] if routing is None else [StreamChunk(text="", tokens=0, final=True, routing=routing)]
        obj = sse_object(payload)
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed(f"server error mid-stream: {one_line(msg, 200)}")
        usage = _usage(obj.get("usage"))
        choices = obj.get("choices") or []
        if self.routing_layout is not None:
            ext = obj.get("sglext")
            if isinstance(ext, dict) and ext.get("routed_experts") is not None:
                self._routed = ext["routed_experts"]  # SGLang: a response-level chunk after the last token
        if not choices:
            if usage is None:
                return []
            if (why := usage_refusal(usage["completion_tokens"], self.max_tokens, self.streamed_floor)) is not None:
                raise RequestFailed(why)
            if usage["prompt_tokens"] is not None:
                self.prompt_tokens = usage["prompt_tokens"]
            return [
                StreamChunk(
                    text="",
                    tokens=0,
                    final=True,
                    prompt_tokens=usage["prompt_tokens"],
                    usage_output_tokens=usage["completion_tokens"],
                    usage_reasoning_tokens=usage["reasoning_tokens"],
                    routing=self._routing() if self._routed is not None or self._routing_reason else None,
                )
            ]
        choice = choices[0]
        if not isinstance(choice, dict):
            raise SSEError(f"malformed SSE event (bad choice): {one_line(payload, 120)}")
        if choice.get("finish_reason") is not None:
            self.finished = True
        if self.routing_layout is not None and choice.get("routed_experts") is not None:
            self._routed = choice["routed_experts"]  # vLLM's field, should a stream carry it
        text, reasoning, thinking = _choice_text(choice)
        server_n: int | None = None
        if isinstance(choice.get("token_ids"), list):
            server_n = len(choice["token_ids"])
        elif usage is not None and usage["completion_tokens"] is not None:
            grown = usage["completion_tokens"] - self.usage_out
            server_n = grown if grown >= 0 else None  # a count that shrank is not believed
            self.usage_out = max(self.usage_out, usage["completion_tokens"])
        self.streamed_floor += server_n if server_n is not None else int(bool(text or reasoning))
        out = []
        guess = self.content_count.tokenizer is None  # no tokenizer: one token per chunk
        # a reasoning delta whose text is empty (a token that ends inside a UTF-8 character) still
        # carries its token when the server counts it (token_ids): it is reasoning, not answer
        if reasoning or (thinking and not text and server_n):
            n = self.reasoning_count.add(reasoning, True) if reasoning else 0
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


USAGE_MAX = 10**9  # a token count above this in a usage report is not a count


def usage_refusal(completion: int | None, max_tokens: int | None, streamed: int) -> str | None:
    """Why a usage report's ``completion_tokens`` is not believed for its request, or None: more
    than the request's own ``max_tokens`` (a server stops there), or fewer than the tokens it
    streamed (:attr:`CompletionStream.streamed_floor`). A refused count fails its request, as
    streamed tokens over the output cap do (:func:`engines.base.output_cap`): never a throughput."""
    if completion is None:
        return None
    if max_tokens is not None and completion > max_tokens:
        return f"the server's usage says {completion} output tokens for max_tokens={max_tokens}: not believed"
    if completion < streamed:
        return f"the server's usage says {completion} output tokens after streaming at least {streamed}: not believed"
    return None


def _usage_count(v: Any) -> int | None:
    """A usage count: a whole number in [0, 1e9], else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v) if 0 <= v <= USAGE_MAX else None


def _usage(value: Any) -> dict[str, int | None] | None:
    """A usage report's prompt, completion and reasoning counts (the last from
    ``completion_tokens_details.reasoning_tokens``), each a whole number in [0, 1e9] or None: a
    NaN, a string, a negative or an absurd count is that request's server being wrong, and is
    ignored (the client's own count stands), never an error of the run."""
    if not isinstance(value, dict):
        return None
    details = value.get("completion_tokens_details")
    return {
        "prompt_tokens": _usage_count(value.get("prompt_tokens")),
        "completion_tokens": _usage_count(value.get("completion_tokens")),
        "reasoning_tokens": _usage_count(details.get("reasoning_tokens")) if isinstance(details, dict) else None,
    }


def _clean(text: Any) -> str:
    """Text as valid Unicode: a lone surrogate (JSON "\\ud800") becomes "?", so no tokenizer or
    writer downstream meets a string it cannot encode."""
    text = str(text)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _choice_text(choice: dict[str, Any]) -> tuple[str, str, bool]:
    """(content text, reasoning text, whether the delta is a reasoning one) of one streamed choice;
    ``reasoning_content`` (DeepSeek, SGLang) or ``reasoning`` (vLLM 0.32)."""
    if "delta" in choice:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return "", "", False
        content = _text(delta.get("content"))
        reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
        thinking = isinstance(delta.get("reasoning_content"), str) or isinstance(delta.get("reasoning"), str)
        return _clean(content), _clean(reasoning), thinking
    return _clean(_text(choice.get("text"))), "", False


def _text(value: Any) -> str:
    """A streamed text field: only a string is text (a number, list or object a server sends in
    its place is none: it counts no token)."""
    return value if isinstance(value, str) else ""

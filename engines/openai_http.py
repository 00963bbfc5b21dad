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
for exact lengths (option ``exact_lengths``). The API key comes from the environment only
(``MOEBENCH_OPENAI_API_KEY``, else ``OPENAI_API_KEY``) and is never part of the options,
so it never reaches the database or an export.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from engines.accelerators import Availability
from engines.base import Engine, EngineOptions, GenerationRequest, ProgressFn, StreamChunk, register_engine
from engines.errors import EngineUnavailable, ModelLoadError, RequestFailed, ServerUnreachable
from engines.launch import ManagedProcess, creeping_progress
from engines.settings import get_settings

API_KEY_ENV_VARS: tuple[str, ...] = ("MOEBENCH_OPENAI_API_KEY", "OPENAI_API_KEY")


def api_key_from_env() -> str | None:
    """The API key from ``MOEBENCH_OPENAI_API_KEY`` or ``OPENAI_API_KEY`` (None when unset)."""
    for var in API_KEY_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OpenAIOptions(EngineOptions):
    """Options of an OpenAI-compatible endpoint. ``model`` is the name the server serves."""

    kind: Literal["openai"] = "openai"  # type: ignore[assignment]
    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="The server's OpenAI API root, e.g. http://host:8000/v1"
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions (raw prompt) or /v1/chat/completions (chat template)"
    )
    tokenizer: str | None = Field(
        None,
        description="Local tokenizer folder for prompts and client counts ('server': the server's /tokenize); "
        "default: the model's own when the model is a preset or a folder",
    )
    exact_lengths: bool = Field(
        True, description="Send ignore_eos (and min_tokens) so every output is exactly the requested length"
    )
    send_min_tokens: bool = Field(True, description="Send min_tokens too, for servers that ignore ignore_eos")
    server_token_counts: bool = Field(
        False, description="Ask the server for per-chunk token counts (vLLM: per-chunk usage or token ids)"
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Per-request read timeout in seconds; default MOEBENCH_REQUEST_TIMEOUT_S"
    )
    max_connections: int = Field(1024, ge=1, le=65536, description="HTTP connection pool size (>= the concurrency)")
    check_model: bool = Field(True, description="At start, check that the server lists the model under /models")
    async_client: bool = Field(
        True,
        description="Send a run's requests from one asyncio loop (aiohttp), as vllm bench serve does; "
        "off: one thread per in-flight request (httpx)",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:  # the vllm engine's "launch a server" value
            return None
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got '{_redacted(v)}'")
        if "@" in v.split("://", 1)[1].split("/", 1)[0]:
            # user:key@host would be stored with the run, its export and its errors: refuse it.
            raise ValueError(
                f"base_url carries credentials ({_redacted(v)}); give the key with MOEBENCH_OPENAI_API_KEY instead"
            )
        return v


def _redacted(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@``."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    if "@" in host:
        host = "***@" + host.rsplit("@", 1)[1]
    return f"{scheme}{sep}{host}{slash}{path}" if sep else url


SERVER_TOKENIZER = "server"  # options.tokenizer value: use the server's /tokenize


class ServerTokenizer:
    """The server's ``/tokenize`` and ``/detokenize`` (vLLM, SGLang) behind the few tokenizer
    calls MoE Bench makes: counting tokens of prompts and streamed text. It has no vocabulary
    to sample from, so random exact-length prompts still need a local tokenizer."""

    supports_random_prompts = False

    def __init__(self, client: Any, root: str, model: str) -> None:
        self.client, self.root, self.model = client, root, model
        self.all_special_ids: list[int] = []

    def available(self) -> bool:
        try:
            return bool(self.encode("hello"))
        except Exception:  # noqa: BLE001 - no such endpoint, or not this format
            return False

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        resp = self.client.post(f"{self.root}/tokenize", json=body, timeout=30.0)
        resp.raise_for_status()
        return list(resp.json()["tokens"])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        resp = self.client.post(
            f"{self.root}/detokenize", json={"model": self.model, "tokens": list(ids)}, timeout=30.0
        )
        resp.raise_for_status()
        return str(resp.json()["prompt"])

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=self.encode(text, add_special_tokens=add_special_tokens))


MAX_SSE_EVENT_BYTES = 4 * 2**20  # one SSE line or event; a real completion event is far smaller


class SSEError(RequestFailed):
    """The server's event stream was malformed or ended early."""


class SSEDecoder:
    """An incremental server-sent-event decoder: bytes in, complete ``data`` payloads out.

    Follows the SSE rules that matter here: ``data:`` lines of one event are joined
    with newlines, a blank line ends an event, ``:`` lines are comments, other fields
    (``event``, ``id``, ``retry``) are ignored; :meth:`close` gives a payload still
    pending at the end (some servers omit the last blank line). Lines are split on
    ``\\n`` before decoding, which is safe because ``\\n`` never occurs inside a UTF-8
    multi-byte sequence, and cheaper per chunk than an incremental text decoder.
    """

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._pending = b""
        self._data: list[str] = []
        self._data_bytes = 0
        self.max_event_bytes = max_event_bytes or MAX_SSE_EVENT_BYTES

    def _too_big(self, what: str) -> SSEError:
        mib = self.max_event_bytes / 2**20
        return SSEError(f"an SSE {what} over {mib:g} MiB: stopped reading (a completion event is a few hundred bytes)")

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
            self._data_bytes += len(value)
            if self._data_bytes > self.max_event_bytes:
                raise self._too_big("event")
            self._data.append(value)
        return None

    def feed(self, chunk: bytes) -> list[str]:
        """Take the next bytes of the stream; the payloads of the events they complete."""
        if not chunk:
            return []
        self._pending += chunk
        if b"\n" not in chunk:
            if len(self._pending) > self.max_event_bytes:
                raise self._too_big("line")
            return []
        *lines, self._pending = self._pending.split(b"\n")
        out = []
        for raw in lines:
            if len(raw) > self.max_event_bytes:
                raise self._too_big("line")
            payload = self.line(raw.decode("utf-8", errors="replace"))
            if payload is not None:
                out.append(payload)
        return out

    def close(self) -> list[str]:
        """The stream ended: the payload still pending, if any."""
        out = []
        if self._pending:
            payload = self.line(self._pending.decode("utf-8", errors="replace"))
            self._pending = b""
            if payload is not None:
                out.append(payload)
        if self._data:
            out.append("\n".join(self._data))
            self._data = []
        return out


def sse_payloads(chunks: Iterable[bytes]) -> Iterator[str]:
    """The ``data`` payloads of a server-sent event stream given as byte chunks."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


async def asse_payloads(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """:func:`sse_payloads` for an asynchronous byte stream (aiohttp's ``content.iter_any()``)."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for payload in decoder.feed(chunk):
            yield payload
    for payload in decoder.close():
        yield payload


@contextlib.contextmanager
def http_errors(url: str, who: str = "the server") -> Iterator[None]:
    """Turn httpx's errors while talking to ``url`` into one-line :class:`RequestFailed`."""
    import httpx

    try:
        yield
    except httpx.TimeoutException as exc:
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except httpx.RemoteProtocolError as exc:
        raise RequestFailed(f"connection dropped by {who}: {_one_line(str(exc), 200)}") from exc
    except httpx.ConnectError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {_one_line(str(exc), 200)}") from exc
    except httpx.HTTPError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {_one_line(str(exc), 200)}") from exc


@contextlib.contextmanager
def aiohttp_errors(url: str, who: str = "the server") -> Iterator[None]:
    """:func:`http_errors` for the asynchronous client (aiohttp)."""
    import aiohttp

    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise RequestFailed(f"timed out waiting for {url} ({type(exc).__name__})") from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise RequestFailed(f"connection dropped by {who}: {_one_line(str(exc), 200)}") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ServerUnreachable(f"could not connect to {url}: {_one_line(str(exc), 200)}") from exc
    except aiohttp.ClientError as exc:
        raise RequestFailed(f"{type(exc).__name__} from {url}: {_one_line(str(exc), 200)}") from exc


def _error_message(body: bytes) -> str:
    """The human part of an OpenAI-style error body (``{"error": {"message": ...}}`` and variants)."""
    text = body.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return _one_line(text, 200) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if err.get(key):
                    return _one_line(str(err[key]), 200)
        elif isinstance(err, str):
            return _one_line(err, 200)
        if obj.get("detail"):
            return _one_line(json.dumps(obj["detail"]), 200)
    return _one_line(text, 200)


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


def sse_object(payload: str, source: str = "") -> dict[str, Any]:
    """One SSE ``data`` payload as a JSON object; :class:`SSEError` names what was wrong."""
    where = f" from {source}" if source else ""
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise SSEError(f"malformed SSE event{where} (not JSON): {_one_line(payload, 120)}") from exc
    if not isinstance(obj, dict):
        raise SSEError(f"malformed SSE event{where} (not an object): {_one_line(payload, 120)}")
    return obj


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens in ``text`` (no special tokens added), through a Hugging Face fast tokenizer's
    Rust core when it has one (skipping the Python wrapper's per-call cost)."""
    if not text:
        return 0
    core = getattr(tokenizer, "backend_tokenizer", None)
    if core is not None:
        return len(core.encode(text, add_special_tokens=False).ids)
    return len(tokenizer.encode(text, add_special_tokens=False))


class TextCounter:
    """Client-side token counts of one stream: the growth of the token count of all text so far.

    Counting the whole text (not each delta alone) avoids counting a multi-byte character
    split across chunks twice; a chunk that stands for a token counts at least one, and a
    later chunk gives back what such floors over-counted. The text's token count is kept
    up to date from the growth over the last ``TAIL`` characters plus the delta, not by
    re-encoding the whole text (which made a long stream quadratic): tokenizers split on
    word boundaries, so the local growth is the global one. Exact only when the text
    re-tokenizes as generated: the server's ``usage`` stays the reference.
    """

    TAIL = 64

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tail = ""
        self.tail_tokens = 0  # tokens in self.tail
        self.total = 0  # tokens in all text so far
        self.counted = 0

    def _len(self, text: str) -> int:
        return count_tokens(self.tokenizer, text)

    def add(self, delta: str, carries_token: bool) -> int:
        floor = 1 if (delta or carries_token) else 0
        # U+FFFD stands for bytes the server could not decode (a byte token of a split or
        # invalid character): it says nothing about the token count, so it is left out.
        clean = delta.replace("\ufffd", "")
        if self.tokenizer is None or not clean:
            n = floor
        else:
            grown = self.tail + clean
            grown_tokens = self._len(grown)
            self.total += grown_tokens - self.tail_tokens
            if len(grown) > 2 * self.TAIL:  # one extra encode every TAIL characters or so
                self.tail = grown[-self.TAIL :]
                self.tail_tokens = self._len(self.tail)
            else:
                self.tail, self.tail_tokens = grown, grown_tokens
            n = max(self.total - self.counted, floor)
        self.counted += n
        return n


@register_engine
class OpenAIEngine(Engine):
    """An OpenAI-compatible server over HTTP; see the module docstring."""

    kind = "openai"
    label = "OpenAI-compatible HTTP server"
    options_model = OpenAIOptions

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.opts: OpenAIOptions = options  # type: ignore[assignment]
        self._client: Any = None
        self._tokenizer: Any = None
        self.tokenizer_path: str | None = None
        self.served_models: list[str] = []
        self._lock = threading.Lock()
        self._asession: Any = None  # aiohttp session between aopen() and aclose()

    # --- what subclasses may override -------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.opts.base_url

    @property
    def served_name(self) -> str:
        """The model name sent in requests."""
        return self.opts.model

    def _tokenizer_source(self) -> str | None:
        """A local folder for the client tokenizer, or None when there is none."""
        if self.opts.tokenizer == SERVER_TOKENIZER:
            return None
        if self.opts.tokenizer:
            return self.opts.tokenizer
        from engines.models import resolve_model

        try:
            return str(resolve_model(self.opts.model)[1])
        except ModelLoadError:
            return None  # a remote-only model name: no client tokenizer

    # --- lifecycle --------------------------------------------------------------------
    @classmethod
    def availability(cls) -> Availability:
        import importlib.util

        if importlib.util.find_spec("httpx") is None:
            return Availability(False, "httpx is not installed: pip install -r requirements.txt")
        return Availability(True)

    def _http_settings(self) -> tuple[float, dict[str, str], int]:
        """(read timeout s, headers, pool size) shared by the threaded and the asyncio client."""
        headers = {"Accept": "text/event-stream, application/json"}
        key = api_key_from_env()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return self.opts.timeout_s or get_settings().request_timeout_s, headers, self.opts.max_connections

    def _make_client(self) -> Any:
        import httpx

        read, headers, n = self._http_settings()
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        # TCP_NODELAY, as aiohttp (vllm bench serve) sets it: httpcore writes the headers and
        # the body separately, and Nagle + delayed ACK would hold the body back ~40 ms.
        transport = httpx.HTTPTransport(limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        return httpx.Client(
            timeout=httpx.Timeout(connect=10.0, read=read, write=30.0, pool=None),
            transport=transport,
            headers=headers,
        )

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

    def _load_tokenizer(self, report: ProgressFn) -> None:
        source = self._tokenizer_source()
        if source is None:
            return
        report(f"loading tokenizer {source}", 0.1)
        try:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=self.opts.trust_remote_code)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ModelLoadError(f"could not load tokenizer '{source}': {type(exc).__name__}: {first}") from exc
        self.tokenizer_path = source

    def _check_server(self) -> None:
        """GET /models: the server answers, and serves ``model`` (when it lists models)."""
        import httpx

        url = f"{self.base_url}/models"
        try:
            resp = self._client.get(url, timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(
                f"cannot reach the OpenAI-compatible server at {self.base_url}: {type(exc).__name__}: "
                f"{_one_line(str(exc), 200) or 'no answer'}"
            ) from exc
        if resp.status_code in (401, 403):
            raise EngineUnavailable(
                f"{url} refused the credentials (HTTP {resp.status_code}): set MOEBENCH_OPENAI_API_KEY or "
                f"OPENAI_API_KEY; {_error_message(resp.content)}"
            )
        if resp.status_code == 404:
            return  # no /models on this server: nothing to check
        if resp.status_code != 200:
            raise EngineUnavailable(f"{url} answered HTTP {resp.status_code}: {_error_message(resp.content)}")
        try:
            data = resp.json().get("data", [])
            self.served_models = [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (ValueError, AttributeError) as exc:
            raise EngineUnavailable(f"{url} did not answer an OpenAI model list: {_one_line(resp.text, 120)}") from exc
        if self.opts.check_model and self.served_models and self.served_name not in self.served_models:
            raise EngineUnavailable(
                f"model '{self.served_name}' is not served at {self.base_url}; it serves: "
                f"{', '.join(self.served_models)}"
            )

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self.started = False

    def tokenizer(self) -> Any | None:
        return self._tokenizer

    # --- sending from other processes (bench.sender) ----------------------------------
    def sender_spec(self) -> dict[str, Any] | None:
        if not self.started or not self.base_url:
            return None
        return {**self.base_sender_spec(), "base_url": self.base_url, "served_name": self.served_name}

    def attach_sender(self, spec: dict[str, Any]) -> None:
        # No tokenizer in a sender process: chunks count as the server says (token ids,
        # usage) or one per chunk, and the recorder recounts a request's text with the
        # parent's tokenizer where the server's usage disagrees.
        self._tokenizer = None
        if not self.async_capable():
            self._client = self._make_client()
        self.started = True

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            base_url=self.base_url,
            served_model=self.served_name,
            endpoint=self.opts.endpoint,
            tokenizer=self.tokenizer_path,
            api_key_set=api_key_from_env() is not None,
            served_models=self.served_models,
        )
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
        if self._client is None:
            raise EngineUnavailable(f"the {self.kind} engine is not started")
        url = self._url_for_endpoint()
        body = self.request_body(request)
        parser = CompletionStream(self._tokenizer)
        with http_errors(url), self._client.stream("POST", url, json=body) as resp:
            if resp.status_code >= 400:
                raise RequestFailed(f"HTTP {resp.status_code} from {url}: {_error_message(resp.read())}")
            for payload in sse_payloads(resp.iter_bytes()):
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
        # aiohttp sets TCP_NODELAY itself; as in vllm bench serve: no total timeout, a read one.
        connector = aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=read)
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
        with aiohttp_errors(url):
            async with session.post(url, json=self.request_body(request)) as resp:
                if resp.status >= 400:
                    raise RequestFailed(f"HTTP {resp.status} from {url}: {_error_message(await resp.read())}")
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
            raise RequestFailed(f"server error mid-stream: {_one_line(str(msg), 200)}")
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
            raise SSEError(f"malformed SSE event (bad choice): {_one_line(payload, 120)}")
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


class ServerEngine(OpenAIEngine):
    """An HTTP engine that reaches a running server at ``base_url`` or launches its own.

    Shared by the vllm, triton and lmdeploy engines: the launch (argv list, free port,
    ready wait with the log's last lines on failure, the whole tree stopped on any error),
    a long-lived probe client for metrics and health (``httpx.get`` would build a client and
    an SSL context per call, holding the GIL while requests stream), and the health rule
    (the process exited, or the ready URL has not answered for 15 s).
    """

    server_label: ClassVar[str] = "server"

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self._url: str | None = getattr(options, "base_url", None)
        self.server: ManagedProcess | None = None
        self.argv: list[str] = []
        self.load_seconds = 0.0
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self._health_fail_since: float | None = None

    @property
    def base_url(self) -> str:
        return self._url or ""

    def health_url(self) -> str:
        """The URL that answers 200 while the server can serve."""
        raise NotImplementedError

    def attach_sender(self, spec: dict[str, Any]) -> None:
        self._url = spec["base_url"]  # a launched server's URL is known only after start
        if hasattr(self, "model_name"):
            self.model_name = spec["served_name"]
        super().attach_sender(spec)

    def launch(
        self,
        argv: list[str],
        url: str,
        report: ProgressFn,
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Start ``argv``, wait until :meth:`health_url` answers, then connect and check."""
        t0 = time.perf_counter()
        self.argv = argv
        self.server = ManagedProcess(argv, name=self.server_label, env=env).start()
        self._url = url
        try:
            wait = timeout or get_settings().server_start_timeout_s
            self.server.wait_http(self.health_url(), wait, progress=creeping_progress(report, 0.2, 0.9))
            self._client = self._make_client()
            self._check_server()
        except BaseException:
            self.server.stop()
            raise
        self.load_seconds = time.perf_counter() - t0

    def probe_client(self) -> Any:
        import httpx

        with self._probe_lock:
            if self._probe is None:
                self._probe = httpx.Client(timeout=5.0, limits=httpx.Limits(max_connections=4))
            return self._probe

    def stop(self) -> None:
        super().stop()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()
                self._probe = None
        if self.server is not None:
            self.server.stop()

    def health(self) -> str | None:
        """None while the server runs and answers; else why not (one line)."""
        if self.server is not None:
            reason = self.server.exit_reason()
            if reason is not None:
                what = reason.removeprefix(f"{self.server.name} ")
                return f"{self.label} {what}; last log lines: {self.server.tail_one_line(3)}"
        if not self.base_url:
            return None
        import httpx

        try:
            ok = self.probe_client().get(self.health_url(), timeout=5.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._health_fail_since = None
            return None
        # A busy server may miss one probe: report only after 15 s without an answer.
        now = time.monotonic()
        if self._health_fail_since is None:
            self._health_fail_since = now
        if now - self._health_fail_since > 15.0:
            return f"{self.label} at {self.base_url} has not answered {self.health_url()} for 15 s"
        return None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            managed=self.server is not None,
            server_argv=self.argv,
            log_path=str(self.server.log_path) if self.server is not None else None,
            load_seconds=round(self.load_seconds, 3),
        )
        return info

"""The client side every HTTP engine shares (openai, vllm, lmdeploy, triton).

:class:`HTTPOptions` holds what reaching a server takes (base URL, client tokenizer,
exact lengths, timeout, pool size); :class:`HTTPEngine` builds the threaded httpx client
from it, loads the client tokenizer, applies the API-key rule, and sends from sender
processes. The protocol (request bodies, which URL streams, how events become chunks) is
each engine's own: :mod:`engines.openai_http` for OpenAI-compatible servers,
:mod:`engines.triton` for Triton's generate extension.

The API key comes from the environment only (``MOEBENCH_OPENAI_API_KEY``, else
``OPENAI_API_KEY``) and is never part of the options, so it never reaches the database
or an export; it is sent only to the hosts in ``MOEBENCH_API_KEY_HOSTS`` (:func:`api_key_for`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from engines.accelerators import Availability
from engines.base import Engine, EngineOptions, ProgressFn
from engines.errors import EngineUnavailable, ModelLoadError
from engines.http_errors import (
    CONNECT_TIMEOUT_S,
    ERROR_BODY_MAX,
    WRITE_TIMEOUT_S,
    RequestDeadline,
    http_errors,
    httpx_client,
    read_capped,
    redacted,
    status_failure,
    total_deadline,
)
from engines.settings import get_settings
from engines.tokens import SERVER_TOKENIZER

API_KEY_ENV_VARS: tuple[str, ...] = ("MOEBENCH_OPENAI_API_KEY", "OPENAI_API_KEY")


def api_key_from_env() -> str | None:
    """The API key from ``MOEBENCH_OPENAI_API_KEY`` or ``OPENAI_API_KEY`` (None when unset)."""
    for var in API_KEY_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def api_key_for(base_url: str) -> tuple[str | None, str]:
    """(the key to send to ``base_url``, or None; what :meth:`HTTPEngine.describe` says about it).

    The environment's key goes only to hosts in ``MOEBENCH_API_KEY_HOSTS`` (default
    ``api.openai.com,127.0.0.1,localhost``; ``*``: any host), so pointing MoE Bench at some
    other server does not hand it the user's OpenAI key.
    """
    key = api_key_from_env()
    if key is None:
        return None, "not set"
    host = (urlsplit(base_url).hostname or "").lower()
    allowed = {h.strip().lower() for h in get_settings().api_key_hosts.split(",") if h.strip()}
    if "*" in allowed or host in allowed:
        return key, "sent"
    return None, f"withheld: host {host or '?'} not in MOEBENCH_API_KEY_HOSTS"


class HTTPOptions(EngineOptions):
    """What every engine reached over HTTP takes. ``base_url`` None: the engine launches
    its own server (vllm, triton, lmdeploy)."""

    base_url: str | None = Field(
        None,
        description="The server's URL",
        title="Server URL (empty: MoE Bench starts one)",
        json_schema_extra={"group": "connect"},
    )
    tokenizer: str | None = Field(
        None,
        description="Local tokenizer folder for prompts and client counts ('server': the server's /tokenize); "
        "default: the model's own when the model is a preset or a folder",
        title="Tokenizer folder",
        json_schema_extra={"group": "connect"},
    )
    exact_lengths: bool = Field(
        True,
        description="Ask the server for exactly the requested output length (ignore_eos)",
        title="Exact output length (ignore EOS)",
        json_schema_extra={"group": "connect"},
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Deadline of each whole request in seconds; default MOEBENCH_REQUEST_TIMEOUT_S",
        title="Request deadline (s)",
        json_schema_extra={"group": "connect"},
    )
    max_connections: int = Field(
        1024,
        ge=1,
        le=65536,
        description="HTTP connection pool size (>= the concurrency)",
        title="HTTP connection pool size",
        json_schema_extra={"group": "advanced"},
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:  # a managed engine's "launch a server" value
            return None
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got '{redacted(v)}'")
        if "@" in v.split("://", 1)[1].split("/", 1)[0]:
            # user:key@host would be stored with the run, its export and its errors: refuse it.
            raise ValueError(
                f"base_url carries credentials ({redacted(v)}); give the key with MOEBENCH_OPENAI_API_KEY instead"
            )
        return v


class HTTPEngine(Engine):
    """The shared client of the HTTP engines; subclasses add the protocol (``start``,
    ``stream``, ``_check_server``)."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.opts: HTTPOptions = options  # type: ignore[assignment]
        self._client: Any = None
        self._tokenizer: Any = None
        self.tokenizer_path: str | None = None

    # --- what subclasses may override -------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.opts.base_url or ""

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

    def _check_server(self) -> None:
        """Check that the server answers and serves the model; :class:`EngineUnavailable` if not."""
        raise NotImplementedError

    # --- lifecycle --------------------------------------------------------------------
    @classmethod
    def availability(cls) -> Availability:
        import importlib.util

        if importlib.util.find_spec("httpx") is None:
            return Availability(False, "httpx is not installed: pip install -r requirements.txt")
        return Availability(True)

    def request_deadline(self) -> RequestDeadline:
        """The time limits of one request, starting now: the total is the ``timeout_s`` option,
        else ``MOEBENCH_REQUEST_TIMEOUT_S``; the first byte ``MOEBENCH_FIRST_BYTE_TIMEOUT_S``."""
        settings = get_settings()
        if self.opts.timeout_s:
            return RequestDeadline(self.opts.timeout_s, settings.first_byte_timeout_s, "option timeout_s")
        return RequestDeadline(settings.request_timeout_s, settings.first_byte_timeout_s)

    def _http_settings(self) -> tuple[float, dict[str, str], int]:
        """(read timeout s, headers, pool size) shared by the threaded and the asyncio client."""
        # identity: a compressed answer could inflate far past what it weighs on the wire (bodies
        # are read capped anyway, decoded bytes counted)
        headers = {"Accept": "text/event-stream, application/json", "Accept-Encoding": "identity"}
        key, _ = api_key_for(self.base_url)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return self.request_deadline().read_s, headers, self.opts.max_connections

    def _make_client(self) -> Any:
        import httpx

        read, headers, n = self._http_settings()
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        # TCP_NODELAY, as aiohttp (vllm bench serve) sets it: httpcore writes the headers and
        # the body separately, and Nagle + delayed ACK would hold the body back ~40 ms.
        transport = httpx.HTTPTransport(limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        return httpx_client(
            timeout=httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=read, write=WRITE_TIMEOUT_S, pool=None),
            transport=transport,
            headers=headers,
        )

    @contextlib.contextmanager
    def post_stream(self, url: str, body: dict[str, Any], who: str = "the server") -> Iterator[Iterator[bytes]]:
        """POST ``body`` to ``url`` with the threaded client and give the response's bytes as
        they arrive, under the request's :class:`RequestDeadline`. HTTP errors (status >= 400,
        timeouts, dropped connections) become one-line :class:`RequestFailed`."""
        if self._client is None:
            raise EngineUnavailable(f"the {self.kind} engine is not started")
        deadline = self.request_deadline()
        with (
            http_errors(url, who, deadline),
            total_deadline(None, end=deadline.end),
            self._client.stream("POST", url, json=body, timeout=deadline.httpx_timeout()) as resp,
        ):
            deadline.answered = True
            failure = status_failure(
                resp.status_code,
                url,
                resp.headers.get("location"),
                read_capped(resp.iter_bytes(), ERROR_BODY_MAX, url, truncate=True) if resp.status_code >= 400 else b"",
            )
            if failure is not None:
                raise failure
            yield deadline.checked(resp.iter_bytes())

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

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self.started = False

    def tokenizer(self) -> Any | None:
        return self._tokenizer

    # --- sending from other processes (bench.send) ----------------------------------
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
            tokenizer=self.tokenizer_path,
            api_key_set=api_key_from_env() is not None,
            api_key=api_key_for(self.base_url)[1],
        )
        return info

"""The Engine contract and the registry of engine kinds.

Every engine (native transformers, vLLM, Triton, LMDeploy, any OpenAI-compatible
server) implements the same small interface:

- ``start(progress)``: load the model or reach the server;
- ``stream(request, cancel)``: yield :class:`StreamChunk` objects (text plus the number
  of new tokens it carries) as the engine produces them; engines that can (HTTP clients)
  also offer ``astream`` on an event loop, between ``aopen()`` and ``aclose()``;
- ``stop()``; ``describe()``; ``memory()``.

Engines never take timestamps: :func:`timed_stream` and :func:`timed_astream` stamp
every chunk with one monotonic clock as it reaches the caller, so TTFT means the same
thing for every engine.

Options are typed pydantic models discriminated by ``kind``. Engine modules are
imported lazily through :data:`ENGINE_MODULES`, so a missing vLLM or tritonclient
only matters when that engine is picked.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engines.accelerators import ACCELERATORS, Availability, MemoryStats, canonical_dtype
from engines.errors import ConfigError, RequestFailed, ServerUnreachable, UnknownEngine, one_line

ProgressFn = Callable[[str, float], None]  # (message, fraction 0..1)


class SamplingParams(BaseModel):
    """Per-request sampling. ``ignore_eos`` makes the output exactly ``max_tokens`` long."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(16, ge=1, le=32768)
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    ignore_eos: bool = True
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One request. ``prompt_token_ids`` is set when the workload fixed the exact tokens."""

    request_id: str
    prompt: str
    sampling: SamplingParams
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_tokens: int | None = None  # the workload's count, when known


@dataclass(frozen=True)
class StreamChunk:
    """What an engine yields: new text and how many tokens it holds.

    ``final`` marks an end-of-stream usage report that may carry no text (e.g. an
    OpenAI ``usage`` chunk); ``prompt_tokens`` / ``usage_output_tokens`` come from it.
    """

    text: str
    tokens: int = 1
    final: bool = False
    prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    # the server's count of reasoning tokens (usage.completion_tokens_details.reasoning_tokens)
    usage_reasoning_tokens: int | None = None
    reasoning: bool = False  # a reasoning_content chunk (reasoning models), not answer content
    # ``tokens`` is a guess (one per chunk: no server count and no client tokenizer here)
    estimated: bool = False
    token_ids: tuple[int, ...] | None = None  # the chunk's token ids, where the engine has them (native)
    # the request's expert routing as the server reports it: tokens per (phase, MoE layer, routed
    # expert), phase 0 the prompt and 1 the generated tokens (int array [2, layers, experts])
    routing: Any | None = None


@dataclass
class TimedChunk:
    t: float  # time.perf_counter() when the chunk reached the caller
    tokens: int
    reasoning: bool = False  # a reasoning chunk (before the answer of a reasoning model)


# Cumulative server counters of prefix-cache lookups and hits, in prompt tokens (an engine's
# telemetry names them so; the runner turns them into the run's prefix-cache hit rate).
REQUEST_CANCELLED = "cancelled"  # the error of a request cut short by its run's cancel (not a failure)
SERIES_PREFIX_QUERIES = "server_prefix_cache_queries"
SERIES_PREFIX_HITS = "server_prefix_cache_hits"
# Cumulative speculative-decoding counters (vLLM's vllm:spec_decode_*): drafts proposed, draft
# tokens proposed, draft tokens accepted, and accepted tokens at draft position k
# (SERIES_SPEC_POS + "k"); the runner turns their deltas over the run into acceptance figures.
SERIES_SPEC_DRAFTS = "server_spec_drafts"
SERIES_SPEC_DRAFT_TOKENS = "server_spec_draft_tokens"
SERIES_SPEC_ACCEPTED = "server_spec_accepted_tokens"
SERIES_SPEC_POS = "server_spec_accepted_pos"
SERIES_SPEC_ACCEPTANCE = "server_spec_acceptance_pct"  # accepted / draft tokens between two scrapes, %


@dataclass
class TimedResult:
    """One request as the caller saw it, on the perf_counter clock."""

    start: float
    end: float = 0.0
    chunks: list[TimedChunk] = field(default_factory=list)  # output chunks, reasoning and answer
    first_any: float | None = None  # first chunk of any kind (reasoning or content)
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int = 0
    usage_output_tokens: int | None = None
    reasoning_tokens: int = 0  # the client's count of reasoning tokens (in output_tokens too)
    usage_reasoning_tokens: int | None = None  # the server's count, where its usage reports one
    error: str | None = None
    estimated: bool = False  # some chunk's token count was a guess (see StreamChunk.estimated)
    unreachable: bool = False  # failed without reaching the server (connection refused, ...)
    routing: Any | None = None  # the server's routing counts for this request (StreamChunk.routing)


def output_cap(max_tokens: int) -> int:
    """The most output tokens a request may bring before it fails: a margin over what it asked
    for (a server that streams without end must not fill the client's memory)."""
    return max(2 * max_tokens, max_tokens + 64)


class Stamper:
    """Turns an engine's chunks into a :class:`TimedResult`: the single timing point,
    shared by :func:`timed_stream` and :func:`timed_astream`."""

    def __init__(self, request: GenerationRequest, on_chunk: Callable[[TimedChunk], None] | None) -> None:
        self.request = request
        self.on_chunk = on_chunk
        self.parts: list[str] = []
        self.result = TimedResult(start=time.perf_counter(), prompt_tokens=request.prompt_tokens)
        self.cap = output_cap(request.sampling.max_tokens)

    def add(self, chunk: StreamChunk, now: float | None = None) -> None:
        """Take one chunk; ``now`` is when it reached the caller (default: this moment).
        A thread that runs ``stream`` for an event loop stamps the chunk as the engine
        yields it and passes that time here."""
        if now is None:
            now = time.perf_counter()
        result = self.result
        if chunk.prompt_tokens is not None:
            result.prompt_tokens = chunk.prompt_tokens
        if chunk.usage_output_tokens is not None:
            result.usage_output_tokens = chunk.usage_output_tokens
        if chunk.usage_reasoning_tokens is not None:
            result.usage_reasoning_tokens = chunk.usage_reasoning_tokens
        if chunk.routing is not None:
            result.routing = chunk.routing
        carries = chunk.tokens > 0 or bool(chunk.text)
        if chunk.estimated:
            result.estimated = True
        if carries and result.first_any is None:
            result.first_any = now
        if carries:
            tc = TimedChunk(now, chunk.tokens, chunk.reasoning)
            result.chunks.append(tc)
            result.output_tokens += chunk.tokens
            if chunk.reasoning:
                result.reasoning_tokens += chunk.tokens
            else:
                self.parts.append(chunk.text)
            if self.on_chunk is not None:
                self.on_chunk(tc)
        if result.output_tokens > self.cap:
            max_tokens = self.request.sampling.max_tokens
            raise RequestFailed(
                f"the server sent more than {self.cap} output tokens for max_tokens={max_tokens}: stopped reading"
            )

    def fail(self, exc: BaseException) -> None:
        self.result.error = one_line(f"{type(exc).__name__}: {exc}", 500)
        self.result.unreachable = isinstance(exc, ServerUnreachable)

    def finish(self, cancel: threading.Event | None) -> TimedResult:
        result = self.result
        result.end = time.perf_counter()
        cancelled = cancel is not None and cancel.is_set()
        if result.error is None and cancelled and result.output_tokens < self.request.sampling.max_tokens:
            result.error = REQUEST_CANCELLED
        result.text = "".join(self.parts)
        if result.usage_output_tokens is not None and not result.chunks:
            result.output_tokens = result.usage_output_tokens
        return result


def timed_stream(
    engine: Engine,
    request: GenerationRequest,
    cancel: threading.Event | None = None,
    on_chunk: Callable[[TimedChunk], None] | None = None,
) -> TimedResult:
    """Run one request and stamp every chunk that carries text: the single timing point.

    An engine error ends this request with its reason in ``error``; it never raises
    for a request-level failure (the run goes on).
    """
    stamper = Stamper(request, on_chunk)
    try:
        for chunk in engine.stream(request, cancel):
            stamper.add(chunk)
    except Exception as exc:  # noqa: BLE001 - a failed request is recorded, not raised
        stamper.fail(exc)
    return stamper.finish(cancel)


async def timed_astream(
    engine: Engine,
    request: GenerationRequest,
    cancel: threading.Event | None = None,
    on_chunk: Callable[[TimedChunk], None] | None = None,
    stamped: AsyncIterator[tuple[StreamChunk, float]] | None = None,
) -> TimedResult:
    """:func:`timed_stream` over :meth:`Engine.astream`, for many requests on one event loop.

    ``stamped`` replaces ``engine.astream`` with (chunk, time) pairs stamped where the engine
    yielded them (an engine's threaded ``stream`` run for the loop: ``bench.send``).
    A task cancelled mid-request (the run was cancelled) ends the request as "cancelled".
    """
    stamper = Stamper(request, on_chunk)
    try:
        if stamped is None:
            async for chunk in engine.astream(request, cancel):
                stamper.add(chunk)
        else:
            async for chunk, t in stamped:
                stamper.add(chunk, t)
    except asyncio.CancelledError:
        stamper.result.error = REQUEST_CANCELLED
    except Exception as exc:  # noqa: BLE001 - a failed request is recorded, not raised
        stamper.fail(exc)
    return stamper.finish(cancel)


class EngineOptions(BaseModel):
    """Options every engine takes. Subclasses narrow ``kind`` to a Literal."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    model: str = "tiny-deepseek-v3"
    accelerator: str = "cpu"
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    trust_remote_code: bool = False

    @field_validator("dtype", mode="before")
    @classmethod
    def _canonical_dtype(cls, v: Any) -> str:
        # Aliases (fp16, half, bf16, fp32, float) become canonical names here, once; engines
        # read only auto | float16 | bfloat16 | float32.
        return canonical_dtype(v if isinstance(v, str) or v is None else str(v))

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, v: str) -> str:
        if v not in ACCELERATORS:
            raise ValueError(f"unknown accelerator '{v}'; known accelerators: {', '.join(ACCELERATORS)}")
        return v


class Engine:
    """Base class of all engines. See the module docstring for the contract."""

    kind: ClassVar[str] = ""
    label: ClassVar[str] = ""
    options_model: ClassVar[type[EngineOptions]] = EngineOptions
    # The model computes in the process that starts the engine (the native engine). A process
    # that also draws charts (the dashboard) loads such engines in an engine host instead
    # (bench.run.engine_host), so the model and the drawing never share a GIL.
    model_in_process: ClassVar[bool] = False

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.started = False

    @classmethod
    def availability(cls) -> Availability:
        """Whether this engine's packages are installed (cheap; no model loaded)."""
        return Availability(True)

    def start(self, progress: ProgressFn | None = None) -> None:
        raise NotImplementedError

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        raise NotImplementedError

    def async_capable(self) -> bool:
        """Whether :meth:`astream` works, so a run can send every request from one event
        loop (as ``vllm bench serve`` does) instead of a thread per in-flight request."""
        return False

    async def aopen(self) -> None:
        """Set up what :meth:`astream` needs on the running event loop (e.g. an HTTP session)."""
        return None

    async def aconnect(self, n: int) -> None:
        """Open up to ``n`` connections for :meth:`astream` ahead of time (HTTP engines), so
        a run's first wave does not pay for connection set-up inside its measured time."""
        return None

    async def aclose(self) -> None:
        """Release what :meth:`aopen` set up, on the same event loop."""
        return None

    def astream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> AsyncIterator[StreamChunk]:
        """The asynchronous twin of :meth:`stream`; only where :meth:`async_capable` says so."""
        raise NotImplementedError(f"the {self.kind} engine has no asynchronous stream")

    def prepare(
        self,
        requests: Sequence[GenerationRequest],
        concurrency: int,
        progress: Callable[[str], None] | None = None,
    ) -> str | None:
        """Get ready for a run before its clock starts: what its first requests must not pay inside
        the measured window (the native engine compiles and captures its decode step for the batch
        sizes the run will form). ``requests``: a sample of the run's requests (their lengths);
        ``concurrency``: the most in flight. Returns a line saying what was done (the run's warm-up
        phase shows it and the run keeps it), or None when there is nothing to do."""
        return None

    def stop(self) -> None:
        self.started = False

    def sender_spec(self) -> dict[str, Any] | None:
        """What a sender process needs to rebuild a client of this engine (picklable), or
        None when requests must be sent from this process (the model is loaded here).
        See :func:`client_from_spec` and :mod:`bench.send`."""
        return None

    def base_sender_spec(self) -> dict[str, Any]:
        """The part of every :meth:`sender_spec`: where the class lives, and the options."""
        cls = type(self)
        opts = self.options.model_dump()
        return {"module": cls.__module__, "class": cls.__qualname__, "kind": self.kind, "options": opts}

    def attach_sender(self, spec: dict[str, Any]) -> None:
        """In a sender process: make this fresh engine a client of the one ``spec`` came from,
        ready for :meth:`aopen` and :meth:`astream` (or :meth:`stream`), without loading
        anything heavy."""
        raise NotImplementedError(f"the {self.kind} engine cannot send from another process")

    def describe(self) -> dict[str, Any]:
        """Engine, model, accelerator, dtype, parameter count, versions: stored with each run."""
        return {"engine": self.kind, "model": self.options.model, "accelerator": self.options.accelerator}

    def memory(self) -> MemoryStats | None:
        """Device memory now, or None when the engine cannot see it (remote servers)."""
        return None

    def reset_peak_memory(self) -> None:
        return None

    def begin_window(self) -> None:
        """The measured window starts (the warm-up is over): what :meth:`window_warning` reads
        starts here."""
        return None

    def window_warning(self) -> str | None:
        """One line on what the engine saw hold up the measured window (a server compiling a
        kernel mid-run), else None: it goes into the run's disturbance line."""
        return None

    def server_pids(self) -> list[int]:
        """The process tree of a server this engine launched (its device memory is the run's
        memory where telemetry sees processes); empty for in-process and remote engines."""
        return []

    def tokenizer(self) -> Any | None:
        """A Hugging Face tokenizer for exact-length prompts and client counts, if known."""
        return None

    def context_length(self) -> int | None:
        """The most tokens (prompt + output) one request may hold, if known; prompts that
        cannot fit are refused before a run sends anything. Default: unknown."""
        return None

    def telemetry(self) -> dict[str, float]:
        """Extra live series sampled about once a second during a run (e.g. a server's
        Prometheus gauges: ``kv_cache_usage_pct``, ``requests_waiting``). Names become
        time-series names in the store. Default: none."""
        return {}

    def expert_routing(self) -> dict[str, Any] | None:
        """Tokens per expert per MoE layer since the last reset (see engines.routing), or None
        when the engine cannot see its gates (remote servers)."""
        return None

    def reset_expert_routing(self) -> None:
        return None

    def communication(self) -> dict[str, Any] | None:
        """What the engine's ranks moved between devices since :meth:`reset_communication` (the
        native engine with ``expert_parallel``: bytes and time of its all-to-alls, per rank), or
        None where the engine does not run ranks of its own."""
        return None

    def reset_communication(self) -> None:
        return None

    def routing_layout(self) -> dict[str, Any] | None:
        """For an engine whose server reports each request's routing (:attr:`StreamChunk.routing`):
        ``layers`` (labels), ``num_experts``, ``top_k``, ``n_group`` and ``source`` (where the
        counts come from, in words); None when its server reports none."""
        return None

    def profiler(self, trace_path: Any, with_stack: bool = True) -> Any:
        """A context manager that profiles the requests run inside it; afterwards its
        ``result`` holds the operator table, the breakdown and the trace file path.
        Engines that cannot be profiled raise :class:`EngineUnavailable` with the reason."""
        from engines.errors import EngineUnavailable

        raise EngineUnavailable(f"the {self.kind} engine does not support profiling runs")

    def health(self) -> str | None:
        """None while the engine can serve; else a one-line reason (e.g. "vLLM server exited
        with code -9"). The runner polls it and ends a run as failed when it is not None."""
        return None

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# kind -> module that registers it. Modules import their heavy packages lazily.
ENGINE_MODULES: dict[str, str] = {
    "native": "engines.native",
    "openai": "engines.openai_http",
    "vllm": "engines.vllm",
    "triton": "engines.triton",
    "lmdeploy": "engines.lmdeploy",
}

_REGISTRY: dict[str, type[Engine]] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make ``cls`` available under ``cls.kind``."""
    _REGISTRY[cls.kind] = cls
    return cls


def known_kinds() -> list[str]:
    return list(ENGINE_MODULES)


def engine_class(kind: str) -> type[Engine]:
    """The class for ``kind``; :class:`UnknownEngine` lists the known kinds otherwise."""
    if kind not in ENGINE_MODULES:
        raise UnknownEngine(f"unknown engine '{kind}'; known engines: {', '.join(known_kinds())}")
    if kind not in _REGISTRY:
        importlib.import_module(ENGINE_MODULES[kind])
    return _REGISTRY[kind]


def parse_options(data: dict[str, Any] | EngineOptions) -> EngineOptions:
    """Validate a dict into the options model of its ``kind``; errors become one line."""
    if isinstance(data, EngineOptions):
        return data
    cls = engine_class(str(data.get("kind", "")))
    try:
        return cls.options_model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line_validation(exc)) from exc


def _one_line_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "value"
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def create_engine(data: dict[str, Any] | EngineOptions) -> Engine:
    """Build (not start) an engine from options."""
    opts = parse_options(data)
    return engine_class(opts.kind)(opts)


def client_from_spec(spec: dict[str, Any]) -> Engine:
    """In a sender process: a client of the engine that gave ``spec`` (:meth:`Engine.sender_spec`)."""
    cls = getattr(importlib.import_module(spec["module"]), spec["class"])
    engine = cls(cls.options_model.model_validate(spec["options"]))
    engine.attach_sender(spec)
    return engine


def list_engines() -> list[tuple[str, str, Availability]]:
    """(kind, label, availability) for every known engine kind."""
    out = []
    for kind in known_kinds():
        try:
            cls = engine_class(kind)
            out.append((kind, cls.label or kind, cls.availability()))
        except Exception as exc:  # noqa: BLE001 - a broken engine module is shown, not fatal
            out.append((kind, kind, Availability(False, f"{type(exc).__name__}: {exc}")))
    return out

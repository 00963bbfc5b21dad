"""A fake engine with deterministic chunk timings, for schedule, sender and recorder tests.

Request ``rNNN`` waits ``ttft_s`` and then yields ``max_tokens`` one-token chunks
``itl_s`` apart (asynchronously when ``async_stream``, else from ``stream`` in a thread).
With ``processes`` it offers a :meth:`sender_spec`, so runs send from sender processes
as HTTP engines do. ``fail_every`` makes every n-th request fail after its first chunk.
Registered as kind ``fake`` by the ``fake_engine_kind`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from engines.base import Engine, EngineOptions, GenerationRequest, StreamChunk, register_engine
from engines.errors import RequestFailed


class FakeOptions(EngineOptions):
    kind: Literal["fake"] = "fake"  # type: ignore[assignment]
    ttft_s: float = 0.005
    itl_s: float = 0.002
    async_stream: bool = True
    processes: bool = False
    fail_every: int = 0
    tokens_per_chunk: int = 1  # each chunk carries up to this many tokens (speculative decoding)
    reasoning_tokens: int = 0  # the first tokens of each answer stream as reasoning
    usage_reasoning_tokens: int | None = None  # what the final usage reports as reasoning tokens
    ttft_spread_s: float = 0.0  # planted variance: request rN waits ttft_s + a seeded draw in [0, spread)


@register_engine
class FakeEngine(Engine):
    kind = "fake"
    label = "fake (tests)"
    options_model = FakeOptions

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.fo: FakeOptions = options  # type: ignore[assignment]
        self.sent: list[str] = []
        self.spans: dict[str, tuple[float, float]] = {}  # request id -> (began, ended), perf_counter
        self.in_process_pid: int | None = None

    def start(self, progress: Any = None) -> None:
        self.started = True

    def _ttft(self, request: GenerationRequest) -> float:
        if not self.fo.ttft_spread_s:
            return self.fo.ttft_s
        import random

        return self.fo.ttft_s + random.Random(request.request_id).random() * self.fo.ttft_spread_s

    def _fails(self, request: GenerationRequest) -> bool:
        digits = "".join(ch for ch in request.request_id if ch.isdigit())
        n = int(digits) if digits else 0
        if not self.fo.fail_every or request.request_id.startswith("warmup"):
            return False
        return (n + 1) % self.fo.fail_every == 0

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        self.sent.append(request.request_id)
        began = time.perf_counter()
        yield StreamChunk(text="", tokens=0, prompt_tokens=request.prompt_tokens or 4)
        time.sleep(self._ttft(request))
        for i, chunk in enumerate(self._chunks(request)):
            if cancel is not None and cancel.is_set():
                return
            if i:
                time.sleep(self.fo.itl_s)
            yield chunk
            if i == 0 and self._fails(request):
                raise RequestFailed("scripted failure")
        self.spans[request.request_id] = (began, time.perf_counter())
        yield self._usage(request)

    def async_capable(self) -> bool:
        return self.fo.async_stream

    async def astream(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> AsyncIterator[StreamChunk]:
        self.sent.append(request.request_id)
        began = time.perf_counter()
        yield StreamChunk(text="", tokens=0, prompt_tokens=request.prompt_tokens or 4)
        await asyncio.sleep(self._ttft(request))
        for i, chunk in enumerate(self._chunks(request)):
            if cancel is not None and cancel.is_set():
                return
            if i:
                await asyncio.sleep(self.fo.itl_s)
            yield chunk
            if i == 0 and self._fails(request):
                raise RequestFailed("scripted failure")
        self.spans[request.request_id] = (began, time.perf_counter())
        yield self._usage(request)

    def _chunks(self, request: GenerationRequest) -> list[StreamChunk]:
        """The answer's chunks: ``reasoning_tokens`` of reasoning first, then content, up to
        ``tokens_per_chunk`` tokens each (a chunk never mixes the two)."""
        n = request.sampling.max_tokens
        thinking = min(self.fo.reasoning_tokens, n)
        out = []
        for part, reasoning in ((thinking, True), (n - thinking, False)):
            while part > 0:
                k = min(self.fo.tokens_per_chunk, part)
                out.append(StreamChunk(text=" t" * k, tokens=k, reasoning=reasoning))
                part -= k
        return out

    def _usage(self, request: GenerationRequest) -> StreamChunk:
        return StreamChunk(
            text="",
            tokens=0,
            final=True,
            usage_output_tokens=request.sampling.max_tokens,
            usage_reasoning_tokens=self.fo.usage_reasoning_tokens,
        )

    def sender_spec(self) -> dict[str, Any] | None:
        return self.base_sender_spec() if self.fo.processes else None

    def attach_sender(self, spec: dict[str, Any]) -> None:
        self.started = True


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most (start, end) intervals open at one moment (an end before a start at a tie)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    level = peak = 0
    for _t, d in events:
        level += d
        peak = max(peak, level)
    return peak

"""The sending core: one asyncio loop that sends a run's requests on a :mod:`bench.send.schedule`.

:func:`send` is the only sender. Each slot takes the next ticket, waits until that
request is due, streams it through :func:`engines.base.timed_astream` (the single
timing point) and hands the finished request to ``emit`` as a :class:`Completion`,
which costs a tuple and a queue put: no I/O, no JSON and no statistics on this loop
(the recorder does those, off the loop). Engines without ``astream`` (the native
engine, Triton's generate stream, ``async_client=false``) are adapted by
:func:`thread_astream`: ``stream`` runs in an executor thread that stamps each chunk
as the engine yields it, and the loop consumes the stamped chunks. Where the loop runs
is :mod:`bench.send.processes` (or :mod:`bench.send.ray`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, overload

from bench.send.schedule import Strategy, Tickets
from engines.base import Engine, GenerationRequest, TimedChunk, TimedResult, timed_astream
from engines.errors import MoEBenchError

FEED_AHEAD_BLOCKS = 4  # blocks of prompts a sender process holds ahead of the tickets taken
FEED_POLL_S = 0.01  # how often the feeder looks at the tickets taken
EMIT_BATCH_S = 0.05  # a child sends its finished requests to the parent this often (or per EMIT_BATCH_N)
EMIT_BATCH_N = 256
READY_TIMEOUT_S = 120.0  # a sender process must have opened its session and warmed up by then
CANCEL_POLL_S = 0.05
# A slot whose request could not reach the server waits before its next one: 50 ms,
# doubling up to 1 s, until a request reaches it again. A server that is down is not
# hammered, its run is not burnt through in milliseconds as a column of "failed"
# requests, and the health check has time to end the run with the server's own reason.
UNREACHABLE_BACKOFF_S = (0.05, 1.0)
UNREACHABLE_GIVE_UP_S = 15.0  # no request reached the server for this long: the run stops


class ServerGone(MoEBenchError):
    """The server could not be reached for :data:`UNREACHABLE_GIVE_UP_S`: the run stops with this reason."""


@dataclass(frozen=True)
class Completion:
    """One finished request as the sender saw it, on the perf_counter clock (absolute times).

    ``text`` is kept only when the sender guessed the output's token count (one per chunk:
    no server count, no tokenizer in a sender process) and the server's usage does not
    confirm it; the recorder then counts the text (:meth:`bench.run.recorder.Recorder.record`).
    """

    seq: int
    request_id: str
    start: float
    end: float
    chunk_times: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    usage_output_tokens: int | None
    first_any: float | None
    due: float
    error: str | None
    text: str | None = None
    routing: Any = None  # the server's routing counts for this request (engines.base.StreamChunk.routing)
    chunk_tokens: tuple[int, ...] | None = None  # tokens per output chunk; None: one each
    reasoning_chunks: int = 0  # the leading chunks that are reasoning (before the first answer chunk)
    reasoning_tokens: int = 0  # the client's count of reasoning tokens (in output_tokens too)
    usage_reasoning_tokens: int | None = None  # the server's count, where its usage reports one


class FedRequests(Sequence[GenerationRequest]):
    """A sender process's view of the run's requests: blocks the parent feeds it over a pipe.

    The parent builds the prompts (lazily, a block at a time: :class:`bench.workloads.RequestSource`)
    and sends each block to every sender process a few blocks ahead of the tickets taken;
    a reader thread files them here. A request whose block has not arrived yet waits for it
    (the send lag records the wait: the parent fell behind). Old blocks are dropped.
    """

    KEEP_BLOCKS = 8

    def __init__(self, n: int, block_size: int, first: dict[int, list[GenerationRequest]]) -> None:
        self.n, self.block_size = n, block_size
        self._blocks = dict(first)
        self._cond = threading.Condition()
        self._closed = False
        self._cancel: Any = None

    def __getstate__(self) -> dict[str, Any]:  # sent to the child with its first blocks
        return {"n": self.n, "block_size": self.block_size, "blocks": self._blocks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n"], state["block_size"], state["blocks"])  # type: ignore[misc]

    def feed_from(self, conn: Connection, cancel: Any) -> None:
        """Start filing the blocks that arrive on ``conn`` (until it closes)."""
        self._cancel = cancel

        def reader() -> None:
            try:
                while True:
                    k, block = pickle.loads(conn.recv_bytes())
                    with self._cond:
                        self._blocks[k] = block
                        for old in sorted(self._blocks)[: -self.KEEP_BLOCKS]:
                            del self._blocks[old]
                        self._cond.notify_all()
            except (EOFError, OSError):
                pass
            finally:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()

        threading.Thread(target=reader, name="feed", daemon=True).start()

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> GenerationRequest: ...
    @overload
    def __getitem__(self, i: slice) -> list[GenerationRequest]: ...
    def __getitem__(self, i: int | slice) -> GenerationRequest | list[GenerationRequest]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        k, j = divmod(i, self.block_size)
        with self._cond:
            while k not in self._blocks:
                if self._closed or (self._cancel is not None and self._cancel.is_set()):
                    raise MoEBenchError(f"request {i}: its prompt never arrived from the parent process")
                self._cond.wait(CANCEL_POLL_S)
            return self._blocks[k][j]


def light_requests(block: Sequence[GenerationRequest]) -> list[GenerationRequest]:
    """The requests without token ids: HTTP engines send text."""
    return [dataclasses.replace(r, prompt_token_ids=None) for r in block]


def blocks_of(requests: Sequence[GenerationRequest]) -> tuple[int, Callable[[int], list[GenerationRequest]]]:
    """(block size, block k) of a run's requests: a lazy source's own blocks, else slices of the list."""
    size = getattr(requests, "block_size", None)
    if size is not None and hasattr(requests, "block"):
        return size, requests.block  # type: ignore[attr-defined]
    size = 256

    def block(k: int) -> list[GenerationRequest]:
        return list(requests[k * size : (k + 1) * size])

    return size, block


def chunk_layout(chunks: Sequence[TimedChunk]) -> tuple[tuple[int, ...] | None, int]:
    """(tokens per chunk, or None when every chunk holds one; the leading reasoning chunks)."""
    tokens = tuple(c.tokens for c in chunks)
    lead = 0
    while lead < len(chunks) and chunks[lead].reasoning:
        lead += 1
    return (None if all(n == 1 for n in tokens) else tokens), lead


def completion(seq: int, req: GenerationRequest, res: TimedResult, due: float, keep_text: bool) -> Completion:
    chunk_tokens, reasoning_chunks = chunk_layout(res.chunks)
    return Completion(
        seq=seq,
        request_id=req.request_id,
        start=res.start,
        end=res.end,
        chunk_times=tuple(c.t for c in res.chunks),
        prompt_tokens=int(res.prompt_tokens or 0),
        output_tokens=res.output_tokens,
        usage_output_tokens=res.usage_output_tokens,
        first_any=res.first_any,
        due=due,
        error=res.error,
        text=res.text if keep_text and res.estimated and res.usage_output_tokens != res.output_tokens else None,
        routing=res.routing,
        chunk_tokens=chunk_tokens,
        reasoning_chunks=reasoning_chunks,
        reasoning_tokens=res.reasoning_tokens,
        usage_reasoning_tokens=res.usage_reasoning_tokens,
    )


class Counters:
    """Live counts of one sending loop: tokens streamed so far and requests in flight."""

    def __init__(self) -> None:
        self.tokens = 0
        self.in_flight = 0

    def add_tokens(self, n: int) -> None:
        self.tokens += n

    def started(self) -> None:
        self.in_flight += 1

    def ended(self) -> None:
        self.in_flight -= 1


class SharedCounters(Counters):
    """:class:`Counters` of worker ``w`` written into arrays the parent reads."""

    def __init__(self, tokens: Any, in_flight: Any, w: int) -> None:
        super().__init__()
        self._tok, self._fl, self._w = tokens, in_flight, w

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        self._tok[self._w] = self.tokens

    def started(self) -> None:
        self.in_flight += 1
        self._fl[self._w] = self.in_flight

    def ended(self) -> None:
        self.in_flight -= 1
        self._fl[self._w] = self.in_flight


async def thread_astream(
    engine: Engine, request: GenerationRequest, cancel: threading.Event | Any, executor: ThreadPoolExecutor
) -> AsyncIterator[tuple[Any, float]]:
    """``engine.stream`` run in an executor thread; yields (chunk, time the engine yielded it).

    When the consumer stops early (the output cap, a cancelled task), the producer stops
    too: the engine sees a cancel flag that is set for this request alone, and the thread
    reads no further (before, it read a capped server's stream to its end, holding the slot).
    """
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Any] = asyncio.Queue()
    end = object()
    stopped = _RequestCancel(cancel)

    def produce() -> None:
        try:
            for chunk in engine.stream(request, stopped):
                if stopped.own.is_set():
                    break
                loop.call_soon_threadsafe(q.put_nowait, (chunk, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming coroutine
            loop.call_soon_threadsafe(q.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(q.put_nowait, end)

    fut = loop.run_in_executor(executor, produce)
    try:
        while True:
            item = await q.get()
            if item is end:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stopped.own.set()
        if not fut.done():
            # Stopped mid-stream: the engine sees the flag at its next chunk; do not wait here.
            fut.add_done_callback(lambda f: f.exception())


class _RequestCancel:
    """The run's cancel flag, or this request's own (its consumer stopped reading)."""

    def __init__(self, run_cancel: Any) -> None:
        self.run_cancel = run_cancel
        self.own = threading.Event()

    def is_set(self) -> bool:
        return self.own.is_set() or (self.run_cancel is not None and self.run_cancel.is_set())


def stream_executor(engine: Engine, threads: int, prestart: bool = False) -> ThreadPoolExecutor | None:
    """Threads for an engine without ``astream`` (its ``stream`` runs there); None for the others.

    ``prestart``: all ``threads`` are started now. A ThreadPoolExecutor starts a thread on the
    submit that finds none idle, so a closed loop's first wave would start them one by one on
    the clock: 128 took 30-50 ms (the last request sent that late, its batch held back with it)."""
    if engine.async_capable():
        return None
    n = max(1, threads)
    executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="send")
    if prestart:
        gate = threading.Event()
        parked = [executor.submit(gate.wait) for _ in range(n)]  # each finds the others busy: a thread each
        gate.set()
        for f in parked:
            f.result()
    return executor


def _timed(
    engine: Engine,
    request: GenerationRequest,
    cancel: Any,
    on_chunk: Callable[[Any], None] | None,
    executor: ThreadPoolExecutor | None,
) -> Awaitable[TimedResult]:
    """One request through the single timing point, by ``astream`` or by ``stream`` in ``executor``."""
    stamped = None if executor is None else thread_astream(engine, request, cancel, executor)
    return timed_astream(engine, request, cancel, on_chunk, stamped)


async def send(
    engine: Engine,
    strategy: Strategy,
    requests: Sequence[GenerationRequest],
    tickets: Tickets,
    t0: float,
    cancel: Any,
    emit: Callable[[Completion], None],
    counters: Counters,
    slots: Sequence[int],
    keep_text: bool = False,
    executor: ThreadPoolExecutor | None = None,
) -> None:
    """Send requests on ``strategy`` from the given ``slots`` until the tickets run out.

    ``cancel`` (a threading or multiprocessing Event): no new request starts, and the
    requests in flight are cancelled (each ends as a "cancelled" request). ``executor``: the
    threads for an engine without ``astream``, started before the clock (made here otherwise);
    shut down at the end either way.
    """
    if executor is None:
        executor = stream_executor(engine, len(slots))
    add_tokens = counters.add_tokens
    atake = getattr(tickets, "atake", None)  # tickets from another process (a Ray actor) are awaited
    reached = t0  # when a request last reached the server (or the start)
    deadline = None if strategy.deadline is None else t0 + strategy.deadline

    def on_chunk(chunk: Any) -> None:
        add_tokens(chunk.tokens)

    async def slot(k: int) -> None:
        nonlocal reached
        free = t0 + strategy.slot_start(k)
        backoff = 0.0
        while not cancel.is_set():
            seq = tickets.take() if atake is None else await atake()
            if seq is None:
                return
            due = t0 + strategy.due(seq, free - t0)
            if deadline is not None and max(due, time.perf_counter()) > deadline:
                return  # a duration-bound run sends nothing after its end
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if cancel.is_set():
                return
            counters.started()
            res = await _timed(engine, requests[seq], cancel, on_chunk, executor)
            counters.ended()
            emit(completion(seq, requests[seq], res, due, keep_text))
            free = res.end
            if res.unreachable:
                if res.end - reached > UNREACHABLE_GIVE_UP_S:
                    raise ServerGone(
                        f"no request reached the server for {UNREACHABLE_GIVE_UP_S:.0f} s; last error: {res.error}"
                    )
                first, most = UNREACHABLE_BACKOFF_S
                backoff = min(most, backoff * 2 or first)
                await asyncio.sleep(backoff)
                free = time.perf_counter()
            else:
                backoff = 0.0
                reached = max(reached, res.end)

    tasks = [asyncio.create_task(slot(k)) for k in slots]
    watch = asyncio.gather(*tasks, return_exceptions=True)
    try:
        while not watch.done():
            await asyncio.wait([watch], timeout=CANCEL_POLL_S)
            gave_up = any(t.done() and not t.cancelled() and t.exception() is not None for t in tasks)
            if (gave_up or cancel.is_set()) and not watch.done():
                # A cancel reaches requests waiting on a silent server too.
                for task in tasks:
                    task.cancel()
                await asyncio.wait([watch])
        for out in watch.result():
            if isinstance(out, Exception):
                raise out
    finally:
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


async def warm_up(engine: Engine, warmup: Sequence[GenerationRequest], cancel: Any, in_flight: int = 1) -> None:
    """Send the warm-up requests through the sending loop's own session, up to ``in_flight`` at
    once (the sender's slots: the run's concurrency, as AIPerf's warm-up and vllm bench serve's
    ``--num-warmups`` send theirs). So a server meets the run's batch sizes before the clock
    starts: vLLM compiles a Triton MoE kernel for each new batch size the first time it sees
    it, which on an H100 held a first wave of 8 for ~0.9 s (docs/benchmarks.md)."""
    lanes = max(1, min(in_flight, len(warmup)))
    executor = stream_executor(engine, lanes)
    pending = iter(warmup)  # shared: each lane takes the next request when its last one ends

    async def lane() -> None:
        for req in pending:
            if cancel.is_set():
                return
            res = await _timed(engine, req, cancel, None, executor)
            if res.error and not cancel.is_set():
                raise MoEBenchError(f"warm-up request failed: {res.error}")

    try:
        await asyncio.gather(*(lane() for _ in range(lanes)))
    finally:
        if executor is not None:
            executor.shutdown(wait=False)


def split_slots(n_slots: int, workers: int) -> list[list[int]]:
    """Slot numbers of each worker: ``n_slots`` dealt round-robin, so any worker count covers them all."""
    return [list(range(w, n_slots, workers)) for w in range(workers)]


# --- in the calling process ---------------------------------------------------------

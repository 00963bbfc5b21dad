"""The sending core: one asyncio loop that sends a run's requests on a :mod:`bench.schedule`.

:func:`send` is the only sender. Each slot takes the next ticket, waits until that
request is due, streams it through :func:`engines.base.timed_astream` (the single
timing point) and hands the finished request to ``emit`` as a :class:`Completion`,
which costs a tuple and a queue put: no I/O, no JSON and no statistics on this loop
(the recorder does those, off the loop). Engines without ``astream`` (the native
engine, Triton's generate stream, ``async_client=false``) are adapted by
:func:`thread_astream`: ``stream`` runs in an executor thread that stamps each chunk
as the engine yields it, and the loop consumes the stamped chunks.

Where it runs:

- :class:`InProcessSender`: the loop in a thread of the calling process. For engines
  whose model lives in this process (native).
- :class:`ProcessSender`: HTTP engines. The loop runs in ``workers`` child processes of
  their own (spawned: no torch, no Streamlit, no tokenizer there), so chart drawing,
  tokenizers and the recorder never share the sending loop's GIL. Each child rebuilds a
  client of the engine from :meth:`engines.base.Engine.sender_spec`, opens its session,
  sends the warm-up requests through it and opens one connection per slot (so the first
  wave does not time TCP set-up), then waits for the common start. Tickets,
  the start time and the cancel flag are shared between the children, so the schedule
  is global: an open-loop rate holds across workers, and the concurrency cap is split
  into slots (``concurrency`` slots over all workers). Children send their finished
  requests to the parent in batches over a pipe; the live token and in-flight counts
  are shared integers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing as mp
import os
import pickle
import queue
import sys
import threading
import time
import traceback
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, overload

from bench.schedule import LocalTickets, Strategy, Tickets
from engines.base import Engine, GenerationRequest, TimedResult, client_from_spec, timed_astream
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
    confirm it; the recorder then counts the text (:meth:`bench.recorder.Recorder.record`).
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


def _light(block: Sequence[GenerationRequest]) -> list[GenerationRequest]:
    """The requests without token ids: HTTP engines send text."""
    return [dataclasses.replace(r, prompt_token_ids=None) for r in block]


def _blocks_of(requests: Sequence[GenerationRequest]) -> tuple[int, Callable[[int], list[GenerationRequest]]]:
    """(block size, block k) of a run's requests: a lazy source's own blocks, else slices of the list."""
    size = getattr(requests, "block_size", None)
    if size is not None and hasattr(requests, "block"):
        return size, requests.block  # type: ignore[attr-defined]
    size = 256

    def block(k: int) -> list[GenerationRequest]:
        return list(requests[k * size : (k + 1) * size])

    return size, block


def completion(seq: int, req: GenerationRequest, res: TimedResult, due: float, keep_text: bool) -> Completion:
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


class _SharedCounters(Counters):
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


def _executor(engine: Engine, threads: int, prestart: bool = False) -> ThreadPoolExecutor | None:
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
        executor = _executor(engine, len(slots))
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


async def warm_up(engine: Engine, warmup: Sequence[GenerationRequest], cancel: Any) -> None:
    """Send the warm-up requests one at a time through the sending loop's own session."""
    executor = _executor(engine, 1)
    try:
        for req in warmup:
            if cancel.is_set():
                return
            res = await _timed(engine, req, cancel, None, executor)
            if res.error and not cancel.is_set():
                raise MoEBenchError(f"warm-up request failed: {res.error}")
    finally:
        if executor is not None:
            executor.shutdown(wait=False)


def split_slots(n_slots: int, workers: int) -> list[list[int]]:
    """Slot numbers of each worker: ``n_slots`` dealt round-robin, so any worker count covers them all."""
    return [list(range(w, n_slots, workers)) for w in range(workers)]


# --- in the calling process ---------------------------------------------------------
class InProcessSender:
    """The sending loop in a thread of this process (engines whose model is loaded here)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counters = Counters()

    def live(self) -> tuple[int, int]:
        """(tokens streamed, requests in flight) so far."""
        return self.counters.tokens, self.counters.in_flight

    def run(
        self,
        strategy: Strategy,
        requests: Sequence[GenerationRequest],
        warmup: Sequence[GenerationRequest],
        cancel: threading.Event,
        emit: Callable[[Completion], None],
        before_start: Callable[[], None],
        on_start: Callable[[float], None],
    ) -> None:
        """Warm up, call ``before_start()``, stamp the start ``t0``, call ``on_start(t0)``
        and send everything. Returns without starting when cancelled during warm-up."""
        engine = self.engine

        async def main() -> None:
            await engine.aopen()
            try:
                await warm_up(engine, warmup, cancel)
                await engine.aconnect(strategy.slots)
                if cancel.is_set():
                    return
                executor = _executor(engine, strategy.slots, prestart=True)  # its threads up before the clock
                before_start()
                t0 = time.perf_counter()
                on_start(t0)
                await send(
                    engine,
                    strategy,
                    requests,
                    LocalTickets(len(requests)),
                    t0,
                    cancel,
                    emit,
                    self.counters,
                    range(strategy.slots),
                    executor=executor,
                )
            finally:
                await engine.aclose()

        asyncio.run(main())


# --- in sender processes ------------------------------------------------------------
class SharedTickets:
    """Tickets shared by every sender process of a run (a counter in shared memory)."""

    def __init__(self, n: int, value: Any) -> None:
        self.n = n
        self._value = value

    def take(self) -> int | None:
        with self._value.get_lock():
            seq = self._value.value
            if seq >= self.n:
                return None
            self._value.value = seq + 1
            return seq


@dataclass
class _Shared:
    """What the parent and its sender processes share (multiprocessing primitives)."""

    tickets: Any
    t0: Any
    go: Any
    cancel: Any
    tokens: Any
    in_flight: Any


def _child_main(
    w: int,
    spec: dict[str, Any],
    strategy: Strategy,
    requests: FedRequests,
    warmup: list[GenerationRequest],
    slots: list[int],
    shared: _Shared,
    conn: Connection,
    feed: Connection,
) -> None:
    """A sender process: rebuild the engine's client, warm up, wait for the start, send."""
    requests.feed_from(feed, shared.cancel)
    out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def writer() -> None:  # pipe writes off the loop: a full pipe must not stall it
        while (data := out.get()) is not None:
            try:
                conn.send_bytes(data)
            except OSError:  # the parent is gone: stop sending
                shared.cancel.set()
                return

    wthread = threading.Thread(target=writer, name="emit", daemon=True)
    wthread.start()

    def post(kind: str, payload: Any = None) -> None:
        out.put(pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL))

    try:
        engine = client_from_spec(spec)
        counters = _SharedCounters(shared.tokens, shared.in_flight, w)
        batch: list[Completion] = []

        def flush() -> None:
            if batch:
                post("batch", list(batch))
                batch.clear()

        last_failure_flush = 0.0

        def emit(c: Completion) -> None:
            nonlocal last_failure_flush
            batch.append(c)
            if len(batch) >= EMIT_BATCH_N:
                flush()
            elif c.error is not None and c.end - last_failure_flush > EMIT_BATCH_S / 5:
                # A failure reaches the parent at once: it may be the sign to check the server.
                last_failure_flush = c.end
                flush()

        parent = os.getppid()

        async def flusher() -> None:  # finished requests reach the parent within EMIT_BATCH_S
            while True:
                await asyncio.sleep(EMIT_BATCH_S)
                flush()
                if os.getppid() != parent:  # the parent died (killed): no one records; stop
                    shared.cancel.set()

        async def main() -> None:
            await engine.aopen()
            try:
                await warm_up(engine, warmup, shared.cancel)
                await engine.aconnect(len(slots))
                # This process's heap is small and stays put: no collection pauses mid-stream
                # (as vllm bench serve freezes its heap).
                gc.collect()
                gc.freeze()
                post("ready")
                # Nothing else runs on this loop yet: block until every worker is ready.
                while not shared.go.wait(CANCEL_POLL_S):
                    if shared.cancel.is_set() or os.getppid() != parent:
                        return
                t0 = shared.t0.value
                tickets = SharedTickets(len(requests), shared.tickets)
                flushing = asyncio.create_task(flusher())
                try:
                    await send(engine, strategy, requests, tickets, t0, shared.cancel, emit, counters, slots, True)
                finally:
                    flushing.cancel()
            finally:
                await engine.aclose()

        asyncio.run(main())
        flush()
        post("done")
    except ServerGone as exc:  # the parent reports it once, as it is
        post("stop", str(exc))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it as the run's reason
        reason = str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}"
        post("error", " ".join(reason.split()) or traceback.format_exc(limit=1))
    finally:
        out.put(None)
        wthread.join(timeout=10)
        conn.close()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def main_not_reimported() -> Iterator[None]:
    """Start a spawned child without importing this process's ``__main__`` there.

    multiprocessing's spawn runs the parent's main script again in each child (to find
    functions defined there). Nothing a sender process needs lives there, and the main
    script may be the Streamlit runner or a script without a ``__main__`` guard, which
    would run again. So the child is told of a main module with no file and no spec.
    """
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class ProcessSender:
    """Runs the sending loop in ``workers`` spawned child processes (HTTP engines)."""

    def __init__(self, spec: dict[str, Any], workers: int) -> None:
        self.spec = spec
        self.workers = workers
        self._ctx = mp.get_context("spawn")
        self._tokens = self._ctx.RawArray("q", workers)
        self._in_flight = self._ctx.RawArray("q", workers)

    def live(self) -> tuple[int, int]:
        return sum(self._tokens), sum(self._in_flight)

    def run(
        self,
        strategy: Strategy,
        requests: Sequence[GenerationRequest],
        warmup: Sequence[GenerationRequest],
        cancel: threading.Event,
        emit: Callable[[Completion], None],
        before_start: Callable[[], None],
        on_start: Callable[[float], None],
    ) -> None:
        """As :meth:`InProcessSender.run`, with the sending loops in child processes."""
        ctx = self._ctx
        shared = _Shared(
            tickets=ctx.Value("q", 0),
            t0=ctx.RawValue("d", 0.0),
            go=ctx.Event(),
            cancel=ctx.Event(),
            tokens=self._tokens,
            in_flight=self._in_flight,
        )
        # The children send text, never token ids: HTTP engines do not need them. They get
        # the first blocks of prompts now and the rest from a feeder, ahead of the tickets.
        size, block = _blocks_of(requests)
        n_blocks = -(-len(requests) // size)
        ahead = max(FEED_AHEAD_BLOCKS, -(-2 * strategy.slots // size))
        first = {k: _light(block(k)) for k in range(min(ahead, n_blocks))}
        light_warm = _light(warmup)
        procs: list[Any] = []
        conns: dict[Connection, int] = {}
        feeds: list[Connection] = []
        feeder: threading.Thread | None = None
        self.feed_error: str | None = None
        self._feed_stop = threading.Event()
        try:
            for w, slots in enumerate(split_slots(strategy.slots, self.workers)):
                reader, writer = ctx.Pipe(duplex=False)
                feed_r, feed_w = ctx.Pipe(duplex=False)
                fed = FedRequests(len(requests), size, first)
                p = ctx.Process(
                    target=_child_main,
                    args=(w, self.spec, strategy, fed, light_warm, slots, shared, writer, feed_r),
                    name=f"moebench-sender-{w}",
                    daemon=True,
                )
                with main_not_reimported():
                    p.start()
                writer.close()
                feed_r.close()
                procs.append(p)
                conns[reader] = w
                feeds.append(feed_w)
            feeder = threading.Thread(
                target=self._feed, args=(feeds, block, size, len(first), n_blocks, ahead, shared), daemon=True
            )
            feeder.start()
            self._wait_ready(conns, procs, shared, cancel)
            if cancel.is_set():
                shared.cancel.set()
                return
            before_start()
            t0 = time.perf_counter()
            shared.t0.value = t0
            shared.go.set()
            on_start(t0)
            self._collect(conns, shared, cancel, emit)
        finally:
            shared.cancel.set()  # a child still waiting for `go` leaves
            self._feed_stop.set()
            if feeder is not None:
                feeder.join(timeout=10)
            for f in feeds:
                f.close()
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)

    def _feed(
        self,
        feeds: list[Connection],
        block: Callable[[int], list[GenerationRequest]],
        size: int,
        start: int,
        n_blocks: int,
        ahead: int,
        shared: _Shared,
    ) -> None:
        """Build and send blocks ``start..n_blocks-1`` to every child, ``ahead`` blocks before the tickets.

        It never takes a lock the children share (the tickets' or the cancel event's): a
        parent killed while holding one would leave them waiting forever. It reads the
        ticket counter unlocked (one aligned 64-bit word) and stops on its own event.
        """
        taken = shared.tickets.get_obj()
        try:
            for k in range(start, n_blocks):
                while (k - ahead) * size >= taken.value:
                    if self._feed_stop.wait(FEED_POLL_S):
                        return
                if self._feed_stop.is_set():
                    return
                data = pickle.dumps((k, _light(block(k))), protocol=pickle.HIGHEST_PROTOCOL)
                for f in feeds:
                    with contextlib.suppress(OSError):  # a child that ended is reported by _collect
                        f.send_bytes(data)
        except Exception as exc:  # noqa: BLE001 - a prompt that cannot be built ends the run with its reason
            self.feed_error = str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}"
            shared.cancel.set()

    def _wait_ready(self, conns: dict[Connection, int], procs: list[Any], shared: _Shared, cancel: Any) -> None:
        waiting = set(conns)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while waiting:
            if cancel.is_set():
                return
            if time.monotonic() > deadline:
                raise MoEBenchError(f"sender processes not ready after {READY_TIMEOUT_S:.0f} s")
            for c in wait(list(waiting), timeout=CANCEL_POLL_S):
                kind, payload = self._recv(c, procs[conns[c]])
                if kind == "error":
                    raise MoEBenchError(f"sender process {conns[c]}: {payload}")
                if kind == "ready":
                    waiting.discard(c)

    def _collect(
        self, conns: dict[Connection, int], shared: _Shared, cancel: Any, emit: Callable[[Completion], None]
    ) -> None:
        open_ = set(conns)
        errors: list[str] = []
        while open_:
            if cancel.is_set():
                shared.cancel.set()
            for c in wait(list(open_), timeout=CANCEL_POLL_S):
                try:
                    kind, payload = pickle.loads(c.recv_bytes())
                except (EOFError, OSError):
                    open_.discard(c)
                    errors.append(f"sender process {conns[c]} ended without finishing")
                    continue
                if kind == "batch":
                    for item in payload:
                        emit(item)
                elif kind == "error":
                    errors.append(f"sender process {conns[c]}: {payload}")
                    open_.discard(c)
                elif kind == "stop":
                    shared.cancel.set()
                    if payload not in errors:
                        errors.append(payload)
                    open_.discard(c)
                elif kind == "done":
                    open_.discard(c)
        if self.feed_error is not None:
            errors.insert(0, f"building prompts: {self.feed_error}")
        if errors:
            shared.cancel.set()
            raise MoEBenchError("; ".join(errors))

    @staticmethod
    def _recv(c: Connection, proc: Any) -> tuple[str, Any]:
        try:
            return pickle.loads(c.recv_bytes())
        except (EOFError, OSError):
            code = proc.exitcode
            return "error", f"exited before it was ready (exit code {code})"


def make_sender(engine: Engine, workers: int, ray_address: str | None = None) -> Any:
    """Sender processes for engines that can be reached from another process, else in-process;
    Ray actors on the cluster at ``ray_address`` where one is given (:mod:`bench.ray_sender`)."""
    spec = engine.sender_spec()
    if ray_address:
        if spec is None:
            raise MoEBenchError(
                f"ray_address: the {engine.kind} engine sends from the process that loaded the model; "
                "Ray load generation applies to engines reached over HTTP"
            )
        from bench.ray_sender import RaySender

        return RaySender(spec, workers, ray_address)
    if spec is None:
        if workers > 1:
            raise MoEBenchError(
                f"the {engine.kind} engine sends from the process that loaded the model; "
                "workers > 1 applies to HTTP engines"
            )
        return InProcessSender(engine)
    return ProcessSender(spec, workers)

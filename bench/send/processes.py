"""Where the sending loop runs.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from bench.send.core import (
    CANCEL_POLL_S,
    EMIT_BATCH_N,
    EMIT_BATCH_S,
    FEED_AHEAD_BLOCKS,
    FEED_POLL_S,
    READY_TIMEOUT_S,
    Completion,
    Counters,
    FedRequests,
    ServerGone,
    SharedCounters,
    blocks_of,
    light_requests,
    send,
    split_slots,
    stream_executor,
    warm_up,
)
from bench.send.cpu_wait import CpuWait, combine, lift_priority, own_session
from bench.send.schedule import LocalTickets, Strategy
from engines.base import Engine, GenerationRequest, client_from_spec
from engines.errors import MoEBenchError
from engines.settings import get_settings


class InProcessSender:
    """The sending loop in a thread of this process (engines whose model is loaded here)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counters = Counters()
        self._tickets: LocalTickets | None = None
        self.cpu: dict[str, float] | None = None  # the sending loop's CPU and run-queue wait (bench.send.cpu_wait)

    def stop_sending(self) -> None:
        """Send no more requests; those taken already go on (until_ci met)."""
        if self._tickets is not None:
            self._tickets.stop()

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
                await warm_up(engine, warmup, cancel, strategy.slots)
                await engine.aconnect(strategy.slots)
                if cancel.is_set():
                    return
                executor = stream_executor(engine, strategy.slots, prestart=True)  # its threads up before the clock
                before_start()
                self._tickets = LocalTickets(len(requests))
                t0 = time.perf_counter()
                on_start(t0)
                clock = CpuWait()
                clock.start()
                try:
                    await send(
                        engine,
                        strategy,
                        requests,
                        self._tickets,
                        t0,
                        cancel,
                        emit,
                        self.counters,
                        range(strategy.slots),
                        executor=executor,
                    )
                finally:
                    self.cpu = combine([cpu] if (cpu := clock.stop()) else [])
            finally:
                await engine.aclose()

        asyncio.run(main())


# --- in sender processes ------------------------------------------------------------
class SharedTickets:
    """Tickets shared by every sender process of a run (a counter in shared memory)."""

    def __init__(self, n: int, value: Any, stop: Any = None) -> None:
        self.n = n
        self._value = value
        self._stop = stop  # a shared flag: set, no more tickets (the parent's stop_sending)

    def take(self) -> int | None:
        with self._value.get_lock():
            seq = self._value.value
            if seq >= self.n or (self._stop is not None and self._stop.value):
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
    stop: Any = None  # set by the parent: hand out no more tickets (until_ci met)


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
    # A session of its own: the kernel shares a core between sessions (autogroup) before it
    # shares it between their threads; in the parent's session this loop got that session's
    # small share of the core a vLLM CPU server's engine core spins on (bench.send.cpu_wait).
    own_session()
    lift_priority(get_settings().sender_priority)  # before its threads start: they inherit it
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
        counters = SharedCounters(shared.tokens, shared.in_flight, w)
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
                await warm_up(engine, warmup, shared.cancel, len(slots))
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
                tickets = SharedTickets(len(requests), shared.tickets, shared.stop)
                flushing = asyncio.create_task(flusher())
                clock = CpuWait()
                clock.start()
                try:
                    await send(engine, strategy, requests, tickets, t0, shared.cancel, emit, counters, slots, True)
                finally:
                    flushing.cancel()
                    if (cpu := clock.stop()) is not None:
                        post("cpu", cpu)
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
        self._shared: _Shared | None = None
        self.cpu: dict[str, float] | None = None  # the sending loops' CPU and run-queue wait (bench.send.cpu_wait)

    def live(self) -> tuple[int, int]:
        return sum(self._tokens), sum(self._in_flight)

    def stop_sending(self) -> None:
        """Send no more requests; those taken already go on (until_ci met)."""
        if self._shared is not None:
            self._shared.stop.value = 1

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
            stop=ctx.RawValue("b", 0),
        )
        self._shared = shared
        # The children send text, never token ids: HTTP engines do not need them. They get
        # the first blocks of prompts now and the rest from a feeder, ahead of the tickets.
        size, block = blocks_of(requests)
        n_blocks = -(-len(requests) // size)
        ahead = max(FEED_AHEAD_BLOCKS, -(-2 * strategy.slots // size))
        first = {k: light_requests(block(k)) for k in range(min(ahead, n_blocks))}
        light_warm = light_requests(warmup)
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
                data = pickle.dumps((k, light_requests(block(k))), protocol=pickle.HIGHEST_PROTOCOL)
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
        cpu: list[dict[str, float]] = []
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
                elif kind == "cpu":
                    cpu.append(payload)
                    self.cpu = combine(cpu)
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

"""The sending loops as Ray actors spread over a cluster's nodes (``--ray-address``).

One client machine stops being enough once a deployment takes thousands of requests a
second; llmperf answers with Ray actors, AIPerf and inference-perf with worker processes
and pods. MoE Bench uses Ray, an existing distributed runtime, for the same job, and
keeps everything else as :class:`bench.send.processes.ProcessSender` does it:

- Each actor runs :func:`bench.send.core.send`, the one sending core, against a client
  rebuilt from :meth:`engines.base.Engine.sender_spec`, with its share of the slots
  (``concurrency`` slots over all actors).
- The schedule stays global: request numbers come from one counter actor. Each actor leases
  one per slot before the start (so the first wave waits on no round trip), then as many
  at a time (at most :data:`LEASE_MAX`), asking for the next lease while a whole one is
  still left: a slot waits on the counter's round trip only if that takes longer than a
  wave. (With a lease of a quarter of the slots, refilled at half, the counter's round trip
  on a loaded 2-core machine left slots waiting: send lag p99 283 ms vs 45 ms for local
  processes; with these leases 34 ms.) A request's due time depends on its number alone, so
  an open-loop rate holds over the nodes; at the end an actor holds at most two leases.
- Clocks: before the start the driver asks each actor for its clock a few times and keeps
  the sample with the shortest round trip (the NTP way): offset = actor clock - the
  midpoint of the driver's send and receive. The start time goes to each actor in its
  own clock, and every time an actor reports is moved back onto the driver's clock, so
  records from every node sit on one time line. The offsets and round trips are kept in
  the run (artifact ``load_generators``).
- Finished requests stay in the actor until the driver drains them (every
  :data:`bench.send.core.EMIT_BATCH_S`), and go to the driver's recorder and store.
- An actor that dies (its node lost, its process killed) fails the run with a reason
  that names it; the others are stopped, and everything already drained is kept.

Ray is optional (``requirements-ray.txt``); nothing here imports it until a run asks
for a Ray address. The code ships to the cluster with the job (Ray's ``py_modules``),
so each node needs only MoE Bench's Python requirements and the same Ray version.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.config import parse_ray_address
from bench.send.core import (
    EMIT_BATCH_S,
    READY_TIMEOUT_S,
    Completion,
    Counters,
    ServerGone,
    light_requests,
    send,
    split_slots,
    warm_up,
)
from bench.send.schedule import Strategy
from engines.base import GenerationRequest, client_from_spec
from engines.errors import ConfigError, MoEBenchError

LEASE_MAX = 256  # most request numbers an actor takes from the counter at once (after its first wave)
CLOCK_SAMPLES = 9  # round trips per actor to measure its clock offset
START_LEAD_S = 0.25  # the start is set this far ahead, so every actor has it before it comes
DRAIN_TIMEOUT_S = 30.0
CONNECT_CHECK_S = 5.0  # the cluster's port must answer within this


def ray_module() -> Any:
    """The ``ray`` package, or a one-line reason it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "ray_address: Ray is not installed in this environment; pip install -r requirements-ray.txt"
        ) from exc
    return ray


JOIN_TIMEOUT_S = 60.0  # joining a cluster that does not complete within this is given up


def _http_probe(sock: socket.socket) -> bytes:
    """What a server sends back to one HTTP/1.1 request line within a second (b"" for none): a
    Ray head's GCS speaks gRPC (HTTP/2) and does not answer with an HTTP/1 status line."""
    sock.settimeout(1.0)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(16)
    except OSError:
        return b""


def check_address(address: str) -> str:
    """``auto``, ``host:port`` or ``ray://host:port``; anything else is refused in one line."""
    try:
        return parse_ray_address(address)
    except ValueError as exc:
        raise ConfigError(f"ray_address: {exc}") from exc


def shift(c: Completion, by: float) -> Completion:
    """``c`` with every time moved by ``by`` seconds (from one clock onto another)."""
    if by == 0.0:
        return c
    return dataclasses.replace(
        c,
        start=c.start + by,
        end=c.end + by,
        chunk_times=tuple(t + by for t in c.chunk_times),
        first_any=None if c.first_any is None else c.first_any + by,
        due=c.due + by,
    )


def placement_line(artifact: dict[str, Any]) -> str:
    """One line for a run's ``load_generators`` artifact: where each actor ran, its clock offset."""
    actors = artifact.get("actors") or []
    nodes = len({a.get("node_id") for a in actors})
    parts = [
        f"{a.get('node_ip', '?')} pid {a.get('pid', '?')} clock {a.get('clock_offset_ms', 0.0):+.2f} ms "
        f"(rtt {a.get('rtt_ms', 0.0):.2f} ms)"
        for a in actors
    ]
    return f"{len(actors)} Ray actors on {nodes} node{'s' if nodes != 1 else ''} of {artifact.get('ray_address')}: " + (
        "; ".join(parts)
    )


class TicketCounter:
    """The run's one ticket counter (a Ray actor): request numbers in order, each once."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.next = 0

    def take(self, k: int) -> tuple[int, int]:
        """The next ``k`` numbers as [start, end); start == end when none are left."""
        start = self.next
        self.next = min(self.n, start + max(1, k))
        return start, self.next


class LeasedTickets:
    """An actor's view of the global counter: numbers leased a slot's worth at a time, the
    next lease asked for while a whole one is left, so a slot seldom waits on a round trip."""

    def __init__(self, counter: Any, lease: int) -> None:
        self.counter = counter
        self.lease = lease
        self._buf: collections.deque[int] = collections.deque()
        self._pending: asyncio.Future[None] | None = None
        self._done = False

    def take(self) -> int | None:  # the Tickets protocol; the sending loop uses atake
        return self._buf.popleft() if self._buf else None

    async def atake(self) -> int | None:
        while True:
            if self._buf:
                seq = self._buf.popleft()
                self._prefetch()
                return seq
            if self._done:
                return None
            self._prefetch()
            assert self._pending is not None
            await asyncio.shield(self._pending)

    def _prefetch(self) -> None:
        if self._pending is None and not self._done and len(self._buf) <= self.lease:
            self._pending = asyncio.ensure_future(self._fetch())

    async def prime(self, n: int) -> None:
        """Lease ``n`` numbers before the start: the first wave (one per slot) waits on no round trip."""
        self._pending = asyncio.ensure_future(self._fetch(n))
        await asyncio.shield(self._pending)

    async def _fetch(self, n: int | None = None) -> None:
        try:
            start, end = await self.counter.take.remote(n or self.lease)
            self._done = start >= end
            self._buf.extend(range(start, end))
        finally:
            self._pending = None


class SenderActor:
    """One sending loop on a node of the cluster (a Ray actor; async, so its methods share one loop).

    ``skew_s`` adds a constant to every time this actor reports and to the start it is
    given, as a node whose clock is that far off would: it lets the tests show that the
    offsets are measured and removed. Zero outside tests.
    """

    def __init__(self, w: int, skew_s: float = 0.0) -> None:
        self.w = w
        self.skew = skew_s
        self.cancel = asyncio.Event()
        self.counters = Counters()
        self.out: list[Completion] = []
        self.engine: Any = None

    async def clock(self) -> float:
        return time.perf_counter() + self.skew

    async def where(self) -> dict[str, Any]:
        import ray

        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def prepare(
        self,
        spec: dict[str, Any],
        strategy: Strategy,
        requests: list[GenerationRequest],
        warmup: list[GenerationRequest],
        slots: list[int],
        counter: Any,
        lease: int,
    ) -> None:
        """Rebuild the client, open its session, warm up and open one connection per slot."""
        self.strategy, self.requests, self.slots = strategy, requests, slots
        self.tickets = LeasedTickets(counter, lease)
        self.engine = client_from_spec(spec)
        await self.engine.aopen()
        await warm_up(self.engine, warmup, self.cancel, len(slots))
        await self.engine.aconnect(len(slots))
        await self.tickets.prime(len(slots))
        gc.collect()
        gc.freeze()  # no collection pauses mid-stream (as the sender processes do)

    async def go(self, t0: float) -> None:
        """Send on the schedule from ``t0`` (this actor's clock) until the tickets run out."""
        real_t0 = t0 - self.skew
        skew = self.skew

        def emit(c: Completion) -> None:
            self.out.append(shift(c, skew))

        try:
            await send(
                self.engine, self.strategy, self.requests, self.tickets, real_t0, self.cancel, emit, self.counters,
                self.slots, True,
            )  # fmt: skip
        finally:
            await self.engine.aclose()

    async def drain(self) -> tuple[list[Completion], int, int]:
        """The requests finished since the last drain, and the live (tokens, in flight)."""
        out, self.out = self.out, []
        return out, self.counters.tokens, self.counters.in_flight

    async def stop(self) -> None:
        self.cancel.set()


def _reason(exc: BaseException) -> str:
    """One line for an actor's failure: its own exception's message where Ray kept it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ServerGone | MoEBenchError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


class RaySender:
    """Runs the sending loops as ``workers`` Ray actors (the cluster at ``address``)."""

    # Tests only: per actor, a clock offset to simulate (see SenderActor); () on real runs.
    simulated_skews_s: Sequence[float] = ()

    def __init__(self, spec: dict[str, Any], workers: int, address: str) -> None:
        self.spec = spec
        self.workers = workers
        self.address = check_address(address)
        self.cpu: dict[str, float] | None = None  # not measured on Ray actors
        skews = list(self.simulated_skews_s)[:workers]
        self.skews = skews + [0.0] * (workers - len(skews))
        self._live = [(0, 0)] * workers
        self.placement: list[dict[str, Any]] = []  # per actor: node, pid, clock offset, round trip
        self.actors: list[Any] = []

    def live(self) -> tuple[int, int]:
        return sum(t for t, _ in self._live), sum(f for _, f in self._live)

    def _connect(self) -> tuple[Any, bool]:
        ray = ray_module()
        if ray.is_initialized():
            return ray, False
        import bench
        import engines

        modules = [str(Path(m.__file__).parent) for m in (bench, engines)]  # type: ignore[arg-type]
        if self.address != "auto":  # Ray itself waits minutes for a cluster that is not there
            host, _, port = self.address.removeprefix("ray://").rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_CHECK_S) as sock:
                    answer = _http_probe(sock)
            except OSError as exc:
                raise MoEBenchError(
                    f"cannot join the Ray cluster at {self.address}: nothing answers there ({exc.strerror or exc}); "
                    "start one with `ray start --head` or check the address"
                ) from exc
            if answer.startswith(b"HTTP/1."):
                raise MoEBenchError(
                    f"cannot join the Ray cluster at {self.address}: an HTTP server answers there, not a Ray head "
                    "(give the head's GCS port, 6379 by default)"
                )
        outcome: list[BaseException | None] = []

        def join() -> None:
            try:
                ray.init(
                    address=self.address,
                    runtime_env={"py_modules": modules},
                    log_to_driver=False,
                    logging_level="ERROR",
                    configure_logging=False,
                )
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported below, in this thread
                outcome.append(exc)

        joiner = threading.Thread(target=join, name="ray-join", daemon=True)
        joiner.start()
        joiner.join(JOIN_TIMEOUT_S)
        if not outcome:  # Ray retries a head that does not answer as one for minutes
            raise MoEBenchError(
                f"cannot join the Ray cluster at {self.address}: no Ray head answered within {JOIN_TIMEOUT_S:g} s"
            )
        if outcome[0] is not None:
            first = " ".join(str(outcome[0]).split())[:300]
            raise MoEBenchError(f"cannot join the Ray cluster at {self.address}: {first}") from outcome[0]
        return ray, True

    def _clock_offsets(self, ray: Any) -> list[tuple[float, float]]:
        """(offset, round trip) per actor: the sample with the shortest round trip."""
        out = []
        for actor in self.actors:
            best: tuple[float, float] | None = None
            for _ in range(CLOCK_SAMPLES):
                sent = time.perf_counter()
                theirs = ray.get(actor.clock.remote(), timeout=READY_TIMEOUT_S)
                back = time.perf_counter()
                rtt = back - sent
                if best is None or rtt < best[1]:
                    best = (theirs - (sent + back) / 2, rtt)
            assert best is not None
            out.append(best)
        return out

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
        """As :meth:`bench.send.processes.InProcessSender.run`, with the sending loops on Ray actors."""
        ray, joined = self._connect()
        counter = None
        try:
            actor_cls = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(SenderActor)
            counter = ray.remote(num_cpus=0)(TicketCounter).remote(len(requests))
            self.actors = [actor_cls.remote(w, self.skews[w]) for w in range(self.workers)]
            where = ray.get([a.where.remote() for a in self.actors], timeout=READY_TIMEOUT_S)
            offsets = self._clock_offsets(ray)
            self.placement = [
                {"worker": w, **where[w], "clock_offset_ms": off * 1e3, "rtt_ms": rtt * 1e3}
                for w, (off, rtt) in enumerate(offsets)
            ]
            slots = split_slots(strategy.slots, self.workers)
            reqs = ray.put(light_requests(list(requests)))  # text only: HTTP engines send text
            light_warm = light_requests(warmup)
            ready = [
                a.prepare.remote(
                    self.spec, strategy, reqs, light_warm, slots[w], counter, max(1, min(LEASE_MAX, len(slots[w])))
                )
                for w, a in enumerate(self.actors)
            ]
            self._wait_ready(ray, ready, cancel)
            if cancel.is_set():
                return
            before_start()
            t0 = time.perf_counter() + START_LEAD_S
            runs = {a.go.remote(t0 + offsets[w][0]): w for w, a in enumerate(self.actors)}
            on_start(t0)
            self._collect(ray, runs, [off for off, _ in offsets], cancel, emit)
        finally:
            for a in [*self.actors, *([counter] if counter is not None else [])]:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            if joined:
                ray.shutdown()

    def _wait_ready(self, ray: Any, ready: list[Any], cancel: threading.Event) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {ref: w for w, ref in enumerate(ready)}
        while pending:
            if cancel.is_set():
                return
            if time.monotonic() > deadline:
                raise MoEBenchError(f"Ray sender actors not ready after {READY_TIMEOUT_S:.0f} s")
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.1)
            for ref in done:
                w = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:
                    raise MoEBenchError(f"Ray sender actor {w} ({self._node(w)}): {_reason(exc)}") from exc

    def _node(self, w: int) -> str:
        p = self.placement[w] if w < len(self.placement) else {}
        return f"pid {p.get('pid', '?')} on {p.get('node_ip', '?')}"

    def _collect(
        self,
        ray: Any,
        runs: dict[Any, int],
        offsets: list[float],
        cancel: threading.Event,
        emit: Callable[[Completion], None],
    ) -> None:
        errors: list[str] = []
        alive = set(range(self.workers))
        stopping = False

        def stop_all() -> None:
            nonlocal stopping
            if not stopping:
                stopping = True
                for w in alive:
                    self.actors[w].stop.remote()

        def drain(ws: Sequence[int]) -> None:
            refs = {self.actors[w].drain.remote(): w for w in ws}
            for ref, w in refs.items():
                try:
                    out, tokens, in_flight = ray.get(ref, timeout=DRAIN_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - a dead actor: its undrained requests are lost
                    alive.discard(w)
                    errors.append(f"Ray sender actor {w} ({self._node(w)}) died: {_reason(exc)}")
                    stop_all()
                    continue
                self._live[w] = (tokens, in_flight)
                for c in out:
                    emit(shift(c, -offsets[w]))

        pending = dict(runs)
        while pending:
            if cancel.is_set():
                stop_all()
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=EMIT_BATCH_S)
            for ref in done:
                w = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the run's reason
                    from ray.exceptions import RayActorError

                    if isinstance(exc, RayActorError):
                        if w in alive:
                            errors.append(f"Ray sender actor {w} ({self._node(w)}) died: {_reason(exc)}")
                        alive.discard(w)
                    else:
                        errors.append(f"Ray sender actor {w} ({self._node(w)}): {_reason(exc)}")
                    stop_all()
            drain(sorted(alive))
            self._live = [v if w in alive else (v[0], 0) for w, v in enumerate(self._live)]
        if errors:
            raise MoEBenchError("; ".join(dict.fromkeys(errors)))

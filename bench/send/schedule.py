"""When each request is sent: arrival strategies, pure and clock-free.

A run's requests are numbered ``0..n-1``. Every sending slot repeats one step: take
the next number (a *ticket*), wait until that request is due, send it, and when it
ends take the next ticket. A :class:`Strategy` says how many slots there are and when
a request is due; it never reads a clock, so the same strategy drives the real sender
(:mod:`bench.send`) and the fake-clock simulation below (:func:`simulate`), which the
tests use to check each strategy exactly.

- :class:`Sequential`: one slot (latency mode, seed 8.1.1).
- :class:`ClosedLoop`: ``concurrency`` slots, a request is due the moment its slot frees.
- :class:`OpenLoop`: arrivals of a gamma process at ``rate`` per second with shape
  ``burstiness`` (1 = Poisson), at most ``concurrency`` in flight (vllm bench's
  ``--request-rate`` with ``--max-concurrency``); a request finding every slot busy waits,
  and that wait is its send lag.

Tickets are handed out in order by a :class:`Tickets` source: a local counter, or one
shared by several sender processes (:class:`bench.send.processes.SharedTickets`), so the order
and the concurrency cap stay global when the slots are spread over processes.

Two options apply to every strategy:

- ``duration_s``: a duration-bound run. No request is sent after ``duration_s`` from the
  start (the ones in flight finish and are measured); the request count is then a cap.
- ``ramp_s``: a linear ramp-up. Closed loop: slot ``k`` of ``C`` opens at
  ``ramp_s * k / C``, so the load climbs from one request in flight to ``C``. Open loop:
  the arrival rate climbs linearly from 0 to ``rate`` over ``ramp_s``, then holds
  (the gamma process is run on the ramp's cumulative intensity, so its burstiness holds).
"""

from __future__ import annotations

import heapq
import math
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Due times in seconds from the run's start for ``n`` open-loop arrivals.

    The first request is due at 0; each gap is drawn from Gamma(shape=burstiness,
    scale=1/(request_rate*burstiness)), so the mean gap is 1/request_rate whatever
    the burstiness. The same seed gives the same schedule.
    """
    if n <= 0:
        return []
    if not (request_rate > 0 and math.isfinite(request_rate)):
        raise ValueError(f"request_rate must be a positive number of requests per second, not {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive number, not {burstiness}")
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    out = [0.0]
    for _ in range(n - 1):
        out.append(out[-1] + rng.gammavariate(burstiness, scale))
    return out


class Strategy(ABC):
    """How many requests may be in flight, and when each one is due (seconds from t0)."""

    name: str = ""

    @property
    @abstractmethod
    def slots(self) -> int:
        """Requests in flight at most."""

    @abstractmethod
    def due(self, seq: int, slot_free_s: float) -> float:
        """When request ``seq`` is due, given that the slot taking it freed at ``slot_free_s``."""

    def slot_start(self, slot: int) -> float:
        """When slot ``slot`` may send its first request (a ramp-up staggers these)."""
        return 0.0

    @property
    def deadline(self) -> float | None:
        """No request is sent after this (seconds from t0); None: the tickets bound the run."""
        return None

    @property
    def max_requests(self) -> int | None:
        """The most requests this schedule has a due time for (None: any number)."""
        return None

    @property
    def open_loop(self) -> bool:
        return False


@dataclass(frozen=True)
class ClosedLoop(Strategy):
    """``concurrency`` slots; each sends its next request as soon as its last one ends."""

    concurrency: int = 1
    duration_s: float | None = None
    ramp_s: float = 0.0
    name = "closed loop"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")

    @property
    def slots(self) -> int:
        return self.concurrency

    def due(self, seq: int, slot_free_s: float) -> float:
        return slot_free_s

    def slot_start(self, slot: int) -> float:
        return self.ramp_s * slot / self.concurrency

    @property
    def deadline(self) -> float | None:
        return self.duration_s


@dataclass(frozen=True)
class Sequential(ClosedLoop):
    """One request at a time (latency mode)."""

    concurrency: int = 1
    duration_s: float | None = None
    ramp_s: float = 0.0
    name = "sequential"

    def __post_init__(self) -> None:
        if self.concurrency != 1:
            raise ValueError("a sequential schedule has exactly one slot")


@dataclass(frozen=True)
class OpenLoop(Strategy):
    """Gamma arrivals at ``rate`` req/s (shape ``burstiness``), at most ``concurrency`` in flight."""

    offsets: tuple[float, ...]
    rate: float
    burstiness: float = 1.0
    concurrency: int = 1
    duration_s: float | None = None
    ramp_s: float = 0.0
    name = "open loop"

    @classmethod
    def make(
        cls,
        n: int,
        rate: float,
        burstiness: float = 1.0,
        concurrency: int = 1,
        seed: int = 0,
        duration_s: float | None = None,
        ramp_s: float = 0.0,
    ) -> OpenLoop:
        offsets = arrival_offsets(n, rate, burstiness, seed)
        if ramp_s > 0:
            offsets = [ramped(t, ramp_s) for t in offsets]
        if duration_s is not None:  # the arrivals after the deadline are never sent
            offsets = [t for t in offsets if t <= duration_s] or offsets[:1]
        return cls(tuple(offsets), rate, burstiness, concurrency, duration_s, ramp_s)

    @property
    def slots(self) -> int:
        return self.concurrency

    def due(self, seq: int, slot_free_s: float) -> float:
        return self.offsets[seq]

    @property
    def deadline(self) -> float | None:
        return self.duration_s

    @property
    def max_requests(self) -> int | None:
        return len(self.offsets)

    @property
    def open_loop(self) -> bool:
        return True


@dataclass(frozen=True)
class TraceSchedule(OpenLoop):
    """A trace's own arrivals (bench.trace): request ``i`` due at ``offsets[i]``, at most
    ``concurrency`` in flight; a request finding every slot busy waits, and that is its send lag."""

    name = "trace"

    @classmethod
    def of(cls, offsets: Sequence[float], concurrency: int, duration_s: float | None = None) -> TraceSchedule:
        due = list(offsets)
        if duration_s is not None:  # the arrivals after the deadline are never sent
            due = [t for t in due if t <= duration_s] or due[:1]
        n = len(due)
        rate = (n - 1) / due[-1] if n > 1 and due[-1] > 0 else float(n)
        return cls(tuple(due), rate, 1.0, concurrency, duration_s, 0.0)


def ramped(t: float, ramp_s: float) -> float:
    """An arrival at ``t`` of a constant-rate process, moved onto a rate that climbs linearly
    from 0 to that rate over ``ramp_s`` and then holds: the time where the ramp's cumulative
    intensity reaches ``rate * t``."""
    if t < ramp_s / 2:
        return math.sqrt(2.0 * ramp_s * t)
    return t + ramp_s / 2


def strategy_for(
    mode: str,
    n: int,
    concurrency: int,
    request_rate: float | None,
    burstiness: float,
    seed: int,
    duration_s: float | None = None,
    ramp_s: float = 0.0,
    arrivals: Sequence[float] | None = None,
) -> Strategy:
    """The strategy a run config asks for (``arrivals``: a trace's own due times)."""
    if arrivals is not None:
        return TraceSchedule.of(arrivals[:n], concurrency, duration_s)
    if mode == "latency":
        return Sequential(duration_s=duration_s)
    if request_rate is not None:
        return OpenLoop.make(n, request_rate, burstiness, concurrency, seed, duration_s, ramp_s)
    return ClosedLoop(concurrency, duration_s, ramp_s)


class Tickets(Protocol):
    """Hands out request numbers in order, each once; None when none are left."""

    def take(self) -> int | None: ...


class LocalTickets:
    """Tickets for the slots of one process (thread-safe)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            if self._next >= self.n:
                return None
            seq = self._next
            self._next += 1
            return seq

    def stop(self) -> None:
        """Hand out no more tickets (the requests already taken go on)."""
        with self._lock:
            self.n = min(self.n, self._next)


@dataclass(frozen=True)
class Planned:
    """One request as :func:`simulate` sends it (seconds from t0)."""

    seq: int
    slot: int
    due: float
    sent: float
    end: float

    @property
    def lag(self) -> float:
        return self.sent - self.due


def simulate(strategy: Strategy, service_s: Sequence[float]) -> list[Planned]:
    """Run ``strategy`` on a fake clock: request ``i`` takes ``service_s[i]`` seconds.

    Each slot takes the next ticket when it frees, waits until that request is due and
    sends it: the same steps as :mod:`bench.send`, with no real time passing. Returns
    the requests in ticket order.
    """
    n = len(service_s) if strategy.max_requests is None else min(len(service_s), strategy.max_requests)
    tickets = LocalTickets(n)
    # (time the slot is free, slot): slots take tickets in the order they free up
    free = [(strategy.slot_start(s), s) for s in range(strategy.slots)]
    heapq.heapify(free)
    out: list[Planned] = []
    while free:
        t_free, slot = heapq.heappop(free)
        seq = tickets.take()
        if seq is None:
            continue
        due = strategy.due(seq, t_free)
        sent = max(due, t_free)
        if strategy.deadline is not None and sent > strategy.deadline:
            continue
        end = sent + service_s[seq]
        out.append(Planned(seq, slot, due, sent, end))
        heapq.heappush(free, (end, slot))
    return sorted(out, key=lambda p: p.seq)

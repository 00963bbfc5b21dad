"""Static batching for the native engine: requests in flight decode together, up to N at once.

What the book's ``optimize(batch_size=32)`` implies, done the simple way: a batcher thread
takes the requests waiting (up to ``batch_size``, waiting until ``wait_s`` passes with no new
arrival so a wave arriving together batches together), left-pads their prompts to one length, and runs one
``generate`` for all of them. Each decode step's new token of each sequence goes to that
sequence's own stream at once, so each request is timed on its own (TTFT, TPOT, ITL); a
sequence that reaches its own ``max_tokens``, its EOS, or is cancelled ends its stream then
and its row is marked finished (``generate`` pads it from there on). The batch, being
static, ends when its last sequence does; requests that arrive meanwhile wait for the next
one. Requests batch only with requests of the same sampling (temperature, top_p,
ignore_eos); others wait for a batch of their own.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

END = object()  # a sequence's stream ends


@dataclass
class Failed:
    """A sequence's stream ends with this error (the batch's ``generate`` raised)."""

    error: BaseException


@dataclass(eq=False)
class Pending:
    """One request waiting for, or decoding in, a batch."""

    ids: list[int]
    max_tokens: int
    sampling: Any  # its SamplingParams: a batch decodes with its first request's (all share ``key``)
    out_q: queue.Queue[Any] = field(default_factory=queue.Queue)
    cancel: threading.Event | None = None
    left: threading.Event = field(default_factory=threading.Event)  # the consumer stopped reading

    @property
    def key(self) -> tuple[Any, ...]:
        """The sampling a request shares with its batch (lengths and seeds may differ)."""
        return (self.sampling.temperature, self.sampling.top_p, self.sampling.ignore_eos)

    @property
    def stopped(self) -> bool:
        return self.left.is_set() or (self.cancel is not None and self.cancel.is_set())


def left_pad(rows: list[list[int]], pad: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token rows left-padded with ``pad`` to one length, and their attention masks (0 on padding)."""
    width = max(len(r) for r in rows)
    return [[pad] * (width - len(r)) + r for r in rows], [[0] * (width - len(r)) + [1] * len(r) for r in rows]


# run(batch) runs one generate over the batch; BatchRows does the per-row bookkeeping.
RunBatch = Callable[[list[Pending]], None]


class BatchRows:
    """Per-row bookkeeping of a running batch: which rows are done, and their streams.

    ``step(tokens)`` takes one decode step's tokens (one per row) and routes each to its
    row's stream; ``done()`` are the rows ``generate`` may stop (a stopping criterion's
    answer); ``finish(error)`` ends every stream still open."""

    def __init__(self, rows: list[Pending], eos_ids: set[int], stop_at_eos: bool) -> None:
        self.rows = rows
        self.eos_ids = eos_ids
        self.stop_at_eos = stop_at_eos
        self.count = [0] * len(rows)
        self.closed = [False] * len(rows)

    def _close(self, i: int, item: Any = END) -> None:
        if not self.closed[i]:
            self.closed[i] = True
            self.rows[i].out_q.put(item)

    def step(self, tokens: list[int]) -> None:
        for i, tok in enumerate(tokens):
            if self.closed[i]:
                continue
            row = self.rows[i]
            if row.stopped:
                self._close(i)
                continue
            row.out_q.put([tok])
            self.count[i] += 1
            if self.count[i] >= row.max_tokens or (self.stop_at_eos and tok in self.eos_ids):
                self._close(i)

    def done(self) -> list[bool]:
        for i, row in enumerate(self.rows):
            if row.stopped:
                self._close(i)
        return list(self.closed)

    def finish(self, error: BaseException | None = None) -> None:
        for i in range(len(self.rows)):
            self._close(i, Failed(error) if error is not None else END)


# A batch waits ``wait_s`` after its last arrival, and at most this many times ``wait_s`` after its
# first: a closed loop's first wave (or a wave of requests finishing together) arrives over tens of
# ms on a busy host, and a fixed window cut it into a small batch and a large one that then
# alternated for the whole run (11 and 117 of 128 on an H100, 2026-12-06).
WAVE_WAIT_FACTOR = 50


class StaticBatcher:
    """The batcher thread (started on first use, stopped by :meth:`close`)."""

    def __init__(self, run: RunBatch, batch_size: int, wait_s: float, name: str = "native-batcher") -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.run = run
        self.batch_size = batch_size
        self.wait_s = wait_s
        self.name = name
        self._waiting: collections.deque[Pending] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.batches: list[int] = []  # the size of each batch run (tests, describe)

    def submit(self, item: Pending) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._waiting.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cv.notify_all()
        for item in waiting:
            item.out_q.put(Failed(RuntimeError("the engine was stopped")))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    def _take(self) -> list[Pending] | None:
        """The next batch: the oldest waiting request and up to ``batch_size - 1`` more with its
        sampling, taken once full or once ``wait_s`` passes with no new arrival (at most
        :data:`WAVE_WAIT_FACTOR` x ``wait_s`` after the first); None once closed."""
        with self._cv:
            while not self._waiting and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            start = time.monotonic()
            cap = start + self.wait_s * WAVE_WAIT_FACTOR
            quiet_until, seen = start + self.wait_s, len(self._waiting)
            while True:
                key = self._waiting[0].key
                same = sum(1 for p in self._waiting if p.key == key)
                now = time.monotonic()
                if len(self._waiting) > seen:  # a wave still arriving: wait for its rest
                    quiet_until, seen = min(cap, now + self.wait_s), len(self._waiting)
                left = quiet_until - now
                if same >= self.batch_size or left <= 0 or self._closed:
                    break
                self._cv.wait(timeout=left)
            batch: list[Pending] = []
            keep: collections.deque[Pending] = collections.deque()
            for p in self._waiting:
                if p.key == key and len(batch) < self.batch_size and not p.stopped:
                    batch.append(p)
                elif p.stopped:
                    p.out_q.put(END)  # cancelled while waiting: nothing was generated
                else:
                    keep.append(p)
            self._waiting = keep
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            self.batches.append(len(batch))
            try:
                self.run(batch)
            except BaseException as exc:  # noqa: BLE001 - every stream of the batch gets the reason
                for p in batch:
                    p.out_q.put(Failed(exc))

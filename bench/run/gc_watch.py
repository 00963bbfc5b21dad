"""Python garbage-collector pauses in the measuring process, while a run measures.

A full (generation 2) collection walks every tracked object of the process. With a model
loaded in-process (the native engine: torch, transformers, the model's modules) that is
hundreds of thousands of objects: about 80-100 ms on this 2-core machine for the
V2-Lite-shaped model's 366k objects, and every thread (the decode loop, the senders) waits
for it. One such pause lands on every sequence in flight at once, so at batch 128 it is
the p99 of the inter-token gaps.

Two things here, both in :func:`bench.run.execute`:

- the heap as it stands when the clock starts (the engine, the model, the prompts) is
  collected once and frozen (``gc.freeze``: moved to a generation the collector never walks,
  as vLLM does after its start-up) and unfrozen when the run ends, so a collection during the
  run walks only what the run itself allocates;
- :class:`GcWatch` times every collection during the run (``gc.callbacks``); the run keeps
  the counts, the total and longest pause, and each pause of 10 ms or more with its time
  (artifact ``gc_pauses``); the CLI notes the long ones.

Only this process is watched: sender processes and servers have their own collectors.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

LONG_MS = 10.0  # a pause this long is kept with its time
KEEP = 100  # at most this many long pauses kept


class GcWatch:
    """Times this process's garbage collections between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.t0: float | None = None  # the run's clock start (perf_counter), for the pauses' times
        self.counts = [0, 0, 0]
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.max_generation: int | None = None
        self.long: list[dict[str, Any]] = []
        self.frozen = 0
        self._began: dict[int, float] = {}  # thread id -> the collection's start
        self._on = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        me = threading.get_ident()
        if phase == "start":
            self._began[me] = now
            return
        began = self._began.pop(me, None)
        if began is None:
            return
        ms = (now - began) * 1000.0
        gen = int(info.get("generation", 0))
        self.counts[min(gen, 2)] += 1
        self.total_ms += ms
        if ms > self.max_ms:
            self.max_ms, self.max_generation = ms, gen
        if ms >= LONG_MS and len(self.long) < KEEP:
            t = None if self.t0 is None else round(began - self.t0, 3)
            self.long.append({"t_s": t, "generation": gen, "ms": round(ms, 2), "collected": info.get("collected")})

    def start(self, freeze: bool = True) -> None:
        """Collect and freeze the heap as it stands (``freeze``), then time every collection."""
        if freeze:
            gc.collect()
            gc.freeze()
            self.frozen = gc.get_freeze_count()
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True

    def stop(self) -> None:
        if self._on:
            gc.callbacks.remove(self._callback)
            self._on = False
        if self.frozen:
            gc.unfreeze()  # the next collections walk it again (an unloaded model's cycles are freed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "collections": {f"gen{g}": n for g, n in enumerate(self.counts)},
            "total_ms": round(self.total_ms, 2),
            "max_ms": round(self.max_ms, 2),
            "max_generation": self.max_generation,
            "long_ms": LONG_MS,
            "long": self.long,
            "frozen_objects": self.frozen,
        }


def note(found: dict[str, Any]) -> str | None:
    """One line for the CLI when the run had pauses of :data:`LONG_MS` or more, else None."""
    long = found.get("long") or []
    if not long:
        return None
    worst = max(long, key=lambda p: p["ms"])
    when = "" if worst.get("t_s") is None else f" at {worst['t_s']:.2f} s"
    return (
        f"Python GC paused this process {len(long)} time(s) for {found.get('long_ms', LONG_MS):g} ms or more "
        f"(longest {worst['ms']:.0f} ms, generation {worst['generation']}{when}): every token in flight then waited"
    )

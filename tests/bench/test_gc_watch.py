"""GC pauses in the measuring process: the heap is frozen for the run and unfrozen after it,
every collection during the run is timed, and a long one is kept with its time and noted by
the CLI (a pause lands on every token in flight at once). Real collections throughout; a long
pause is made by a slow gc callback of the test's own."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.config import RunConfig
from bench.run.artifacts import ARTIFACT_GC
from bench.run.gc_watch import GcWatch, note
from bench.run.manager import start_run
from bench.store import Store


@pytest.fixture
def slow_collections() -> Iterator[list[int]]:
    """Every collection takes 15 ms more (a callback that sleeps once the collector is done:
    it runs before the watch's own, so the watch sees the whole of it)."""
    seen: list[int] = []

    def slow(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            seen.append(info["generation"])
            time.sleep(0.015)

    gc.callbacks.insert(0, slow)
    try:
        yield seen
    finally:
        gc.callbacks.remove(slow)


def test_the_watch_freezes_times_and_unfreezes() -> None:
    watch = GcWatch()
    watch.start()
    try:
        assert watch.frozen == gc.get_freeze_count() > 1000  # the interpreter's own objects at least
        watch.t0 = time.perf_counter()
        gc.collect(0)
        gc.collect(2)
    finally:
        watch.stop()
    assert gc.get_freeze_count() == 0
    found = watch.as_dict()
    assert found["collections"]["gen0"] >= 1 and found["collections"]["gen2"] >= 1
    assert found["max_ms"] >= 0 and found["total_ms"] >= found["max_ms"]
    assert gc.callbacks.count(watch._callback) == 0  # no callback left behind


def test_long_pauses_are_kept_with_their_time(slow_collections: list[int]) -> None:
    watch = GcWatch()
    watch.start(freeze=False)
    watch.t0 = time.perf_counter()
    try:
        gc.collect(1)
    finally:
        watch.stop()
    (pause,) = watch.long
    assert pause["generation"] == 1 and pause["ms"] >= 15.0 and 0 <= pause["t_s"] < 1.0
    line = note(watch.as_dict())
    assert line is not None and line.startswith("Python GC paused this process 1 time(s) for 10 ms or more (longest")
    assert "generation 1 at 0.00 s" in line
    assert note(GcWatch().as_dict()) is None  # no long pause: no note


def _run(store: Store, engine: object, requests: int, concurrency: int, input_len: int, output_len: int) -> Any:
    """A completed native concurrency run: its snapshot and its gc_pauses artifact."""
    cfg = RunConfig.build(
        engine={"kind": "native"}, mode="concurrency", requests=requests, concurrency=concurrency,
        workload={"source": "random", "input_len": input_len, "output_len": output_len},
    )  # fmt: skip
    snap = start_run(cfg, store, engine=engine).wait(120)  # type: ignore[arg-type]
    assert snap.status == "completed", snap.error
    found = store.artifact(snap.run_id, ARTIFACT_GC)
    assert isinstance(found, dict)
    return snap, found


def test_a_run_keeps_its_gc_pauses(store: Store, native_engine: object, slow_collections: list[int]) -> None:
    snap, found = _run(store, native_engine, 8, 4, 32, 16)
    assert found["frozen_objects"] > 1000
    assert sum(found["collections"].values()) == len(found["long"]) >= 1  # each one 15 ms: all kept
    run = store.get_run(snap.run_id)
    assert run is not None and run.summary is not None
    assert all(0 <= p["t_s"] <= run.summary.duration_s + 1 for p in found["long"])
    assert gc.get_freeze_count() == 0  # unfrozen after the run


def test_the_freeze_can_be_turned_off(store: Store, native_engine: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """MOEBENCH_GC_FREEZE=off: nothing frozen, the pauses still timed (to see what the freeze changes)."""
    monkeypatch.setenv("MOEBENCH_GC_FREEZE", "off")
    _, found = _run(store, native_engine, 4, 2, 16, 8)
    assert found["frozen_objects"] == 0
    assert set(found["collections"]) == {"gen0", "gen1", "gen2"}

"""Issue 45 §3: Stop ends a run at once, whatever else is going on: the in-flight requests are
abandoned (sender processes, HTTP streams, the native engine's generation in its host process)
and what was measured is kept.

Real parts only: the stub server streaming slowly to two sender processes, the tiny model in a
spawned engine host, real SQLite stores. The bounds are a small share of what the requests
would take to finish on their own, so they test that the cancel reaches them, not speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.config import RunConfig
from bench.run.engine_host import HostedEngine, RemoteJob
from bench.run.manager import start_run
from bench.store import Store
from engines.base import parse_options

NATIVE = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"}
STOPPED_WITHIN_S = 2.0


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_stop_abandons_slow_http_streams_in_the_sender_processes(store: Store) -> None:
    """Each stream needs 64 x 200 ms = 12.8 s; the run is cancelled within 2 s of Stop, its four
    in-flight requests recorded as cancelled with part of their tokens."""
    from bench.stub_server import start_stub_server

    url, stub = start_stub_server(itl_ms=200.0)
    try:
        cfg = RunConfig.build(
            engine={"kind": "openai", "base_url": url},
            mode="concurrency",
            requests=64,
            concurrency=4,
            workers=2,
            warmup=0,
            workload={"source": "builtin", "output_len": 64},
        )
        job = start_run(cfg, store)
        _wait(lambda: job.snapshot().in_flight == 4, 60, "four streams in flight")
        time.sleep(1.0)  # a few tokens into each stream
        t = time.perf_counter()
        job.cancel()
        _wait(lambda: job.status == "cancelled", 30, "the run to end")
        took = time.perf_counter() - t
        assert took < STOPPED_WITHIN_S, f"cancelled {took:.2f} s after Stop (a stream needs 12.8 s)"
        snap = job.wait(10)
        recs = store.records(snap.run_id)  # type: ignore[arg-type]
        assert len(recs) == 4 and all(r.error == "cancelled" for r in recs)
        assert all(0 < r.output_tokens < 64 for r in recs)
        assert snap.summary is not None and snap.summary.cancelled == 4 and snap.summary.failed == 0
    finally:
        stub.stop()


@pytest.fixture(scope="module")
def hosted(tiny_model: object) -> Iterator[HostedEngine]:
    engine = HostedEngine(parse_options(NATIVE))
    engine.start()
    yield engine
    engine.stop()


def test_a_stop_reaches_the_hosted_run_while_the_hosts_pipe_is_busy(hosted: HostedEngine, store: Store) -> None:
    """The dashboard's native runs execute in the engine host; every call to it (the mirror's
    snapshots, the sidebar's memory reads) takes turns on one pipe. A Stop must not queue behind
    them: here a call holds the pipe for the whole check, and the run still ends cancelled in the
    store (written by the host) within 2 s, with what it measured."""
    cfg = RunConfig.build(
        engine=NATIVE,
        mode="concurrency",
        requests=400,
        concurrency=2,
        warmup=0,
        workload={"source": "random", "input_len": 16, "output_len": 256},
    )
    job = start_run(cfg, store, engine=hosted)
    assert isinstance(job, RemoteJob)
    _wait(lambda: job.snapshot().status == "running" and job.snapshot().in_flight > 0, 120, "the run to start")
    time.sleep(0.5)
    run_id = job.run_id
    assert run_id is not None
    with hosted.host._lock:  # a call in progress on the pipe (as a slow memory read would be)
        t = time.perf_counter()
        job.cancel()
        deadline = t + 10
        while time.perf_counter() < deadline:
            run = store.get_run(run_id)
            if run is not None and run.status != "running":
                break
            time.sleep(0.02)
        took = time.perf_counter() - t
    run = store.get_run(run_id)
    assert run is not None and run.status == "cancelled", f"still {run.status if run else None} after {took:.1f} s"
    assert took < STOPPED_WITHIN_S, f"the host ended the run {took:.2f} s after Stop"
    snap = job.wait(30)
    assert snap.status == "cancelled"
    assert run.summary is not None and run.summary.cancelled == 2 and run.summary.failed == 0
    assert store.sample_count(run_id) == run.summary.requests  # what was measured is kept

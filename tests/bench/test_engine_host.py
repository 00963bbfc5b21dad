"""The engine host: the dashboard's native engine in a child process, runs executed there.

Real parts only: the tiny DeepSeek-V3 loaded in a spawned host process, real runs written
to a real SQLite store, a real SIGKILL of the host mid-run.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from bench.config import RunConfig
from bench.run import engine_host
from bench.run.engine_host import HostedEngine, RemoteJob
from bench.run.manager import start_run
from engines.base import EngineOptions, parse_options
from engines.native import NativeEngine

ENGINE = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"}


def _cfg(requests: int = 4, output_len: int = 4, **extra: object) -> RunConfig:
    return RunConfig.build(
        mode="latency",
        engine=ENGINE,
        workload={"source": "random", "input_len": 16, "output_len": output_len},
        requests=requests,
        concurrency=1,
        warmup=0,
        **extra,
    )


@pytest.fixture
def hosting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("MOEBENCH_MODEL_HOST", raising=False)
    engine_host.enable(True)
    yield
    engine_host.enable(False)


@pytest.fixture(scope="module")
def hosted(tiny_model: object) -> Iterator[HostedEngine]:
    """One host process with the tiny model, shared by the tests of this module."""
    engine = HostedEngine(parse_options(ENGINE))
    phases: list[str] = []
    engine.start(lambda msg, frac: phases.append(msg))
    assert phases[0] == "starting the engine host process" and "ready" in phases
    yield engine
    engine.stop()


def test_only_a_process_that_hosts_gets_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    opts: EngineOptions = parse_options(ENGINE)
    engine_host.enable(False)
    assert isinstance(engine_host.make_engine(opts), NativeEngine)  # the CLI: inline
    engine_host.enable(True)
    try:
        assert isinstance(engine_host.make_engine(opts), HostedEngine)
        assert not engine_host.wants_host(parse_options({"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}))
        monkeypatch.setenv("MOEBENCH_MODEL_HOST", "inline")
        assert isinstance(engine_host.make_engine(opts), NativeEngine)
    finally:
        engine_host.enable(False)


def test_the_model_loads_and_reports_from_another_process(hosted: HostedEngine) -> None:
    info = hosted.describe()
    pid = info["engine_host_pid"]
    assert pid != os.getpid()
    os.kill(pid, 0)  # alive
    assert info["engine"] == "native" and info["parameters"] > 0
    mem = hosted.memory()
    assert mem is not None and mem.allocated_bytes > 0  # the host's memory, not ours
    assert hosted.health() is None


def test_a_run_executes_in_the_host_and_lands_in_the_store(hosted: HostedEngine, store) -> None:
    job = start_run(_cfg(requests=4), store, engine=hosted)
    assert isinstance(job, RemoteJob)
    assert job.run_id is not None and store.get_run(job.run_id).status == "running"  # recorded at once
    snap = job.wait(120)
    assert snap.status == "completed", snap.error
    assert snap.done == 4 and snap.failed == 0 and snap.summary is not None
    run = store.get_run(job.run_id)
    assert run.status == "completed" and run.summary.completed == 4
    assert len(store.records(job.run_id)) == 4
    # The run was measured in the host: its stored engine info is the host's engine's.
    assert run.engine_info.get("parameters") == hosted.describe()["parameters"]
    assert hosted.health() is None  # the host stays loaded for the next run


def test_stop_cancels_in_the_host_and_nothing_is_failed(hosted: HostedEngine, store) -> None:
    job = start_run(_cfg(requests=400, output_len=16), store, engine=hosted)
    deadline = time.monotonic() + 60
    while job.snapshot().done < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel()
    snap = job.wait(60)
    assert snap.status == "cancelled"
    assert snap.failed == 0 and 2 <= snap.done < 400
    run = store.get_run(job.run_id)
    assert run.status == "cancelled" and run.summary is not None and run.summary.completed >= 2


def test_a_run_without_an_engine_gets_its_own_host_which_is_gone_after(hosting: None, store, tiny_model) -> None:
    job = start_run(_cfg(requests=2), store)
    assert isinstance(job, RemoteJob) and job.owns_engine
    snap = job.wait(180)
    assert snap.status == "completed", snap.error
    assert job.engine._host is not None and not job.engine._host.proc.is_alive()


def test_a_host_killed_mid_run_fails_the_run_and_keeps_what_it_stored(hosting: None, store, tiny_model) -> None:
    engine = HostedEngine(parse_options(ENGINE))
    engine.start()
    try:
        job = start_run(_cfg(requests=400, output_len=16), store, engine=engine)
        deadline = time.monotonic() + 60
        while len(store.records(job.run_id)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(engine.describe()["engine_host_pid"], signal.SIGKILL)
        snap = job.wait(30)
        assert snap.status == "failed"
        assert "engine host process" in snap.error and "-9" in snap.error
        run = store.get_run(job.run_id)
        assert run.status == "failed" and "engine host process" in run.error
        stored = len(store.records(job.run_id))
        assert stored >= 2 and run.summary is not None and run.summary.completed == stored
        assert engine.health() is not None  # says the host is gone
    finally:
        engine.stop()

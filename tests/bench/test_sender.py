"""The sending core, the recorder and the sender processes, driven by the fake engine
(deterministic chunk timings: tests/fakes.py) and a real SQLite store."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bench.config import RunConfig
from bench.metrics.records import RequestRecord, percentile
from bench.metrics.summary import summarize
from bench.run.manager import start_run
from bench.run.recorder import Distribution, Recorder
from bench.send.core import Completion
from bench.send.schedule import arrival_offsets
from bench.store import Store
from tests.fakes import peak_overlap


def _run(store: Store, kind: str, wait: float = 60, **kw: object):  # type: ignore[no-untyped-def]
    engine = {"kind": kind, **kw.pop("engine", {})}  # type: ignore[dict-item]
    base: dict[str, object] = {
        "engine": engine,
        "mode": "concurrency",
        "workload": {"source": "builtin", "output_len": 4},
        "requests": 40,
        "concurrency": 4,
    }
    base.update(kw)
    job = start_run(RunConfig.build(**base), store)
    return job, job.wait(wait)


def _peak_overlap(recs: list[RequestRecord]) -> int:
    return peak_overlap([(r.start_s, r.end_s) for r in recs])


@pytest.mark.parametrize("processes,workers", [(False, 1), (True, 1), (True, 2)])
@pytest.mark.parametrize("async_stream", [True, False])
def test_every_request_is_sent_once_within_the_global_cap(
    store: Store, fake_engine_kind: str, processes: bool, workers: int, async_stream: bool
) -> None:
    _, snap = _run(
        store,
        fake_engine_kind,
        engine={"processes": processes, "async_stream": async_stream},
        requests=60,
        concurrency=5,
        workers=workers,
    )
    assert snap.status == "completed", snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert sorted(r.request_id for r in recs) == sorted(f"r{i}" for i in range(60))
    assert all(r.ok and r.output_tokens == 4 and len(r.chunk_times_s) == 4 for r in recs)
    assert _peak_overlap(recs) <= 5  # the cap holds over all workers together
    assert _peak_overlap(recs) >= 4  # and the slots were used
    # The first wave leaves together (all 5 within a few ms of the start).
    first = sorted(r.start_s for r in recs)[:5]
    assert first[-1] - first[0] < 0.05
    s = snap.summary
    assert s is not None and s.completed == 60 and s.send_lag_ms is not None and s.send_lag_ms.count == 60


def test_open_loop_rate_holds_across_sender_processes(store: Store, fake_engine_kind: str) -> None:
    _, snap = _run(
        store,
        fake_engine_kind,
        engine={"processes": True},
        requests=30,
        concurrency=8,
        workers=2,
        request_rate=40.0,
        burstiness=1.0,
        workload={"source": "builtin", "output_len": 3, "seed": 5},
    )
    assert snap.status == "completed", snap.error
    due = arrival_offsets(30, 40.0, 1.0, seed=5)
    for r in store.records(snap.run_id):  # type: ignore[arg-type]
        i = int(r.request_id.lstrip("r"))
        assert r.send_lag_ms is not None
        assert r.start_s == pytest.approx(due[i] + r.send_lag_ms / 1000, abs=1e-6)
        assert r.send_lag_ms > -0.01  # never ahead of the schedule


def test_warm_up_is_sent_first_and_not_recorded(store: Store, fake_engine_kind: str) -> None:
    from engines.base import create_engine

    engine = create_engine({"kind": fake_engine_kind})
    engine.start()
    cfg = RunConfig.build(
        engine={"kind": fake_engine_kind},
        requests=6,
        concurrency=3,
        warmup=2,
        workload={"source": "builtin", "output_len": 2},
    )
    snap = start_run(cfg, store, engine=engine).wait(30)
    assert snap.status == "completed", snap.error
    assert engine.sent[:2] == ["warmup0", "warmup1"] and sorted(engine.sent[2:]) == [f"r{i}" for i in range(6)]  # type: ignore[attr-defined]
    assert len(store.records(snap.run_id)) == 6  # type: ignore[arg-type]
    assert min(r.start_s for r in store.records(snap.run_id)) >= 0  # type: ignore[arg-type]


@pytest.mark.parametrize("async_stream", [True, False])
def test_warm_up_goes_at_the_runs_concurrency(store: Store, fake_engine_kind: str, async_stream: bool) -> None:
    """A server meets the run's batch size in the warm-up (vLLM compiles a kernel per new batch
    size: a first wave that met it cold waited ~0.9 s on an H100), never more than it."""
    from engines.base import create_engine

    options = {"kind": fake_engine_kind, "async_stream": async_stream, "ttft_s": 0.05}
    engine = create_engine(options)
    engine.start()
    cfg = RunConfig.build(
        engine=options,
        requests=4,
        concurrency=3,
        warmup=5,
        workload={"source": "builtin", "output_len": 2},
    )
    snap = start_run(cfg, store, engine=engine).wait(30)
    assert snap.status == "completed", snap.error
    spans = engine.spans  # type: ignore[attr-defined]
    warm = sorted(spans[f"warmup{i}"] for i in range(5))
    most = max(sum(1 for b, e in warm if b <= t < e) for t, _ in warm)
    assert most == 3  # the first three together, then one in each freed slot
    first_run = min(b for rid, (b, _) in spans.items() if rid.startswith("r"))
    assert max(e for _, e in warm) <= first_run  # all warmed up before the clock


def test_failed_requests_are_recorded_and_the_run_goes_on(store: Store, fake_engine_kind: str) -> None:
    _, snap = _run(store, fake_engine_kind, engine={"processes": True, "fail_every": 4}, requests=20)
    assert snap.status == "completed", snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    failed = sorted(int(r.request_id.lstrip("r")) for r in recs if not r.ok)
    assert failed == [3, 7, 11, 15, 19] and all("scripted failure" in (r.error or "") for r in recs if not r.ok)
    assert snap.summary is not None and snap.summary.failed == 5 and snap.summary.completed == 15


def test_cancel_reaches_the_sender_processes(store: Store, fake_engine_kind: str) -> None:
    job, _ = _run(
        store,
        fake_engine_kind,
        wait=0,
        engine={"processes": True, "itl_s": 0.05},
        requests=400,
        concurrency=4,
        workers=2,
        workload={"source": "builtin", "output_len": 20},
    )
    deadline = time.time() + 30
    while time.time() < deadline and job.snapshot().done < 4:
        time.sleep(0.05)
    t = time.perf_counter()
    job.cancel()
    snap = job.wait(10)
    assert time.perf_counter() - t < 5
    assert snap.status == "cancelled"
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert 4 <= len(recs) < 400
    assert any(r.error == "cancelled" for r in recs)  # the ones in flight end as cancelled
    # ... and are counted as cancelled, not as failures
    s = snap.summary
    assert s is not None and s.failed == 0 and s.cancelled == sum(r.error == "cancelled" for r in recs) > 0
    assert s.requests == s.completed + s.cancelled == len(recs)


def test_workers_on_an_in_process_engine_is_a_failed_run_with_the_reason(store: Store, fake_engine_kind: str) -> None:
    _, snap = _run(store, fake_engine_kind, engine={"processes": False}, workers=2)
    assert snap.status == "failed"
    assert "sends from the process that loaded the model" in (snap.error or "")


def test_recorder_keeps_a_negative_send_lag(store: Store) -> None:
    rec = Recorder(store, run_id=1)
    rec.t0 = 100.0
    early = Completion(
        seq=0,
        request_id="r0",
        start=100.010,
        end=100.5,
        chunk_times=(100.2, 100.3),
        prompt_tokens=4,
        output_tokens=2,
        usage_output_tokens=2,
        first_any=100.2,
        due=100.015,
        error=None,
    )
    r = rec.record(early)
    assert r.send_lag_ms == pytest.approx(-5.0)  # sent 5 ms early: shown, not clamped to 0
    assert r.start_s == pytest.approx(0.010) and r.chunk_times_s == pytest.approx([0.2, 0.3])


def test_recorder_recounts_text_when_usage_disagrees(store: Store, tiny_model: object) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    text = "the quick brown fox jumps over the lazy dog " * 3
    n = len(tok.encode(text, add_special_tokens=False))
    rec = Recorder(store, run_id=1, tokenizer=tok)
    rec.t0 = 0.0
    c = Completion(0, "r0", 0.0, 1.0, (0.1, 0.2), 4, 2, n, 0.1, 0.0, None, text)
    assert rec.record(c).output_tokens == n  # 2 chunks, but the text holds n tokens


def test_recorder_writes_in_batches_and_its_live_summary_matches_the_exact_one(store: Store) -> None:
    run_id = store.create_run(mode="concurrency", engine="fake", model="m", accelerator="cpu", config={})
    slos = ["ttft_ms:p90<=25", "tpot_ms:p99<=30"]
    rec = Recorder(store, run_id, slos=slos)
    rec.start()
    rec.t0 = 0.0
    rng = random.Random(3)
    for i in range(3000):
        start = rng.uniform(0, 50)
        gaps = [rng.lognormvariate(-4, 0.5) for _ in range(8)]
        chunks = [start + 0.02 + sum(gaps[: k + 1]) for k in range(8)]
        rec.put(Completion(i, f"r{i}", start, chunks[-1] + 0.001, tuple(chunks), 16, 8, 8, chunks[0], start, None))
    rec.close()
    assert store.sample_count(run_id) == 3000
    exact = summarize(rec.records(), slos=slos)
    live = rec.live_summary(exact.duration_s)
    assert live is not None and live.completed == exact.completed == 3000
    # goodput counts the same requests live as at the end; the live verdict agrees here
    assert live.good_requests == exact.good_requests and 0 < exact.good_requests < 3000  # type: ignore[operator]
    assert live.goodput_rps == pytest.approx(exact.goodput_rps) and live.slo_met == exact.slo_met
    assert live.output_tokens == exact.output_tokens
    assert live.tokens_per_chunk == exact.tokens_per_chunk == 1.0  # 8 tokens in 8 chunks
    assert live.single_chunk_share == exact.single_chunk_share == 0.0 and not live.bursty
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        a, b = getattr(live, name), getattr(exact, name)
        # the exact summary reads the store, which keeps times to the microsecond
        assert a.count == b.count and a.mean == pytest.approx(b.mean, rel=1e-6)
        for q in ("p50", "p90", "p99"):
            assert getattr(a, q) == pytest.approx(getattr(b, q), rel=0.02), (name, q)


def test_distribution_percentiles_within_one_percent_with_signs() -> None:
    rng = random.Random(11)
    xs = [rng.gauss(0.5, 3.0) for _ in range(20000)] + [0.0] * 50
    d = Distribution()
    for x in xs:
        d.add(x)
    for q in (1, 10, 50, 90, 99):
        exact = percentile(xs, q)
        assert exact is not None
        assert d.quantile(q) == pytest.approx(exact, rel=0.02, abs=0.01), q
    batch = Distribution()
    batch.add_many(xs)  # the vectorized path buckets exactly as one value at a time
    assert batch.buckets == d.buckets and batch.count == d.count and (batch.min, batch.max) == (d.min, d.max)
    assert batch.sum == pytest.approx(d.sum) and batch.sumsq == pytest.approx(d.sumsq)
    other = Distribution()
    for x in xs[:100]:
        other.add(x)
    merged = Distribution()
    merged.merge(d)
    merged.merge(other)
    assert merged.count == d.count + 100 and len(d.buckets) < 2000


@pytest.mark.slow
def test_sender_processes_stop_when_their_parent_is_killed(tmp_path: Path, tiny_model: object) -> None:
    """A CLI killed mid-run (SIGKILL: no clean-up runs) leaves no sender process sending, and
    the run, found interrupted, is summarized exactly from the requests it had stored."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from bench.stub_server import start_stub_server

    url, stub = start_stub_server(itl_ms=20.0)
    try:
        argv = [
            sys.executable, "-m", "bench", "run", "--engine", "openai", "--base-url", url,
            "--requests", "100000", "--concurrency", "4", "--workers", "2", "--output-len", "64",
            "--prompts", "builtin", "--quiet", "--db", str(tmp_path / "db.sqlite"),
        ]  # fmt: skip
        cli = subprocess.Popen(argv, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        senders: list[psutil.Process] = []
        while time.time() < deadline and len(senders) < 2:
            senders = [p for p in psutil.Process(cli.pid).children(recursive=True) if "spawn" in " ".join(p.cmdline())]
            time.sleep(0.2)
        assert len(senders) == 2, "the sender processes did not start"
        db = tmp_path / "db.sqlite"
        while time.time() < deadline and Store(db).sample_count(1) < 20:
            time.sleep(0.2)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(10)
        _, alive = psutil.wait_procs(senders, timeout=10)
        assert not alive, f"sender processes still running after their parent died: {alive}"
        (run,) = Store(db).list_runs()  # opening the store finds the run's process gone
        stored = Store(db).sample_count(run.id)
        assert run.status == "interrupted" and stored >= 20
        assert run.summary is not None and run.summary.requests == stored and run.summary.output_tokens > 0
    finally:
        stub.stop()


def test_a_server_that_goes_away_is_not_hammered_and_fails_the_run(store: Store) -> None:
    """Once the server refuses connections, each slot backs off (50 ms doubling to 1 s)
    instead of burning through the run's requests in milliseconds, until the health
    check ends the run with its reason."""
    from bench.stub_server import start_stub_server

    url, stub = start_stub_server(itl_ms=5.0)
    try:
        cfg = RunConfig.build(
            engine={"kind": "openai", "base_url": url},
            mode="concurrency",
            requests=2000,
            concurrency=2,
            workload={"source": "builtin", "output_len": 8},
        )
        job = start_run(cfg, store)
        deadline = time.time() + 60
        while time.time() < deadline and job.snapshot().done < 20:
            time.sleep(0.05)
        assert job.snapshot().done >= 20
    finally:
        stub.stop()
    snap = job.wait(60)
    assert snap.status == "failed"
    assert snap.error is not None and "no request reached the server for 15 s" in snap.error, snap.error
    assert "\n" not in snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    refused = sorted(r.start_s for r in recs if r.error and "could not connect" in r.error)
    assert refused, [r.error for r in recs if r.error][:3]
    # ~15 s until the health check gives up, 2 slots waiting up to 1 s each between tries.
    assert len(refused) < 80, len(refused)
    assert len(recs) < 2000


@pytest.mark.parametrize("workers", [1, 2])
def test_sender_processes_get_prompts_block_by_block_in_order(
    store: Store, fake_engine_kind: str, tmp_path: Path, workers: int
) -> None:
    """700 requests span three blocks of prompts: the first go with the processes, the rest
    are fed ahead of the tickets. Each request must get its own prompt: line i % 5 of the
    file asks for i % 5 + 1 tokens, so the output length tells which prompt was sent."""
    f = tmp_path / "p.jsonl"
    f.write_text("".join(f'{{"prompt": "line {k}", "output_len": {k + 1}}}\n' for k in range(5)))
    _, snap = _run(
        store,
        fake_engine_kind,
        engine={"processes": True, "ttft_s": 0.0, "itl_s": 0.0},
        workload={"source": "jsonl", "path": str(f)},
        requests=700,
        concurrency=8,
        workers=workers,
        wait=120,
    )
    assert snap.status == "completed", snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert len(recs) == 700
    assert all(r.output_tokens == int(r.request_id[1:]) % 5 + 1 for r in recs)


def test_requests_the_store_refuses_fail_the_run_but_are_counted(tmp_path: Path, fake_engine_kind: str) -> None:
    """A store that fails a batch (disk full): the run ends failed saying so, and its summary
    still counts every request (the refused ones are kept in memory for it)."""
    import sqlite3

    class Flaky(Store):
        calls = 0

        def add_samples(self, run_id, items):  # type: ignore[no-untyped-def]
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise sqlite3.OperationalError("database or disk is full")
            super().add_samples(run_id, items)

    store = Flaky(tmp_path / "db.sqlite")
    _, snap = _run(store, fake_engine_kind, requests=60, concurrency=2, engine={"itl_s": 0.01})
    assert snap.status == "failed" and "could not store" in (snap.error or "")
    assert "database or disk is full" in (snap.error or "") and "the summary counts them" in (snap.error or "")
    assert snap.summary is not None and snap.summary.requests == 60
    assert 0 < store.sample_count(snap.run_id) < 60  # type: ignore[arg-type]


def test_a_busy_other_process_is_named_as_the_runs_disturbance(store: Store, fake_engine_kind: str) -> None:
    """A real CPU burner beside the run: the host series are stored per second and the summary
    says the run was disturbed, naming the burner's process."""
    import os
    import signal
    import subprocess
    import sys

    from bench.run.host_load import HOST_SERIES

    # Not a child of this process (that would be MoE Bench's own tree): the shell that starts it exits.
    started = subprocess.run(
        ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    burner_pid = int(started.stdout.strip())
    try:
        _, snap = _run(store, fake_engine_kind, requests=120, concurrency=2, engine={"itl_s": 0.02})
    finally:
        os.kill(burner_pid, signal.SIGKILL)
    assert snap.status == "completed", snap.error
    s = snap.summary
    assert s is not None and s.other_cpu_cores is not None and s.other_cpu_cores >= 0.5
    assert s.disturbance is not None and f"pid {burner_pid}," in s.disturbance
    names = {name for _, name, _ in store.timeseries(snap.run_id)}  # type: ignore[arg-type]
    assert set(HOST_SERIES) <= names
    assert store.get_run(snap.run_id).summary.disturbance == s.disturbance  # type: ignore[arg-type, union-attr]


def test_a_quiet_host_leaves_no_disturbance(store: Store, fake_engine_kind: str) -> None:
    _, snap = _run(store, fake_engine_kind, requests=60, concurrency=2, engine={"itl_s": 0.02})
    s = snap.summary
    assert s is not None and s.other_cpu_cores is not None and s.client_cpu_cores is not None
    if s.other_cpu_cores < 0.5 and (s.steal_pct or 0) < 5 and s.load_warning is None:
        assert s.disturbance is None
    else:  # this shared machine was busy: then the reason must say so
        assert s.disturbance is not None


def test_an_in_process_engines_send_threads_are_up_before_the_clock(tiny_model: object) -> None:
    """The native engine's ``stream`` runs in the sender's threads: all of them start before t0,
    so the first wave of a closed loop leaves together (started on demand, 128 of them took
    30-50 ms of the clock, and the runs were flagged client-bound)."""
    import threading

    from bench.send.processes import InProcessSender
    from bench.send.schedule import ClosedLoop
    from engines.base import GenerationRequest, SamplingParams, create_engine

    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"})
    engine.start()
    try:
        at_start: list[int] = []
        sent: list[Completion] = []
        requests = [
            GenerationRequest(f"r{i}", "", SamplingParams(max_tokens=2), prompt_token_ids=(100 + i, 101, 102))
            for i in range(6)
        ]
        strategy = ClosedLoop(concurrency=6)
        InProcessSender(engine).run(
            strategy,
            requests,
            [],
            threading.Event(),
            sent.append,
            lambda: None,
            lambda t0: at_start.append(sum(t.name.startswith("send") for t in threading.enumerate())),
        )
        assert at_start == [6]  # one thread per slot, all up when the clock starts
        assert len(sent) == 6 and all(c.error is None for c in sent)
    finally:
        engine.stop()

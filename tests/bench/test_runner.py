"""Background runs on the real native engine and a real SQLite store."""

from __future__ import annotations

import csv
import io
import itertools
import time

import pytest

from bench.config import RunConfig
from bench.report.csv_export import summary_csv
from bench.run.manager import JobManager, start_run
from bench.run.recorder import SERIES_DONE, SERIES_IN_FLIGHT, SERIES_MEM_PEAK, SERIES_OUTPUT_TOK_S
from bench.store import Store
from engines.errors import ConfigError


def _config(**kw: object) -> RunConfig:
    base: dict[str, object] = {
        "engine": {"kind": "native"},
        "mode": "concurrency",
        "workload": {"source": "random", "input_len": 32, "output_len": 16},
        "requests": 8,
        "concurrency": 4,
    }
    base.update(kw)
    return RunConfig.build(**base)


def test_concurrency_run_records_every_request(store: Store, native_engine: object) -> None:
    t0 = time.perf_counter()
    job = start_run(_config(), store, engine=native_engine)  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 0.5  # never blocks the caller
    snap = job.wait(120)
    assert snap.status == "completed", snap.error
    assert snap.done == snap.total == 8 and snap.failed == 0
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert len(recs) == 8 and sum(r.output_tokens for r in recs) == 8 * 16
    assert all(r.prompt_tokens == 32 for r in recs)
    run = store.get_run(snap.run_id)  # type: ignore[arg-type]
    assert run is not None and run.status == "completed" and run.summary is not None
    s = run.summary
    assert s.output_tokens == 128 and s.prompt_tokens == 256
    assert s.output_throughput_tok_s == pytest.approx(128 / s.duration_s)
    assert s.peak_memory_gib and s.peak_memory_gib > 0.1
    assert run.engine_info["parameters"] > 1_000_000
    names = {n for _t, n, _v in store.timeseries(snap.run_id)}  # type: ignore[arg-type]
    assert {SERIES_IN_FLIGHT, SERIES_DONE, SERIES_MEM_PEAK} <= names
    in_flight = [v for _t, n, v in store.timeseries(snap.run_id, [SERIES_IN_FLIGHT])]  # type: ignore[arg-type]
    assert max(in_flight) <= 4


def test_latency_mode_is_sequential_after_warmup(store: Store, native_engine: object) -> None:
    job = start_run(_config(mode="latency", requests=4, concurrency=8, warmup=2), store, engine=native_engine)  # type: ignore[arg-type]
    snap = job.wait(120)
    assert snap.status == "completed"
    recs = sorted(store.records(snap.run_id), key=lambda r: r.start_s)  # type: ignore[arg-type]
    assert len(recs) == 4  # warm-up requests are not recorded
    for a, b in itertools.pairwise(recs):
        assert b.start_s >= a.end_s  # one at a time
    assert store.get_run(snap.run_id).concurrency == 1  # type: ignore[arg-type, union-attr]


def test_live_progress_and_cancel_within_two_seconds(store: Store, native_engine: object) -> None:
    job = start_run(
        _config(requests=400, concurrency=2, workload={"source": "builtin", "output_len": 64}, sample_interval_s=0.2),
        store,
        engine=native_engine,  # type: ignore[arg-type]
    )
    deadline = time.time() + 60
    while time.time() < deadline and job.snapshot().done < 3:
        time.sleep(0.1)
    time.sleep(0.5)
    mid = job.snapshot()
    assert mid.status == "running" and 3 <= mid.done < 400 and mid.summary is not None
    assert mid.summary.completed >= 3
    t_cancel = time.perf_counter()
    job.cancel()
    snap = job.wait(5)
    assert time.perf_counter() - t_cancel < 2.0
    assert snap.status == "cancelled"
    run = store.get_run(snap.run_id)  # type: ignore[arg-type]
    assert run is not None and run.status == "cancelled"
    assert store.sample_count(run.id) >= mid.done  # nothing measured is lost
    assert len(store.timeseries(run.id, [SERIES_OUTPUT_TOK_S])) >= 2


def test_engine_start_failure_is_a_failed_run_with_the_reason(store: Store) -> None:
    job = start_run(_config(engine={"kind": "native", "model": "/nonexistent/model"}), store)
    snap = job.wait(30)
    assert snap.status == "failed" and "does not exist" in (snap.error or "")
    run = store.get_run(snap.run_id)  # type: ignore[arg-type]
    assert run is not None and run.status == "failed" and "does not exist" in (run.error or "")


def test_unavailable_accelerator_fails_the_run_with_the_reason(store: Store) -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("CUDA build of torch")
    snap = start_run(_config(engine={"kind": "native", "accelerator": "cuda"}), store).wait(30)
    assert snap.status == "failed" and "accelerator 'cuda' is unavailable" in (snap.error or "")


def test_bad_configs_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"concurrency: Input should be greater than or equal to 1"):
        _config(concurrency=0)
    with pytest.raises(ConfigError, match="unknown engine 'nope'"):
        _config(engine={"kind": "nope"})
    with pytest.raises(ConfigError, match=r"workload\.output_len"):
        _config(workload={"output_len": 0})


def test_job_manager_allows_one_run_at_a_time(store: Store, native_engine: object) -> None:
    jm = JobManager(store)
    job = jm.submit(_config(requests=50, workload={"source": "builtin", "output_len": 32}), engine=native_engine)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="already in progress"):
        jm.submit(_config(), engine=native_engine)  # type: ignore[arg-type]
    assert jm.active() is job
    jm.cancel_all()
    assert jm.active() is None and jm.latest("concurrency") is job


def test_open_loop_run_follows_its_schedule_and_records_send_lag(store: Store, native_engine: object) -> None:
    from bench.send.schedule import arrival_offsets

    cfg = _config(
        requests=6,
        concurrency=2,
        request_rate=4.0,
        burstiness=2.0,
        workload={"source": "random", "input_len": 16, "output_len": 4, "seed": 3},
    )
    snap = start_run(cfg, store, engine=native_engine).wait(120)  # type: ignore[arg-type]
    assert snap.status == "completed", snap.error
    recs = {int(r.request_id.lstrip("r")): r for r in store.records(snap.run_id)}  # type: ignore[arg-type]
    due = arrival_offsets(6, 4.0, 2.0, seed=3)
    assert sorted(recs) == list(range(6))
    for i, rec in recs.items():
        # The lag is measured against the schedule's own due time (not clamped): start = due + lag.
        assert rec.send_lag_ms is not None
        assert rec.start_s == pytest.approx(due[i] + rec.send_lag_ms / 1000, abs=1e-6)
        assert rec.send_lag_ms > -0.01  # the sender never sends ahead of the schedule
    run = store.get_run(snap.run_id)  # type: ignore[arg-type]
    assert run is not None and run.summary is not None
    assert run.summary.request_rate == 4.0 and run.summary.burstiness == 2.0
    assert run.summary.send_lag_ms is not None and run.summary.send_lag_ms.count == 6
    csv_text = summary_csv(store, [snap.run_id]).decode()  # type: ignore[list-item]
    # csv, not split(","): a disturbed run's note (other busy processes, named) holds commas
    (row,) = list(csv.DictReader(io.StringIO(csv_text)))
    assert row["request_rate"] == "4"


def test_closed_loop_send_lag_is_the_gap_after_the_slot_frees(store: Store, native_engine: object) -> None:
    snap = start_run(_config(requests=6, concurrency=2), store, engine=native_engine).wait(120)  # type: ignore[arg-type]
    assert snap.status == "completed", snap.error
    recs = sorted(store.records(snap.run_id), key=lambda r: r.start_s)  # type: ignore[arg-type]
    assert all(r.send_lag_ms is not None for r in recs)
    ends = sorted(r.end_s for r in recs)
    # Each of the later requests is due when some earlier request ended: its start minus its
    # lag is one of the end times (the two first ones are due at the run's start, 0).
    for r in recs:
        due = r.start_s - r.send_lag_ms / 1000  # type: ignore[operator]
        assert abs(due) < 1e-3 or min(abs(due - e) for e in ends) < 1e-3
    assert store.get_run(snap.run_id).summary.request_rate is None  # type: ignore[arg-type, union-attr]


def test_request_rate_is_refused_for_latency_runs() -> None:
    with pytest.raises(ConfigError, match="request_rate applies to concurrency"):
        _config(mode="latency", request_rate=2.0)
    with pytest.raises(ConfigError, match="request_rate"):
        _config(request_rate=-1.0)
    # 0 is the forms' "closed loop"
    assert _config(request_rate=0).request_rate is None


def test_graphs_are_captured_before_the_clock_for_every_batch_size_the_run_can_form(store: Store) -> None:
    """The native engine with captured decode steps (capture faked on the CPU, as in
    tests/engines/test_native_tuning.py) and batch_size 4 at concurrency 3: the run's prepare step
    captures sizes 1, 2 and 4 (3 rows run in 4) before the clock, says so in its artifact, and the
    measured window captures nothing."""
    from engines.base import create_engine
    from engines.graphs import GraphedDecoder
    from tests.engines.test_native_tuning import _fake_capture

    engine = create_engine(
        {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "cache": "static", "batch_size": 4}
    )
    engine.start()
    try:
        engine._graphed = GraphedDecoder(engine.model)  # type: ignore[attr-defined]
        _fake_capture(engine._graphed)  # type: ignore[attr-defined]
        job = start_run(_config(requests=9, concurrency=3, warmup=0), store, engine=engine)
        snap = job.wait(120)
        assert snap.status == "completed", snap.error
        prepared = store.artifact(snap.run_id, "engine_prepare")  # type: ignore[arg-type]
        assert prepared is not None and prepared["seconds"] >= 0
        assert prepared["text"].startswith("decode step captured for batch sizes 1, 2, 4 (prompts up to 32 tokens")
        assert engine._graphed.captures == 3  # type: ignore[attr-defined]  # all before the clock
        assert set(engine._batcher.batches) <= {1, 2, 3}  # type: ignore[attr-defined]
        run = store.get_run(snap.run_id)  # type: ignore[arg-type]
        assert run is not None and run.engine_info["tuning"]["cuda_graphs_captured"] == 3
    finally:
        engine.stop()

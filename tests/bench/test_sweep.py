"""Sweeps and capacity searches against the stub server that slows with load (real HTTP,
real sender processes, a real SQLite file), and the duration-bound runs they build on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from bench.sweep.axes import number_list
from bench.sweep.spec import CapacitySpec, SweepSpec, sweep_points
from bench.sweep.task import SweepTask
from engines.errors import ConfigError

# Each stream waits LOAD_MS more per other stream in flight: at concurrency c the first
# token comes after about (c - 1) * LOAD_MS, so TTFT p99 <= SLO_MS passes up to c = 3
# (~40 ms) and fails from c = 4 (~60 ms), with ~10 ms of room either side.
LOAD_MS = 20.0
SLO = "ttft_ms:p99<=50"


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    from bench.stub_server import start_stub_server

    url, proc = start_stub_server(itl_ms=1.0, load_ms=LOAD_MS)
    try:
        yield url
    finally:
        proc.stop()


def _base(url: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "engine": {"kind": "openai", "base_url": url},
        "workload": {"source": "builtin", "output_len": 4},
        "requests": 16,
        "server_metrics": False,
        "slos": [SLO],
    }
    base.update(kw)
    return base


def test_capacity_search_agrees_with_a_brute_force_sweep(store: Store, stub_url: str) -> None:
    sweep = SweepTask(SweepSpec.build(base=_base(stub_url), concurrency=list(range(1, 8))), store).begin()
    snap = sweep.wait(300)
    assert snap.status == "completed", snap.error
    points = sweep_points(store, snap.sweep_id)  # type: ignore[arg-type]
    assert [p.point["concurrency"] for p in points] == list(range(1, 8))
    assert all(len(p.runs) == 1 and p.runs[0].status == "completed" for p in points)
    assert all(p.runs[0].sweep_id == snap.sweep_id for p in points)
    passing = [p.point["concurrency"] for p in points if p.summaries[0].slo_met]
    brute = max(passing)
    assert passing == list(range(1, brute + 1))  # it passes up to a point, then fails
    cap = SweepTask(CapacitySpec.build(base=_base(stub_url), axis="concurrency", start=1, maximum=64), store).begin()
    res = cap.wait(300)
    assert res.status == "completed", res.error
    r = res.result
    assert r["fails_at"] - r["passes_at"] <= 1 and r["converged"]
    assert abs(r["passes_at"] - brute) <= 1, (r, brute)  # within one step of the brute force
    assert r["runs"] == len(r["probes"]) <= 12
    assert "passes at concurrency" in r["verdict"] and "fails at concurrency" in r["verdict"]
    probe_runs = store.sweep_runs(res.sweep_id)  # type: ignore[arg-type]
    assert len(probe_runs) == r["runs"]  # each probe a stored run of the search
    row = store.get_sweep(res.sweep_id)  # type: ignore[arg-type]
    assert row is not None and row.kind == "capacity" and row.status == "completed"


def test_a_sweep_stops_a_line_on_an_slo_broken_by_a_margin(store: Store, stub_url: str) -> None:
    spec = SweepSpec.build(base=_base(stub_url), concurrency=[1, 2, 6, 8, 12], stop_on_slo_margin=0.5)
    snap = SweepTask(spec, store).begin().wait(300)
    assert snap.status == "completed", snap.error
    ran = [p.point["concurrency"] for p in sweep_points(store, snap.sweep_id)]  # type: ignore[arg-type]
    assert ran == [1, 2, 6]  # c=6 is ~100 ms against 50 ms: more than 50 % over
    (stop,) = snap.result["stopped"]
    assert stop["after"] == {"concurrency": 6} and stop["reason"].startswith("SLO broken by")


def test_saturation_stop_and_repeats_with_their_spread(store: Store, stub_url: str) -> None:
    # With the load model, output tok/s stops rising past a few streams: the line stops there.
    spec = SweepSpec.build(
        base=_base(stub_url, slos=[]), concurrency=[1, 2, 4, 8, 16, 32], repeats=2, stop_on_saturation=0.10
    )
    snap = SweepTask(spec, store).begin().wait(300)
    assert snap.status == "completed", snap.error
    points = sweep_points(store, snap.sweep_id)  # type: ignore[arg-type]
    assert 2 <= len(points) < 6 and all(len(p.runs) == 2 for p in points)
    (stop,) = snap.result["stopped"]
    assert stop["reason"].startswith("saturated:")
    lo, hi = points[0].spread("output_throughput_tok_s")  # type: ignore[misc]
    mean = points[0].mean("output_throughput_tok_s")
    assert mean is not None and lo <= mean <= hi
    assert {r.sweep_point["repeat"] for r in points[0].runs} == {0, 1}  # type: ignore[index]


def test_a_killed_sweep_resumes_and_keeps_its_finished_points(tmp_path: Path, stub_url: str) -> None:
    db = tmp_path / "sweep.sqlite"
    argv = [
        sys.executable, "-m", "bench", "sweep", "--engine", "openai", "--base-url", stub_url,
        "--prompts", "builtin", "--output-len", "4", "--requests", "12", "--concurrency", "1..8",
        "--slo", SLO, "--no-server-metrics", "--db", str(db), "--name", "resumable",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    store = Store(db)
    deadline = time.time() + 120
    while time.time() < deadline:
        sweeps = store.list_sweeps()
        if sweeps and sum(r.status == "completed" for r in store.sweep_runs(sweeps[0].id)) >= 2:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    store = Store(db)  # a new process: the sweep and its run in flight are marked interrupted
    (row,) = store.list_sweeps()
    assert row.status == "interrupted"
    kept = [r.id for r in store.sweep_runs(row.id) if r.status == "completed"]
    assert len(kept) >= 2
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "sweep",
            "--resume",
            str(row.id),
            "--db",
            str(db),
            "--csv",
            str(tmp_path / "s.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    store = Store(db)
    runs = store.sweep_runs(row.id)
    done = [r for r in runs if r.status == "completed"]
    assert [r.id for r in done][: len(kept)] == kept  # kept, not re-run
    assert sorted(r.sweep_point["concurrency"] for r in done) == [1, 2, 4, 8]  # type: ignore[index]
    assert store.get_sweep(row.id).status == "completed"  # type: ignore[union-attr]
    assert "best" in out.stdout and f"sweep id      {row.id}" in out.stdout
    csv_lines = (tmp_path / "s.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(runs) and "concurrency" in csv_lines[0]


def test_duration_bound_run_sends_nothing_after_its_end(store: Store, fake_engine_kind: str) -> None:
    cfg = RunConfig.build(
        engine={"kind": fake_engine_kind, "ttft_s": 0.01, "itl_s": 0.01},
        workload={"source": "builtin", "output_len": 5},
        concurrency=4,
        duration_s=1.0,
    )
    assert cfg.requests == 1_000_000  # a cap; the duration bounds the run
    snap = start_run(cfg, store).wait(60)
    assert snap.status == "completed", snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert max(r.start_s for r in recs) <= 1.0 + 0.02
    assert 4 * 12 <= len(recs) <= 4 * 20  # ~60 ms per request on 4 slots for 1 s
    assert len({r.request_id for r in recs}) == len(recs)  # cycled prompts, distinct ids


@pytest.mark.parametrize(
    "data,reason",
    [
        ({}, "nothing to sweep"),
        ({"concurrency": [1, 2], "stop_on_slo_margin": 0.5}, "stop_on_slo_margin needs SLOs"),
        ({"concurrency": [0, 2]}, "values must be above 0"),
        ({"concurrency": list(range(1, 40)), "request_rate": [float(x) for x in range(1, 40)]}, "more than 1000"),
    ],
)
def test_bad_sweeps_have_a_one_line_reason(data: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        SweepSpec.build(base={"engine": {"kind": "native"}}, **data)
    assert reason in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="needs at least one SLO"):
        CapacitySpec.build(base={})


def test_sweep_lists_and_the_grid_order() -> None:
    assert number_list(int, "c")("1..32") == [1, 2, 4, 8, 16, 32]
    assert number_list(int, "c")("8..32+8,2") == [2, 8, 16, 24, 32]
    assert number_list(float, "r")("0.5,1.5") == [0.5, 1.5]
    spec = SweepSpec.build(base={}, concurrency=[4, 1], lengths=[(128, 16), (32, 8)])
    assert spec.points() == [
        {"input_len": 128, "output_len": 16, "concurrency": 1},
        {"input_len": 128, "output_len": 16, "concurrency": 4},
        {"input_len": 32, "output_len": 8, "concurrency": 1},
        {"input_len": 32, "output_len": 8, "concurrency": 4},
    ]
    cfg = spec.run_config(spec.points()[2])
    assert (cfg.workload.input_len, cfg.workload.output_len, cfg.concurrency) == (32, 8, 1)
    rate = SweepSpec.build(base={"engine": {"kind": "vllm"}}, request_rate=[2.0], engine_axis={"max_num_seqs": [8]})
    assert rate.run_config(rate.points()[0]).engine["max_num_seqs"] == 8
    with pytest.raises(ConfigError, match="max_num_seqs"):  # the native engine has no such option
        SweepSpec.build(base={}, concurrency=[1], engine_axis={"max_num_seqs": [8]})
    assert rate.run_config(rate.points()[0]).concurrency == 256  # an open loop needs room in flight


def test_a_capacity_search_over_a_traces_replay_speed(store: Store, stub_url: str, tmp_path: Path) -> None:
    """A trace replayed faster and faster (axis speedup: time_scale = 1 / speed-up) until TTFT breaks
    its SLO on the stub that slows with load; each probe is the same trace at its own speed."""
    from bench.trace import synth, write_jsonl

    trace = write_jsonl(synth(40, 10.0, seed=2, prefix_groups=0, input_len=16, output_len=4), tmp_path / "t.jsonl")
    base = _base(stub_url, workload={"source": "trace", "path": str(trace)}, requests=40)
    with pytest.raises(ConfigError, match="axis speedup"):
        CapacitySpec.build(base=base, axis="rate")
    with pytest.raises(ConfigError, match="give a trace workload"):
        CapacitySpec.build(base=_base(stub_url), axis="speedup")
    res = SweepTask(CapacitySpec.build(base=base, axis="speedup", start=1, maximum=256, step=1), store).begin()
    snap = res.wait(300)
    assert snap.status == "completed", snap.error
    r = snap.result
    assert r["converged"] and r["fails_at"] - r["passes_at"] <= 1 and "trace replay speed" in r["verdict"]
    by_value = {p["value"]: p for p in r["probes"]}
    assert by_value[r["passes_at"]]["passed"] and not by_value[r["fails_at"]]["passed"]
    for run in store.sweep_runs(snap.sweep_id):  # type: ignore[arg-type]
        value = next(p["value"] for p in r["probes"] if p["run_id"] == run.id)
        assert run.config["workload"]["time_scale"] == pytest.approx(1 / value)
        assert run.summary is not None and run.summary.completed == 40


def test_capacity_under_an_interactivity_floor_is_one_command(tmp_path: Path, stub_url: str) -> None:
    """The most in flight while users still stream at 33 tok/s or more (issue 48): each gap waits
    LOAD_MS per other stream, so TPOT is ~21 ms at 2 in flight (~47 tok/s per user) and ~41 ms at 3
    (~24 tok/s); the search must settle between them."""
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--db", str(tmp_path / "c.sqlite"), "capacity", "--engine", "openai",
         "--base-url", stub_url, "--prompts", "builtin", "--output-len", "8", "--requests", "12",
         "--no-server-metrics", "--axis", "concurrency", "--start", "1", "--max", "16",
         "--slo", "interactivity_tok_s:p50>=33"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    store = Store(tmp_path / "c.sqlite")
    row = store.list_sweeps()[0]
    assert row.kind == "capacity" and row.status == "completed"
    assert row.result["passes_at"] == 2 and row.result["fails_at"] == 3, row.result
    assert "tok/s per user p50 ≥ 33 tok/s" in out.stdout + str(row.result), out.stdout[-1500:]

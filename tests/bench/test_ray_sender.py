"""Load generation on a real local Ray cluster (``ray start --head``, stopped after the module)
against the zero-compute stub server: the same workload sent by local sender processes and
by Ray actors gives the same requests and tokens; an actor whose node clock is an hour off
still lands on the driver's time line; a killed actor fails the run with its reason and
keeps what was measured; what cannot work is refused in one line before anything is sent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.config import RunConfig
from bench.run.artifacts import ARTIFACT_LOAD_GENERATORS
from bench.run.manager import start_run
from bench.store import Store
from engines.errors import ConfigError
from engines.launch import free_port

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="Ray is installed by make test (requirements-ray.txt)")

RAY = Path(sys.executable).with_name("ray")


CLIENT_PORT: dict[str, int] = {}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A one-node Ray cluster started for these tests: its address (host:port); its Ray Client
    server (ray://) listens on CLIENT_PORT["port"]."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    CLIENT_PORT["port"] = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # the driver (this process) too
    argv = [
        str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=4",
        "--include-dashboard=false", "--object-store-memory=100000000", "--disable-usage-stats", f"--temp-dir={tmp}",
        f"--ray-client-server-port={CLIENT_PORT['port']}",
    ]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    from bench.stub_server import start_stub_server

    url, stub = start_stub_server(itl_ms=2.0)
    try:
        yield url
    finally:
        stub.stop()


def _config(url: str, ray_address: str | None, **kw: object) -> RunConfig:
    base: dict[str, object] = {
        "engine": {"kind": "openai", "base_url": url},
        "mode": "concurrency",
        "requests": 160,
        "concurrency": 6,
        "workers": 2,
        "workload": {"source": "builtin", "output_len": 12},
        "server_metrics": False,
        "device_telemetry": False,
        "ray_address": ray_address,
    }
    base.update(kw)
    return RunConfig.build(**base)


def test_ray_actors_and_local_processes_send_the_same_run(
    ray_cluster: str, stub_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same workload, local sender processes vs 2 Ray actors, the second on a clock an hour
    ahead: same requests and tokens, every time on the driver's clock, the cap held."""
    from bench.send.ray import RaySender

    monkeypatch.setattr(RaySender, "simulated_skews_s", (0.0, 3600.0))
    snaps, took = {}, {}
    for where in ("local", "ray"):
        t = time.perf_counter()
        job = start_run(_config(stub_url, ray_cluster if where == "ray" else None), store)
        snaps[where] = job.wait(180)
        took[where] = time.perf_counter() - t
        assert snaps[where].status == "completed", snaps[where].error
    local = store.records(snaps["local"].run_id)  # type: ignore[arg-type]
    remote = store.records(snaps["ray"].run_id)  # type: ignore[arg-type]
    assert len(local) == len(remote) == 160
    assert sorted(r.request_id for r in remote) == sorted(r.request_id for r in local)
    assert sum(r.output_tokens for r in remote) == sum(r.output_tokens for r in local) == 160 * 12
    assert sum(r.prompt_tokens for r in remote) == sum(r.prompt_tokens for r in local)
    assert all(r.ok for r in remote)
    # The hour is measured and removed: every request starts and ends within the run.
    wall = snaps["ray"].summary.duration_s  # type: ignore[union-attr]
    assert 0 < wall < took["ray"], (wall, took)
    assert all(-0.05 <= r.start_s <= r.end_s <= wall + 0.05 for r in remote), (wall, remote[0])
    first = sorted(r.start_s for r in remote)[:6]
    assert first[-1] - first[0] < 0.1, first  # the first wave leaves together on both actors
    from tests.fakes import peak_overlap

    assert 4 <= peak_overlap([(r.start_s, r.end_s) for r in remote]) <= 6  # the global cap
    placed = store.artifact(snaps["ray"].run_id, ARTIFACT_LOAD_GENERATORS)  # type: ignore[arg-type]
    assert [a["worker"] for a in placed["actors"]] == [0, 1]
    offsets = [a["clock_offset_ms"] for a in placed["actors"]]
    assert abs(offsets[0]) < 50 and abs(offsets[1] - 3_600_000) < 50, offsets
    assert len({a["pid"] for a in placed["actors"]}) == 2 and all(a["pid"] != os.getpid() for a in placed["actors"])
    assert store.artifact(snaps["local"].run_id, ARTIFACT_LOAD_GENERATORS) is None  # type: ignore[arg-type]
    from dashboard.data import senders_line

    line = senders_line(store, snaps["ray"].run_id)  # type: ignore[arg-type]
    assert line is not None and line.startswith("Sent from 2 Ray actors on 1 node") and "+3600000" in line, line


def _actor_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if "ray::SenderActor" in " ".join(p.info["cmdline"] or []):
            out.append(p)
    return out


def test_a_killed_actor_fails_the_run_with_its_reason_and_keeps_what_was_measured(
    ray_cluster: str, store: Store
) -> None:
    from bench.stub_server import start_stub_server

    url, stub = start_stub_server(itl_ms=20.0)
    try:
        job = start_run(_config(url, ray_cluster, requests=100_000, concurrency=4), store)
        deadline = time.time() + 120
        while time.time() < deadline and job.snapshot().done < 30:
            time.sleep(0.1)
        assert job.snapshot().done >= 30, job.snapshot().error
        actors = _actor_processes()
        assert len(actors) == 2, [p.info["cmdline"] for p in actors]
        os.kill(actors[1].pid, signal.SIGKILL)
        snap = job.wait(120)
    finally:
        stub.stop()
    assert snap.status == "failed"
    assert snap.error is not None and "\n" not in snap.error
    assert "Ray sender actor" in snap.error and "died" in snap.error, snap.error
    kept = store.records(snap.run_id)  # type: ignore[arg-type]
    assert len(kept) >= 30 and sum(r.output_tokens for r in kept if r.ok) > 0
    assert snap.summary is not None and snap.summary.requests == len(kept)
    assert not _actor_processes()  # the other actor was stopped and removed


def test_what_cannot_run_on_ray_is_refused_in_one_line(ray_cluster: str, stub_url: str, store: Store) -> None:
    for bad in ("nowhere", "ray://host", "host:99999", "http://h:1"):
        with pytest.raises(ConfigError, match="ray_address"):
            _config(stub_url, bad)
    # Nothing listens there: refused at once, not after Ray's minutes of retries.
    dead = f"127.0.0.1:{free_port()}"
    t = time.perf_counter()
    snap = start_run(_config(stub_url, dead), store).wait(60)
    assert snap.status == "failed" and "cannot join the Ray cluster" in (snap.error or ""), snap.error
    assert "\n" not in (snap.error or "") and time.perf_counter() - t < 30
    # An engine whose model is in this process cannot send from another machine.
    cfg = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3"},
        mode="concurrency",
        requests=2,
        concurrency=1,
        ray_address=ray_cluster,
        device_telemetry=False,
    )
    snap = start_run(cfg, store).wait(120)
    assert snap.status == "failed" and "Ray load generation applies to engines reached over HTTP" in (
        snap.error or ""
    ), snap.error


def test_cli_ray_run_prints_where_its_senders_ran(ray_cluster: str, stub_url: str, tmp_path: Path) -> None:
    """Through Ray Client (ray://host:port), as from a laptop outside the cluster."""
    client = f"ray://127.0.0.1:{CLIENT_PORT['port']}"
    argv = [
        sys.executable, "-m", "bench", "run", "--engine", "openai", "--base-url", stub_url, "--requests", "40",
        "--concurrency", "4", "--workers", "2", "--output-len", "8", "--prompts", "builtin", "--no-server-metrics",
        "--db", str(tmp_path / "db.sqlite"), "--ray-address", client,
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("senders"))
    assert f"2 Ray actors on 1 node of {client}" in line and "clock" in line, line
    (run,) = Store(tmp_path / "db.sqlite").list_runs()
    recs = Store(tmp_path / "db.sqlite").records(run.id)
    assert run.status == "completed" and len(recs) == 40 and sum(r.output_tokens for r in recs) == 40 * 8
    bad = subprocess.run([*argv[:-2], "--ray-address", "nowhere"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "ray_address" in bad.stderr, bad.stderr

"""Expert parallelism on the CPU (engines.expert_parallel): two ranks under torch's own launcher
with gloo, each holding half the tiny model's routed experts, against one process: the same
greedy tokens, the same logits within float32 rounding, and all-to-all bytes counted by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_two_ranks_give_one_processs_tokens_and_logits(tiny_model: Path) -> None:
    batch, seq, steps = 4, 16, 3
    from engines.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "engines.expert_parallel", "--check", str(tiny_model), "--batch", str(batch), "--seq", str(seq),
           "--steps", str(steps)]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("EP-CHECK "))
    out = json.loads(line.removeprefix("EP-CHECK "))
    config = json.loads((tiny_model / "config.json").read_text())
    experts, k, hidden = config["n_routed_experts"], config["num_experts_per_tok"], config["hidden_size"]
    moe_layers = config["num_hidden_layers"] - config["first_k_dense_replace"]
    assert out["world"] == 2 and out["experts_per_rank"] == [experts // 2] * moe_layers
    assert out["same_greedy_tokens"] is True
    assert out["max_abs_diff"] <= 1e-5 * max(1.0, out["max_abs_logit"])  # float32: within rounding
    # bytes to the other rank, by hand: per forward and MoE layer, each rank sends the other its row of counts
    # ([E/2 + 1] int64: the last column names the layer), and every pair whose expert lives on the other rank
    # travels twice (there and back, a float32 row); those pairs are counted on the reference model's routing
    sent = sum(r["sent_bytes"] for r in out["comm"])
    assert sent == moe_layers * steps * 2 * (experts // 2 + 1) * 8 + 2 * out["cross_rank_pairs"] * hidden * 4
    pairs = sum(batch * (seq + s) * k for s in range(steps)) * moe_layers  # no KV cache: step s reads seq + s
    assert 0 < out["cross_rank_pairs"] < pairs  # some pairs stay home, some travel
    assert sum(r["recv_bytes"] for r in out["comm"]) == sent
    assert all(r["calls"] == 3 * moe_layers * steps for r in out["comm"])


# --- the engine option: rank 0 serves, the followers hold experts --------------------------------


def followers_of(pid: int) -> list[int]:
    """Processes started for an expert-parallel engine of process ``pid`` (they carry its pid in
    ``MOEBENCH_EP_OWNER``: the follower, and its launcher's watchdog while it lives)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("MOEBENCH_EP_OWNER") == str(pid):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def followers_below(pid: int) -> list[int]:
    """The expert-parallel processes of ``pid`` or of any process below it (the dashboard loads a
    native engine in a host process of its own: rank 0 is that host)."""
    import psutil

    owners = {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    return sorted({f for o in owners for f in followers_of(o)})


def alive(pids: list[int], timeout: float = 15.0) -> list[int]:
    """Of ``pids``, those still running after up to ``timeout`` s."""
    import time

    import psutil

    def running(p: int) -> bool:
        try:
            return psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _gone(pid: int, timeout: float = 15.0) -> list[int]:
    import time

    deadline = time.monotonic() + timeout
    while (left := followers_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_the_engine_serves_from_rank_0_with_one_processs_logits_and_tokens(native_engine: object) -> None:
    import os

    import torch

    from engines.base import GenerationRequest, SamplingParams, create_engine

    ep = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "expert_parallel": 2})
    ep.start()
    try:
        assert followers_of(os.getpid())
        one = native_engine.model  # type: ignore[attr-defined]
        vocab = int(one.config.vocab_size)
        ids = torch.randint(0, vocab, (3, 12), generator=torch.Generator().manual_seed(7))
        with torch.inference_mode():
            a, b = one(input_ids=ids).logits, ep.model(input_ids=ids).logits  # type: ignore[attr-defined]
        assert float((a - b).abs().max()) <= 1e-5 * max(1.0, float(a.abs().max()))  # float32: within rounding
        assert ep.tuning()["expert_parallel"] == 2  # type: ignore[attr-defined]

        def tokens(engine: object, i: int) -> list[int]:
            sp = SamplingParams(max_tokens=6, temperature=1.0, seed=100 + i, ignore_eos=True)
            req = GenerationRequest(request_id=f"r{i}", prompt=f"the expert number {i} says " * 3, sampling=sp)
            return [t for c in engine.stream(req) for t in (c.token_ids or ())]  # type: ignore[attr-defined]

        ep.reset_communication()
        for i in range(3):  # sampled with a seed: the same tokens need the same logits at every step
            assert tokens(ep, i) == tokens(native_engine, i)
        comm = ep.communication()
        assert comm is not None and comm["world"] == 2 and comm["backend"] == "gloo"
        r0, r1 = comm["ranks"]
        # what one rank sent the other received, and both took part in every MoE layer of every forward:
        # 3 requests x 6 forwards (the prompt, then 5 decode steps) x the tiny model's 2 MoE layers
        assert r0["sent_bytes"] == r1["recv_bytes"] > 0 and r1["sent_bytes"] == r0["recv_bytes"] > 0
        assert r0["layers"] == r1["layers"] == comm["moe_layer_exchanges"] == 3 * 6 * 2
        assert r0["seconds"] > 0 and r1["expert_seconds"] > 0
        assert ep.health() is None
        from engines.errors import ConfigError

        with pytest.raises(ConfigError, match="cannot change on a loaded expert-parallel model"):
            ep.retune(expert_parallel=1)  # type: ignore[attr-defined]
        assert tokens(ep, 0) == tokens(native_engine, 0)  # the refused retune kept the engine as it was
    finally:
        ep.stop()
    assert _gone(os.getpid()) == []


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        ({"expert_parallel": 3}, "the model's 8 routed experts do not split evenly over 3 ranks"),
        (
            {"expert_parallel": 2, "cache": "static", "compile": "default"},
            "expert_parallel=2 with compile: the expert exchange sizes its all-to-alls on the host",
        ),
    ],
)
def test_what_cannot_spread_is_refused_in_one_line(opts: dict[str, object], reason: str) -> None:
    import os

    from engines.base import create_engine
    from engines.errors import ConfigError

    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", **opts})
    with pytest.raises(ConfigError, match=reason) as got:
        engine.start()
    assert "\n" not in str(got.value)
    assert _gone(os.getpid()) == []


def _cli(db: Path, *extra: str, requests: int = 4, mode: str = "profile") -> list[str]:
    return [sys.executable, "-m", "bench", "run", "--engine", "native", "--model", "tiny-deepseek-v3",
            "--accelerator", "cpu", "--engine-opt", "expert_parallel=2", "--mode", mode, "--requests",
            str(requests), "--concurrency", "2", "--input-len", "16", "--output-len", "8",
            "--db", str(db), *extra]  # fmt: skip


def test_a_profile_run_from_the_cli_has_a_communication_share_and_leaves_no_process(tmp_path: Path) -> None:
    from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_COMMUNICATION
    from bench.store import Store

    db = tmp_path / "ep.sqlite"
    proc = subprocess.Popen(_cli(db), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "communication expert parallel over 2 ranks (gloo)" in out
    assert _gone(proc.pid) == []
    store = Store(db)
    rows = {r["category"]: r for r in store.artifact(1, ARTIFACT_BREAKDOWN)["rows"]}
    assert rows["communication"]["cpu_ms"] > 0 and rows["routed_experts"]["cpu_ms"] > 0
    comm = store.artifact(1, ARTIFACT_COMMUNICATION)
    r0, r1 = comm["ranks"]
    assert r0["sent_bytes"] == r1["recv_bytes"] > 0 and r0["layers"] == r1["layers"] > 0
    assert store.get_run(1).engine_info["tuning"]["expert_parallel"] == 2
    # the profile's communication is rank 0's time inside its all-to-alls, gloo's waits included (the
    # c10d op alone returns before them): the two clocks see the same calls
    assert rows["communication"]["cpu_ms"] >= 0.5 * r0["seconds"] * 1e3


def _wait(what: str, check: object, timeout: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _measured(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return int(con.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_ctrl_c_or_a_sigkill_of_rank_0_leaves_no_follower(tmp_path: Path, sig: str) -> None:
    """Rank 0 is the CLI: Ctrl-C cancels the run (exit 130, what was measured kept) and stops the
    followers; a SIGKILL gives it no chance, and its followers still go (their sockets close, the
    launcher's watchdog ends their process group)."""
    import signal
    import time

    db, log = tmp_path / "ep.sqlite", tmp_path / "stderr.txt"
    with log.open("wb") as err:
        # SIGINT's default disposition for the CLI, as in a terminal: a suite started in the background by a
        # non-interactive shell has SIGINT ignored, which the CLI would inherit (CI, 2026-12-07: the run went on)
        proc = subprocess.Popen(_cli(db, requests=100_000, mode="concurrency"), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=err,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        _wait("the run to measure", lambda: _measured(db) > 0)
        ranks = followers_of(proc.pid)
        assert ranks
        proc.send_signal(getattr(signal, sig))
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:  # say where it is stuck: the CLI dumps its threads on SIGUSR1
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(f"rank 0 did not exit after {sig}:\n{log.read_text()[-6000:]}") from None
        assert code == (130 if sig == "SIGINT" else -9), log.read_text()[-2000:]
        assert alive(ranks) == [] and _gone(proc.pid) == []
    finally:
        proc.kill()


def test_a_failed_rank_fails_the_run_in_one_line_and_keeps_what_was_measured(tmp_path: Path) -> None:
    import os
    import signal

    import psutil

    from bench.store import Store

    db = tmp_path / "ep.sqlite"
    proc = subprocess.Popen(_cli(db, requests=100_000, mode="concurrency"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait("the run to measure", lambda: _measured(db) >= 8)
        follower = next(p for p in followers_of(proc.pid) if "--follow" in psutil.Process(p).cmdline())
        os.kill(follower, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    line = next(x for x in err.splitlines() if x.startswith("error: run 1 failed"))
    assert "expert-parallel rank 1: was killed by SIGKILL" in line, err[-2000:]
    run = Store(db).get_run(1)
    assert run.status == "failed" and "expert-parallel rank 1" in run.error
    assert run.summary is not None and run.summary.completed >= 8  # what was measured before stays
    assert _gone(proc.pid) == []


def test_the_all_to_all_sweep_prints_sizes_and_rates_that_agree(tmp_path: Path) -> None:
    out_json = tmp_path / "a2a.json"
    p = subprocess.run([sys.executable, "-m", "bench", "a2a", "--ranks", "2", "--max-mib", "1", "--iters", "3",
                        "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("all-to-all over 2 ranks (gloo, cpu)")
    rows = json.loads(out_json.read_text())
    assert [r["bytes_per_peer"] for r in rows] == [4096, 16384, 65536, 262144, 1048576]
    for r in rows:  # each rate is the same time read three ways
        seconds = r["median_us"] / 1e6
        assert r["algbw_gb_s"] == pytest.approx(r["bytes_per_peer"] * 2 / seconds / 1e9)
        assert r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"] / 2)
        assert r["peer_gb_s_both_ways"] == pytest.approx(2 * r["bytes_per_peer"] / seconds / 1e9)
    bad = subprocess.run([sys.executable, "-m", "bench", "a2a", "--ranks", "4", "--accelerator", "cuda"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1
    assert "--ranks 4 on cuda needs 4 GPUs" in bad.stderr


_HOSTED = """
import sys, time
from bench.run import engine_host
from engines.base import parse_options
engine_host.enable()
engine = engine_host.make_engine(parse_options({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu",
                                                "expert_parallel": 2}))
engine.start()
print(engine.describe()["engine_host_pid"], flush=True)
time.sleep(600)
"""


def test_a_sigkill_of_the_dashboards_process_ends_its_engine_host_and_the_followers() -> None:
    """The dashboard loads a native engine in a host process of its own (bench.run.engine_host):
    rank 0 is that host and the dashboard its parent. SIGKILL the parent: the host reads the end of
    its pipe and stops its engine, which stops the followers."""
    import signal

    proc = subprocess.Popen([sys.executable, "-c", _HOSTED], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        host = int(proc.stdout.readline())
        ranks = followers_of(host)
        assert ranks and followers_below(proc.pid) == sorted(ranks)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert alive([host, *ranks], timeout=30) == []
    finally:
        proc.kill()


def test_stop_gives_up_on_an_exchange_that_never_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exchange stuck half-way (a peer that stopped answering) holds the exchange lock: the
    run's counters are then not asked for, and stop waits LOCK_WAIT_S for it, then kills the
    followers (which ends any collective still waiting on them) and leaves no process."""
    import os
    import time

    from engines import expert_parallel
    from engines.base import create_engine

    ep = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "expert_parallel": 2})
    ep.start()
    ranks = followers_of(os.getpid())
    assert ranks
    monkeypatch.setattr(expert_parallel, "LOCK_WAIT_S", 0.5)
    expert_parallel.EXCHANGE_LOCK.acquire()  # stands for an exchange that never ends
    try:
        t0 = time.monotonic()
        assert ep.communication() is None
        ep.stop()
        assert time.monotonic() - t0 < 15
    finally:
        expert_parallel.EXCHANGE_LOCK.release()
    assert alive(ranks) == []

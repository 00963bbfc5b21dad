"""The vllm engine with a real vLLM CPU server and the tiny DeepSeek-V3 (slow: ~1 min per server).

One server is started per module for the measuring tests; the crash test starts its own.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.send.schedule import arrival_offsets
from bench.store import Store
from engines.base import GenerationRequest, SamplingParams, create_engine, timed_stream
from engines.errors import EngineUnavailable

pytestmark = pytest.mark.slow


def _skip_without_vllm() -> None:
    from engines.vllm import VLLMEngine

    avail = VLLMEngine.availability()
    if not avail.ok:
        pytest.skip(avail.reason)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _wait_dead(procs: list[psutil.Process], timeout: float = 30.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(procs):
        time.sleep(0.2)
    return _alive(procs)


OPTIONS: dict[str, Any] = {
    "kind": "vllm",
    "model": "tiny-deepseek-v3",
    "accelerator": "cpu",
    "cpu_kvcache_space_gib": 1,
}


@pytest.fixture(scope="module")
def vllm_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _skip_without_vllm()
    engine = create_engine({**OPTIONS, "profiler_dir": str(tmp_path_factory.mktemp("vllm-profiles"))})
    messages: list[str] = []
    engine.start(lambda msg, frac: messages.append(msg))
    assert messages[-1] == "ready"
    procs = _tree(engine.server.pid)
    yield engine
    engine.stop()
    assert not _wait_dead(procs), "vLLM processes left behind"


def _config(**kw: Any) -> RunConfig:
    data: dict[str, Any] = {
        "engine": OPTIONS,
        "mode": "concurrency",
        "requests": 32,
        "concurrency": 8,
        "workload": {"source": "random", "input_len": 32, "output_len": 16, "seed": 0},
        "sample_interval_s": 0.25,
    }
    data.update(kw)
    return RunConfig.build(**data)


def test_a_tensor_parallel_cpu_deployment_completes_a_run(tiny_model: Path, store: Store) -> None:
    """TP 2 on this machine's two cores (each worker bound to its own core): a real vLLM CPU
    deployment of two workers serves a concurrency run with exact lengths and records its shape.
    (Data parallelism is refused on cpu: vLLM's CPU build fails every MoE request with DP 2.)
    First in the module: the module's own server is not started yet, so the two cores are free."""
    _skip_without_vllm()
    engine = create_engine({**OPTIONS, "tensor_parallel_size": 2})
    try:
        engine.start()
        procs = _tree(engine.server.pid)
        names = " ".join(" ".join(p.cmdline()) for p in procs if p.is_running())
        assert "Worker_TP0" in names and "Worker_TP1" in names, names
        cfg = _config(requests=16, engine={**OPTIONS, "tensor_parallel_size": 2})
        snap = start_run(cfg, store, engine=engine).wait(300)
        assert snap.status == "completed", snap.error
        s = snap.summary
        errors = [r.error for r in store.records(snap.run_id) if r.error]
        log_tail = Path(engine.describe()["log_path"]).read_text(errors="replace")[-3000:] if errors else ""
        assert s is not None and s.completed == 16 and s.failed == 0, (errors, log_tail)
        assert s.output_tokens == 16 * 16
        shape = engine.describe()["deployment"]
        assert shape["tensor_parallel_size"] == 2 and shape["devices_on_this_node"] == 2
        assert shape["cpu_threads_bind"] is not None and shape["cpu_threads_bind"].count("|") == 1
        assert store.get_run(snap.run_id).engine_info["deployment"]["tensor_parallel_size"] == 2  # type: ignore[arg-type]
    finally:
        engine.stop()
    assert not _wait_dead(procs), "vLLM processes left behind"


def test_describe(vllm_engine: Any) -> None:
    info = vllm_engine.describe()
    assert info["engine"] == "vllm" and info["vllm_version"] == "0.32.0"
    assert info["port"] and f"--port {info['port']}" in " ".join(info["server_argv"])
    assert "vllm.entrypoints.openai.api_server" in info["server_argv"]
    assert Path(info["log_path"]).exists()
    assert int(info["kv_cache"]["num_gpu_blocks"]) > 0
    assert vllm_engine.health() is None
    # the server's own /v1/models says its context (max_model_len): prompts are checked against it
    assert vllm_engine.context_length() == info["context_length"] == 1024
    # a server MoE Bench launched is described from its checkpoint and its process tree
    assert info["parameters"] > 1_000_000 and info["device"] == "cpu" and info["dtype"] == "bfloat16"
    mem = vllm_engine.memory()
    assert mem is not None and mem.source == "server process tree RSS" and mem.allocated_bytes > 200 * 2**20
    # the deployment it was launched as: one replica on one device, vLLM's default executor
    shape = info["deployment"]
    assert (shape["tensor_parallel_size"], shape["data_parallel_size"], shape["devices_on_this_node"]) == (1, 1, 1)
    assert shape["expert_parallel"] is False and shape["nodes"] == 1
    # its process tree (server and engine core) is what per-process device memory is read for
    assert len(vllm_engine.server_pids()) >= 2


def test_concurrency_run_exact_lengths_metrics_and_series(vllm_engine: Any, store: Store) -> None:
    job = start_run(_config(), store, engine=vllm_engine)
    snap = job.wait(300)
    assert snap.status == "completed", snap.error
    s = snap.summary
    assert s is not None and s.completed == 32 and s.failed == 0
    assert s.output_tokens == 32 * 16 and s.prompt_tokens == 32 * 32
    for stat in (s.ttft_ms, s.tpot_ms, s.itl_ms, s.e2e_ms):
        assert stat.count > 0 and stat.p50 is not None and stat.p99 is not None and stat.p50 > 0
    assert s.output_throughput_tok_s > 0
    # The server's usage agrees with the client's counts: output (token ids) and prompt (tokenizer).
    records = store.records(job.run_id)
    assert len(records) == 32
    for r in records:
        assert r.output_tokens == r.usage_output_tokens == 16
        assert r.prompt_tokens == 32  # the server's usage count of the client-built 32-token prompt
        # one chunk per token as a rule; a busy server coalesces tokens into fewer chunks
        assert 1 <= len(r.chunk_times_s) <= 16
    chunks = sum(len(r.chunk_times_s) for r in records)
    assert s.tokens_per_chunk == pytest.approx(32 * 16 / chunks)  # the summary says how it was chunked
    assert s.bursty == (s.tokens_per_chunk >= 2.0 or (s.single_chunk_share or 0) >= 0.2)
    assert s.usage_mismatches == 0
    names = {name for _, name, _ in store.timeseries(job.run_id)}
    for series in (
        "server_kv_cache_usage_pct",
        "server_requests_running",
        "server_requests_waiting",
        "server_preemptions",
        "server_generation_tok_s",
        "server_prompt_tok_s",
    ):
        assert series in names, names
    run = store.get_run(job.run_id)
    assert run is not None and run.engine_info["engine"] == "vllm"


def test_open_loop_run_without_server_metrics(vllm_engine: Any, store: Store) -> None:
    """Poisson arrivals against the real server, with the /metrics scrape off (no observer cost)."""
    cfg = _config(requests=12, concurrency=4, request_rate=20.0, server_metrics=False)
    snap = start_run(cfg, store, engine=vllm_engine).wait(300)
    assert snap.status == "completed", snap.error
    assert snap.summary is not None and snap.summary.completed == 12 and snap.summary.request_rate == 20.0
    names = {name for _, name, _ in store.timeseries(snap.run_id)}  # type: ignore[arg-type]
    assert "in_flight" in names and not any(n.startswith("server_") for n in names), names
    records = store.records(snap.run_id)  # type: ignore[arg-type]
    due = arrival_offsets(12, 20.0, 1.0, seed=0)
    for r in records:  # sent on the schedule's own due times, the lag measured against them
        assert r.send_lag_ms is not None and r.send_lag_ms > -0.01
        assert r.start_s == pytest.approx(due[int(r.request_id.lstrip("r"))] + r.send_lag_ms / 1000, abs=1e-6)
    assert all(r.output_tokens == 16 for r in records)


def test_openai_engine_counts_agree_with_usage(vllm_engine: Any) -> None:
    """The generic openai engine on the same server, counting tokens with the client tokenizer."""
    engine = create_engine({"kind": "openai", "model": "tiny-deepseek-v3", "base_url": vllm_engine.base_url})
    engine.start()
    try:
        assert not engine.opts.server_token_counts
        res = timed_stream(engine, GenerationRequest("c0", "hello world", SamplingParams(max_tokens=16)))
        assert res.error is None and res.usage_output_tokens == 16
        assert res.prompt_tokens == len(engine.tokenizer().encode("hello world", add_special_tokens=False))
        assert res.output_tokens == 16
    finally:
        engine.stop()


def test_server_side_tokenizer_counts(vllm_engine: Any) -> None:
    """tokenizer="server": prompt and output counts from vLLM's /tokenize, no local tokenizer."""
    from engines.tokens import ServerTokenizer

    engine = create_engine(
        {"kind": "openai", "model": "tiny-deepseek-v3", "base_url": vllm_engine.base_url, "tokenizer": "server"}
    )
    engine.start()
    try:
        tok = engine.tokenizer()
        assert isinstance(tok, ServerTokenizer)
        local = vllm_engine.tokenizer()
        assert tok.encode("mixture of experts") == local.encode("mixture of experts", add_special_tokens=False)
        res = timed_stream(engine, GenerationRequest("s", "hello world", SamplingParams(max_tokens=8)))
        assert res.error is None and res.output_tokens == res.usage_output_tokens == 8
        with pytest.raises(Exception, match="need a local tokenizer"):
            from bench.workloads import WorkloadSpec, build_requests

            build_requests(WorkloadSpec(source="random"), 1, SamplingParams(), tok)
    finally:
        engine.stop()


def test_connect_to_running_server_and_bad_names(vllm_engine: Any) -> None:
    engine = create_engine({**OPTIONS, "base_url": vllm_engine.base_url})
    engine.start()
    try:
        res = timed_stream(engine, GenerationRequest("x", "hi", SamplingParams(max_tokens=4)))
        assert res.error is None and res.output_tokens == 4
        telemetry = engine.telemetry()
        assert {"server_requests_running", "server_kv_cache_usage_pct"} <= set(telemetry), telemetry
        assert 0.0 <= telemetry["server_kv_cache_usage_pct"] <= 100.0
        assert engine.health() is None and engine.describe()["managed"] is False
    finally:
        engine.stop()
    wrong = create_engine({**OPTIONS, "base_url": vllm_engine.base_url, "served_model_name": "deepseek-v9"})
    with pytest.raises(EngineUnavailable) as info:
        wrong.start()
    assert str(info.value) == (
        f"model 'deepseek-v9' is not served at {vllm_engine.base_url}; it serves: tiny-deepseek-v3"
    )
    bad = create_engine({**OPTIONS, "base_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(EngineUnavailable, match=r"^cannot reach the OpenAI-compatible server at http://127.0.0.1:9/v1"):
        bad.start()


def test_the_lmdeploy_engines_client_against_a_vllm_server_says_who_served(vllm_engine: Any, store: Store) -> None:
    """The lmdeploy engine's connect mode is the OpenAI client an LMDeploy api_server answers; no
    LMDeploy runs on this CPU machine, so it drives a whole run against the real vLLM server, and
    the run records who answered (the model list's owned_by): vllm, not lmdeploy."""
    engine = create_engine({"kind": "lmdeploy", "model": "tiny-deepseek-v3", "base_url": vllm_engine.base_url})
    engine.start()
    try:
        cfg = RunConfig.build(
            engine={"kind": "lmdeploy", "model": "tiny-deepseek-v3", "base_url": vllm_engine.base_url},
            workload={"source": "random", "input_len": 16, "output_len": 8},
            requests=6,
            concurrency=3,
        )
        snap = start_run(cfg, store, engine=engine).wait(120)
        assert snap.status == "completed", snap.error
        recs = store.records(snap.run_id)
        assert len(recs) == 6 and all(r.output_tokens == 8 and r.ttft_ms for r in recs)
        info = store.get_run(snap.run_id).engine_info
        assert info["engine"] == "lmdeploy" and info["served_by"] == "vllm"
    finally:
        engine.stop()


def test_profile_run_through_vllms_profiler_endpoints(vllm_engine: Any, store: Store) -> None:
    cfg = RunConfig.build(
        engine={"kind": "vllm", "base_url": vllm_engine.base_url},
        mode="profile",
        workload={"source": "random", "input_len": 8, "output_len": 4},
        requests=2,
        warmup=0,
    )
    snap = start_run(cfg, store, engine=vllm_engine).wait(300)
    assert snap.status == "completed", snap.error
    trace = store.artifact(snap.run_id, "profile_trace")
    assert trace is not None and Path(trace["path"]).stat().st_size > 1000
    # the server wrote it under profiler_dir; the run keeps a copy in its store's traces folder
    assert Path(trace["path"]) == store.trace_path(snap.run_id) and Path(trace["path"]).parent == store.traces_dir
    kept = Path(trace["path"]).read_bytes()
    (original,) = [p for p in Path(vllm_engine.vopts.profiler_dir).rglob("*.gz") if p.read_bytes() == kept]
    with gzip.open(trace["path"], "rt") as fh:  # the worker's trace: the model's operators, no stacks
        names = {e.get("name", "") for e in json.load(fh)["traceEvents"]}
    assert any(n.startswith("aten::") for n in names) and not any(".py(" in n for n in names)
    assert store.artifact(snap.run_id, "profile_breakdown") is None  # vLLM gives a trace, not our breakdown
    # The operator table read from that trace is the one vLLM's own torch profiler printed
    # beside it (its top 50 rows by self CPU time; annotations like vLLM's steps included).
    ops = {o["operator"]: o for o in store.artifact(snap.run_id, "profile_operators")}
    printed = _profiler_table(original.with_name(original.name.split(".")[0] + ".profiler_out.txt"))
    assert len(printed) >= 20 and any(name.startswith("execute_") for name in printed)
    for name, (calls, self_ms, total_ms) in printed.items():
        assert ops[name]["calls"] == calls, name
        assert ops[name]["self_cpu_ms"] == pytest.approx(self_ms, rel=0.01, abs=0.002), name
        assert ops[name]["cpu_total_ms"] == pytest.approx(total_ms, rel=0.01, abs=0.002), name


def _profiler_table(path: Path) -> dict[str, tuple[int, float, float]]:
    """name -> (calls, self CPU ms, CPU total ms) from torch's printed ``key_averages`` table."""
    unit = {"s": 1000.0, "ms": 1.0, "us": 0.001}
    row = re.compile(
        r"\s*(\S.*?)\s{2,}[\d.]+%\s+([\d.]+)(s|ms|us)\s+[\d.]+%\s+([\d.]+)(s|ms|us)\s+[\d.]+(?:s|ms|us)\s+(\d+)\s*$"
    )
    out = {}
    for line in path.read_text().splitlines():
        if m := row.match(line):
            out[m[1]] = (int(m[6]), float(m[2]) * unit[m[3]], float(m[4]) * unit[m[5]])
    return out


def test_server_without_profiler_says_so(tmp_path: Path) -> None:
    """A real HTTP server that has no /start_profile (python -m http.server answers 501 to POST)."""
    import httpx

    from engines.launch import ManagedProcess, free_port
    from engines.vllm import VLLMProfileSession

    port = free_port()
    with ManagedProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], name="http") as proc:
        proc.wait_http(f"http://127.0.0.1:{port}/", timeout=30)
        with httpx.Client() as client, pytest.raises(EngineUnavailable, match="was not started with a profiler"):
            VLLMProfileSession(client, f"http://127.0.0.1:{port}", None).__enter__()


def test_server_killed_mid_run(tiny_model: Path, store: Store) -> None:
    _skip_without_vllm()
    engine = create_engine(OPTIONS)
    engine.start()
    procs = _tree(engine.server.pid)
    assert any("EngineCore" in p.name() for p in procs), [p.name() for p in procs]
    try:
        # far more requests than can finish before the kill, even when this test's thread is slow to see done >= 4
        cfg = _config(requests=4000, concurrency=2, workload={"source": "random", "input_len": 32, "output_len": 64})
        job = start_run(cfg, store, engine=engine)
        deadline = time.monotonic() + 120
        while job.snapshot().done < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.snapshot().done >= 4
        os.kill(engine.server.pid, signal.SIGKILL)
        snap = job.wait(120)
        assert snap.status == "failed"
        assert snap.error is not None and "killed by SIGKILL" in snap.error and "\n" not in snap.error
        run = store.get_run(job.run_id)
        assert run is not None and run.status == "failed"
        records = store.records(job.run_id)
        assert sum(1 for r in records if r.ok) >= 4  # the finished samples are kept
        assert len(records) < 4000
    finally:
        engine.stop()
    assert not _wait_dead(procs), [p.pid for p in _alive(procs)]


def test_prefix_cache_hit_rate_warns_when_the_prompts_were_seen_before(
    tiny_model: Path, store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM caches full KV blocks of prompts: the same seed again is served from the cache.

    On CPU vLLM turns prefix caching off for MLA models; VLLM_MLA_DISABLE=1 runs the tiny
    DeepSeek with standard attention so the cache (and its counters) work here."""
    _skip_without_vllm()
    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    opts = {**OPTIONS, "enable_prefix_caching": True}
    engine = create_engine(opts)
    engine.start()
    try:
        first = _config(
            engine=opts,
            requests=6,
            concurrency=2,
            workload={"source": "random", "input_len": 256, "output_len": 4, "seed": 77},
        )
        a = start_run(first, store, engine=engine).wait(300)
        assert a.status == "completed", a.error
        assert a.summary is not None and a.summary.prefix_cache_hit_rate is not None
        assert (
            a.summary.prefix_cache_hit_rate < 0.10 and a.summary.cache_warning is None
        )  # new prompts; warm-up: other seed
        again = first.model_copy(update={"slos": ["ttft_ms:p99<=60000", "tpot_ms:p99<=60000"]})
        b = start_run(again, store, engine=engine).wait(300)
        assert b.status == "completed", b.error
        s = b.summary
        assert s is not None and s.prefix_cache_hit_rate is not None and s.prefix_cache_hit_rate > 0.3
        assert s.cache_warning is not None and "prefix cache served" in s.cache_warning
        assert s.slo_met is True and s.good_requests == 6 and s.goodput_rps == pytest.approx(6 / s.duration_s)
        # A synthesized Mooncake trace (3 prefix groups: each prompt one shared 512-token block, then 188
        # tokens of its own) replayed on the same server: the hit rate the server reports is the trace's
        # shared-block share (a hit needs the block the group's first request sent).
        from bench.trace import prefix_share, read_trace, synth, write_jsonl

        trace = write_jsonl(synth(30, 6.0, seed=11, prefix_groups=3, input_len=700, output_len=4), tmp_path / "t.jsonl")
        expected = prefix_share(read_trace(trace))
        replay = _config(engine=opts, workload={"source": "trace", "path": str(trace), "seed": 11}, warmup=0)
        c = start_run(replay, store, engine=engine).wait(300)
        assert c.status == "completed", c.error
        t = c.summary
        assert t is not None and t.completed == 30 and 0.5 < expected < 0.75 and t.prefix_cache_hit_rate is not None
        assert abs(t.prefix_cache_hit_rate - expected) < 0.03, (t.prefix_cache_hit_rate, expected)
    finally:
        engine.stop()


def test_a_concurrency_sweep_on_the_vllm_server(vllm_engine: Any, store: Store) -> None:
    from bench.sweep.spec import SweepSpec, sweep_points
    from bench.sweep.task import SweepTask

    base = _config(requests=8, slos=["ttft_ms:p99<=60000"]).model_dump()
    task = SweepTask(SweepSpec.build(base=base, concurrency=[1, 4]), store, engine=vllm_engine).begin()
    snap = task.wait(300)
    assert snap.status == "completed", snap.error
    points = sweep_points(store, snap.sweep_id)  # type: ignore[arg-type]
    assert [p.point for p in points] == [{"concurrency": 1}, {"concurrency": 4}]
    assert all(p.summaries and p.summaries[0].completed == 8 and p.summaries[0].slo_met for p in points)


def test_ngram_speculation_and_the_r1_reasoning_parser_on_the_cpu_server(tiny_model: Path, store: Store) -> None:
    """vLLM's CPU server with n-gram speculative decoding and the deepseek_r1 reasoning parser (the
    tiny model's greedy text repeats itself, so n-gram drafts are proposed and accepted). The run's
    acceptance figures are the deltas of the server's own counters, read here before and after the
    run. The tiny model never writes </think>: R1's parser streams all of it as reasoning, while
    the server's usage counts 0 reasoning tokens (it counts only between generated <think> tags):
    the mismatch flag fires on a real server."""
    _skip_without_vllm()
    from engines.prometheus import parse_prometheus

    chat = {**OPTIONS, "endpoint": "chat", "speculative_method": "ngram", "reasoning_parser": "deepseek_r1"}
    engine = create_engine(chat)
    engine.start()
    procs = _tree(engine.server.pid)
    try:
        assert "--speculative-config" in engine.server.argv and "--reasoning-parser" in engine.server.argv
        names = ("drafts", "draft_tokens", "accepted_tokens")

        def counters() -> dict[str, float]:
            values = parse_prometheus(engine._scrape())
            return {n: values[f"vllm:spec_decode_num_{n}_total"] for n in names}

        config = _config(
            engine=chat, requests=8, concurrency=4, warmup=0,
            workload={"source": "random", "input_len": 16, "output_len": 24, "seed": 3},
        )  # fmt: skip
        before = counters()
        snap = start_run(config, store, engine=engine).wait(300)
        after = counters()
    finally:
        engine.stop()
    assert not _wait_dead(procs), "vLLM processes left behind"
    assert snap.status == "completed", snap.error
    s = snap.summary
    drafts, tokens, accepted = (after[n] - before[n] for n in names)
    assert drafts > 0 and (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens) == (drafts, tokens, accepted)
    assert s.spec_acceptance_rate == pytest.approx(accepted / tokens)
    assert s.spec_acceptance_length == pytest.approx(1 + accepted / drafts)
    assert s.spec_accepted_per_pos is not None and len(s.spec_accepted_per_pos) == 3
    records = store.records(snap.run_id)
    assert s.reasoning_tokens is not None and s.reasoning_tokens > 0
    assert s.reasoning_tokens + s.answer_tokens == s.output_tokens
    assert all(r.usage_reasoning_tokens == 0 for r in records)
    assert s.reasoning_mismatches == sum(1 for r in records if r.reasoning_tokens > 2) > 0

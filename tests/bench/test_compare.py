"""bench.analysis.compare: the native-vs-vLLM figures from stored runs (fast), and real runs (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.compare import (
    EFFICIENCY_DEVICE_TELEMETRY,
    EFFICIENCY_KV_CACHE,
    KV_USAGE_SERIES,
    MEMORY_DEVICE_TELEMETRY,
    MEMORY_EFFICIENCY_DEFINITION,
    MEMORY_EFFICIENCY_TELEMETRY_DEFINITION,
    MEMORY_PROCESS_RSS,
    MEMORY_TORCH_PEAK,
    common_memory,
    compare_engines,
    default_pair,
    device_memory_series_peak_gib,
    engine_figures,
    format_compare,
    gain_context,
    memory_efficiency,
    mismatch,
    peak_device_memory_gib,
    run_memory,
    run_offline_workload,
    workload_key,
)
from bench.bundle import import_bundle_file
from bench.config import RunConfig
from bench.metrics.records import RequestRecord
from bench.metrics.summary import summarize
from bench.store import Store
from bench.store.rows import RunRow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _stored_run(store: Store, engine: str, e2e_s: float, tokens: int, kv: list[float] | None = None) -> int:
    run_id = store.create_run(mode="concurrency", engine=engine, model="m", accelerator="cpu", config={})
    records = [
        RequestRecord(
            f"r{i}",
            0.0,
            e2e_s,
            chunk_times_s=[e2e_s / tokens * (k + 1) for k in range(tokens)],
            prompt_tokens=4,
            output_tokens=tokens,
        )
        for i in range(4)
    ]
    store.finish_run(run_id, "completed", summary=summarize(records, duration_s=e2e_s))
    if kv is not None:
        store.set_engine_info(run_id, {"kv_cache": {"kv_cache_memory_bytes": str(2 * 1024**3)}})
        store.add_points(run_id, [(float(t), KV_USAGE_SERIES, v) for t, v in enumerate(kv)])
    return run_id


def test_figures_and_ratios_from_the_store(store: Store) -> None:
    native = engine_figures(store, _stored_run(store, "native", 2.0, 10))
    vllm = engine_figures(store, _stored_run(store, "vllm", 0.5, 10, kv=[0.0, 12.5, 40.0, 3.0]))
    assert native.memory_efficiency_pct is None  # not measurable, not made up
    assert vllm.memory_efficiency_pct == 40.0 and vllm.kv_cache_reserved_gib == 2.0
    assert native.output_throughput_tok_s == pytest.approx(20.0)
    assert vllm.output_throughput_tok_s == pytest.approx(80.0)
    assert native.e2e_p99_ms == pytest.approx(2000.0) and vllm.e2e_p99_ms == pytest.approx(500.0)
    assert "vllm:kv_cache_usage_perc" in MEMORY_EFFICIENCY_DEFINITION


def _bundle_device_peak(path: Path) -> float:
    """The bundle's peak device memory in use, computed here from its JSON: at each sample time
    the dev*_mem_used_gib values are added up, and the largest sum is the peak."""
    bundle = json.loads(path.read_text(encoding="utf-8"))
    sums: dict[float, float] = {}
    for t, name, value in bundle["timeseries"]:
        if "dev" in name and name.endswith("_mem_used_gib") and value is not None:
            sums[t] = sums.get(t, 0.0) + value
    assert sums, f"{path.name} has no device memory series"
    return max(sums.values())


def test_device_memory_and_memory_efficiency_of_the_h200_bundles(store: Store) -> None:
    for name in ("h200-latency-bs1.json", "h200-concurrency-16.json"):
        run = store.get_run(import_bundle_file(store, EXAMPLES / name))
        assert run is not None and run.summary is not None and run.summary.peak_memory_gib is not None
        peak = _bundle_device_peak(EXAMPLES / name)
        assert device_memory_series_peak_gib(store, run.id) == pytest.approx(peak)
        assert peak_device_memory_gib(store, run) == pytest.approx(peak)
        mem = run_memory(store, run)
        assert (mem.engine_peak_gib, mem.engine_source) == (run.summary.peak_memory_gib, MEMORY_TORCH_PEAK)
        assert mem.shown == (run.summary.peak_memory_gib, MEMORY_TORCH_PEAK)
        # The native engine has no KV pool: tensor memory / device memory in use, from telemetry.
        pct, source = memory_efficiency(store, run)
        assert source == EFFICIENCY_DEVICE_TELEMETRY
        assert pct == pytest.approx(run.summary.peak_memory_gib / peak * 100)
        figures = engine_figures(store, run.id)
        assert figures.memory_efficiency_pct == pct and figures.memory_efficiency_source == source
        assert figures.device_memory_gib == pytest.approx(peak)
        if name == "h200-concurrency-16.json":
            assert run.summary.peak_memory_gib == pytest.approx(83.617, abs=1e-3)
            assert pct == pytest.approx(83.61707210540771 / peak * 100)
            assert 70.0 < pct < 70.2  # 83.6 GiB of tensors in 119.3 GiB in use
    assert "device telemetry" in MEMORY_EFFICIENCY_TELEMETRY_DEFINITION


def _device_run(
    store: Store,
    accelerator: str,
    engine: str = "native",
    peak_gib: float | None = None,
    points: list[tuple[float, str, float | None]] | None = None,
    summary_device_gib: float | None = None,
) -> RunRow:
    """A completed run with an engine peak, device telemetry series and summary figure as given."""
    run_id = store.create_run(mode="concurrency", engine=engine, model="m", accelerator=accelerator, config={})
    records = [RequestRecord("r0", 0.0, 1.0, chunk_times_s=[0.5, 1.0], prompt_tokens=4, output_tokens=2)]
    summary = summarize(records, duration_s=1.0, peak_memory_gib=peak_gib)
    summary = dataclasses.replace(summary, device_mem_used_gib=summary_device_gib)
    store.finish_run(run_id, "completed", summary=summary)
    store.add_points(run_id, points or [])
    run = store.get_run(run_id)
    assert run is not None
    return run


def test_device_memory_is_the_peak_of_the_sum_over_devices_and_hosts(store: Store) -> None:
    points = [
        (0.0, "dev0_mem_used_gib", 10.0), (0.0, "dev1_mem_used_gib", 15.0), (0.0, "h10_0_0_7_dev0_mem_used_gib", 1.0),
        (1.0, "dev0_mem_used_gib", 20.0), (1.0, "dev1_mem_used_gib", 1.0), (1.0, "h10_0_0_7_dev0_mem_used_gib", 2.0),
        (2.0, "dev0_mem_used_gib", 5.0), (2.0, "dev1_mem_used_gib", 30.0), (2.0, "h10_0_0_7_dev0_mem_used_gib", None),
        (2.0, "dev0_mem_total_gib", 80.0), (2.0, "mem_peak_gib", 99.0),  # not memory in use on a device
    ]  # fmt: skip
    run = _device_run(store, "cuda", peak_gib=14.0, points=points)
    assert device_memory_series_peak_gib(store, run.id) == 35.0  # 5 + 30 at t=2 (not 20 + 30)
    pct, source = memory_efficiency(store, run)
    assert (pct, source) == (pytest.approx(40.0), EFFICIENCY_DEVICE_TELEMETRY)


def test_memory_falls_back_and_is_never_made_up(store: Store) -> None:
    # No series: the summary's device figure (an older run, a bundle without series).
    older = _device_run(store, "npu", engine="openai", summary_device_gib=50.0)
    assert peak_device_memory_gib(store, older) == 50.0
    assert run_memory(store, older).shown == (50.0, MEMORY_DEVICE_TELEMETRY)  # no engine peak: telemetry
    assert memory_efficiency(store, older) == (None, None)  # a server's RSS is not tensor memory
    # A CPU run: its RSS, no device telemetry, no memory efficiency.
    cpu = _device_run(store, "cpu", peak_gib=2.0)
    assert run_memory(store, cpu).shown == (2.0, MEMORY_PROCESS_RSS) and peak_device_memory_gib(store, cpu) is None
    assert memory_efficiency(store, cpu) == (None, None)
    assert engine_figures(store, cpu.id).memory_efficiency_pct is None
    # Nothing at all: not measured.
    bare = _device_run(store, "cuda")
    assert run_memory(store, bare).shown == (None, None) and memory_efficiency(store, bare) == (None, None)
    # A vLLM run's KV-cache use wins over telemetry.
    vllm = _device_run(
        store, "cuda", engine="vllm", points=[(0.0, KV_USAGE_SERIES, 12.5), (0.0, "dev0_mem_used_gib", 70.0)]
    )
    assert memory_efficiency(store, vllm) == (12.5, EFFICIENCY_KV_CACHE)
    # Two runs' memory from a source both have.
    torch_a = run_memory(store, _device_run(store, "cuda", peak_gib=10.0, points=[(0.0, "dev0_mem_used_gib", 20.0)]))
    torch_b = run_memory(store, _device_run(store, "npu", peak_gib=8.0, points=[(0.0, "dev0_mem_used_gib", 12.0)]))
    assert common_memory(torch_a, torch_b) == (10.0, 8.0, MEMORY_TORCH_PEAK)
    assert common_memory(torch_a, run_memory(store, older)) == (20.0, 50.0, MEMORY_DEVICE_TELEMETRY)
    assert common_memory(torch_a, run_memory(store, cpu)) is None  # a torch peak is no ratio of an RSS


def _configured_run(
    store: Store, engine: str, status: str = "completed", summary: bool = True, **config: Any
) -> RunRow:
    """A run stored with the config a real run of ``RunConfig.build(**config)`` stores."""
    cfg = RunConfig.build(engine={"kind": "native"}, **config)
    run_id = store.create_run(
        mode=cfg.mode,
        engine=engine,
        model="tiny-deepseek-v3",
        accelerator="cpu",
        config=cfg.model_dump(),
        concurrency=cfg.concurrency,
    )
    records = [RequestRecord("r0", 0.0, 1.0, chunk_times_s=[0.5, 1.0], prompt_tokens=4, output_tokens=2)]
    store.finish_run(run_id, status, summary=summarize(records, duration_s=1.0) if summary else None)
    run = store.get_run(run_id)
    assert run is not None
    return run


def test_workload_key_holds_what_the_engine_was_asked_and_not_how_long(store: Store) -> None:
    a = _configured_run(store, "native", mode="concurrency", concurrency=8, requests=32)
    b = _configured_run(
        store, "vllm", mode="concurrency", concurrency=8, requests=500, workload={"source": "random", "seed": 7}
    )
    key = workload_key(a)
    assert key == workload_key(b)  # the request count and the prompt seed are not the workload
    assert {"mode": "concurrency", "source": "random", "input_len": 32, "output_len": 16, "concurrency": 8}.items() <= (
        key.items()
    )
    assert key["request_rate"] is None and "requests" not in key and "seed" not in key
    # A latency run is one request at a time whatever concurrency its config carries.
    assert workload_key(_configured_run(store, "native", mode="latency", concurrency=8))["concurrency"] == 1
    # An older run stored with a bare config matches a full one of the same workload (defaults fill in).
    bare_id = store.create_run(
        mode="concurrency",
        engine="native",
        model="m",
        accelerator="cpu",
        config={"mode": "concurrency", "concurrency": 8, "request_rate": 0, "workload": {"input_len": 32}},
    )
    bare = store.get_run(bare_id)
    assert bare is not None and workload_key(bare) == key
    # Drawn lengths carry their distribution.
    drawn = _configured_run(
        store,
        "native",
        concurrency=8,
        workload={"input_dist": "uniform", "input_min": 8, "input_max": 64},
    )
    assert workload_key(drawn)["input_min"] == 8 and workload_key(drawn)["input_max"] == 64
    assert mismatch(a, drawn) == ["input_dist: fixed vs uniform"]


def test_mismatch_names_each_field_that_differs(store: Store) -> None:
    latency = _configured_run(store, "native", mode="latency")
    loaded = _configured_run(store, "vllm", mode="concurrency", concurrency=8)
    assert mismatch(latency, loaded) == ["mode: latency vs concurrency", "concurrency: 1 vs 8"]
    assert mismatch(loaded, loaded) == []
    lengths = _configured_run(store, "vllm", concurrency=8, workload={"input_len": 128, "output_len": 64})
    assert mismatch(loaded, lengths) == ["input_len: 32 vs 128", "output_len: 16 vs 64"]
    open_loop = _configured_run(store, "vllm", concurrency=8, request_rate=4.0)
    assert mismatch(loaded, open_loop) == ["request_rate: closed loop vs 4"]
    # Another prompt source: the source is named, not the fields only one of the two reads.
    builtin = _configured_run(store, "vllm", concurrency=8, workload={"source": "builtin", "input_len": 999})
    assert mismatch(loaded, builtin) == ["source: random vs builtin"]


def test_default_pair_is_the_latest_native_and_vllm_runs_of_one_workload(store: Store) -> None:
    assert default_pair([]) is None
    native_latency = _configured_run(store, "native", mode="latency")
    vllm_loaded = _configured_run(store, "vllm", mode="concurrency", concurrency=8)
    assert default_pair(store.list_runs()) is None  # the case: no pair of one workload
    old_vllm = _configured_run(store, "vllm", mode="latency")
    assert default_pair(store.list_runs()) == (native_latency, old_vllm)
    native_loaded = _configured_run(store, "native", mode="concurrency", concurrency=8)
    _configured_run(store, "native", mode="concurrency", concurrency=8, status="failed", summary=False)
    _configured_run(store, "triton", mode="concurrency", concurrency=8)  # neither side
    # The newest pair wins (the failed native run after it does not count).
    assert default_pair(store.list_runs()) == (native_loaded, vllm_loaded)
    newer_vllm = _configured_run(store, "vllm", mode="latency")
    assert default_pair(reversed(store.list_runs())) == (native_latency, newer_vllm)  # order of the input is moot


@pytest.mark.slow
def test_compare_engines_real(tiny_model: Path, store: Store) -> None:
    from engines.vllm import VLLMEngine

    if not VLLMEngine.availability().ok:
        pytest.skip(VLLMEngine.availability().reason)
    config = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3"},
        requests=8,
        concurrency=4,
        workload={"source": "random", "input_len": 16, "output_len": 8},
        sample_interval_s=0.2,
    )
    seen: list[str] = []
    result = compare_engines(config, store, {"cpu_kvcache_space_gib": 1}, progress=lambda m, f: seen.append(m))
    assert result.native.status == "completed" and result.vllm.status == "completed", result.notes
    assert store.get_run(result.native_run_id).engine == "native"  # type: ignore[union-attr]
    assert store.get_run(result.vllm_run_id).engine == "vllm"  # type: ignore[union-attr]
    assert result.throughput_speedup is not None and result.throughput_speedup > 0
    assert result.p99_latency_speedup is not None and result.p99_latency_speedup > 0
    assert result.memory_efficiency_native_pct is None
    assert result.memory_efficiency_vllm_pct is not None and 0.0 <= result.memory_efficiency_vllm_pct <= 100.0
    assert "speedup" in format_compare(result)


@pytest.mark.slow
def test_offline_throughput(tiny_model: Path) -> None:
    from engines.vllm import VLLMEngine

    if not VLLMEngine.availability().ok:
        pytest.skip(VLLMEngine.availability().reason)
    res: Any = run_offline_workload({"model": "tiny-deepseek-v3", "cpu_kvcache_space_gib": 1}, 8, 16, 8)
    assert res.requests == 8 and res.output_tokens == 64 and res.prompt_tokens == 8 * 16
    assert res.requests_per_s > 0 and res.total_tok_s > res.output_tok_s > 0
    assert res.vllm_version == "0.32.0" and Path(res.log_path).exists()


def test_the_gain_context_names_the_runs_conditions_and_why_the_gain_shrinks(store: Store) -> None:
    """The Compare page's note beside a measured gain: these runs' model, size, device, load and
    lengths, the conditions that shrink vLLM's gain here, and what a near-0 % KV figure means."""
    ids = []
    for engine in ("native", "vllm"):
        run_id = store.create_run(
            mode="concurrency", engine=engine, model="tiny-deepseek-v3", accelerator="cpu", concurrency=4,
            config={"workload": {"source": "random", "input_len": 32, "output_len": 16}},
        )  # fmt: skip
        store.set_engine_info(run_id, {"parameters": 1_500_000, "device": "x86_64 (2 cores)"})
        ids.append(run_id)
    native, vllm = (store.get_run(i) for i in ids)
    assert native is not None and vllm is not None
    text = gain_context(native, vllm, vllm_kv_pct=0.0155)
    assert text.startswith("These runs: tiny-deepseek-v3 (1.5 M parameters), random weights, on x86_64 (2 cores), ")
    assert "4 request(s) in flight, 32 tokens in and 16 out." in text
    assert "with 4 in flight (little to batch); on a CPU" in text and "with a model this small" in text
    assert "(0.0155 %) is the largest share of its KV-cache pool" in text
    assert "KV-cache pool" not in gain_context(native, vllm, vllm_kv_pct=62.0)

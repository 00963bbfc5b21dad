"""bench.compare: the native-vs-vLLM figures from stored runs (fast), and real runs (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.compare import (
    KV_USAGE_SERIES,
    MEMORY_EFFICIENCY_DEFINITION,
    compare_engines,
    engine_figures,
    format_compare,
    run_offline_workload,
)
from bench.metrics import RequestRecord, summarize
from bench.runner import RunConfig
from bench.store import Store


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

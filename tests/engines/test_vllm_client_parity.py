"""MoE Bench's client against a real vLLM CPU server: no first-wave stall, and parity with
``vllm bench serve`` on the same server (slow: one server for the module, ~3 min).

The stall (issue 45): the sending loop waited on the kernel's run queue behind vLLM's
spinning engine core, so about half the runs read a wave's chunks ~1 s late in a burst
(TTFT p90 ~1 s, TPOT p50 0.01 ms) while the wire showed them on time. bench.send.cpu_wait
has the cause and the fix; these tests fail on the code before it (6-7 of 8 runs stalled).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.config import RunConfig
from bench.run.artifacts import ARTIFACT_CLIENT_CPU
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine

pytestmark = pytest.mark.slow

INPUT_LEN, OUTPUT_LEN, PROMPTS, CONCURRENCY = 32, 32, 64, 8


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Any]:
    from engines.vllm import VLLMEngine

    avail = VLLMEngine.availability()
    if not avail.ok:
        pytest.skip(avail.reason)
    engine = create_engine(
        {"kind": "vllm", "model": "tiny-deepseek-v3", "accelerator": "cpu", "cpu_kvcache_space_gib": 1}
    )
    engine.start()
    yield engine
    engine.stop()


def _openai_run(server: Any, tiny_model: Path, store: Store, seed: int) -> Any:
    config = RunConfig.build(
        engine={
            "kind": "openai",
            "model": server.served_name,
            "base_url": server.base_url,
            "tokenizer": str(tiny_model),
        },
        mode="concurrency",
        workload={"source": "random", "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "seed": seed},
        requests=PROMPTS,
        concurrency=CONCURRENCY,
        warmup=1,
    )
    snap = start_run(config, store).wait(300)
    assert snap.status == "completed" and snap.summary is not None, snap.error
    return snap


def test_no_wave_waits_against_vllm(server: Any, tiny_model: Path, store: Store) -> None:
    """Five runs in a row (the issue's workload): in every one the TTFT tail stays within 4x the
    median and the chunks are read as they come (TPOT p50 > 1 ms, not a burst), and the
    sending loop's run-queue wait is measured and under the limit that would flag the run."""
    seen = []
    for seed in range(5):
        snap = _openai_run(server, tiny_model, store, seed)
        s = snap.summary
        cpu = store.artifact(snap.run_id, ARTIFACT_CLIENT_CPU)
        seen.append((round(s.ttft_ms.p50, 1), round(s.ttft_ms.p90, 1), round(s.tpot_ms.p50, 2), cpu))
        assert s.completed == PROMPTS
        assert s.ttft_ms.p90 <= 4 * s.ttft_ms.p50, seen
        assert s.tpot_ms.p50 > 1.0, seen
        assert isinstance(cpu, dict) and cpu["run_ms"] > 0, seen  # measured (Linux schedstat)
        assert "sending loop waited" not in (s.disturbance or ""), seen


def _ratio(ours: float | None, theirs: float | None) -> float:
    assert ours is not None and theirs is not None and theirs > 0, (ours, theirs)
    return ours / theirs


@pytest.mark.xfail(
    strict=False,
    reason="open (issue 45): on the 2-core CPU server MoE Bench's TTFT median reads 1.22x vllm bench's and its "
    "TPOT/ITL medians 0.90x (5 rounds, 2026-12-07); output tok/s agrees (1.05x)",
)
def test_parity_with_vllm_bench_serve(server: Any, tiny_model: Path, store: Store, tmp_path: Path) -> None:
    """The standing parity check: ``vllm bench serve`` and MoE Bench's openai engine alternate
    (theirs, ours, ours, theirs, ...) over 5 rounds on one server with the same random workload,
    both reading under the same CPU priority (studies.parity_vllm); the median over the rounds of
    each ratio ours / theirs is within 10 % for the TTFT, TPOT and ITL medians and the output
    tok/s, and within 25 % for the TTFT p90. (The median over rounds, not one round: either
    client's single run moves 5-20 % on this 2-core machine, vllm bench's as much as ours.)"""
    from studies.parity_vllm import run_ours, run_theirs

    args = argparse.Namespace(
        model="tiny-deepseek-v3", model_dir=str(tiny_model), input_len=INPUT_LEN, output_len=OUTPUT_LEN,
        num_prompts=PROMPTS, concurrency=CONCURRENCY, seed=0, engine_opt={}, server_metrics=False,
    )  # fmt: skip
    keys = ["TTFT median ms", "TPOT median ms", "ITL median ms", "output tok/s", "TTFT p90 ms"]
    rounds = []
    for n in range(5):
        pair: dict[str, dict[str, Any]] = {}
        order = ("theirs", "ours") if n % 2 == 0 else ("ours", "theirs")
        for who in order:
            if who == "ours":
                pair[who] = run_ours(args, server.base_url, server.served_name, store, "openai")
            else:
                pair[who] = run_theirs(args, server.base_url, server.served_name, str(tiny_model), tmp_path, n)
        rounds.append({k: _ratio(pair["ours"][k], pair["theirs"][k]) for k in keys})
    table = [{k: round(v, 3) for k, v in r.items()} for r in rounds]
    median = {k: statistics.median(r[k] for r in rounds) for k in keys}
    for k in keys[:4]:
        assert abs(median[k] - 1) <= 0.10, (k, median, table)
    assert abs(median["TTFT p90 ms"] - 1) <= 0.25, (median, table)

"""Synthetic runs written through the real store (for page tests with runs present)."""

from __future__ import annotations

import random

from bench.metrics.records import RequestRecord
from bench.metrics.summary import summarize
from bench.run.recorder import (
    SERIES_IN_FLIGHT,
    SERIES_MEM_ALLOCATED,
    SERIES_MEM_PEAK,
    SERIES_MEM_RESERVED,
    SERIES_OUTPUT_TOK_S,
)
from bench.store import Store

PAGES = (
    "app_pages/engine.py",
    "app_pages/latency.py",
    "app_pages/concurrency.py",
    "app_pages/sweep.py",
    "app_pages/results.py",
    "app_pages/compare.py",
    "app_pages/replay.py",
    "app_pages/tuning.py",
)


def synthetic_records(n: int, output_tokens: int = 8, seed: int = 0, fail_every: int = 0) -> list[RequestRecord]:
    """``n`` plausible requests (4 in flight), with chunk times; every ``fail_every``-th fails."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        start = (i // 4) * 0.05 + rng.random() * 0.01
        ttft = 0.01 + rng.random() * 0.02
        gap = 0.002 + rng.random() * 0.002
        chunks = [start + ttft + k * gap for k in range(output_tokens)]
        failed = fail_every and i % fail_every == fail_every - 1
        records.append(
            RequestRecord(
                request_id=f"r{i}",
                start_s=start,
                end_s=chunks[-1],
                chunk_times_s=chunks,
                prompt_tokens=32,
                output_tokens=output_tokens,
                error="RuntimeError: boom" if failed else None,
            )
        )
    return records


def add_synthetic_run(
    store: Store,
    n: int = 20,
    engine: str = "native",
    accelerator: str = "cpu",
    mode: str = "concurrency",
    device: str = "x86_64",
    peak_gib: float | None = 0.5,
    seed: int = 0,
    fail_every: int = 0,
    name: str = "",
) -> int:
    """A completed run written through the real store: samples, per-second series, summary."""
    run_id = store.create_run(
        mode=mode,
        engine=engine,
        model="tiny-deepseek-v3",
        accelerator=accelerator,
        config={
            "mode": mode,
            "requests": n,
            "concurrency": 4,
            "workload": {"source": "random", "input_len": 32, "output_len": 8},
        },
        concurrency=4,
        name=name,
    )
    store.set_engine_info(run_id, {"engine": engine, "device": device, "dtype": "float32"})
    records = synthetic_records(n, seed=seed, fail_every=fail_every)
    store.add_samples(run_id, list(enumerate(records)))
    duration = max(r.end_s for r in records)
    points = []
    for t in range(int(duration) + 2):
        points += [
            (float(t), SERIES_OUTPUT_TOK_S, 100.0 + t),
            (float(t), SERIES_IN_FLIGHT, 4.0),
            (float(t), SERIES_MEM_ALLOCATED, 0.4),
            (float(t), SERIES_MEM_RESERVED, 0.45),
            (float(t), SERIES_MEM_PEAK, 0.5),
        ]
    store.add_points(run_id, points)
    store.finish_run(run_id, "completed", summary=summarize(records, peak_memory_gib=peak_gib, max_concurrency=4))
    return run_id

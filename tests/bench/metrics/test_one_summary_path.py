"""One summary path: a finished run's summary and the one the store recomputes from what the run
stored (a run whose process died, bench.store.Store._summarize_stored through finish_lost_run)
carry the same figures, limits, MoE and per-accelerator throughput included (bench.metrics.enrich)."""

from __future__ import annotations

import math
from pathlib import Path

from bench.config import RunConfig
from bench.run.artifacts import ARTIFACT_LIMITS, ARTIFACT_ROUTING
from bench.run.manager import start_run
from bench.store import Store

# Observed while the run ran, not derivable from what it stored: the host's load and the device
# telemetry's means are kept as series, their summary figures are the run's own.
RUNTIME_ONLY = {"disturbance", "other_cpu_cores", "client_cpu_cores", "steal_pct", "device_util_pct",
                "device_power_w", "device_mem_used_gib"}  # fmt: skip


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_a_recomputed_summary_equals_the_finished_one_field_for_field(store: Store, tiny_model: Path) -> None:
    cfg = RunConfig.build(
        engine={"kind": "native", "model": str(tiny_model), "record_routing": True},
        requests=6,
        concurrency=2,
        workload={"source": "random", "input_len": 16, "output_len": 6},
    )
    snap = start_run(cfg, store).wait(120)
    assert snap.status == "completed", snap.error
    run_id = snap.run_id
    assert run_id is not None and store.artifact(run_id, ARTIFACT_ROUTING) is not None
    finished = store.get_run(run_id).summary  # type: ignore[union-attr]
    limits = store.artifact(run_id, ARTIFACT_LIMITS)
    assert finished is not None and finished.moe_imbalance_max is not None and finished.accelerators == 1
    store.finish_lost_run(run_id, "completed", error="recomputed for the test")
    again = store.get_run(run_id).summary  # type: ignore[union-attr]
    assert again is not None
    a, b = finished.as_dict(), again.as_dict()
    differ = sorted(k for k in a if k not in RUNTIME_ONLY and not _same(a[k], b[k]))
    assert differ == [], {k: (a[k], b[k]) for k in differ}
    assert store.artifact(run_id, ARTIFACT_LIMITS) == limits

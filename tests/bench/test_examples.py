"""The committed H200 example runs import into a real store and carry a GPU breakdown."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.runner import ARTIFACT_BREAKDOWN, ARTIFACT_ROUTING, ARTIFACT_TRACE
from bench.store import Store, import_bundle_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_h200_profile_example(store: Store) -> None:
    run_id = import_bundle_file(store, EXAMPLES / "h200-profile.json")
    run = store.get_run(run_id)
    assert run is not None and run.status == "completed" and run.accelerator == "cuda"
    assert run.engine_info["device"] == "NVIDIA H200" and run.engine_info["parameters"] > 15e9
    bd = store.artifact(run_id, ARTIFACT_BREAKDOWN)
    assert bd["basis"] == "device"
    assert sum(r["device_ms"] for r in bd["rows"]) == pytest.approx(bd["total_ms"], rel=1e-6)
    routing = store.artifact(run_id, ARTIFACT_ROUTING)
    assert len(routing["layers"]) == 26 and routing["top_k"] == 6 and len(routing["counts"][0]) == 64
    trace = Path(store.artifact(run_id, ARTIFACT_TRACE)["path"])
    with gzip.open(trace, "rt") as fh:
        assert len(json.load(fh)["traceEvents"]) > 1000


@pytest.mark.parametrize("name", ["h200-latency-bs1.json", "h200-concurrency-16.json"])
def test_h200_run_examples(store: Store, name: str) -> None:
    run_id = import_bundle_file(store, EXAMPLES / name)
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None and run.summary.failed == 0
    assert store.sample_count(run_id) == run.summary.requests

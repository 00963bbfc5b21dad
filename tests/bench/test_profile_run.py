"""A profile run end to end on the tiny model: operator table, breakdown, routing, trace."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from bench.config import RunConfig
from bench.report.csv_export import OPERATOR_CSV_COLUMNS, operators_csv
from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_OPERATORS, ARTIFACT_ROUTING, ARTIFACT_TRACE
from bench.run.manager import start_run
from bench.store import Store
from engines.errors import MoEBenchError


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory, native_engine: object) -> tuple[Store, int]:
    store = Store(tmp_path_factory.mktemp("profile") / "p.sqlite")
    cfg = RunConfig.build(
        engine={"kind": "native"},
        mode="profile",
        workload={"source": "random", "input_len": 12, "output_len": 8},
        requests=2,
        concurrency=2,
        warmup=1,
    )
    snap = start_run(cfg, store, engine=native_engine).wait(300)  # type: ignore[arg-type]
    assert snap.status == "completed", snap.error
    return store, snap.run_id  # type: ignore[return-value]


@pytest.mark.slow
def test_operator_table_has_deepseek_ops(profiled: tuple[Store, int]) -> None:
    store, run_id = profiled
    ops = store.artifact(run_id, ARTIFACT_OPERATORS)
    names = {o["operator"] for o in ops}
    # matmuls, the sigmoid scoring and the group-limited top-k of DeepSeek-V3's router
    assert {"aten::mm", "aten::sigmoid", "aten::topk"} <= names
    assert not any(".py(" in n for n in names)
    mm = [o for o in ops if o["operator"] == "aten::mm"]
    assert all(o["calls"] > 0 and o["self_cpu_ms"] > 0 for o in mm) and any(o["input_shapes"] for o in mm)
    rows = list(csv.DictReader(io.StringIO(operators_csv(store, run_id).decode())))
    assert list(rows[0]) == list(OPERATOR_CSV_COLUMNS) and len(rows) == len(ops)


@pytest.mark.slow
def test_breakdown_sums_to_total(profiled: tuple[Store, int]) -> None:
    store, run_id = profiled
    bd = store.artifact(run_id, ARTIFACT_BREAKDOWN)
    assert bd["basis"] == "cpu" and bd["total_ms"] > 0
    by_cat = {r["category"]: r for r in bd["rows"]}
    assert sum(r["time_ms"] for r in bd["rows"]) == pytest.approx(bd["total_ms"], rel=1e-6)
    assert sum(r["share_pct"] for r in bd["rows"]) == pytest.approx(100.0, abs=0.01)
    for cat in ("attention_kv", "moe_routing", "routed_experts", "shared_experts", "dense_mlp", "sampling"):
        assert by_cat[cat]["time_ms"] > 0, cat
    assert by_cat["communication"]["time_ms"] == 0  # one device, no collectives


@pytest.mark.slow
def test_expert_counts_match_tokens_times_topk_times_layers(profiled: tuple[Store, int]) -> None:
    store, run_id = profiled
    routing = store.artifact(run_id, ARTIFACT_ROUTING)
    records = store.records(run_id)
    tokens = sum(r.prompt_tokens + r.output_tokens - 1 for r in records)
    assert len(records) == 2 and tokens == 2 * (12 + 8 - 1)
    moe_layers = len(routing["layers"])
    assert moe_layers == 2
    assert sum(sum(row) for row in routing["counts"]) == tokens * routing["top_k"] * moe_layers


@pytest.mark.slow
def test_trace_opens_as_json(profiled: tuple[Store, int]) -> None:
    store, run_id = profiled
    path = Path(store.artifact(run_id, ARTIFACT_TRACE)["path"])
    # beside its own store, named after it: a run of another store with the same id cannot overwrite it
    assert path == store.path.parent / "traces" / f"p-run{run_id}.trace.json"
    trace = json.loads(path.read_text())
    assert len(trace["traceEvents"]) > 100
    assert any(e.get("name") == "moe_bench::routed_experts" for e in trace["traceEvents"])


@pytest.mark.slow
def test_memory_timeline_is_sampled(profiled: tuple[Store, int]) -> None:
    store, run_id = profiled
    mem = store.timeseries(run_id, ["mem_allocated_gib", "mem_peak_gib"])
    assert len(mem) >= 2 and all(v and v > 0 for _t, _n, v in mem)
    # the headline peak is a point on the timeline (the analysis after the requests is not in it)
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    assert run.summary.peak_memory_gib == max(v for _t, n, v in mem if n == "mem_peak_gib")
    # and the timeline reaches the end of the measured phase
    assert max(t for t, _n, _v in mem) == pytest.approx(run.summary.duration_s, abs=0.5)


def test_operators_csv_of_a_non_profile_run_is_a_clear_error(store: Store) -> None:
    run_id = store.create_run(mode="latency", engine="native", model="m", accelerator="cpu", config={})
    with pytest.raises(MoEBenchError, match="only profile runs have one"):
        operators_csv(store, run_id)


def test_normal_runs_store_expert_routing(store: Store, native_engine: object) -> None:
    cfg = RunConfig.build(engine={"kind": "native"}, workload={"input_len": 8, "output_len": 4}, requests=3)
    snap = start_run(cfg, store, engine=native_engine).wait(120)  # type: ignore[arg-type]
    routing = store.artifact(snap.run_id, ARTIFACT_ROUTING)  # type: ignore[arg-type]
    assert routing is not None and sum(routing["tokens"]) == 2 * 3 * (8 + 4 - 1)

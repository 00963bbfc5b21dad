"""The MoE deployment analysis (bench.metrics.moe): per-layer figures, EP rank loads and the EPLB
what-if, checked against vLLM's own EPLB policy (DefaultEplbPolicy, in the vLLM environment) on
the same loads, placement for placement."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.metrics import moe
from engines.errors import ConfigError
from engines.vllm import vllm_python

VLLM_POLICY = r"""
import json, sys
import torch
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
out = []
for case in json.load(sys.stdin):
    w = torch.tensor(case["weight"], dtype=torch.float32)
    out.append(DefaultEplbPolicy.rebalance_experts(
        w, case["physical"], case["groups"], case["nodes"], case["ranks"]).tolist())
print(json.dumps(out))
"""


def _skewed(layers: int, experts: int, seed: int) -> np.ndarray:
    """Token counts with a few hot experts per layer, no two equal (ties sort by implementation)."""
    rng = np.random.default_rng(seed)
    base = rng.exponential(100.0, size=(layers, experts))
    hot = rng.integers(0, experts, size=(layers, 3))
    for layer, row in enumerate(hot):
        base[layer, row] *= 20
    return np.round(base + rng.random((layers, experts)), 3)


CASES = [  # (experts, groups, nodes, ranks, physical)
    (64, 1, 1, 8, 64),  # V2-Lite's shape, EP 8, no replicas
    (64, 1, 1, 8, 96),  # 32 redundant replicas
    (64, 8, 2, 8, 80),  # grouped experts on two nodes (hierarchical)
    (256, 8, 1, 32, 288),  # V3's 256 experts in 8 groups, EP 32, 32 redundant
    (8, 1, 1, 4, 12),  # the tiny model
]


def test_the_eplb_placement_is_vllms_placement_on_skewed_loads() -> None:
    weights = [_skewed(4, e, seed=i) for i, (e, *_rest) in enumerate(CASES)]
    payload = [
        {"weight": w.tolist(), "groups": g, "nodes": n, "ranks": r, "physical": p}
        for w, (_e, g, n, r, p) in zip(weights, CASES, strict=True)
    ]
    done = subprocess.run(
        [vllm_python(), "-c", VLLM_POLICY], input=json.dumps(payload), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for w, (_e, g, n, r, p), ref in zip(weights, CASES, theirs, strict=True):
        ours = moe.eplb_placement(w, p, g, n, r)
        assert ours.tolist() == ref, (g, n, r, p)
        # every expert placed at least once, each rank the same number of slots
        assert set(ours[0].tolist()) == set(range(w.shape[1])) and ours.shape == (4, p)


def test_eplb_evens_out_a_skewed_load_and_a_uniform_one_is_already_even() -> None:
    skew = {"counts": _skewed(6, 64, seed=7).tolist(), "n_group": 1}
    w = moe.eplb_whatif(skew, ep=8, redundant=32)
    assert w.balancedness is not None and w.eplb_balancedness is not None
    assert w.eplb_balancedness > w.balancedness and w.eplb_balancedness > 0.95
    assert w.rank_loads.sum() == pytest.approx(np.asarray(skew["counts"]).sum())  # tokens kept
    assert w.eplb_rank_loads.sum() == pytest.approx(w.rank_loads.sum())
    uniform = {"counts": [[100] * 64] * 4}
    u = moe.eplb_whatif(uniform, ep=8)
    assert u.balancedness == pytest.approx(1.0) and u.eplb_balancedness == pytest.approx(1.0)
    assert u.worst_layer_imbalance == pytest.approx(1.0)


def test_contiguous_rank_loads_and_vllms_balancedness() -> None:
    counts = np.array([[4, 0, 0, 0], [1, 1, 1, 1]], dtype=float)
    loads = moe.contiguous_rank_loads(counts, 2)
    assert loads.tolist() == [[4, 0], [2, 2]]
    # vLLM: sum of the layers' mean rank loads (2 + 2) over the sum of their max (4 + 2)
    assert moe.balancedness(loads) == pytest.approx(4 / 6)


def test_layer_figures() -> None:
    rows = moe.layer_routing({"counts": [[10, 0, 0, 10], [5, 5, 5, 5]], "layers": ["a", "b"]})
    assert [r.layer for r in rows] == ["a", "b"]
    assert rows[0].imbalance == pytest.approx(2.0) and rows[0].cold == 2 and rows[0].entropy == pytest.approx(0.5)
    assert rows[1].imbalance == pytest.approx(1.0) and rows[1].entropy == pytest.approx(1.0)
    assert set(rows[0].hot[:2]) == {0, 3}


@pytest.mark.parametrize(
    ("routing", "ep", "redundant", "reason"),
    [
        ({"counts": [[1, 2, 3]]}, 2, 0, "EP size 2 does not divide the 3 experts"),
        ({"counts": [[1, 2, 3, 4]]}, 2, 1, "experts + redundant (5) must divide by EP 2"),
        ({"counts": [1, 2, 3, 4]}, 2, 0, "counts must be [layers][experts]"),
        ({"counts": [[1, -2]]}, 2, 0, "finite and not negative"),
        ({"counts": [["x", 1]]}, 2, 0, "counts are not numbers"),
    ],
)
def test_bad_routing_or_ep_sizes_say_why_in_one_line(routing: dict, ep: int, redundant: int, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)):
        moe.eplb_whatif(routing, ep, redundant)


def test_the_routing_command_prints_the_table_and_says_why_when_a_run_has_none(tmp_path: Path) -> None:
    from bench.bundle import import_bundle_file
    from bench.store import Store
    from tests.hostile.clirun import ROOT, bench

    db = tmp_path / "db.sqlite"
    store = Store(db)
    eager = import_bundle_file(store, ROOT / "examples" / "h200-latency-bs1.json")
    fast = import_bundle_file(store, ROOT / "examples" / "h100-fast-latency-bs1.json")
    routing = store.artifact(eager, "expert_routing")
    expected = moe.eplb_whatif(routing, 8, 32)
    r = bench("routing", str(eager), "--ep", "8", "--redundant", "32", "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "26 MoE layers x 64 experts, top-6" in r.stdout
    assert f"balancedness {expected.balancedness:.3f}" in r.stdout
    assert f"32 redundant replica(s) on 1 node(s): balancedness {expected.eplb_balancedness:.3f}" in r.stdout
    assert len([line for line in r.stdout.splitlines() if re.match(r"layer \d+ ", line)]) == 26
    r = bench("routing", str(fast), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and "has no routing record" in r.one_error()
    r = bench("routing", str(eager), "--ep", "6", "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and "EP size 6 does not divide the 64 experts" in r.one_error()


def test_runs_carry_the_moe_figures_in_their_summary(tmp_path: Path, native_engine: object) -> None:
    """A native run of the tiny model (gate hooks count its routing) and an imported example from
    before the figures: both get moe_imbalance_max, ep_rank_imbalance and eplb_balancedness_whatif,
    equal to what bench.metrics.moe computes from the stored routing record; the summary CSV has them."""
    from bench.bundle import import_bundle_file
    from bench.config import RunConfig
    from bench.report.csv_export import summary_csv
    from bench.run.manager import start_run
    from bench.store import Store
    from tests.hostile.clirun import ROOT

    store = Store(tmp_path / "db.sqlite")
    cfg = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"},
        workload={"source": "random", "input_len": 16, "output_len": 4},
        requests=2,
    )
    snap = start_run(cfg, store, engine=native_engine).wait(300)
    assert snap.status == "completed", snap.error
    example = import_bundle_file(store, ROOT / "examples" / "h200-concurrency-16.json")
    for run_id in (snap.run_id, example):
        run = store.get_run(run_id)
        routing = store.artifact(run_id, "expert_routing")
        assert run is not None and run.summary is not None and routing
        want = moe.run_figures(routing)
        assert all(v is not None for v in want.values()), want
        got = {k: getattr(run.summary, k) for k in moe.MOE_RUN_COLUMNS}
        assert got == pytest.approx(want)
        assert 1.0 <= got["moe_imbalance_max"] and 0 < got["eplb_balancedness_whatif"] <= 1.0
    header = summary_csv(store, [example]).decode().splitlines()[0].split(",")
    assert set(moe.MOE_RUN_COLUMNS) <= set(header)

"""The committed GPU example runs (H200 eager baseline, H100 fastest configuration) import into a real
store and carry what they measured: a GPU breakdown, NVML telemetry, the tuning they ran under."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.bundle import import_bundle_file
from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_DEVICE_TELEMETRY, ARTIFACT_ROUTING, ARTIFACT_TRACE
from bench.store import Store

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


@pytest.mark.parametrize("name", ["h200-latency-bs1.json", "h200-concurrency-16.json"])
def test_h200_examples_carry_nvml_telemetry(store: Store, name: str) -> None:
    """Recorded on the H200 through NVML: utilisation, power and memory of GPU 0, once a second."""
    run_id = import_bundle_file(store, EXAMPLES / name)
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    assert store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY) == {
        "sources": [{"source": "NvmlSource", "name": "nvml"}],
        "missing": [],
    }
    total = [v for _, _, v in store.timeseries(run_id, ["dev0_mem_total_gib"]) if v is not None]
    assert total and min(total) > 130  # an H200's 141 GiB as NVML reports it
    assert len(store.timeseries(run_id, ["dev0_util_pct"])) >= run.summary.duration_s - 2
    s = run.summary
    assert s.device_util_pct is not None and 0 < s.device_util_pct <= 100
    assert s.device_power_w is not None and 60 < s.device_power_w < 700
    assert s.device_mem_used_gib is not None and s.device_mem_used_gib >= run.engine_info["weights_gib"]


@pytest.mark.parametrize(
    "name",
    [
        "h200-bf16-kernels",
        "h200-bf16-cache-compile",
        "h200-fp32-check",
        "h100-bf16-graph-loop",
        "h100-bf16-graph-loop-sync",
        "h100-bf16-transformers-5.19",
    ],
)
def test_gpu_tuning_runs_import_with_their_tuning(store: Store, tmp_path: Path, name: str) -> None:
    """The tuning ablation's runs (bench/analysis/tuning_ablation.py on the H200 and an H100): every
    row of results.json that ran is a bundle that imports, with the tuning it ran under."""
    import tarfile

    rows = [r for r in json.loads((EXAMPLES / "tuning" / f"{name}.results.json").read_text())["rows"] if "run_id" in r]
    with tarfile.open(EXAMPLES / "tuning" / f"{name}.bundles.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        f"tuning-{r['config']}-b{r['batch']}.json" for r in rows
    )
    for r in rows:
        run = store.get_run(import_bundle_file(store, tmp_path / f"tuning-{r['config']}-b{r['batch']}.json"))
        device = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}[name[:4]]
        assert run is not None and run.status == "completed" and run.engine_info["device"] == device
        assert run.engine_info["tuning"]["batch_size"] == r["batch"]
        if r["config"].startswith("cuda_graphs"):  # which graph loop streamed it, recorded with the run
            assert run.engine_info["tuning"]["cuda_graphs_pipelined"] is not r["config"].endswith("_sync")
        assert run.summary is not None and run.summary.itl_ms.p50 == pytest.approx(r["step_ms_p50"])


def test_the_ablations_stall_finder_names_the_h200_batch_128_stall(store: Store, tmp_path: Path) -> None:
    """native_tuning.py's stall summary over the saved H200 cuda_graphs batch-128 run: the one
    stall every one of the 128 sequences took at the same step (gaps of 290-308 ms, one of 389,
    beginning 2.70-2.75 s into the run), and nothing else."""
    import tarfile

    from bench.analysis.tuning_ablation import find_stalls, stall_text

    with tarfile.open(EXAMPLES / "tuning" / "h200-bf16-cuda-graphs.bundles.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    run_id = import_bundle_file(store, tmp_path / "tuning-cuda_graphs-b128.json")
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    stalls = find_stalls(store.records(run_id), run.summary.itl_ms.p50)
    assert len(stalls) == 1, stalls
    (stall,) = stalls
    assert stall["sequences"] == 128 and 380 <= stall["ms_max"] <= 400 and 2.69 <= stall["t_s"] <= 2.71
    assert "1 stall(s), worst" in stall_text({"stalls": stalls}) and "128 sequences" in stall_text({"stalls": stalls})
    # the batch-1 run of the same file has none
    one = import_bundle_file(store, tmp_path / "tuning-cuda_graphs-b1.json")
    one_run = store.get_run(one)
    assert one_run is not None and one_run.summary is not None
    assert find_stalls(store.records(one), one_run.summary.itl_ms.p50) == []


FAST_OPTIONS = {"cuda_graphs": True, "compile": "default", "mla": "absorbed", "experts_impl": "lean_grouped_mm",
                "router": "lean", "cache": "static"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "mode", "batch"),
    [("h100-fast-latency-bs1", "latency", 1), ("h100-fast-concurrency-128", "concurrency", 128)],
)
def test_h100_fast_examples_were_recorded_by_the_cli_with_the_fast_configuration(
    store: Store, name: str, mode: str, batch: int
) -> None:
    """studies/showcase_gpu.py on an H100 (2026-12-07): `python -m bench run` with the fastest options,
    every shape captured before the clock (the run's engine_prepare artifact), NVML on, nothing failed."""
    run_id = import_bundle_file(store, EXAMPLES / f"{name}.json")
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None and run.mode == mode and run.name == name
    assert run.summary.failed == 0 and run.summary.completed == run.summary.requests
    engine = run.config["engine"]
    assert {k: engine[k] for k in FAST_OPTIONS} == FAST_OPTIONS and engine["batch_size"] == batch
    assert run.engine_info["device"] == "NVIDIA H100 80GB HBM3"
    assert run.engine_info["tuning"]["cuda_graphs_uncompiled"] == 0
    prepared = store.artifact(run_id, "engine_prepare")
    assert prepared is not None and f"batch sizes {batch} " in prepared["text"] and prepared["seconds"] > 0
    telemetry = [v for _, _, v in store.timeseries(run_id, ["dev0_mem_total_gib"]) if v is not None]
    assert telemetry and 75 < min(telemetry) < 85  # an H100's 80 GB as NVML reports it


def test_h100_batch_128_example_reaches_the_tuning_figure(store: Store) -> None:
    """The product path's batch-128 run against `bench tune` in the same device call: >= 0.9x."""
    run = store.get_run(import_bundle_file(store, EXAMPLES / "h100-fast-concurrency-128.json"))
    tune = json.loads((EXAMPLES / "tuning" / "h100-2026-12-07-showcase-tune.json").read_text())["rows"]
    tuned = next(r["output_tok_s"] for r in tune if r["batch"] == 128)
    assert run is not None and run.summary is not None
    assert run.summary.output_throughput_tok_s / tuned >= 0.9


def test_h100_plain_example_is_the_eager_baseline(store: Store) -> None:
    run = store.get_run(import_bundle_file(store, EXAMPLES / "h100-plain-latency.json"))
    assert run is not None and run.summary is not None and run.summary.failed == 0
    engine = run.config["engine"]
    assert not engine.get("cuda_graphs") and engine.get("compile") in (None, "off")


def test_the_example_sweep_imports_with_its_runs_and_exports_back(store: Store) -> None:
    """A sweep bundle (moebench-sweep/1): the sweep row and its four runs, each pointing at it; exported
    again it holds the same runs and points."""
    from bench.bundle import import_file

    kind, sweep_id = import_file(store, EXAMPLES / "h100-fast-sweep.sweep.json")
    assert kind == "sweep"
    sweep = store.get_sweep(sweep_id)
    assert sweep is not None and sweep.name == "h100-fast-sweep" and sweep.status == "completed"
    runs = store.sweep_runs(sweep_id)
    assert [r.sweep_point["concurrency"] for r in runs if r.sweep_point] == [1, 8, 32, 128]
    assert all(r.summary is not None and r.summary.failed == 0 for r in runs)
    again = store.export_sweep_bundle(sweep_id)
    assert again["format"] == "moebench-sweep/1" and len(again["runs"]) == 4
    assert [b["run"]["name"] for b in again["runs"]] == [r.name for r in runs]


@pytest.mark.parametrize(
    "name,tokens", [("h100-energy-latency-bs1.json", 48), ("h100-energy-concurrency-16.json", 256)]
)
def test_h100_energy_examples_are_the_nvml_counters_delta(store: Store, name: str, tokens: int) -> None:
    """Native runs on an H100 (2026-12-07, studies/exit_check.py): the energy over the measured window
    is the NVML energy counter's last value less its first, and J/token divides it by the output tokens."""
    run_id = import_bundle_file(store, EXAMPLES / name)
    run = store.get_run(run_id)
    assert run is not None and run.engine_info["device"] == "NVIDIA H100 80GB HBM3"
    s = run.summary
    counter = [v for _, _, v in store.timeseries(run_id, ["dev0_energy_j"]) if v is not None]
    assert s is not None and s.output_tokens == tokens and len(counter) >= 3
    assert s.energy_j == pytest.approx(counter[-1] - counter[0])
    assert s.joules_per_output_token == pytest.approx(s.energy_j / tokens)
    assert 60 < s.power_avg_w < 700  # an H100 SXM's board power: idle ~70 W, limit 700 W
    assert store.artifact(run_id, "energy")["devices"][0]["method"] == "energy counter"


def test_h100_vllm_examples_name_their_card_and_engine(store: Store) -> None:
    """vLLM 0.25.0 served on an H100 through MoE Bench's managed server (2026-12-08): each run says
    which vLLM and that its weights were random (dummy), and is named for its card from its own
    NVML telemetry (the launch recorded only 'cuda' then), so the Compare page's H100 column finds it."""
    from bench.bundle import import_path

    for name in ("h100-vllm-latency-bs1.json", "h100-vllm-concurrency-128.json", "h100-vllm-ngram-bs1.json"):
        run = store.get_run(import_path(store, EXAMPLES / name).id)
        assert run is not None and run.engine == "vllm" and run.status == "completed"
        assert run.engine_info["vllm_version"] == "0.25.0" and run.engine_info["load_format"].startswith("dummy")
        assert run.engine_info["device"] == "NVIDIA H100 80GB HBM3"
        assert run.summary is not None and run.summary.failed == 0 and run.summary.energy_j
    ngram = store.get_run(import_path(store, EXAMPLES / "h100-vllm-ngram-bs1.json").id)
    assert ngram is not None and ngram.summary is not None and ngram.summary.spec_acceptance_rate is not None
    sweep = import_path(store, EXAMPLES / "h100-vllm-sweep.sweep.json")
    points = sorted(r.concurrency or 0 for r in store.sweep_runs(sweep.id))
    assert points == [1, 8, 32, 128]

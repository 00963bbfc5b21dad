"""A run's hardware limits (bench.metrics.run_limits): the H200 examples against the H200's datasheet,
a CPU run of the tiny model against this machine's measured bandwidth, and the one-line
reasons where there is no limit."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from bench.bundle import import_bundle_file
from bench.metrics.cpu_limits import CPU_CACHE_FILE, cpu_spec, forget_measurement, measure_cpu
from bench.metrics.model_shape import ModelShape
from bench.metrics.roofline import get_spec, preset_config, roofline
from bench.metrics.run_limits import NoLimit, for_run, for_run_or_reason
from bench.run.artifacts import ARTIFACT_LIMITS
from bench.store import Store
from engines.models import TINY_CONFIG
from tests.bench.test_cli import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(("name", "batch"), [("h200-latency-bs1.json", 1), ("h200-concurrency-16.json", 16)])
def test_the_h200_examples_are_held_against_the_h200_datasheet(store: Store, name: str, batch: int) -> None:
    run = store.get_run(import_bundle_file(store, EXAMPLES / name))
    assert run is not None and run.summary is not None
    got = for_run(run.config, run.engine_info, run.summary, run.accelerator)
    s = run.summary
    context = round(s.prompt_tokens / s.completed + s.output_tokens / s.completed / 2)
    assert (got.spec_key, got.batch, got.context_len, got.dtype) == ("h200", batch, context, "bfloat16")
    shape = ModelShape.from_config(preset_config("random-v2-lite-shape"))
    point = roofline(shape, get_spec("h200"), batch, context, "bf16")
    assert got.tpot_limit_ms == pytest.approx(point.step_ms) and got.output_tok_s_limit == pytest.approx(point.tok_s)
    assert got.bound == "memory"
    if batch == 1:
        assert 0.5 < got.tpot_limit_ms < 3  # ~1 ms: 2.7 B active bf16 at 4.8 TB/s
    assert got.tpot_pct == pytest.approx(got.tpot_limit_ms / s.tpot_ms.p50 * 100)
    assert got.throughput_pct == pytest.approx(s.output_throughput_tok_s / got.output_tok_s_limit * 100)
    assert got.tpot_pct < 5  # eager transformers is launch-bound: a few % of the HBM limit at most
    assert "NVIDIA H200 (SXM), bfloat16, batch" in got.line() and "reached: TPOT p50" in got.line()
    assert got.caveat == ""


@pytest.mark.slow
def test_a_cpu_run_stores_its_limit_in_summary_csv_and_artifact(
    tmp_path: Path, tiny_model: Path, moebench_data: Path
) -> None:
    db = tmp_path / "db.sqlite"
    p = cli(
        "run", "--engine", "native", "--model", "tiny-deepseek-v3", "--accelerator", "cpu",
        "--mode", "concurrency", "--requests", "6", "--concurrency", "2", "--input-len", "24", "--output-len", "8",
        "--summary-csv", str(tmp_path / "sum.csv"), db=db,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    store = Store(db)
    run = store.list_runs(limit=1)[0]
    s = run.summary
    assert s is not None and s.completed == 6
    saved = store.artifact(run.id, ARTIFACT_LIMITS)
    assert saved["spec_key"] == "cpu" and saved["batch"] == 2 and saved["confidence"] == "measured"
    # The CPU figures are this machine's measured ones, as the data folder keeps them.
    kept = json.loads((moebench_data / CPU_CACHE_FILE).read_text())["measurement"]
    assert saved["bandwidth_gb_s"] == kept["read_gb_s"]["median"]
    assert saved["context_len"] == round((s.prompt_tokens + s.output_tokens / 2) / s.completed)
    recorded = run.engine_info["model_config"]
    assert recorded["n_routed_experts"] == TINY_CONFIG["n_routed_experts"]
    shape = ModelShape.from_config(recorded)
    spec = cpu_spec(bandwidth_gb_s=saved["bandwidth_gb_s"], peak_gflops=saved["peak_tflops"] * 1000)
    point = roofline(shape, spec, 2, saved["context_len"], saved["dtype"])
    assert s.tpot_limit_ms == pytest.approx(point.step_ms) and s.output_tok_s_limit == pytest.approx(point.tok_s)
    assert s.tpot_pct_of_limit == pytest.approx(point.step_ms / s.tpot_ms.p50 * 100)
    assert s.throughput_pct_of_limit == pytest.approx(s.output_throughput_tok_s / point.tok_s * 100)
    assert "limit         this machine's CPU, float32, batch 2" in p.stdout
    row = next(csv.DictReader(io.StringIO((tmp_path / "sum.csv").read_text())))
    assert float(row["tpot_limit_ms"]) == pytest.approx(s.tpot_limit_ms, rel=1e-3)  # the CSV rounds
    assert float(row["throughput_pct_of_limit"]) == pytest.approx(s.throughput_pct_of_limit, rel=1e-3)


def test_the_cpu_measurement_is_kept_in_the_data_folder(moebench_data: Path) -> None:
    forget_measurement()  # an earlier test of this process may have measured (another data folder)
    first = measure_cpu()
    kept = json.loads((moebench_data / CPU_CACHE_FILE).read_text())
    assert kept["measurement"]["read_gb_s"]["median"] == first.read_gb_s.median
    forget_measurement()  # a new process: it reads the kept figures instead of measuring again
    again = measure_cpu()
    assert again == first  # float-for-float: a new measurement would differ
    kept["host"] = "another|1|cpu"
    (moebench_data / CPU_CACHE_FILE).write_text(json.dumps(kept))
    forget_measurement()
    other = measure_cpu()  # another host's figures are not used: measured afresh
    assert other.read_gb_s.median != first.read_gb_s.median
    assert json.loads((moebench_data / CPU_CACHE_FILE).read_text())["host"] != "another|1|cpu"


def test_no_limit_is_one_line_naming_why() -> None:
    tiny = {"engine": {"model": "tiny-deepseek-v3", "accelerator": "cpu"}, "mode": "latency"}
    assert for_run_or_reason({"engine": {"model": "deepseek-ai/DeepSeek-V3", "accelerator": "cuda"}}, {}, None) == (
        "no config for model 'deepseek-ai/DeepSeek-V3' here (not a preset, no local config.json)"
    )
    assert for_run_or_reason(tiny, {"device": "NVIDIA A100-SXM4-80GB"}, None, "cuda") == (
        "no spec for the device 'NVIDIA A100-SXM4-80GB' (known: H100 SXM, H200, Ascend 910B, MLU590)"
    )
    assert for_run_or_reason(tiny, {"base_url": "http://gpu-box.example:8000/v1"}, None) == (
        "served from gpu-box.example: this machine's CPU figures would not apply"
    )
    assert for_run_or_reason(tiny, {"host": "elsewhere-host"}, None) == (
        "measured on another host (elsewhere-host): this machine's CPU figures would not apply"
    )
    with pytest.raises(NoLimit, match="not a DeepSeek-V2/V3"):
        for_run(tiny, {"model_config": {"hidden_size": 8}}, None)


def test_npu_and_mlu_runs_use_the_table_defaults_and_say_how_weak_they_are() -> None:
    cfg = {"engine": {"model": "random-v2-lite-shape"}, "mode": "latency", "workload": {"input_len": 128}}
    npu = for_run(cfg, {"device": "Ascend910B2"}, None, "npu")
    assert npu.spec_key == "ascend-910b2" and npu.context_len == 128 and npu.tpot_pct is None
    assert npu.caveat == " (spec figures: low confidence)" and npu.line().endswith(npu.caveat)
    mlu = for_run(cfg, {}, None, "mlu")
    assert mlu.spec_key == "mlu590" and "unverified" in mlu.caveat

"""The Compare page with the real H200 run bundles: a baseline of the user's choice, the book's %
beside the measured %, device memory from telemetry, and memory efficiency from telemetry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bundle import import_bundle_file
from bench.metrics.summary import summarize
from bench.store import RunRow, Store
from dashboard.data import fmt_unit
from engines.settings import get_settings
from tests.dashboard.synthetic import add_synthetic_run, synthetic_records
from tests.dashboard.test_compare_page import PAGE, _frame, _no_exception, _texts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REMOTE_SERIES = ("h10_0_0_7_dev0_mem_used_gib", "h10_0_0_7_dev1_mem_used_gib")
REMOTE_MEMORY = [(20.0, 18.0), (31.5, 30.0), (25.0, 24.0)]  # per second, per device of the remote server


def _bundle_device_peak(path: Path) -> float:
    """The bundle's peak device memory in use, from its JSON: per sample time the sum over devices."""
    sums: dict[float, float] = {}
    for t, name, value in json.loads(path.read_text(encoding="utf-8"))["timeseries"]:
        if name.startswith("dev") and name.endswith("_mem_used_gib") and value is not None:
            sums[t] = sums.get(t, 0.0) + value
    return max(sums.values())


def _like(store: Store, model: RunRow, engine: str, accelerator: str, peak_gib: float | None, seed: int) -> int:
    """A completed run of ``model``'s workload (same config) by another engine or accelerator."""
    run_id = store.create_run(
        mode=model.mode,
        engine=engine,
        model=model.model,
        accelerator=accelerator,
        config=model.config,
        concurrency=model.concurrency,
    )
    records = synthetic_records(32, output_tokens=32, seed=seed)
    store.add_samples(run_id, list(enumerate(records)))
    store.finish_run(run_id, "completed", summary=summarize(records, peak_memory_gib=peak_gib))
    return run_id


def _remote_ascend_run(store: Store, h200: RunRow) -> int:
    """An openai-engine run against a remote server, read through its exporter: stored with the client's
    accelerator (cpu), no engine peak, device memory from the exporter's series only."""
    run_id = _like(store, h200, "openai", "cpu", None, seed=3)
    store.set_engine_info(run_id, {"engine": "openai", "base_url": "http://10.0.0.7:8000/v1"})
    store.add_points(
        run_id,
        [
            (float(t), name, gib)
            for t, row in enumerate(REMOTE_MEMORY)
            for name, gib in zip(REMOTE_SERIES, row, strict=True)
        ],
    )
    return run_id


def _pct(value: float, base: float) -> str:
    return f"{value / base * 100:.0f}%"


def _chart_titles(at: Any) -> list[str]:
    titles = []
    for chart in at.get("plotly_chart"):
        title = json.loads(chart.proto.spec)["layout"].get("title", {})
        titles.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return titles


def test_h200_bundle_as_baseline_then_the_ascend_column(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    store = Store(get_settings().db_path)
    latency_id = import_bundle_file(store, EXAMPLES / "h200-latency-bs1.json")
    h200_id = import_bundle_file(store, EXAMPLES / "h200-concurrency-16.json")
    h200 = store.get_run(h200_id)
    assert h200 is not None and h200.summary is not None and h200.summary.peak_memory_gib is not None
    remote_id = _remote_ascend_run(store, h200)
    cpu_id = _like(store, h200, "native", "cpu", 2.0, seed=4)  # the same workload on the CPU: RSS, no telemetry
    tiny_id = add_synthetic_run(store, 20, name="tiny on the CPU")  # another workload
    remote = store.get_run(remote_id)
    assert remote is not None and remote.summary is not None

    at = app_test(PAGE)
    _no_exception(at)
    # Each column lists the runs on its card first (newest first), then every other run; it starts on
    # the newest on its card, or on none: an H200 run is no H100 run (issue 45).
    cuda_pick = at.selectbox(key="c.acc.cuda")
    assert cuda_pick.value is None
    assert cuda_pick.options[0] == "none"
    assert cuda_pick.options[1].startswith(f"#{h200_id} native") and "NVIDIA H200" in cuda_pick.options[1]
    assert cuda_pick.options[2].startswith(f"#{latency_id} native")
    assert all(o.endswith(" · no H100") for o in cuda_pick.options[1:3])
    others = cuda_pick.options[3:]
    assert [o.split()[0] for o in others] == [f"#{tiny_id}", f"#{cpu_id}", f"#{remote_id}"]
    assert all(o.endswith(" · accelerator cpu") for o in others)  # said where it differs from the column's
    assert at.selectbox(key="c.acc.npu").value is None and at.selectbox(key="c.acc.mlu").value is None
    assert "no Huawei Ascend 910B run measured yet: any other stored run can be picked above" in _texts(at, "info")
    assert at.selectbox(key="c.acc.baseline").value == "cuda"
    # The user stands the H200 run in the H100 column; the page says it is no H100.
    at.selectbox(key="c.acc.cuda").set_value(h200_id).run()
    assert f"Run #{h200_id} was not measured on the column's card (NVIDIA H100)." in _texts(at, "warning")

    # The remote run stands in the Ascend column; the H200 run is the baseline.
    at.selectbox(key="c.acc.npu").set_value(remote_id).run()
    at.selectbox(key="c.acc.mlu").set_value(cpu_id).run()
    _no_exception(at)
    assert not any(t.startswith("Not comparable") for t in _texts(at, "error"))
    h200_dev, remote_dev = _bundle_device_peak(EXAMPLES / "h200-concurrency-16.json"), max(map(sum, REMOTE_MEMORY))
    s_h200, s_remote = h200.summary, remote.summary
    acc = _frame(at, "measured run").set_index("column")
    h100, ascend, mlu = acc.loc["NVIDIA H100"], acc.loc["Huawei Ascend 910B"], acc.loc["Cambricon MLU590"]
    assert h100["measured run"] == f"#{h200_id} · NVIDIA H200"
    assert ascend["measured run"] == f"#{remote_id} · cpu"
    assert h100["peak memory"] == "83.6 GiB (torch peak)"  # the engine's own peak first
    assert h100["device memory in use (telemetry)"] == f"{fmt_unit(h200_dev, 'GiB')}" == "119.3 GiB"
    assert ascend["peak memory"] == f"{fmt_unit(remote_dev, 'GiB')} (device telemetry)" == "61.5 GiB (device telemetry)"
    assert (
        mlu["peak memory"] == "2 GiB (process RSS peak)" and mlu["device memory in use (telemetry)"] == "not measured"
    )
    assert [h100[f"{m} % ({w})"] for m in ("throughput", "latency", "memory") for w in ("measured", "book")] == [
        "100%", "100%", "100%", "100%", "100% (torch peak)", "100%",
    ]  # fmt: skip
    assert ascend["throughput % (measured)"] == _pct(s_remote.output_throughput_tok_s, s_h200.output_throughput_tok_s)
    assert ascend["latency % (measured)"] == _pct(s_remote.e2e_ms.mean, s_h200.e2e_ms.mean)
    # Memory from the one source both runs have: device telemetry (the remote run has no engine peak).
    assert ascend["memory % (measured)"] == f"{_pct(remote_dev, h200_dev)} (device telemetry)"
    assert (ascend["throughput % (book)"], ascend["latency % (book)"], ascend["memory % (book)"]) == (
        "70%", "120%", "80%",
    )  # fmt: skip
    assert (mlu["throughput % (book)"], mlu["latency % (book)"], mlu["memory % (book)"]) == ("60%", "150%", "70%")
    # A torch peak and a CPU process's RSS are no ratio; the CPU run has no telemetry.
    assert mlu["memory % (measured)"] == "sources differ (torch peak vs process RSS peak)"
    assert any(
        t.startswith(f"Baseline (= 100 %): run #{h200_id} in the NVIDIA H100 column (NVIDIA H200)")
        and t.endswith("(as printed).")
        for t in _texts(at, "caption")
    )
    assert any("python -m bench import FILE" in t and "Results page" in t for t in _texts(at, "caption"))

    # Normalise to the Ascend column's run instead.
    at.selectbox(key="c.acc.baseline").set_value("npu").run()
    _no_exception(at)
    acc = _frame(at, "measured run").set_index("column")
    h100, ascend, mlu = acc.loc["NVIDIA H100"], acc.loc["Huawei Ascend 910B"], acc.loc["Cambricon MLU590"]
    assert h100["throughput % (measured)"] == _pct(s_h200.output_throughput_tok_s, s_remote.output_throughput_tok_s)
    assert h100["latency % (measured)"] == _pct(s_h200.e2e_ms.mean, s_remote.e2e_ms.mean)
    assert h100["memory % (measured)"] == f"{_pct(h200_dev, remote_dev)} (device telemetry)"
    # The book's figures rebased to the 910B (book / book): the H100 is 100/70 of its throughput.
    assert (h100["throughput % (book)"], h100["latency % (book)"], h100["memory % (book)"]) == (
        _pct(100, 70), _pct(100, 120), _pct(100, 80),
    )  # fmt: skip
    assert (h100["throughput % (book)"], h100["latency % (book)"], h100["memory % (book)"]) == ("143%", "83%", "125%")
    assert [ascend[f"{m} % (measured)"] for m in ("throughput", "latency")] == ["100%", "100%"]
    assert ascend["memory % (measured)"] == "100% (device telemetry)"
    assert [ascend[f"{m} % (book)"] for m in ("throughput", "latency", "memory")] == ["100%", "100%", "100%"]
    assert mlu["throughput % (book)"] == _pct(60, 70) and mlu["memory % (book)"] == _pct(70, 80)
    assert mlu["memory % (measured)"] == "sources differ (device telemetry vs process RSS peak)"
    assert any(
        t.startswith(f"Baseline (= 100 %): run #{remote_id} in the Huawei Ascend 910B column (accelerator cpu,")
        and "rebased" in t
        for t in _texts(at, "caption")
    )
    titles = _chart_titles(at)
    assert "Book: % of Huawei Ascend 910B" in titles
    assert f"Measured: % of run #{remote_id} (accelerator cpu, device not recorded)" in titles

    # A column emptied: its row says so, the book's figures stay.
    at.selectbox(key="c.acc.mlu").set_value(None).run()
    mlu = _frame(at, "measured run").set_index("column").loc["Cambricon MLU590"]
    assert mlu["measured run"] == "no run yet" and mlu["throughput % (measured)"] == "-"
    store.close()


def test_native_memory_efficiency_from_device_telemetry(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    store = Store(get_settings().db_path)
    h200_id = import_bundle_file(store, EXAMPLES / "h200-concurrency-16.json")
    h200 = store.get_run(h200_id)
    assert h200 is not None and h200.summary is not None and h200.summary.peak_memory_gib is not None
    vllm_id = _like(store, h200, "vllm", "cuda", None, seed=5)
    store.add_points(vllm_id, [(0.0, "server_kv_cache_usage_pct", 12.5), (1.0, "server_kv_cache_usage_pct", 40.0)])
    cpu_id = add_synthetic_run(store, 20, name="tiny on the CPU")

    at = app_test(PAGE)
    _no_exception(at)
    assert (at.selectbox(key="c.native").value, at.selectbox(key="c.vllm").value) == (h200_id, vllm_id)
    efficiency = h200.summary.peak_memory_gib / _bundle_device_peak(EXAMPLES / "h200-concurrency-16.json") * 100
    row = _frame(at, "native (measured)").set_index("metric").loc["Memory efficiency"]
    assert row["native (measured)"] == f"{fmt_unit(efficiency, '%')} (device telemetry)" == "70.1 % (device telemetry)"
    assert row["vLLM (measured)"] == "40 %"  # the KV cache's use: the plain figure of the first definition
    assert row["gain (measured)"] == "definitions differ"  # two definitions make no gain in points
    assert any(
        "labelled (device telemetry): Where the engine reports no KV-cache use" in t for t in _texts(at, "caption")
    )

    # A CPU run has no device telemetry: not measured, never an estimate.
    at.selectbox(key="c.native").set_value(cpu_id).run()
    _no_exception(at)
    row = _frame(at, "native (measured)").set_index("metric").loc["Memory efficiency"]
    assert row["native (measured)"] == "not measured"
    store.close()

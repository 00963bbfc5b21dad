"""The book page compares like with like: matching runs by default, no gain between different workloads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.store import Store
from engines.settings import get_settings
from tests.dashboard.synthetic import add_synthetic_run

PAGE = "app_pages/compare.py"


def _texts(at: Any, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def _frame(at: Any, column: str) -> Any:
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a '{column}' column on the page")


def _gain_traces(at: Any) -> list[str]:
    """The names of the bars of the book-vs-measured gain chart."""
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if "Improvement factor" in json.dumps(spec["layout"].get("title", "")):
            return [t.get("name") for t in spec["data"]]
    raise AssertionError("no gain chart on the page")


def _no_exception(at: Any) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_runs_of_different_workloads_get_no_gain(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The issue's case: a native latency run and a vLLM concurrency run, and nothing else."""
    store = Store(get_settings().db_path)
    native = add_synthetic_run(store, 20, mode="latency", name="native latency")
    vllm = add_synthetic_run(store, 20, engine="vllm", seed=1, name="vllm concurrency")
    at = app_test(PAGE)
    _no_exception(at)
    # The page's main action, first and primary.
    run_button = at.button(key="c.btn.compare")
    assert at.main.button[0].key == "c.btn.compare" and run_button.proto.type == "primary"
    assert (at.selectbox(key="c.native").value, at.selectbox(key="c.vllm").value) == (native, vllm)
    assert "Not comparable: mode: latency vs concurrency; concurrency: 1 vs 4" in _texts(at, "error")
    assert any("No native run and vLLM run share a workload yet" in t for t in _texts(at, "info"))
    measured = _frame(at, "native (measured)")
    assert set(measured["gain (measured)"]) == {"not comparable"}
    assert measured["native (measured)"][0].endswith("tokens/s")  # each run's own figures stay
    assert measured["vLLM (measured)"][0].endswith("tokens/s")
    assert _gain_traces(at) == ["book"]  # no measured bar
    assert not any(b.key == "c.btn.pick-pair" for b in at.button)  # no matching pair to offer
    store.close()


def test_the_matching_pair_is_picked_by_default_and_its_gain_drawn(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    native = add_synthetic_run(store, 20, name="native concurrency")
    vllm = add_synthetic_run(store, 40, engine="vllm", seed=1, name="vllm concurrency")  # more requests: same load
    newest_vllm = add_synthetic_run(store, 20, engine="vllm", mode="latency", seed=2, name="vllm latency")
    at = app_test(PAGE)
    _no_exception(at)
    assert (at.selectbox(key="c.native").value, at.selectbox(key="c.vllm").value) == (native, vllm)
    assert not any(t.startswith("Not comparable") for t in _texts(at, "error"))
    s_native, s_vllm = store.get_run(native).summary, store.get_run(vllm).summary  # type: ignore[union-attr]
    measured = _frame(at, "native (measured)")
    assert measured["gain (measured)"][0] == f"{s_vllm.output_throughput_tok_s / s_native.output_throughput_tok_s:.2f}x"
    assert _gain_traces(at) == ["book", "measured"]

    # The user picks a run of another workload: the gain goes, the reason and the way back come.
    at.selectbox(key="c.vllm").set_value(newest_vllm).run()
    _no_exception(at)
    assert "Not comparable: mode: concurrency vs latency; concurrency: 4 vs 1" in _texts(at, "error")
    assert _gain_traces(at) == ["book"]
    at.button(key="c.btn.pick-pair").click().run()
    _no_exception(at)
    assert at.selectbox(key="c.vllm").value == vllm and _gain_traces(at) == ["book", "measured"]
    store.close()


def test_accelerator_percentages_only_against_a_baseline_run_of_the_same_workload(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    cuda = add_synthetic_run(store, 20, accelerator="cuda", device="NVIDIA H100")
    npu = add_synthetic_run(store, 20, accelerator="npu", device="Ascend 910B", mode="latency", seed=1)
    add_synthetic_run(store, 20, accelerator="mlu", device="MLU590", seed=2)
    at = app_test(PAGE)
    _no_exception(at)
    assert at.selectbox(key="c.acc.baseline").value == "cuda"  # the book's baseline by default
    acc = _frame(at, "measured run").set_index("column")
    assert acc.loc["NVIDIA H100", "throughput % (measured)"] == "100%"
    assert acc.loc["NVIDIA H100", "memory % (measured)"] == "100% (torch peak)"
    assert acc.loc["Cambricon MLU590", "throughput % (measured)"].endswith("%")  # same workload: a percentage
    assert acc.loc["Huawei Ascend 910B", "throughput % (measured)"] == "not comparable"
    assert acc.loc["Huawei Ascend 910B", "throughput % (book)"] == "70%"  # the book's figure stays beside it
    assert acc.loc["Huawei Ascend 910B", "throughput"].endswith("tok/s")  # its own figure stays
    assert (
        f"Not comparable (Huawei Ascend 910B column's run #{npu} against the baseline run #{cuda}): "
        "mode: concurrency vs latency; concurrency: 4 vs 1"
    ) in _texts(at, "error")
    store.close()

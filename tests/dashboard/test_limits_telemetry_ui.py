"""The hardware's limits on the dashboard (charts, summaries, the Engine page), the devices a run
watches, and the telemetry fields of the run forms: on the real H200 example runs and the real
tiny model on this CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.bundle import import_bundle_file
from bench.metrics.cpu_limits import cpu_measured, cpu_spec
from bench.metrics.run_limits import RunLimits, model_limits_table
from bench.run.artifacts import ARTIFACT_DEVICE_TELEMETRY
from bench.store import Store
from dashboard import charts, data
from engines.settings import get_settings
from tests.dashboard.test_pages import _no_exception, _submit_form, _texts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _notes(fig: Any, name: str = "limit") -> list[str]:
    return [a.text for a in fig.layout.annotations if a.name == name]


def _limit_table(at: Any) -> Any:
    return next(d.value for d in at.dataframe if "min step (ms)" in d.value.columns)


def _lines(fig: Any, name: str = "limit") -> list[Any]:
    return [s for s in fig.layout.shapes if s.name == name]


def test_a_limit_near_the_data_is_a_line_and_a_far_one_a_note_at_the_edge() -> None:
    near = charts._figure("t")
    charts.hardware_limit(near, 120.0, "hardware limit 120 tok/s", "y", 0.0, 100.0)
    assert [(s.y0, s.y1, s.xref) for s in _lines(near)] == [(120.0, 120.0, "paper")]
    assert _notes(near) == ["hardware limit 120 tok/s"]
    far = charts._figure("t")
    charts.hardware_limit(far, 9000.0, "hardware limit 9,000 tok/s", "y", 0.0, 100.0)
    assert _lines(far) == [] and _notes(far) == ["hardware limit 9,000 tok/s (above the chart) ↑"]
    left = charts._figure("t")
    charts.hardware_limit(left, 1.0, "hardware limit 1 ms", "x", 100.0, 130.0)
    assert _lines(left) == [] and _notes(left) == ["← hardware limit 1 ms (off the chart)"]
    on_x = charts._figure("t")
    charts.hardware_limit(on_x, 9.0, "hardware limit 9 ms", "x", 10.0, 12.0)
    assert [(s.x0, s.yref) for s in _lines(on_x)] == [(9.0, "paper")]


def test_the_h200_example_charts_and_summary_carry_its_limit(store: Store) -> None:
    run = store.get_run(import_bundle_file(store, EXAMPLES / "h200-latency-bs1.json"))
    assert run is not None and run.summary is not None
    limits = data.run_limits(store, run)
    assert isinstance(limits, RunLimits) and limits.spec_key == "h200" and limits.batch == 1
    figs = data.live_figures(data.load_live(store, run.id), run.summary, limits=limits)
    # About 1 ms against a measured ~119 ms TPOT and ~8 tok/s: both limits are far off the data.
    assert _notes(figs["tpot"]) == [
        f"← hardware limit {limits.tpot_limit_ms:.3g} ms (NVIDIA H200 (SXM), batch 1) (off the chart)"
    ]
    assert _notes(figs["throughput"]) == [
        f"hardware limit {limits.output_tok_s_limit:,.0f} tok/s (NVIDIA H200 (SXM), batch 1) (above the chart) ↑"
    ]
    assert _notes(data.live_figures(data.load_live(store, run.id), run.summary)["tpot"]) == []  # without limits
    line = data.limits_line(limits)
    assert line is not None and line.startswith("Hardware limit: NVIDIA H200 (SXM), bfloat16, batch 1, context")
    assert f"TPOT p50 {limits.tpot_pct:.3g} %" in line
    assert data.watched_devices(store, run.id) == ":material/developer_board: Watching nvml"


def test_results_page_shows_the_limit_under_an_imported_h200_run(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    run_id = import_bundle_file(store, EXAMPLES / "h200-latency-bs1.json")
    at = app_test("app_pages/results.py")
    at.multiselect(key="r.selected").set_value([run_id]).run()
    _no_exception(at)
    caption = next(c.value for c in at.caption if "Hardware limit:" in c.value)
    assert "NVIDIA H200 (SXM), bfloat16, batch 1" in caption and "reached: TPOT p50" in caption


def test_results_page_notes_a_runs_long_gc_pauses(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """A run's garbage-collector pauses of 10 ms or more (artifact gc_pauses) are one caption."""
    import gc
    import time

    from bench.run.artifacts import ARTIFACT_GC
    from bench.run.gc_watch import GcWatch

    def slow(phase: str, info: dict[str, Any]) -> None:  # a collection that takes 20 ms more
        if phase == "stop":
            time.sleep(0.02)

    watch = GcWatch()
    gc.callbacks.insert(0, slow)
    try:
        watch.start(freeze=False)
        watch.t0 = time.perf_counter()
        gc.collect(2)
    finally:
        watch.stop()
        gc.callbacks.remove(slow)
    store = Store(get_settings().db_path)
    run_id = import_bundle_file(store, EXAMPLES / "h200-latency-bs1.json")
    store.put_artifact(run_id, ARTIFACT_GC, watch.as_dict())
    assert data.gc_line(store, run_id) is not None
    at = app_test("app_pages/results.py")
    at.multiselect(key="r.selected").set_value([run_id]).run()
    _no_exception(at)
    caption = next(c.value for c in at.caption if "Python GC paused" in c.value)
    assert caption == data.gc_line(store, run_id) and "generation 2 at 0.00 s" in caption


def test_engine_page_shows_the_model_limits_on_the_chosen_accelerator(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    at = app_test()
    _no_exception(at)
    assert at.selectbox(key="e.limit-spec").value == "cpu"  # the chosen accelerator: this CPU
    if cpu_measured() is None:
        assert "not measured yet" in _texts(at)
        at.button(key="e.btn.measure-cpu").click().run()
        _no_exception(at)
    assert cpu_measured() is not None
    table = _limit_table(at)
    kept = cpu_spec(cpu_measured())
    _, rows = model_limits_table("tiny-deepseek-v3", kept, "auto", 1024)
    assert list(table["batch"]) == [1, 8, 32, 128, 256]
    assert list(table["min step (ms)"]) == pytest.approx([r["min step (ms)"] for r in rows])
    # The H200 for DeepSeek-V2-Lite's shape: about 1 ms per step at batch 1 (4.9 GB / 4.8 TB/s).
    at.selectbox(key="e.preset").set_value("random-v2-lite-shape").run()
    at.selectbox(key="e.limit-spec").set_value("h200").run()
    _no_exception(at)
    table = _limit_table(at)
    _, rows = model_limits_table("random-v2-lite-shape", "h200", "auto", 1024)
    assert table["min step (ms)"][0] == pytest.approx(rows[0]["min step (ms)"]) and 0.9 < rows[0]["min step (ms)"] < 1.2
    assert table["bound"][0] == "memory"
    assert any("random-v2-lite-shape on NVIDIA H200 (SXM) (bfloat16, context 1024)" in c.value for c in at.caption)
    # A model with no config here says so in one line.
    at.radio(key="e.model_src").set_value("path").run()
    at.text_input(key="e.path").set_value(str(fresh_data_dir / "no-such-model")).run()
    _no_exception(at)
    assert any("No limits for this model: no config for model" in c.value for c in at.caption)


def test_run_form_passes_telemetry_urls_and_refuses_a_bad_one_in_one_line() -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_submit_form, default_timeout=30).run()
    _no_exception(at)
    assert at.session_state["submitted"]["telemetry_urls"] == []
    assert at.session_state["submitted"]["device_telemetry"] is True
    at.text_input(key="concurrency.telemetry_urls").set_value(
        " http://127.0.0.1:9400/metrics , http://10.0.0.7:8082/metrics"
    ).run()
    at.checkbox(key="concurrency.device_telemetry").uncheck().run()
    _no_exception(at)
    submitted = at.session_state["submitted"]
    assert submitted["telemetry_urls"] == ["http://127.0.0.1:9400/metrics", "http://10.0.0.7:8082/metrics"]
    assert submitted["device_telemetry"] is False
    at.text_input(key="concurrency.telemetry_urls").set_value("http://user:secret@10.0.0.7:9400/metrics").run()
    assert len(at.error) == 1 and "secret" not in at.error[0].value and "\n" not in at.error[0].value
    assert at.session_state["submitted"] is None


def test_run_form_passes_a_ray_address_and_refuses_a_bad_one_in_one_line() -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_submit_form, default_timeout=30).run()
    _no_exception(at)
    assert at.session_state["submitted"]["ray_address"] is None  # empty: local sender processes
    at.text_input(key="concurrency.ray_address").set_value(" 10.0.0.1:6379 ").run()
    _no_exception(at)
    assert at.session_state["submitted"]["ray_address"] == "10.0.0.1:6379"
    at.text_input(key="concurrency.ray_address").set_value("10.0.0.1").run()
    assert len(at.error) == 1 and "ray_address" in at.error[0].value and "\n" not in at.error[0].value
    assert at.session_state["submitted"] is None


def test_watched_devices_names_devices_then_what_was_not_read(store: Store) -> None:
    run_id = store.create_run(mode="latency", engine="native", model="m", accelerator="cuda", config={})
    assert data.watched_devices(store, run_id) is None
    store.put_artifact(
        run_id, ARTIFACT_DEVICE_TELEMETRY, {"sources": [{"source": "NvmlSource", "name": "nvml"}], "missing": []}
    )
    assert data.watched_devices(store, run_id) == ":material/developer_board: Watching nvml"
    store.put_artifact(
        run_id,
        ARTIFACT_DEVICE_TELEMETRY,
        {
            "sources": [{"source": "NvmlSource", "name": "nvml"}, {"source": "ExporterSource", "name": "exporter x"}],
            "missing": ["exporter x: HTTP 404"],
            "devices": ["dev0: NVIDIA H200 (nvml)", "dev1: NVIDIA H200 (nvml)"],
        },
    )
    assert data.watched_devices(store, run_id) == (
        ":material/developer_board: Watching dev0: NVIDIA H200 (nvml), dev1: NVIDIA H200 (nvml) · "
        "not read: exporter x: HTTP 404"
    )

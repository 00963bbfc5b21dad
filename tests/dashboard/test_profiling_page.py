"""Profiling page and its charts, on real data: a tiny-model profile run on CPU and the imported H200 example.

Also the Compare page's "Run native vs vLLM" action (a background comparison whose vLLM half
fails fast against a closed port, so the one-line reason shows) and a profile run on a
non-native engine (the engine's reason shows as an error).
"""

from __future__ import annotations

import base64
import csv
import gzip
import io
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest

from bench.config import RunConfig
from bench.report.csv_export import OPERATOR_CSV_COLUMNS, operators_csv
from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_OPERATORS, ARTIFACT_ROUTING, ARTIFACT_TRACE
from bench.run.manager import start_run
from bench.store import Store
from dashboard import charts, data, profile_data
from engines.profiling import CATEGORIES, CATEGORY_RULES
from engines.settings import get_settings
from tests.dashboard.test_pages import _frame, _no_exception, _poll, _texts

PAGE = "app_pages/profiling.py"
EXAMPLE_PROFILE = "h200-profile"
EXAMPLES = [
    "h100-energy-concurrency-16", "h100-energy-latency-bs1",
    "h100-fast-concurrency-128", "h100-fast-latency-bs1", "h100-fast-profile", "h100-fast-sweep",
    "h100-native-concurrency-128", "h100-native-latency-bs1", "h100-plain-latency",
    "h100-vllm-concurrency-128", "h100-vllm-latency-bs1", "h100-vllm-ngram-bs1", "h100-vllm-sweep",
    "h200-concurrency-16", "h200-latency-bs1", EXAMPLE_PROFILE,
]  # fmt: skip


@pytest.fixture(scope="module")
def profile_store(tmp_path_factory: pytest.TempPathFactory, native_engine: Any) -> Iterator[Store]:
    """A store holding one real profile run of the tiny model (2 requests, 8 tokens, CPU) and the
    imported H200 example runs."""
    store = Store(tmp_path_factory.mktemp("profile") / "moebench.sqlite")
    config = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"},
        mode="profile",
        workload={"source": "random", "input_len": 16, "output_len": 8},
        requests=2,
        name="tiny profile",
    )
    snap = start_run(config, store, engine=native_engine).wait(300)
    assert snap.status == "completed", snap.error
    imported, skipped = profile_data.import_examples(store)
    assert sorted(imported) == EXAMPLES and skipped == []
    yield store
    store.close()


def _run(store: Store, name: str) -> Any:
    return next(r for r in store.list_runs() if r.name == name)


# --- data shaping and charts (no Streamlit) ------------------------------------------------------


def test_profile_and_routing_pickers_list_the_right_runs(profile_store: Store) -> None:
    profiles = profile_data.profile_runs(profile_store)
    # newest first by when each ran: the tiny one now, the H100's of 2026-12-07, the H200's of 2026-12-04
    assert [r.name for r in profiles] == ["tiny profile", "h100-fast-profile", EXAMPLE_PROFILE]
    routing = {r.name for r in profile_data.routing_runs(profile_store)}
    # Latency and concurrency runs of the native engine recorded routing too.
    # The fast H100 runs replay a CUDA graph, where the gate hooks that count routing cannot run.
    assert routing == {EXAMPLE_PROFILE, "tiny profile", "h200-latency-bs1", "h200-concurrency-16", "h100-plain-latency",
                       "h100-energy-latency-bs1", "h100-energy-concurrency-16"}  # fmt: skip
    label = profile_data.profile_run_label(_run(profile_store, EXAMPLE_PROFILE), profile_data.example_names())
    assert label.endswith("native·random-v2-lite-shape·cuda · NVIDIA H200 · eager baseline · imported example")
    fast = profile_data.profile_run_label(_run(profile_store, "h100-fast-profile"), profile_data.example_names())
    assert fast.endswith("NVIDIA H100 80GB HBM3 · tuned · imported example")


def test_importing_the_examples_twice_skips_them(profile_store: Store) -> None:
    before = len(profile_store.list_runs())
    imported, skipped = profile_data.import_examples(profile_store)
    assert imported == [] and sorted(skipped) == EXAMPLES
    assert len(profile_store.list_runs()) == before
    trace = profile_data.trace_file(profile_store, _run(profile_store, EXAMPLE_PROFILE).id)
    example = _run(profile_store, EXAMPLE_PROFILE)
    assert trace.exists and trace.mime == "application/gzip"
    assert trace.path == profile_store.traces_dir / f"{profile_store.path.stem}-run{example.id}.trace.json.gz"
    with gzip.open(trace.path, "rt", encoding="utf-8") as fh:
        assert "traceEvents" in fh.read(4096)


def test_operator_table_sorts_and_cuts_to_top_n(profile_store: Store) -> None:
    tiny = profile_data.load_profile(profile_store, _run(profile_store, "tiny profile").id)
    ops = tiny.operators
    assert list(ops.columns) == list(OPERATOR_CSV_COLUMNS)
    assert len(ops) > 20 and (ops["calls"] > 0).all()
    assert ops["operator"].str.startswith("aten::").any()
    assert not profile_data.has_device_times(ops)  # a CPU run has no kernel times
    assert (ops["input_shapes"] != "").any()
    for sort, col in profile_data.OPERATOR_SORTS.items():
        top = profile_data.top_operators(ops, sort, 10)
        assert len(top) == 10 and list(top["rank"]) == list(range(1, 11))
        assert top[col].is_monotonic_decreasing
        assert top[col].iloc[0] == ops[col].max()
    top = profile_data.top_operators(ops, "self CPU time", 5)
    assert top["share_pct"].iloc[0] == pytest.approx(100 * ops["self_cpu_ms"].max() / ops["self_cpu_ms"].sum())
    # The CSV the download button serves has the same rows.
    payload = operators_csv(profile_store, _run(profile_store, "tiny profile").id).decode()
    rows = list(csv.DictReader(io.StringIO(payload)))
    assert len(rows) == len(ops) and list(rows[0]) == list(OPERATOR_CSV_COLUMNS)

    h200 = profile_data.load_profile(profile_store, _run(profile_store, EXAMPLE_PROFILE).id).operators
    assert profile_data.has_device_times(h200)
    top = profile_data.top_operators(h200, "self device time", 3)
    assert top["self_device_ms"].iloc[0] == pytest.approx(h200["self_device_ms"].max())


def test_breakdown_bars_stack_categories_in_order_with_fixed_colours(profile_store: Store) -> None:
    tiny_run, h200_run = _run(profile_store, "tiny profile"), _run(profile_store, EXAMPLE_PROFILE)
    tiny = profile_store.artifact(tiny_run.id, ARTIFACT_BREAKDOWN)
    h200 = profile_store.artifact(h200_run.id, ARTIFACT_BREAKDOWN)
    assert profile_data.breakdown_basis(tiny) == ["cpu"] and profile_data.breakdown_basis(h200) == ["device", "cpu"]

    frame = profile_data.breakdown_frame([("tiny", tiny), ("H200", h200)], "cpu")
    for run, part in frame.groupby("run"):
        assert part["share_pct"].sum() == pytest.approx(100.0), run
        assert list(part["category"]) == list(CATEGORIES)
    assert frame[frame["run"] == "tiny"]["total_ms"].iloc[0] == pytest.approx(tiny["total_ms"], rel=1e-6)
    fig = charts.breakdown_bars(frame, "cpu")
    names = [t.name for t in fig.data]
    assert names == [c for c in CATEGORIES if c in names]  # stacked in CATEGORIES order
    assert {"attention_kv", "routed_experts", "moe_routing", "other"} <= set(names)
    for trace in fig.data:
        assert trace.orientation == "h" and list(trace.y) == ["tiny", "H200"]
        assert trace.marker.color == charts.CATEGORY_COLORS[trace.name]
    assert fig.layout.barmode == "stack"
    assert fig.layout.xaxis.title.text == "share of profiled CPU time (%)"

    # Device basis: the H200 example's own shares; the CPU run has no device time and is left out.
    device = profile_data.breakdown_frame([("tiny", tiny), ("H200", h200)], "device")
    assert set(device["run"]) == {"H200"}
    expected = {r["category"]: r["share_pct"] for r in h200["rows"]}
    got = dict(zip(device["category"], device["share_pct"], strict=True))
    assert got == pytest.approx(expected)
    fig = charts.breakdown_bars(device, "device")
    experts = next(t for t in fig.data if t.name == "routed_experts")
    assert experts.x[0] == pytest.approx(expected["routed_experts"])  # the largest share on the GPU
    assert "quantization" not in {t.name for t in fig.data}  # no time: no legend entry
    assert fig.layout.xaxis.title.text == "share of profiled device (kernel) time (%)"
    assert charts.breakdown_bars(profile_data.breakdown_frame([], "cpu")).layout.annotations[0].text

    table = profile_data.breakdown_table(device).set_index("category")
    assert table.loc["routed_experts", "H200 (%)"] == pytest.approx(expected["routed_experts"])
    rules = profile_data.rules_table()
    assert len(rules) == len(CATEGORY_RULES) + 1 and set(rules["category"]) == set(CATEGORIES)


def test_routing_charts_draw_the_counts(profile_store: Store) -> None:
    tiny = profile_store.artifact(_run(profile_store, "tiny profile").id, ARTIFACT_ROUTING)
    assert tiny["n_group"] == 2 and tiny["num_experts"] == 8
    heat = charts.routing_heatmap(tiny)
    assert [list(row) for row in heat.data[0].z] == tiny["counts"]
    assert list(heat.data[0].y) == tiny["layers"] and list(heat.data[0].x) == list(range(8))
    # Each token counts once per expert of its top-k.
    assert [sum(row) for row in tiny["counts"]] == [t * tiny["top_k"] for t in tiny["tokens"]]
    imb = charts.routing_imbalance(tiny)
    assert list(imb.data[0].y) == pytest.approx(tiny["imbalance"])
    assert [s.y0 for s in imb.layout.shapes] == [1.0]
    assert imb.layout.annotations[0].text == "1.0 = perfectly balanced"
    groups = charts.routing_groups(tiny)
    assert [list(row) for row in groups.data[0].z] == tiny["group_counts"]
    assert list(groups.data[0].x) == ["group 0", "group 1"]

    h200 = profile_store.artifact(_run(profile_store, EXAMPLE_PROFILE).id, ARTIFACT_ROUTING)
    heat = charts.routing_heatmap(h200)
    assert len(heat.data[0].z) == 26 and len(heat.data[0].z[0]) == 64
    assert heat.layout.height >= 26 * 20  # one readable row per layer
    assert len(charts.routing_groups(h200).data) == 0  # n_group = 1: says so instead
    summary = profile_data.routing_summary(h200)
    assert len(summary) == 26 and summary["max / mean"].iloc[0] == pytest.approx(h200["imbalance"][0])
    assert len(charts.routing_heatmap(None).data) == 0


def test_memory_timeline_marks_the_weights(profile_store: Store) -> None:
    run = _run(profile_store, EXAMPLE_PROFILE)
    ts = profile_data.memory_series(profile_store, run.id)
    weights = run.engine_info["weights_gib"]
    fig = charts.memory_timeline(ts, data.MEMORY_SERIES, weights)
    assert [t.name for t in fig.data] == ["allocated", "reserved", "peak"]
    reserved = ts[ts["name"] == "mem_reserved_gib"]["value"].tolist()
    assert list(fig.data[1].y) == pytest.approx(reserved)
    assert [s.y0 for s in fig.layout.shapes] == [pytest.approx(weights)]
    assert fig.layout.annotations[0].text == f"weights {weights:.3g} GiB"
    assert min(fig.data[0].y) > weights  # allocated = weights + activations + KV cache + runtime
    assert fig.layout.yaxis.title.text == "memory (GiB)"
    tiny = _run(profile_store, "tiny profile")
    series = profile_data.memory_series(profile_store, tiny.id)
    fig = charts.memory_timeline(series, data.MEMORY_SERIES, 0.01, "RSS (GiB)")
    assert fig.data and fig.layout.yaxis.title.text == "RSS (GiB)"


# --- the page (AppTest) ---------------------------------------------------------------------------


def _figures(at: Any) -> list[Any]:
    """The page's plotly charts, decoded back into figures (arrays arrive base64-packed)."""
    return [pio.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]


def _array(value: Any) -> list[Any]:
    """A trace's data array as a list (plotly sends numeric arrays as base64 ``bdata``)."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return flat.reshape([int(x) for x in str(shape).split(",")]).tolist() if shape else flat.tolist()
    return [list(v) if isinstance(v, list | tuple) else v for v in value]


def _chart(at: Any, title: str) -> Any:
    figs = _figures(at)
    for fig in figs:
        if (fig.layout.title.text or "").startswith(title):
            return fig
    raise AssertionError(f"no chart titled {title!r}; charts: {[f.layout.title.text for f in figs]}")


def test_page_renders_on_a_fresh_database(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test(PAGE)
    _no_exception(at)
    assert at.title[0].value == "Profiling"
    assert "No profile run yet" in _texts(at)
    assert at.button(key="p.btn.start").disabled  # no engine loaded
    assert "Load a model on the Engine & Model page first." in _texts(at)
    assert at.checkbox(key="p.with_stack").value is True
    assert at.number_input(key="p.requests").value == 2
    assert not at.get("plotly_chart")


def test_served_routing_shows_without_any_profile_run(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """Runs that only recorded routing (a served engine's) are viewable before any profile run exists,
    EP what-if included (a NameError here once: the view called a helper defined further down)."""
    from tests.dashboard.synthetic import add_synthetic_run

    store = Store(get_settings().db_path)
    for name in ("served a", "served b"):
        rid = add_synthetic_run(store, engine="openai", name=name)
        routing = {"layers": ["layer 1"], "counts": [[6, 2, 2, 2]], "num_experts": 4, "top_k": 1, "n_group": 1,
                   "tokens": [12], "imbalance": [2.0],
                   "source": "routed_experts the server sent with each request"}  # fmt: skip
        store.put_artifact(rid, ARTIFACT_ROUTING, routing)
    at = app_test(PAGE)
    _no_exception(at)
    assert "No profile run yet" in _texts(at) and "Expert routing of other runs" in _texts(at)
    assert at.selectbox(key="p.routing-run").value == rid
    assert "routed_experts the server sent with each request" in _texts(at)
    assert at.selectbox(key="p.ep").value in (1, 2, 4)
    at.selectbox(key="p.routing-compare").select(rid - 1).run()
    _no_exception(at)
    assert "Routing overlap 1.000" in _texts(at)


def test_page_shows_the_imported_h200_example(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test(PAGE)
    at.button(key="p.btn.import-examples").click().run()
    _no_exception(at)
    assert f"Imported {len(EXAMPLES)} example run(s)" in _texts(at)
    store = Store(get_settings().db_path)
    example = _run(store, EXAMPLE_PROFILE)
    # the newest example profile whose time the breakdown splits (the H100's step is a captured graph)
    assert at.selectbox(key="p.run").value == example.id
    assert "imported example" in _texts(at)

    # a. the operator table, largest self device time first, with input shapes
    ops = _frame(at, "self_device_ms")
    assert len(ops) == 25 and ops["self_device_ms"].is_monotonic_decreasing
    assert "input_shapes" in ops.columns
    at.selectbox(key="p.op-sort").set_value("calls").run()
    at.slider(key="p.top_n").set_value(10).run()
    ops = _frame(at, "self_device_ms")
    assert len(ops) == 10 and ops["calls"].is_monotonic_decreasing
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels[0] == "Operator CSV" and labels[1].startswith("Trace (") and labels[1].endswith(" MiB)")

    # b. the breakdown: device time by default on a GPU run, with the rules table
    bars = _chart(at, "Where the time goes")
    assert bars.layout.xaxis.title.text == "share of profiled device (kernel) time (%)"
    assert [t.name for t in bars.data][:3] == ["attention_kv", "moe_routing", "routed_experts"]
    rules = _frame(at, "pattern")
    assert list(rules.columns) == ["category", "target", "pattern", "why"] and len(rules) == len(CATEGORY_RULES) + 1
    at.radio(key="p.basis").set_value("cpu").run()
    assert _chart(at, "Where the time goes").layout.xaxis.title.text.endswith("CPU time (%)")

    # c. routing: heat map (26 layers x 64 experts), imbalance; d. memory with the weights line
    heat = _chart(at, "Tokens routed to each expert")
    assert len(heat.data[0].z) == 26 and len(heat.data[0].z[0]) == 64
    _chart(at, "Load imbalance per layer")
    # the EP what-if: EP 8 with 8 redundant experts by default, the figures bench.metrics.moe computes
    from bench.metrics import moe

    what = moe.eplb_whatif(store.artifact(example.id, ARTIFACT_ROUTING), 8, 8)
    ranks = _chart(at, "EP 8: tokens per rank")
    assert f"balancedness {what.balancedness:.3f} contiguous, {what.eplb_balancedness:.3f} with EPLB" in (
        ranks.layout.title.text
    )
    assert [len(t.x) for t in ranks.data] == [8, 8] and what.eplb_balancedness > what.balancedness
    at.selectbox(key="p.ep").set_value(16).run()
    assert _chart(at, "EP 16: tokens per rank").data[0].x[-1] == "rank 15"
    memory = _chart(at, "Memory timeline")
    assert [t.name for t in memory.data] == ["allocated", "reserved", "peak"]
    assert memory.layout.annotations[0].text == "weights 29.3 GiB"
    assert any(m.label == "Model weights" and m.value == "29.3 GiB" for m in at.metric)

    # Routing of a latency run (no profile) from the routing picker.
    latency = _run(store, "h200-latency-bs1")
    at.selectbox(key="p.routing-run").set_value(latency.id).run()
    _no_exception(at)
    heat = _chart(at, "Tokens routed to each expert")
    assert _array(heat.data[0].z) == store.artifact(latency.id, ARTIFACT_ROUTING)["counts"]

    # A second import adds nothing; a trace that is gone is said to be gone.
    at.button(key="p.btn.import-examples").click().run()
    assert "already here" in _texts(at)
    assert [r.name for r in profile_data.profile_runs(store)] == ["h100-fast-profile", EXAMPLE_PROFILE]
    store.put_artifact(example.id, ARTIFACT_TRACE, {"path": "/nonexistent/run9.trace.json"})
    at.run()
    assert any("is not in this data folder's traces" in w.value for w in at.warning)
    assert [b.proto.label for b in at.get("download_button")] == ["Operator CSV"]
    store.close()


def test_profile_run_started_from_the_page_shows_its_artifacts(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.button(key="e.btn.load").click().run()
        _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    _start_profile_run(at, "from the page")
    job = services.get_job_manager().latest("profile")
    assert job is not None
    _poll(at, lambda a: _has_picker(a) and a.selectbox(key="p.run").value == job.run_id, what="the profile run")
    run = session_store.get_run(job.run_id)
    assert run.status == "completed" and run.mode == "profile" and run.name == "from the page"
    assert run.config["profile_with_stack"] is False and run.config["requests"] == 2
    assert run.summary.completed == 2 and run.summary.output_tokens == 16
    names = set(session_store.artifact_names(run.id))
    assert {ARTIFACT_OPERATORS, ARTIFACT_BREAKDOWN, ARTIFACT_TRACE, ARTIFACT_ROUTING} <= names
    assert Path(session_store.artifact(run.id, ARTIFACT_TRACE)["path"]).is_file()

    ops = _frame(at, "self_cpu_ms")
    assert ops["self_cpu_ms"].is_monotonic_decreasing  # a CPU run sorts by self CPU time
    assert (ops["self_device_ms"] == 0).all()
    assert at.radio(key="p.basis").options == ["CPU time"]
    bars = _chart(at, "Where the time goes")
    shares = [_array(t.x)[0] for t in bars.data]
    assert sum(shares) == pytest.approx(100.0)
    groups = _chart(at, "Expert-group selections per layer")  # the tiny model routes in 2 groups
    assert _array(groups.data[0].z) == session_store.artifact(run.id, ARTIFACT_ROUTING)["group_counts"]
    assert _chart(at, "Memory timeline (process RSS)").layout.yaxis.title.text == "process RSS (GiB)"
    assert "process's resident set size (RSS)" in _texts(at)


@pytest.mark.slow
def test_an_expert_parallel_profile_run_from_the_dashboard_shows_its_communication(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    """Issue 37: the Engine page loads the native engine with 2 expert-parallel ranks, the Profiling
    page runs it and shows the communication share and the per-rank table; Unload leaves no rank."""
    import os

    from dashboard import services
    from tests.engines.test_expert_parallel import alive, followers_below

    at = app_test()
    if services.get_engine_slot().state().status in ("ready", "failed"):
        at.button(key="e.btn.unload").click().run()
    _poll(at, lambda a: not a.button(key="e.btn.load").disabled, what="the Load button (no engine, no run)")
    at.selectbox(key="e.kind").set_value("native").run()
    at.number_input(key="e.opt.native.expert_parallel").set_value(2).run()
    at.button(key="e.btn.load").click().run()
    _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    ranks = followers_below(os.getpid())
    assert ranks
    try:
        _start_profile_run(at, "expert parallel 2")
        job = services.get_job_manager().latest("profile")
        assert job is not None
        _poll(at, lambda a: _has_picker(a) and a.selectbox(key="p.run").value == job.run_id, what="the EP run")
        run = session_store.get_run(job.run_id)
        assert run.status == "completed" and run.engine_info["tuning"]["expert_parallel"] == 2
        rows = {r["category"]: r for r in session_store.artifact(run.id, ARTIFACT_BREAKDOWN)["rows"]}
        assert rows["communication"]["cpu_ms"] > 0
        table = _frame(at, "MoE layer exchanges")
        comm = session_store.artifact(run.id, "communication")
        assert list(table["rank"]) == [0, 1] and list(table["MoE layer exchanges"]) == [comm["ranks"][0]["layers"]] * 2
        assert table["sent (MB)"][0] == pytest.approx(table["received (MB)"][1]) and table["sent (MB)"][0] > 0
        assert "Expert parallelism: 2 ranks (gloo)" in _texts(at)
        assert "EP 2" in next(o for o in at.selectbox(key="p.run").options if "expert parallel 2" in o)
    finally:  # the next tests load the default engine again
        at = app_test()
        at.button(key="e.btn.unload").click().run()
        _poll(at, lambda a: services.get_engine_slot().state().status not in ("ready", "failed", "stopping"),
              what="the engine to unload")  # fmt: skip
    assert alive(ranks) == []


def _start_profile_run(at: Any, name: str) -> None:
    """Open the Profiling page and start a short profile run of the loaded engine from its form."""
    at.switch_page(PAGE).run()
    _no_exception(at)
    at.number_input(key="p.output_len").set_value(8).run()
    at.number_input(key="p.input_len").set_value(16).run()
    at.number_input(key="p.warmup").set_value(0).run()
    at.text_input(key="p.name").set_value(name).run()
    at.checkbox(key="p.with_stack").uncheck().run()  # Python stacks make the analysis slow on 2 cores
    assert not at.button(key="p.btn.start").disabled
    at.button(key="p.btn.start").click().run()
    _no_exception(at)


def _has_picker(at: Any) -> bool:
    return any(s.key == "p.run" for s in at.selectbox)


class _FakeServer(BaseHTTPRequestHandler):
    """Answers /health and nothing else: enough for a vLLM engine given ``base_url`` to start."""

    def do_GET(self) -> None:
        ok = self.path == "/health"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", "2" if ok else "0")
        self.end_headers()
        if ok:
            self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def fake_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("openai", "the openai engine does not support profiling runs"),
        # vLLM profiles through the server's /start_profile, which this stand-in server does not have.
        ("vllm", "this vLLM server answered HTTP 501 to /start_profile"),
    ],
)
def test_profiling_a_non_native_engine_shows_its_reason(
    app_test: Callable[..., Any], fresh_data_dir: Path, fake_server: str, kind: str, reason: str
) -> None:
    from dashboard import services

    slot = services.get_engine_slot()  # this test's own slot (its own data folder)
    slot.load({"kind": kind, "model": "tiny-deepseek-v3", "accelerator": "cpu", "base_url": fake_server})
    assert slot.wait(120).ready, slot.state().error
    try:
        at = app_test(PAGE)
        at.number_input(key="p.warmup").set_value(0).run()
        at.button(key="p.btn.start").click().run()
        _no_exception(at)
        _poll(at, lambda a: any(reason in e.value for e in a.error), timeout=60, what="the profiling error")
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and errors[0].startswith(reason)  # once, one line, no traceback
        assert "\n" not in errors[0] and "Traceback" not in errors[0]
        run = Store(get_settings().db_path).list_runs()[0]
        assert run.mode == "profile" and run.status == "failed" and run.error == errors[0]
        assert f"Run #{run.id} failed before the profiler produced anything to show." in _texts(at)
    finally:
        slot.unload()
        slot.wait(30)


def test_compare_page_runs_native_vs_vllm_in_the_background(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The vLLM half points at a closed port, so it fails fast: the page shows the reason and
    puts the new native run in the native-vs-vLLM table."""
    at = app_test("app_pages/compare.py")
    at.selectbox(key="c.run.mode").set_value("latency").run()
    at.number_input(key="c.run.requests").set_value(2).run()
    at.number_input(key="c.run.output_len").set_value(8).run()
    at.text_input(key="c.run.base_url").set_value("http://127.0.0.1:9/v1").run()
    at.button(key="c.btn.compare").click().run()
    _no_exception(at)
    assert at.button(key="c.btn.compare").disabled  # running: the page did not block
    _poll(at, lambda a: "native vs vLLM · done" in _progress_text(a), timeout=180, what="the comparison")
    store = Store(get_settings().db_path)
    native, vllm = sorted(store.list_runs(), key=lambda r: r.id)
    assert (native.engine, native.status, native.name) == ("native", "completed", "compare: native")
    assert (vllm.engine, vllm.status) == ("vllm", "failed")
    errors = [e.value for e in at.error]
    assert any("cannot reach the OpenAI-compatible server at http://127.0.0.1:9/v1" in e for e in errors), errors
    assert at.selectbox(key="c.native").value == native.id
    measured = _frame(at, "native (measured)")
    shown, unit = measured["native (measured)"][0].rsplit(" ", 1)
    assert unit == "tokens/s" and float(shown.replace(",", "")) == pytest.approx(
        native.summary.output_throughput_tok_s, rel=5e-3
    )
    assert not at.button(key="c.btn.compare").disabled
    store.close()


def _progress_text(at: Any) -> str:
    return " ".join(p.proto.text for p in at.get("progress"))


def test_operator_frame_of_nothing_is_empty() -> None:
    df = profile_data.operators_frame(None)
    assert df.empty and list(df.columns) == list(OPERATOR_CSV_COLUMNS)
    assert not profile_data.has_device_times(df)
    assert profile_data.breakdown_basis(None) == [] and profile_data.breakdown_table(pd.DataFrame()).empty


def test_served_expert_views_are_listed_beside_the_native_ones(tmp_path: Path) -> None:
    """A vLLM run whose server logged EPLB balancedness, and an SGLang run whose recorder gave
    routing counts, join the routing tab's runs; the balancedness draws against the 1.0 line."""
    from tests.dashboard.synthetic import add_synthetic_run

    store = Store(tmp_path / "s.sqlite")
    plain = add_synthetic_run(store, engine="vllm", name="no expert view")
    served = add_synthetic_run(store, engine="vllm", name="eplb")
    store.add_points(served, [(float(t), profile_data.EPLB_SERIES, 0.5 + 0.1 * t) for t in range(4)])
    sglang = add_synthetic_run(store, engine="openai", name="sglang")
    counts = {"layers": ["layer 0"], "counts": [[3, 1]], "num_experts": 2, "top_k": None, "n_group": 1,
              "tokens": [4], "imbalance": [1.5]}  # fmt: skip
    store.put_artifact(sglang, ARTIFACT_ROUTING, counts)
    assert {r.id for r in profile_data.routing_runs(store)} == {served, sglang}
    assert plain not in {r.id for r in profile_data.routing_runs(store)}
    balance = profile_data.eplb_balancedness(store, served)
    assert balance["value"].round(3).tolist() == [0.5, 0.6, 0.7, 0.8]
    fig = charts.eplb_balancedness(balance)
    assert list(fig.data[0].y) == balance["value"].tolist() and fig.layout.shapes[0].y0 == 1.0
    # the server's EPLB moved experts at 2 s (its count of rearrangements went 0 -> 1): marked there
    from engines.vllm import SERIES_EPLB_BALANCEDNESS, SERIES_EPLB_REARRANGEMENTS

    assert (profile_data.EPLB_SERIES, profile_data.EPLB_REARRANGEMENTS) == (
        SERIES_EPLB_BALANCEDNESS, SERIES_EPLB_REARRANGEMENTS,
    )  # the names the vLLM engine writes  # fmt: skip
    moved = profile_data.EPLB_REARRANGEMENTS
    store.add_points(served, [(1.0, moved, 0.0), (2.0, moved, 1.0), (3.0, moved, 1.0)])
    moves = profile_data.eplb_rearrangements(store, served)
    assert moves == [2.0]
    marked = charts.eplb_balancedness(balance, rearranged_at=moves)
    assert [s.x0 for s in marked.layout.shapes if s.line.dash == "dot"] == [2.0]
    assert any(a.text == "experts rearranged" for a in marked.layout.annotations)
    # latency on the same timeline: the run's mean TPOT per 5 s window of request end times
    latency = profile_data.latency_by_window(store, served)
    recs = [r for r in store.records(served) if r.ok and r.tpot_ms is not None]
    first = [r.tpot_ms for r in recs if r.end_s < 5.0]
    assert latency["n"].sum() == len(recs) and latency["t_s"].iloc[0] == 2.5
    # (records() recomputes TPOT from chunk times kept to the microsecond: equal within 1e-4)
    assert latency["value"].iloc[0] == pytest.approx(sum(first) / len(first), rel=1e-4)
    both = charts.eplb_balancedness(balance, rearranged_at=moves, latency=latency)
    assert [t.yaxis for t in both.data] == [None, "y2"]  # the balancedness on the first axis
    assert list(both.data[1].y) == latency["value"].tolist()
    assert both.layout.yaxis2.title.text == "TPOT, ms"
    assert profile_data.eplb_balancedness(store, plain).empty
    empty = charts.eplb_balancedness(profile_data.eplb_balancedness(store, plain))
    assert "no EPLB balancedness" in str(empty.layout.annotations[0].text)


def test_a_servers_operator_table_shows_no_made_up_memory(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """A vLLM profile's table is read from the server's trace: no input shapes and no memory
    there, so the page shows neither column nor a memory sort, and never a 0 for them."""
    import torch

    from engines.profiling import operator_table_from_trace
    from tests.dashboard.synthetic import add_synthetic_run

    fresh_data_dir.mkdir(parents=True, exist_ok=True)
    trace = fresh_data_dir / "server.trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("execute_context_1(8)_generation_0(0)"):
            x = torch.randn(64, 64)
            for _ in range(3):
                x = torch.relu(x @ x)
    prof.export_chrome_trace(str(trace))
    ops = operator_table_from_trace(trace)
    store = Store(get_settings().db_path)
    run_id = add_synthetic_run(store, engine="vllm", mode="profile", name="served profile")
    store.put_artifact(run_id, ARTIFACT_OPERATORS, ops)
    store.put_artifact(run_id, ARTIFACT_TRACE, {"path": str(trace)})

    frame = profile_data.operators_frame(ops)
    assert not profile_data.has_memory(frame) and frame["cpu_memory_mib"].isna().all()
    assert frame.set_index("operator").loc["aten::mm", "calls"] == 3
    assert profile_data.has_memory(profile_data.operators_frame([{**ops[0], "cpu_memory_mib": 0.5}]))

    at = app_test(PAGE)
    at.selectbox(key="p.run").set_value(run_id).run()
    _no_exception(at)
    assert 5 < len(ops) < 25 and at.slider(key="p.top_n").value == len(ops)  # shorter than the default top 25
    assert not any("memory" in option for option in at.selectbox(key="p.op-sort").options)
    table = next(df for df in at.dataframe if "self_cpu_ms" in df.value.columns)
    shown = list(table.proto.column_order)
    assert shown[:2] == ["rank", "operator"] and "self_cpu_ms" in shown
    assert not {"input_shapes", "cpu_memory_mib", "device_memory_mib"} & set(shown)
    assert "read from the vllm server's trace" in _texts(at)
    assert "execute_context_1(8)_generation_0(0)" in set(table.value["operator"])
    store.close()


def test_a_captured_profile_says_why_it_has_no_breakdown(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The H100 fast profile replays a compiled CUDA graph: the breakdown tab says so in words instead
    of drawing nine 0 % bars; its operator table still lists the kernels with their device time."""
    at = app_test(PAGE)
    at.button(key="p.btn.import-examples").click().run()
    store = Store(get_settings().db_path)
    at.selectbox(key="p.run").set_value(_run(store, "h100-fast-profile").id).run()
    _no_exception(at)
    assert "No bottleneck breakdown: no operator time fell inside the per-module scopes" in _texts(at)
    assert "CUDA graph" in _texts(at)
    ops = _frame(at, "self_device_ms")
    assert len(ops) > 0 and ops["self_device_ms"].iloc[0] > 10  # the grouped GEMM kernels, in ms


def test_a_served_runs_routing_plays_over_time(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """A routing record with time windows (as a managed Triton run stores): a slider picks a window
    and the heat map shows that window's counts."""
    import numpy as np

    from bench.metrics.summary import summarize
    from engines.routing import served_record

    at = app_test(PAGE)
    at.button(key="p.btn.import-examples").click().run()
    store = Store(get_settings().db_path)
    run = store.create_run(mode="latency", engine="triton", model="tiny-deepseek-v3", accelerator="cpu", config={})
    early, late = np.zeros((2, 8), dtype=np.int64), np.zeros((2, 8), dtype=np.int64)
    early[:, 0], late[:, 7] = 10, 30
    phases = np.stack([early + late, np.zeros((2, 8), dtype=np.int64)])
    record = served_record(phases, {"top_k": 2, "layers": ["layer 1", "layer 2"]}, {0: early, 2: late}, 5)
    store.put_artifact(run, "expert_routing", record)
    store.finish_run(run, "completed", summarize([]))
    at.run()
    at.selectbox(key="p.routing-run").set_value(run).run()
    _no_exception(at)
    slider = at.select_slider(key="p.routing-window")
    assert slider.options == ["whole run", "0-10 s", "20-30 s"]
    slider.set_value("20-30 s").run()
    heat = _chart(at, "Tokens routed to each expert, 20-30 s")
    assert _array(heat.data[0].z) == late.tolist()


def test_two_runs_routing_side_by_side(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The H200 and H100 eager examples ran the same model shape (random weights, other prompts):
    the page draws the second heat map and their overlap, as bench.metrics.moe computes it."""
    from bench.metrics import moe

    at = app_test(PAGE)
    at.button(key="p.btn.import-examples").click().run()
    store = Store(get_settings().db_path)
    a, b = _run(store, "h200-latency-bs1"), _run(store, "h100-plain-latency")
    at.selectbox(key="p.routing-run").set_value(a.id).run()
    at.selectbox(key="p.routing-compare").set_value(b.id).run()
    _no_exception(at)
    overlap = moe.routing_overlap(store.artifact(a.id, ARTIFACT_ROUTING), store.artifact(b.id, ARTIFACT_ROUTING))
    assert overlap is not None and 0 < overlap <= 1
    assert f"Routing overlap {overlap:.3f}" in _texts(at)
    _chart(at, f"Tokens routed to each expert, run #{b.id}")
    assert moe.routing_overlap({"counts": [[1, 0]]}, {"counts": [[1, 0]]}) == 1.0
    assert moe.routing_overlap({"counts": [[1, 0]]}, {"counts": [[0, 1]]}) == 0.0
    assert moe.routing_overlap({"counts": [[1, 0]]}, {"counts": [[1, 0, 0]]}) is None

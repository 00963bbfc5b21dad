"""Chart builders and data shaping, without Streamlit: real frames in, figures checked point by point."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from bench.metrics.summary import summarize
from bench.run.recorder import SERIES_IN_FLIGHT, SERIES_MEM_PEAK, SERIES_OUTPUT_TOK_S
from bench.store import Store
from dashboard import charts, data
from tests.dashboard.synthetic import add_synthetic_run, synthetic_records


def _samples(n: int = 50, fail_every: int = 0) -> pd.DataFrame:
    return pd.DataFrame([{**r.as_row()} for r in synthetic_records(n, fail_every=fail_every)])


def test_every_chart_uses_the_project_template() -> None:
    samples = _samples()
    ts = pd.DataFrame(
        [(0.0, SERIES_OUTPUT_TOK_S, 10.0), (1.0, SERIES_OUTPUT_TOK_S, 12.0)], columns=["t_s", "name", "value"]
    )
    figs = [
        charts.latency_over_time(samples),
        charts.distribution(samples, "ttft_ms", "TTFT"),
        charts.throughput_over_time(ts),
        charts.empty_figure("x"),
    ]
    for fig in figs:
        assert fig.layout.template.layout.colorway == charts.COLORS


def test_latency_over_time_plots_each_request_and_marks_failures() -> None:
    samples = _samples(20, fail_every=5)
    fig = charts.latency_over_time(samples)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"E2E", "TTFT", "failed"}
    ok = samples[samples["error"] == ""]
    assert list(by_name["E2E"].y) == pytest.approx(list(ok["e2e_ms"]))
    assert list(by_name["E2E"].x) == pytest.approx(list(ok["end_s"]))
    assert len(by_name["failed"].x) == 4
    assert fig.layout.yaxis.title.text == "latency (ms)"
    assert fig.layout.xaxis.title.text == "time since run start (s)"


def test_requests_cut_short_by_stop_are_drawn_as_cancelled_not_failed() -> None:
    samples = _samples(20, fail_every=5)
    samples.loc[samples.index[-3:], "error"] = "cancelled"
    by_name = {t.name: t for t in charts.latency_over_time(samples).data}
    assert len(by_name["cancelled"].x) == 3
    assert len(by_name["failed"].x) == int((~samples["error"].isin(["", "cancelled"])).sum()) > 0


def test_distribution_marks_the_given_percentiles_or_the_window_s() -> None:
    samples = _samples(101)
    fig = charts.distribution(samples, "ttft_ms", "TTFT", p50=12.5, p99=30.0)
    lines = sorted(shape.x0 for shape in fig.layout.shapes)
    assert lines == [12.5, 30.0]
    labels = {a.text for a in fig.layout.annotations}
    assert labels == {"p50 12.5 ms", "p99 30.0 ms"}
    assert len(fig.data[0].x) == 101
    # Without given percentiles it marks the rows' own.
    fig = charts.distribution(samples, "tpot_ms", "TPOT")
    expected = sorted([samples["tpot_ms"].quantile(0.5), samples["tpot_ms"].quantile(0.99)])
    assert sorted(shape.x0 for shape in fig.layout.shapes) == pytest.approx(expected)
    assert fig.layout.xaxis.title.text == "TPOT (ms)"


def test_empty_data_draws_a_message_not_a_made_up_point() -> None:
    empty = pd.DataFrame(columns=["end_s", "e2e_ms", "ttft_ms", "tpot_ms", "error"])
    for fig in (
        charts.latency_over_time(empty),
        charts.distribution(empty, "ttft_ms", "TTFT"),
        charts.throughput_over_time(pd.DataFrame(columns=["t_s", "name", "value"])),
        charts.compare_bars(pd.DataFrame()),
        charts.latency_throughput_scatter(pd.DataFrame(columns=["run_id", "label"])),
    ):
        assert len(fig.data) == 0
        assert fig.layout.annotations and fig.layout.annotations[0].text


def test_downsample_bounds_points_and_keeps_the_last() -> None:
    df = pd.DataFrame({"t_s": range(100_000), "value": range(100_000)})
    out = charts.downsample(df, 2000)
    assert len(out) <= 2000
    assert out["t_s"].iloc[0] == 0 and out["t_s"].iloc[-1] == 99_999
    assert charts.downsample(df.head(10), 2000).equals(df.head(10))


def test_line_charts_pick_their_series_and_stay_bounded() -> None:
    rows = [(float(t), SERIES_OUTPUT_TOK_S, float(t % 7)) for t in range(10_000)]
    rows += [(float(t), SERIES_IN_FLIGHT, 4.0) for t in range(10_000)]
    ts = pd.DataFrame(rows, columns=["t_s", "name", "value"])
    fig = charts.throughput_over_time(ts)
    assert len(fig.data) == 1 and len(fig.data[0].x) <= charts.MAX_POINTS
    assert fig.data[0].x[-1] == 9999.0 and fig.data[0].y[-1] == 9999 % 7
    assert fig.layout.yaxis.title.text == "tokens/s"
    inflight = charts.in_flight_over_time(ts)
    assert set(inflight.data[0].y) == {4.0}
    mem = charts.memory_over_time(ts, data.MEMORY_SERIES)
    assert len(mem.data) == 0  # no memory series in this frame: says so, draws nothing
    assert mem.layout.yaxis.visible is False
    # A run that samples (in flight) without memory series: the engine reports none, not "yet".
    assert data._memory_reported(ts) is False
    remote = charts.memory_over_time(ts, data.MEMORY_SERIES, reported=False)
    assert "reports no memory" in remote.layout.annotations[0].text
    assert "no sample yet" in mem.layout.annotations[0].text
    assert data._memory_reported(ts.head(0)) is True
    with_mem = pd.concat([ts, pd.DataFrame([(0.0, data.MEMORY_SERIES[0][0], 1.0)], columns=ts.columns)])
    assert data._memory_reported(with_mem) is True


def _runs_frame(store: Store) -> pd.DataFrame:
    return data.runs_frame(store.list_runs())


def test_compare_bars_one_bar_per_run_and_no_bar_for_unknown(store: Store) -> None:
    a = add_synthetic_run(store, 10)
    b = add_synthetic_run(store, 10, seed=4, peak_gib=None)
    df = _runs_frame(store).set_index("run_id").loc[[a, b]].reset_index()
    fig = charts.compare_bars(df)
    bars = [t for t in fig.data if not t.showlegend]
    panels = {fig.layout.annotations[i].text: bars[i] for i in range(len(bars))}
    assert "Output throughput (tokens/s)" in panels
    tput = panels["Output throughput (tokens/s)"]
    assert list(tput.x) == [f"#{a}", f"#{b}"]  # short ids: never rotated or cut
    assert tput.xaxis == "x" and fig.layout.xaxis.tickangle == 0
    assert tput.customdata[0].startswith(f"#{a} native · concurrency c=4")  # the hover has the whole label
    assert [t.name for t in fig.data if t.showlegend] == ["native"]  # the legend maps colours to engines
    expected = [store.get_run(i).summary.output_throughput_tok_s for i in (a, b)]
    assert list(tput.y) == pytest.approx(expected)
    mem = list(panels["Peak memory (GiB)"].y)
    assert mem[0] == pytest.approx(0.5) and pd.isna(mem[1])  # unknown stays unknown, not zero


def test_scatter_highlights_the_selected_runs(store: Store) -> None:
    ids = [add_synthetic_run(store, 8, seed=i) for i in range(4)]
    df = _runs_frame(store)
    fig = charts.latency_throughput_scatter(df, highlight=ids[:2])
    (trace,) = fig.data  # one engine, one mode: one trace
    assert trace.name == "native · concurrency" and trace.marker.symbol == "square"
    labelled = {t for t in trace.text if t}
    assert labelled == {f"#{ids[0]}", f"#{ids[1]}"} and sorted(trace.marker.size) == [9, 9, 15, 15]
    assert fig.layout.xaxis.title.text == "output throughput (tokens/s)"
    assert fig.layout.yaxis.title.text == "E2E p99 latency (ms)"
    assert fig.layout.xaxis.range[1] >= df["output_throughput_tok_s"].max()


def test_scatter_colours_by_engine_and_shapes_by_mode(store: Store) -> None:
    add_synthetic_run(store, 8, engine="native", mode="latency")
    add_synthetic_run(store, 8, engine="vllm", mode="concurrency", seed=3)
    fig = charts.latency_throughput_scatter(_runs_frame(store))
    styles = {t.name: (t.marker.color, t.marker.symbol) for t in fig.data}
    assert styles == {
        "native · latency": (charts.engine_color("native"), "circle"),
        "vllm · concurrency": (charts.engine_color("vllm"), "square"),
    }
    assert charts.engine_color("native") != charts.engine_color("vllm")


def test_runs_frame_filter_and_sort(store: Store) -> None:
    a = add_synthetic_run(store, 10, name="alpha")
    b = add_synthetic_run(store, 10, engine="vllm", accelerator="cuda", device="NVIDIA H200", seed=7)
    running = store.create_run(mode="latency", engine="native", model="m", accelerator="cpu", config={"requests": 3})
    df = data.runs_frame(store.list_runs())
    assert list(df["run_id"]) == [running, b, a]
    row = df.set_index("run_id").loc[running]
    assert row["status"] == "running" and row["requests"] == 3 and pd.isna(row["output_throughput_tok_s"])
    assert list(data.filter_runs(df, engines=["vllm"])["run_id"]) == [b]
    assert list(data.filter_runs(df, text="H200")["run_id"]) == [b]
    assert list(data.filter_runs(df, text="alpha")["run_id"]) == [a]
    assert list(data.filter_runs(df, statuses=["running"])["run_id"]) == [running]
    by_tput = data.sort_runs(df, "output throughput (high → low)")
    assert by_tput["run_id"].iloc[-1] == running  # runs without a value go last
    assert by_tput["output_throughput_tok_s"].iloc[0] == df["output_throughput_tok_s"].max()


def test_newest_first_is_by_when_a_run_ran_not_its_id(store: Store) -> None:
    """An imported run keeps its own time: one recorded two days ago sorts below today's runs although
    its id is newer (imported runs of 12-04 were listed above runs of 12-06)."""
    import time

    today = add_synthetic_run(store, 5, name="today")
    old_bundle = store.export_bundle(add_synthetic_run(store, 5, name="two days ago"))
    old_bundle["run"]["created_at"] = time.time() - 2 * 86400
    from bench.bundle import import_run

    imported = import_run(store, old_bundle)
    assert imported > today
    df = data.runs_frame(store.list_runs())
    newest = list(data.sort_runs(df, "newest first")["run_id"])
    assert newest.index(today) < newest.index(imported)
    assert data.sort_runs(df, "oldest first")["run_id"].iloc[0] == imported


def test_live_data_is_a_bounded_window_with_whole_run_percentiles(store: Store) -> None:
    run_id = add_synthetic_run(store, 300)
    live = data.load_live(store, run_id, window=100)
    assert len(live.samples) == 100 and live.total_samples == 300
    assert live.samples["end_s"].is_monotonic_increasing
    all_rows = pd.DataFrame(store.sample_rows(run_id))
    assert live.samples["end_s"].min() == pytest.approx(all_rows["end_s"].nlargest(100).min())
    summary = store.get_run(run_id).summary
    figs = data.live_figures(live, summary)
    assert set(figs) == {"latency", "ttft", "tpot", "throughput", "in_flight", "memory"}
    assert "newest 100 requests" in figs["ttft"].layout.title.text
    assert sorted(s.x0 for s in figs["ttft"].layout.shapes) == pytest.approx([summary.ttft_ms.p50, summary.ttft_ms.p99])
    assert data.last_value(live.timeseries, SERIES_MEM_PEAK) == pytest.approx(0.5)
    assert {t.name for t in figs["memory"].data} == {"allocated", "reserved", "peak"}


def test_live_figures_stay_fast_for_a_big_run(store: Store) -> None:
    """A 20k-request run draws from the same bounded window as a small one."""
    records = synthetic_records(20_000)
    run_id = store.create_run(mode="concurrency", engine="native", model="m", accelerator="cpu", config={})
    store.add_samples(run_id, list(enumerate(records)))
    summary = summarize(records)
    t0 = time.perf_counter()
    figs = data.live_figures(data.load_live(store, run_id), summary)
    elapsed = time.perf_counter() - t0
    assert len(figs["latency"].data[0].x) <= charts.MAX_POINTS
    assert elapsed < 5.0, elapsed


def test_summary_tables_carry_units() -> None:
    summary = summarize(synthetic_records(10), peak_memory_gib=None)
    lat = data.latency_table(summary)
    assert list(lat["metric"]) == ["TTFT", "TPOT", "ITL", "E2E"]
    assert {"mean (ms)", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)"} <= set(lat.columns)
    assert lat.set_index("metric").loc["E2E", "p50 (ms)"] == pytest.approx(summary.e2e_ms.p50)
    tput = data.throughput_table(summary).set_index("figure")
    assert tput.loc["output throughput", "unit"] == "tok/s"  # the catalogue's unit (bench.metrics.catalogue)
    assert tput.loc["peak memory", "value"] == "not measured"  # never a made-up number


def test_number_formatting() -> None:
    assert data.fmt_num(None) == "-"
    assert data.fmt_num(500.0) == "500"
    assert data.fmt_num(12345.6) == "12,346"
    assert data.fmt_num(123.45) == "123.5"
    assert data.fmt_num(0.012345) == "0.0123"
    assert data.fmt_params(1_540_000) == "1.54 M"
    assert data.fmt_params(671_000_000_000) == "671 B"
    assert data.fmt_duration(75) == "1:15"
    assert data.fmt_unit(None, "ms") == "-"


def test_engine_telemetry_gets_its_own_chart_only_when_reported(store: Store) -> None:
    run_id = add_synthetic_run(store, 10)
    assert not [k for k in data.live_figures(data.load_live(store, run_id)) if k.startswith("telemetry")]
    store.add_points(run_id, [(0.0, "server_kv_cache_usage_pct", 10.0), (1.0, "server_kv_cache_usage_pct", 40.0)])
    live = data.load_live(store, run_id)
    assert data.telemetry_series(live.timeseries) == ["server_kv_cache_usage_pct"]
    fig = data.live_figures(live)["telemetry:pct"]
    assert [t.name for t in fig.data] == ["kv cache usage"]
    assert list(fig.data[0].y) == [10.0, 40.0]
    assert fig.layout.yaxis.title.text == "%"


def test_telemetry_is_one_chart_per_unit_with_whole_number_ticks_for_counts(store: Store) -> None:
    run_id = add_synthetic_run(store, 10)
    points = []
    for t in (0.0, 1.0, 2.0):
        points += [
            (t, "server_kv_cache_usage_pct", 20.0 + t), (t, "host_cpu_pct", 50.0),
            (t, "server_generation_tok_s", 100.0 * t), (t, "server_requests_running", t),
            (t, "server_requests_waiting", 0.0), (t, "client_cpu_cores", 1.2),
            (t, "dev0_power_w", 300.0), (t, "dev0_mem_used_gib", 70.0),
        ]  # fmt: skip
    store.add_points(run_id, points)
    figs = data.live_figures(data.load_live(store, run_id))
    groups = {k: [t.name for t in f.data] for k, f in figs.items() if k.startswith("telemetry:")}
    assert groups == {
        "telemetry:cores": ["client cpu"],
        "telemetry:count": ["requests running", "requests waiting"],
        "telemetry:gib": ["dev0 mem used"],
        "telemetry:pct": ["host cpu", "kv cache usage"],
        "telemetry:tok_s": ["generation"],
        "telemetry:w": ["dev0 power"],
    }
    counts = figs["telemetry:count"]
    assert counts.layout.yaxis.dtick == 1 and counts.layout.yaxis.tickformat == "d"
    assert figs["telemetry:pct"].layout.yaxis.dtick is None  # a percentage keeps fractional ticks
    # Several series: the legend sits under the plot, not over the title.
    assert figs["telemetry:pct"].layout.legend.y < 0


def test_a_histogram_of_a_few_requests_has_whole_number_ticks(store: Store) -> None:
    run_id = add_synthetic_run(store, 3)
    fig = data.live_figures(data.load_live(store, run_id))["ttft"]
    assert fig.layout.yaxis.dtick == 1
    big = add_synthetic_run(store, 400)
    fig = data.live_figures(data.load_live(store, big))["ttft"]
    assert fig.layout.yaxis.tickformat == ",d" and fig.layout.yaxis.dtick is None


def test_run_labels_carry_engine_load_and_lengths(store: Store) -> None:
    run_id = add_synthetic_run(store, 3)
    run = store.get_run(run_id)
    assert run is not None
    label = data.run_label(run)
    assert label.startswith(f"#{run_id} {run.engine} · ")
    wl = run.config.get("workload", {})
    assert f"{wl['input_len']}→{wl['output_len']} tok" in label
    assert data.workload_text("concurrency", 16, {"workload": {"input_len": 128, "output_len": 64}}) == (
        "concurrency c=16 · 128→64 tok"
    )
    assert data.workload_text("concurrency", 64, {"request_rate": 4.0, "workload": {"source": "sharegpt"}}) == (
        "concurrency 4 req/s · sharegpt"
    )
    assert data.workload_text(
        "latency", 1, {"workload": {"input_len": 32, "output_len": 16, "output_dist": "normal"}}
    ) == ("latency · ~32→~16 tok")


def _slo_marks(fig: object) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """The SLO shapes (name -> their x0 or y0) and annotations (name -> texts) of a figure."""
    shapes: dict[str, list[float]] = {}
    notes: dict[str, list[str]] = {}
    for s in fig.layout.shapes:  # type: ignore[attr-defined]
        if (s.name or "").startswith("slo:"):
            shapes.setdefault(s.name, []).append(s.x0 if s.xref == "x" else s.y0)
    for a in fig.layout.annotations:  # type: ignore[attr-defined]
        if (a.name or "").startswith("slo:"):
            notes.setdefault(a.name, []).append(a.text)
    return shapes, notes


def test_histograms_draw_the_slos_of_their_own_metric_only() -> None:
    from bench.metrics.slo import parse_slos

    samples = _samples(101)  # TTFT 10-30 ms, TPOT 2-4 ms
    slos = parse_slos(["ttft_ms:p99<=25", "ttft_ms:mean<=20", "tpot_ms:p99<=3.5", "e2e_ms:p50<=40"])
    fig = charts.distribution(samples, "ttft_ms", "TTFT", p50=12.5, p99=30.0, slos=slos)
    shapes, notes = _slo_marks(fig)
    assert shapes == {"slo:ttft_ms:p99<=25": [25.0], "slo:ttft_ms:mean<=20": [20.0]}
    assert notes == {"slo:ttft_ms:p99<=25": ["TTFT p99 ≤ 25 ms"], "slo:ttft_ms:mean<=20": ["TTFT mean ≤ 20 ms"]}
    assert all(s.line.dash == "dash" and s.line.color == charts.SLO_COLOR for s in fig.layout.shapes if s.name)
    assert len(fig.layout.shapes) == 4  # p50, p99 and the two SLOs
    fig = charts.distribution(samples, "tpot_ms", "TPOT", slos=slos)
    assert _slo_marks(fig) == ({"slo:tpot_ms:p99<=3.5": [3.5]}, {"slo:tpot_ms:p99<=3.5": ["TPOT p99 ≤ 3.5 ms"]})
    # No SLO on the metric: the chart is the plain one.
    fig = charts.distribution(samples, "ttft_ms", "TTFT", slos=parse_slos(["tpot_ms:p99<=3"]))
    assert _slo_marks(fig) == ({}, {}) and len(fig.layout.shapes) == 2


def test_an_slo_far_from_the_data_is_a_note_at_the_edge_not_a_squashing_line() -> None:
    from bench.metrics.slo import parse_slos

    samples = _samples(50)  # TTFT 10-30 ms: a 2 s limit would leave them a sliver of the axis
    fig = charts.distribution(samples, "ttft_ms", "TTFT", slos=parse_slos(["mlperf-server"]))
    shapes, notes = _slo_marks(fig)
    assert shapes == {}
    assert notes == {"slo:ttft_ms:p99<=2000": ["TTFT p99 ≤ 2000 ms (off the chart) →"]}
    # Below the data: a 1 ms limit on 10-30 ms stays in view (the axis reaches down to it), a 100 ms one on
    # 1010-1030 ms does not.
    fig = charts.distribution(samples, "ttft_ms", "TTFT", slos=parse_slos(["ttft_ms:p50<=1"]))
    assert _slo_marks(fig)[0] == {"slo:ttft_ms:p50<=1": [1.0]}
    slow = samples.assign(ttft_ms=samples["ttft_ms"] + 1000)
    fig = charts.distribution(slow, "ttft_ms", "TTFT", slos=parse_slos(["ttft_ms:p50<=100"]))
    assert _slo_marks(fig) == ({}, {"slo:ttft_ms:p50<=100": ["← TTFT p50 ≤ 100 ms (off the chart)"]})
    fig = charts.latency_over_time(samples, slos=parse_slos(["e2e_ms:p99<=60000"]))
    assert _slo_marks(fig) == ({}, {"slo:e2e_ms:p99<=60000": ["E2E p99 ≤ 60000 ms (above the chart) ↑"]})


def test_latency_over_time_draws_e2e_and_ttft_slos_as_horizontal_lines() -> None:
    from bench.metrics.slo import parse_slos

    samples = _samples(40, fail_every=5)
    slos = parse_slos(["e2e_ms:p99<=50", "ttft_ms:p99<=25", "tpot_ms:p99<=3", "itl_ms:p99<=3"])
    fig = charts.latency_over_time(samples, slos=slos)
    shapes, notes = _slo_marks(fig)
    assert shapes == {"slo:e2e_ms:p99<=50": [50.0], "slo:ttft_ms:p99<=25": [25.0]}
    assert notes == {"slo:e2e_ms:p99<=50": ["E2E p99 ≤ 50 ms"], "slo:ttft_ms:p99<=25": ["TTFT p99 ≤ 25 ms"]}
    assert all(s.xref == "paper" and s.y0 == s.y1 for s in fig.layout.shapes)
    assert {t.name for t in fig.data} == {"E2E", "TTFT", "failed"}  # lines are shapes, not traces
    assert not charts.latency_over_time(samples).layout.shapes


def test_live_figures_draw_the_runs_slos(store: Store) -> None:
    from bench.metrics.slo import parse_slos

    records = synthetic_records(60)
    summary = summarize(records, slos=["ttft_ms:p99<=25", "tpot_ms:p99<=3.5"])
    run_id = store.create_run(
        mode="concurrency", engine="native", model="m", accelerator="cpu", config={"slos": ["e2e_ms:p99<=45"]}
    )
    store.add_samples(run_id, list(enumerate(records)))
    live = data.load_live(store, run_id)
    # The summary's SLOs (what the run was judged on) win over the stored config's.
    assert [s.text for s in data.run_slos({"slos": ["e2e_ms:p99<=45"]}, summary)] == [
        "ttft_ms:p99<=25",
        "tpot_ms:p99<=3.5",
    ]
    figs = data.live_figures(live, summary)
    assert set(_slo_marks(figs["ttft"])[0]) == {"slo:ttft_ms:p99<=25"}
    assert set(_slo_marks(figs["tpot"])[0]) == {"slo:tpot_ms:p99<=3.5"}
    assert set(_slo_marks(figs["latency"])[0]) == {"slo:ttft_ms:p99<=25"}
    # A run without a summary yet (just started): its config's SLOs.
    slos = data.run_slos({"slos": ["e2e_ms:p99<=45"]}, None)
    assert slos == parse_slos(["e2e_ms:p99<=45"])
    figs = data.live_figures(live, None, slos)
    assert set(_slo_marks(figs["latency"])[0]) == {"slo:e2e_ms:p99<=45"}
    assert _slo_marks(figs["ttft"]) == ({}, {})
    assert data.run_slos({}, None) == [] and data.run_slos(None, summarize(records)) == []


def test_run_progress_counts_time_for_a_duration_bound_run() -> None:
    from bench.run.job import JobSnapshot
    from dashboard.ui import run_progress

    def snap(**kw: object) -> JobSnapshot:
        base = {"job_id": "j", "run_id": 1, "status": "running", "phase": "running", "done": 5, "total": 20,
                "failed": 0, "in_flight": 2, "elapsed_s": 15.0, "error": None, "summary": None,
                "mode": "concurrency"}  # fmt: skip
        return JobSnapshot(**{**base, **kw})  # type: ignore[arg-type]

    assert run_progress(snap()) == (0.25, "5/20 requests · 15.0 s")
    # Its request count is only a cap (1,000,000): progress is the time sent of the duration.
    fraction, text = run_progress(snap(total=1_000_000, config={"duration_s": 60.0}))
    assert fraction == pytest.approx(0.25) and text == "5 requests · 15.0 s of 1:00"
    assert run_progress(snap(total=1_000_000, elapsed_s=61.2, config={"duration_s": 60.0}))[0] == 1.0


def test_a_stopped_runs_progress_line_counts_its_cancelled_requests() -> None:
    """Stop: the 8 requests in flight end cancelled and the line says so (it read "33/64 requests ·
    0 in flight · 0 failed", the 8 nowhere); before the clock the phase leads."""
    from bench.metrics.records import CANCELLED, RequestRecord
    from bench.run.job import JobSnapshot
    from dashboard.ui import progress_line

    records = [RequestRecord(f"r{i}", 0.0, 1.0, [0.5, 1.0], 4, 2) for i in range(33)]
    records += [RequestRecord(f"c{i}", 0.0, 1.0, [0.5], 4, 1, error=CANCELLED) for i in range(8)]
    summary = summarize(records)
    base = {"job_id": "j", "run_id": 1, "status": "cancelled", "phase": "cancelled", "done": 41, "total": 64,
            "failed": 0, "in_flight": 0, "elapsed_s": 3.0, "error": None, "summary": summary,
            "mode": "concurrency"}  # fmt: skip
    assert progress_line(JobSnapshot(**base), "cancelled")[1] == (  # type: ignore[arg-type]
        "41/64 requests · 0 in flight · 0 failed · 8 cancelled · 3.0 s"
    )
    loading = {**base, "status": "loading", "phase": "compiling and capturing the decode step for batch 8 (2/3)",
               "done": 0, "summary": None}  # fmt: skip
    assert progress_line(JobSnapshot(**loading), "loading")[1] == (  # type: ignore[arg-type]
        "compiling and capturing the decode step for batch 8 (2/3) · 0/64 requests · 0 in flight · 0 failed · 3.0 s"
    )


def test_a_probe_without_goodput_is_an_empty_number_cell_not_none(store: Store) -> None:
    """A capacity search whose runs had no SLO goodput printed a literal "None": the column stays
    numeric, its missing cells empty."""
    run_id = add_synthetic_run(store, 10)
    run = store.get_run(run_id)
    assert run is not None
    frame = data.probes_frame({"axis": "rate", "probes": [{"value": 4.0, "passed": True, "run_id": run_id}]}, [run])
    assert frame["goodput (req/s)"].dtype.kind == "f" and frame["goodput (req/s)"].isna().all()
    assert frame["output (tok/s)"].iloc[0] == pytest.approx(run.summary.output_throughput_tok_s)  # type: ignore[union-attr]


def test_a_long_runs_live_charts_read_10_s_means_and_say_so(store: Store) -> None:
    """Two hours of per-second series: the live view reads the 10 s rollup (720 points a series,
    not 7,200) and the series charts' titles say they are means."""
    run_id = add_synthetic_run(store, 50)
    store.add_points(run_id, [(float(t), SERIES_OUTPUT_TOK_S, 100.0 + t % 10) for t in range(7200)])
    live = data.load_live(store, run_id)
    assert live.series_step_s == 10
    tok = live.timeseries[live.timeseries["name"] == SERIES_OUTPUT_TOK_S]
    # the mean of 100..109 in every bucket (the first also holds the synthetic run's own points)
    assert len(tok) == 720 and tok["value"].iloc[1:].eq(104.5).all()
    figs = data.live_figures(live, store.get_run(run_id).summary)
    assert figs["throughput"].layout.title.text.endswith("(10 s means)")
    assert "means" not in (figs["latency"].layout.title.text or "")

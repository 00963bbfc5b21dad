"""bench.analysis.sweep_analysis and bench.report on real stored data: a SQLite store holding sweeps,
capacity searches and runs
whose summaries are computed from real request records (never hand-written)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.serving import serving_curve
from bench.analysis.sweep_analysis import knee, load_axis_of, pareto_front, recommendations, sweep_slos, sweep_table
from bench.metrics.records import RequestRecord
from bench.metrics.summary import summarize
from bench.report.csv_export import SWEEP_CSV_LEAD_COLUMNS, sweep_csv, sweep_csv_columns
from bench.report.figures import (
    capacity_figure,
    goodput_figure,
    latency_throughput_figure,
    run_throughput_figure,
    serving_pareto_figure,
)
from bench.report.html import html_report, parse_target
from bench.run.recorder import SERIES_OUTPUT_TOK_S
from bench.store import Store
from bench.store.rows import SUMMARY_CSV_COLUMNS
from bench.sweep.spec import CapacitySpec, PointResult, SweepSpec, sweep_points
from engines.errors import MoEBenchError

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
ENGINE = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"}
EVIL = "<script>alert(1)</script>"
N, OUT = 11, 10  # requests per run, output tokens per request


def _records(ttft_ms: float, tpot_ms: float, failed: int = 0) -> list[RequestRecord]:
    """N requests whose TTFTs rise evenly from ttft_ms to 2 * ttft_ms, so (linear-interpolated
    percentiles) TTFT p50 = 1.5 * ttft_ms and p99 = 1.99 * ttft_ms; every TPOT is tpot_ms."""
    recs = []
    for i in range(N):
        start = i * 0.01
        first = start + ttft_ms * (1 + i / (N - 1)) / 1000
        chunks = [first + k * tpot_ms / 1000 for k in range(OUT)]
        recs.append(RequestRecord(f"r{i}", start, chunks[-1], chunks, prompt_tokens=8, output_tokens=OUT))
    for j in range(failed):
        recs.append(RequestRecord(f"f{j}", 0.0, 0.05, [], prompt_tokens=8, error="boom"))
    return recs


def _run(
    store: Store,
    sweep_id: int | None,
    point: dict[str, Any],
    *,
    tput: float,
    ttft: float = 100.0,
    tpot: float = 10.0,
    slos: Sequence[str] = (),
    failed: int = 0,
    name: str = "",
    status: str = "completed",
) -> int:
    """A stored run at ``point`` with output throughput ``tput`` tok/s (N * OUT tokens over
    the duration that gives it)."""
    concurrency = point.get("concurrency")
    config = {
        "engine": ENGINE,
        "workload": {"source": "random", "input_len": 32, "output_len": OUT},
        "concurrency": concurrency or 4,
        "request_rate": point.get("request_rate", point.get("rate")),
        "slos": list(slos),
    }
    run_id = store.create_run(
        mode="concurrency", engine="native", model="tiny-deepseek-v3", accelerator="cpu", config=config,
        concurrency=concurrency or 4, name=name, sweep_id=sweep_id, sweep_point=point,
    )  # fmt: skip
    recs = _records(ttft, tpot, failed)
    store.add_samples(run_id, list(enumerate(recs)))
    if status == "completed":
        store.finish_run(run_id, "completed", summary=summarize(recs, duration_s=N * OUT / tput, slos=list(slos)))
    else:
        store.finish_run(run_id, status, error="the engine crashed")
    return run_id


def _sweep(store: Store, name: str = "", slos: Sequence[str] = (), **axes: Any) -> int:
    spec = SweepSpec.build(base={"engine": ENGINE, "slos": list(slos)}, name=name, **axes)
    return store.create_sweep(kind="sweep", config=spec.model_dump(mode="json"), name=name)


# The hand-made curve: concurrency 1, 2, 4, 8, 16 -> 100, 200, 400, 450, 460 output tok/s, and a
# TTFT that climbs with the load (p99 = 1.99 * ttft: 199, 298.5, 597, 2388, 4975 ms).
CURVE = ((1, 100.0, 100.0), (2, 200.0, 150.0), (4, 400.0, 300.0), (8, 450.0, 1200.0), (16, 460.0, 2500.0))
SLO = "ttft_ms:p99<=1000"


@pytest.fixture
def curve(store: Store) -> tuple[Store, int]:
    sid = _sweep(store, name=f"curve {EVIL}", slos=[SLO], concurrency=[c for c, _, _ in CURVE])
    for c, tput, ttft in CURVE:
        _run(store, sid, {"concurrency": c, "repeat": 0}, tput=tput, ttft=ttft, tpot=10.0 + c, slos=[SLO],
             name=f"sweep {EVIL} [concurrency={c}]")  # fmt: skip
    store.update_sweep(sid, status="completed", result={"points": 5, "kept": 0, "stopped": []})
    return store, sid


def _points(store: Store, sid: int) -> list[PointResult]:
    return sweep_points(store, sid)


# --- table ---------------------------------------------------------------------------------------


def test_sweep_table_means_spreads_failures_and_slo_verdicts(store: Store) -> None:
    sid = _sweep(store, slos=[SLO], concurrency=[1, 2], repeats=2)
    a = _run(store, sid, {"concurrency": 1, "repeat": 0}, tput=100.0, ttft=100.0, slos=[SLO])
    b = _run(store, sid, {"concurrency": 1, "repeat": 1}, tput=120.0, ttft=200.0, slos=[SLO], failed=2)
    c = _run(store, sid, {"concurrency": 2, "repeat": 0}, tput=300.0, ttft=600.0, slos=[SLO])  # p99 1194 > 1000
    d = _run(store, sid, {"concurrency": 2, "repeat": 1}, tput=0.0, status="failed")
    rows = sweep_table(_points(store, sid), sweep_slos(store.get_sweep(sid)))
    assert [r["concurrency"] for r in rows] == [1, 2]
    one, two = rows
    assert one["repeats"] == 2 and one["run_ids"] == [a, b]
    assert one["output_throughput_tok_s"] == pytest.approx(110.0)
    assert (one["output_throughput_tok_s_min"], one["output_throughput_tok_s_max"]) == pytest.approx((100.0, 120.0))
    assert one["ttft_ms_p50"] == pytest.approx((150.0 + 300.0) / 2)  # p50 = 1.5 * ttft, averaged over repeats
    assert one["ttft_ms_p99"] == pytest.approx((199.0 + 398.0) / 2)
    assert one["tpot_ms_p50"] == pytest.approx(10.0) and one["tpot_ms_p99"] == pytest.approx(10.0)
    assert one["failed"] == 2
    assert one["slo_met"] is True  # both repeats: p99 199 and 398 ms <= 1000
    assert one["goodput_rps"] is not None and one["request_throughput_rps"] is not None
    # The failed repeat has no summary: it counts in run_ids but not in repeats or the means.
    assert two["repeats"] == 1 and two["run_ids"] == [c, d]
    assert two["output_throughput_tok_s_min"] == two["output_throughput_tok_s_max"] == pytest.approx(300.0)
    assert two["slo_met"] is False
    # Without SLOs there is no verdict (None, an empty cell), never a made-up pass.
    assert sweep_table(_points(store, sid), [])[0]["slo_met"] is None


# --- knee and Pareto front -----------------------------------------------------------------------


def test_knee_on_a_hand_made_curve(curve: tuple[Store, int]) -> None:
    store, sid = curve
    points = _points(store, sid)
    # Kneedle: load 1, 2, 4, 8, 16 scaled to (c - 1) / 15 = 0, .067, .2, .467, 1; throughput
    # 100, 200, 400, 450, 460 scaled to (t - 100) / 360 = 0, .278, .833, .972, 1; the bend above
    # the chord (y - x) = 0, .211, .633, .506, 0: the largest is the third point, concurrency 4.
    k = knee(points, "concurrency")
    assert k is not None and k.point == {"concurrency": 4}
    assert load_axis_of(points) == "concurrency"
    assert knee(points[:2], "concurrency") is None  # fewer than 3 points
    assert knee(points, None) is None


def test_no_knee_on_a_straight_line(store: Store) -> None:
    sid = _sweep(store, concurrency=[1, 2, 3, 4])
    for c in (1, 2, 3, 4):
        _run(store, sid, {"concurrency": c, "repeat": 0}, tput=100.0 * c)  # bends are all 0
    points = _points(store, sid)
    assert knee(points, "concurrency") is None
    assert "in proportion to the load" in recommendations(points, [])["knee"]["text"]


def test_pareto_front_by_hand(store: Store) -> None:
    # (output tok/s, TPOT ms -> per-user tok/s = 1000 / TPOT):
    #   c=1: 100, 10 -> 100     on the front (fastest per user)
    #   c=2:  90, 12 ->  83.3   beaten by c=1 on both
    #   c=4: 300, 20 ->  50     on the front
    #   c=8: 250, 25 ->  40     beaten by c=4 on both
    #   c=16: 500, 50 ->  20    on the front (most throughput)
    sid = _sweep(store, concurrency=[1, 2, 4, 8, 16])
    for c, tput, tpot in ((1, 100.0, 10.0), (2, 90.0, 12.0), (4, 300.0, 20.0), (8, 250.0, 25.0), (16, 500.0, 50.0)):
        _run(store, sid, {"concurrency": c, "repeat": 0}, tput=tput, tpot=tpot)
    points = _points(store, sid)
    assert [p.point["concurrency"] for p in pareto_front(points)] == [1, 4, 16]
    # The serving chart of the same points (one accelerator: the CPU host), tok/s per user on x: the same front.
    curve = serving_curve(points, "s")
    fig = serving_pareto_figure([curve], 20.0, {}, ["s"])
    (front,) = [t for t in fig.data if t.mode == "lines+markers+text"]
    (every,) = [t for t in fig.data if t.showlegend is False]
    assert list(front.x) == pytest.approx([20.0, 50.0, 100.0])
    assert list(front.y) == pytest.approx([500.0, 300.0, 100.0])
    assert front.cliponaxis is False and sorted(front.text) == ["c=1", "c=16", "c=4"]
    assert len(every.x) == 5
    assert fig.layout.xaxis.range[1] > 100 and fig.layout.yaxis.range[1] > 500  # room for the labels
    assert "tok/s per user" in fig.layout.xaxis.title.text and "per accelerator" in fig.layout.yaxis.title.text


# --- recommendations -------------------------------------------------------------------------------


def test_recommendations_pick_the_right_points(curve: tuple[Store, int]) -> None:
    store, sid = curve
    points = _points(store, sid)
    rec = recommendations(points, sweep_slos(store.get_sweep(sid)))
    # TTFT p99 = 199, 298.5, 597, 2388, 4975 ms: concurrency 1, 2, 4 meet 1000 ms; 4 is fastest.
    assert rec["met_any"] is True
    assert rec["best"]["point"] == {"concurrency": 4}
    assert rec["best"]["text"].startswith("Best throughput within the SLOs: concurrency=4, 400 output tok/s, TTFT p99")
    assert "597 ms" in rec["best"]["text"]
    assert rec["best"]["row"]["slo_met"] is True
    # Lowest TTFT p50 (1.5 * ttft): concurrency 1.
    assert rec["lowest_latency"]["point"] == {"concurrency": 1}
    assert "TTFT p50 150 ms" in rec["lowest_latency"]["text"]
    assert rec["knee"]["point"] == {"concurrency": 4}
    assert rec["knee"]["text"].startswith("Knee of output throughput vs concurrency: concurrency=4")
    assert rec["texts"] == [rec["best"]["text"], rec["lowest_latency"]["text"], rec["knee"]["text"]]
    assert all("\n" not in t for t in rec["texts"])


def test_recommendations_say_when_no_point_meets_the_slos(curve: tuple[Store, int]) -> None:
    store, sid = curve
    rec = recommendations(_points(store, sid), ["ttft_ms:p99<=50"])
    assert rec["met_any"] is False and rec["best"]["point"] is None
    # The closest is concurrency 1: TTFT p99 199 ms is 298 % over 50 ms.
    assert rec["best"]["text"] == (
        "No point meets the SLOs (TTFT p99 ≤ 50 ms); closest: concurrency=1 (TTFT p99 199 ms, 298% over)."
    )


def test_recommendations_without_slos_take_the_best_overall_and_ties_go_to_throughput(store: Store) -> None:
    sid = _sweep(store, concurrency=[1, 2, 4])
    _run(store, sid, {"concurrency": 1, "repeat": 0}, tput=100.0, ttft=100.0)
    _run(store, sid, {"concurrency": 2, "repeat": 0}, tput=180.0, ttft=100.0)  # same TTFT, more throughput
    _run(store, sid, {"concurrency": 4, "repeat": 0}, tput=300.0, ttft=400.0)
    rec = recommendations(_points(store, sid), [])
    assert rec["met_any"] is None
    assert rec["best"]["point"] == {"concurrency": 4}
    assert rec["best"]["text"].startswith("Best throughput (no SLOs set")
    assert rec["lowest_latency"]["point"] == {"concurrency": 2}


def test_recommendations_with_nothing_measured(store: Store) -> None:
    sid = _sweep(store, concurrency=[1])
    _run(store, sid, {"concurrency": 1, "repeat": 0}, tput=0.0, status="failed")
    rec = recommendations(_points(store, sid), [SLO])
    assert rec["best"]["point"] is None and "No point has a completed run" in rec["best"]["text"]
    assert rec["knee"]["text"].startswith("No knee: fewer than 3 points")


# --- figures ------------------------------------------------------------------------------------------


def _trace(fig: Any, name: str) -> Any:
    return next(t for t in fig.data if t.name == name)


def _shape_names(fig: Any) -> list[str]:
    return [s.name for s in fig.layout.shapes]


def test_latency_throughput_figures(curve: tuple[Store, int]) -> None:
    store, sid = curve
    points = _points(store, sid)
    slos = sweep_slos(store.get_sweep(sid))
    ttft = latency_throughput_figure(points, slos, "ttft_ms")
    names = [t.name for t in ttft.data]
    assert names == ["knee", "TTFT p50", "TTFT p99"]  # the knee's ring first: drawn under the curves
    p99 = _trace(ttft, "TTFT p99")
    assert list(p99.x) == pytest.approx([100.0, 200.0, 400.0, 450.0, 460.0])
    assert list(p99.y) == pytest.approx([199.0, 298.5, 597.0, 2388.0, 4975.0])
    assert list(p99.text) == ["c=1", "c=2", "c=4", "c=8", "c=16"]
    assert "concurrency=4" in p99.customdata[2]  # the hover names the point
    assert list(_trace(ttft, "knee").x) == pytest.approx([400.0])  # the knee, on the p99 curve
    assert list(_trace(ttft, "knee").y) == pytest.approx([597.0])
    assert _shape_names(ttft) == ["SLO TTFT p99 ≤ 1000 ms"]
    assert ttft.layout.shapes[0].line.dash == "dash" and ttft.layout.shapes[0].y0 == 1000
    assert any(a.text == "TTFT p99 ≤ 1000 ms" for a in ttft.layout.annotations)
    assert ttft.layout.xaxis.title.text == "output throughput (tokens/s)"
    assert ttft.layout.yaxis.title.text == "TTFT (ms)"
    assert ttft.layout.legend.y < 0  # below the plot: never over the title
    assert p99.error_y.array is None  # one repeat per point: no error bars
    tpot = latency_throughput_figure(points, slos + sweep_slos_tpot(), "tpot_ms")
    assert [t.name for t in tpot.data] == ["knee", "TPOT p50", "TPOT p99"]
    assert _shape_names(tpot) == ["SLO TPOT p99 ≤ 80 ms"]  # only the SLOs on TPOT
    assert tpot.layout.yaxis.title.text == "TPOT (ms)"


def test_an_slo_far_above_the_data_is_named_not_drawn_to_scale(curve: tuple[Store, int]) -> None:
    """A 2,000 ms SLO over TTFTs of at most 300 ms stretched the axis and flattened the data: it is
    named at the top edge instead, and the axis fits the data; an SLO within reach stays a line."""
    from bench.metrics.slo import parse_slos

    store, sid = curve
    near = [p for p in _points(store, sid) if p.point["concurrency"] <= 2]  # TTFT p99 up to 298.5 ms
    fig = latency_throughput_figure(near, parse_slos(["ttft_ms:p99<=2000"]), "ttft_ms")
    assert _shape_names(fig) == []
    assert any(a.text == "▲ SLO TTFT p99 ≤ 2000 ms (above the chart)" for a in fig.layout.annotations)
    assert fig.layout.yaxis.range[1] == pytest.approx(298.5 * 1.18)
    within = latency_throughput_figure(near, parse_slos(["ttft_ms:p99<=1000"]), "ttft_ms")
    assert _shape_names(within) == ["SLO TTFT p99 ≤ 1000 ms"] and within.layout.yaxis.range[1] == pytest.approx(1180)


def sweep_slos_tpot() -> list[Any]:
    from bench.metrics.slo import parse_slos

    return parse_slos(["tpot_ms:p99<=80"])


def test_latency_figure_error_bars_from_repeats_and_lines(store: Store) -> None:
    sid = _sweep(store, concurrency=[1, 2], lengths=[(32, 10), (64, 10)], repeats=2)
    for il in (32, 64):
        for c in (1, 2):
            for r, tput in ((0, 100.0 * c), (1, 120.0 * c)):
                point = {"input_len": il, "output_len": 10, "concurrency": c, "repeat": r}
                _run(store, sid, point, tput=tput, ttft=100.0 * c * (1 + r))
    fig = latency_throughput_figure(_points(store, sid), [])
    # One line per prompt length, named by what differs between lines (output_len is always 10).
    assert [t.name for t in fig.data] == [
        "TTFT p50 · input_len=32",
        "TTFT p99 · input_len=32",
        "TTFT p50 · input_len=64",
        "TTFT p99 · input_len=64",
    ]
    p99 = fig.data[1]
    # c=1 repeats: p99 199 and 398 ms (mean 298.5): +99.5 / -99.5; throughput 100 and 120: +10 / -10.
    assert list(p99.y) == pytest.approx([298.5, 597.0])
    assert list(p99.error_y.array) == pytest.approx([99.5, 199.0])
    assert list(p99.error_y.arrayminus) == pytest.approx([99.5, 199.0])
    assert list(p99.error_x.array) == pytest.approx([10.0, 20.0])
    assert "mean of 2 repeats" in p99.customdata[0]


def test_goodput_figure(curve: tuple[Store, int]) -> None:
    store, sid = curve
    fig = goodput_figure(_points(store, sid))
    assert [t.name for t in fig.data] == ["throughput", "goodput"]
    assert list(fig.data[0].x) == [1, 2, 4, 8, 16]
    assert fig.data[1].y[0] > 0 and fig.data[1].y[-1] == 0  # at c=16 no request meets TTFT <= 1000 ms
    assert fig.layout.xaxis.title.text == "concurrency (requests in flight)"
    assert fig.layout.yaxis.title.text == "requests per second (req/s)"


def test_goodput_figure_of_a_rate_sweep_shows_the_offered_load(store: Store) -> None:
    sid = _sweep(store, request_rate=[1.0, 2.0])
    for rate in (1.0, 2.0):
        _run(store, sid, {"request_rate": rate, "repeat": 0}, tput=50.0 * rate)
    fig = goodput_figure(_points(store, sid))
    assert [t.name for t in fig.data] == ["throughput", "offered load"]
    assert any("no goodput" in a.text for a in fig.layout.annotations)
    assert fig.layout.xaxis.title.text == "request rate (req/s)"


def test_figures_of_a_sweep_without_a_load_axis(store: Store) -> None:
    sid = _sweep(store, lengths=[(32, 10), (64, 10)])
    _run(store, sid, {"input_len": 32, "output_len": 10, "repeat": 0}, tput=300.0)
    _run(store, sid, {"input_len": 64, "output_len": 10, "repeat": 0}, tput=200.0)
    points = _points(store, sid)
    assert load_axis_of(points) is None and knee(points, None) is None
    fig = latency_throughput_figure(points, [])
    p99 = _trace(fig, "TTFT p99")
    assert p99.mode == "markers+text" and list(p99.text) == ["input_len=32", "input_len=64"]  # not joined
    good = goodput_figure(points)
    assert list(good.data[0].x) == ["input_len=32, output_len=10", "input_len=64, output_len=10"]
    assert good.layout.xaxis.type == "category"
    assert "no load axis" in recommendations(points, [])["knee"]["text"]


def _capacity(store: Store, name: str = "cap") -> int:
    slos = ["ttft_ms:p99<=1000", "tpot_ms:p99<=80"]
    spec = CapacitySpec.build(base={"engine": ENGINE, "slos": slos}, axis="rate", start=2.0, step=1.0, name=name)
    sid = store.create_sweep(kind="capacity", config=spec.model_dump(mode="json"), name=name)
    probes = []
    for value, ttft, passed in ((2.0, 100.0, True), (4.0, 300.0, True), (8.0, 900.0, False), (6.0, 400.0, True)):
        run_id = _run(store, sid, {"rate": value}, tput=40.0 * value, ttft=ttft, slos=slos)
        probes.append({"value": value, "run_id": run_id, "passed": passed, "why": "TTFT p99: ok" if passed else "x"})
    failed_id = _run(store, sid, {"rate": 7.0}, tput=0.0, status="failed", slos=slos)
    probes.append({"value": 7.0, "run_id": failed_id, "passed": False, "why": "run failed: the engine crashed"})
    verdict = "highest request rate within the SLOs: passes at 6 req/s, fails at 7 req/s; 5 run(s)"
    result = {"axis": "rate", "probes": probes, "passes_at": 6.0, "fails_at": 7.0, "runs": 5, "verdict": verdict,
              "converged": True, "slos": slos}  # fmt: skip
    store.update_sweep(sid, status="completed", result=result)
    return sid


def test_capacity_figure(store: Store) -> None:
    sid = _capacity(store)
    fig = capacity_figure(store.get_sweep(sid), store.sweep_runs(sid))
    passed = [t for t in fig.data if t.name == "passed"]
    failed = [t for t in fig.data if t.name == "failed"]
    assert len(passed) == len(failed) == 2  # one of each per SLO panel
    assert list(passed[0].x) == [2.0, 4.0, 6.0] and list(passed[0].text) == ["1", "2", "4"]  # probe order
    assert list(failed[0].x) == [8.0] and list(failed[0].text) == ["3"]
    assert list(passed[0].y) == pytest.approx([199.0, 597.0, 796.0])  # TTFT p99 of each probe's run
    assert passed[0].marker.color != failed[0].marker.color
    names = _shape_names(fig)
    assert names.count("SLO TTFT p99 ≤ 1000 ms") == 1 and names.count("SLO TPOT p99 ≤ 80 ms") == 1
    brackets = [s for s in fig.layout.shapes if s.name == "bracket"]
    assert len(brackets) == 2 and (brackets[0].x0, brackets[0].x1) == (6.0, 7.0)
    assert "no data" in names  # the failed probe's run measured nothing: a dotted line, no marker
    assert "passes at 6 req/s, fails at 7 req/s" in fig.layout.title.text
    assert fig.layout.xaxis2.title.text == "request rate (req/s)"


def test_figures_without_data_say_why(store: Store) -> None:
    sid = _sweep(store, concurrency=[1])
    _run(store, sid, {"concurrency": 1, "repeat": 0}, tput=0.0, status="failed")
    points = _points(store, sid)
    serving = serving_pareto_figure([serving_curve(points)])
    for fig in (latency_throughput_figure(points, []), serving, goodput_figure(points)):
        assert not fig.data and fig.layout.annotations[0].text.startswith("no point")
    assert run_throughput_figure([]).layout.annotations[0].text == "this run has no per-second series"


# --- HTML report ------------------------------------------------------------------------------------


def test_html_report_of_a_sweep(curve: tuple[Store, int]) -> None:
    store, sid = curve
    from plotly.offline import get_plotlyjs

    text = html_report(store, f"sweep:{sid}").decode("utf-8")
    assert f"<title>Sweep {sid}: curve &lt;script&gt;" in html_report(store, f"s{sid}").decode("utf-8")
    assert EVIL not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert text.count(get_plotlyjs()[:300]) == 1  # plotly.js inlined once
    assert text.count("Plotly.newPlot") == 4
    for i in range(1, 5):
        assert f'id="figure-{i}"' in text
    assert "Best throughput within the SLOs: concurrency=4, 400 output tok/s" in text
    assert "Knee of output throughput vs concurrency: concurrency=4" in text
    assert "TTFT p99 ≤ 1000 ms" in text  # the SLOs in the configuration
    assert "output (tok/s)" in text and "TTFT p99 (ms)" in text  # the table, units in headers
    assert "Metric definitions" in text and "Time to first token" in text


def test_html_report_of_a_run_escapes_its_name(store: Store) -> None:
    run_id = _run(store, None, {}, tput=200.0, ttft=100.0, slos=[SLO], name=EVIL, failed=1)
    store.add_points(run_id, [(float(t), SERIES_OUTPUT_TOK_S, 150.0 + t) for t in range(1, 6)])
    for target in (str(run_id), f"run:{run_id}", f" RUN:{run_id} "):
        text = html_report(store, target).decode("utf-8")
        assert EVIL not in text
        assert f"Run {run_id}: &lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "Latency percentiles (ms)" in text and "p99 (ms)" in text
    assert "Output throughput over time" in text and text.count("Plotly.newPlot") == 1
    assert 'SLOs <span class="ok">met</span>' in text and "goodput" in text
    assert "output throughput (tok/s)" in text


def test_html_report_of_a_capacity_search(store: Store) -> None:
    sid = _capacity(store, name=EVIL)
    text = html_report(store, f"sweep:{sid}").decode("utf-8")
    assert EVIL not in text and f"Capacity search {sid}: &lt;script&gt;" in text
    assert "passes at 6 req/s, fails at 7 req/s" in text
    assert "run failed: the engine crashed" in text  # the probes table
    assert text.count("Plotly.newPlot") == 1


def test_html_report_of_an_empty_sweep_and_of_a_failed_run(store: Store) -> None:
    sid = _sweep(store, concurrency=[1, 2])
    text = html_report(store, f"s{sid}").decode("utf-8")
    assert "No point has a completed run yet." in text and text.count("Plotly.newPlot") == 4
    run_id = _run(store, None, {}, tput=0.0, status="failed")
    text = html_report(store, f"run:{run_id}").decode("utf-8")
    assert "the engine crashed" in text and "This run has no summary" in text
    assert "this run has no per-second series" in text


@pytest.mark.parametrize("target", ["bogus", "run:x", "sweep:", "", "12a", "s-1", "run:1\nrm -rf /"])
def test_bad_targets_raise_one_line(store: Store, target: str) -> None:
    with pytest.raises(MoEBenchError, match="bad report target") as err:
        html_report(store, target)
    assert "\n" not in str(err.value)


def test_unknown_targets_raise(store: Store) -> None:
    with pytest.raises(MoEBenchError, match="no run 999 in"):
        html_report(store, "999")
    with pytest.raises(MoEBenchError, match="no sweep or capacity search 7 in"):
        html_report(store, "s7")
    assert parse_target("capacity:3") == ("sweep", 3) and parse_target("Run:12") == ("run", 12)


# --- sweep CSV ----------------------------------------------------------------------------------------


def _csv(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(data.decode("utf-8")))
    return list(reader.fieldnames or []), list(reader)


def test_sweep_csv_columns_and_rows(store: Store) -> None:
    sid = _sweep(store, slos=[SLO], concurrency=[1, 2], engine_axis={"dtype": ["float32", "bfloat16"]}, repeats=2)
    ids = []
    for dtype in ("float32", "bfloat16"):
        for c in (1, 2):
            for r in (0, 1):
                point = {"engine.dtype": dtype, "concurrency": c, "repeat": r}
                ids.append(_run(store, sid, point, tput=100.0 * c + r, slos=[SLO]))
    header, rows = _csv(sweep_csv(store, sid))
    assert tuple(header) == sweep_csv_columns(["engine.dtype"])
    assert header[:7] == ["sweep_id", "input_len", "output_len", "concurrency", "request_rate", "engine.dtype",
                          "repeat"]  # fmt: skip
    assert set(SUMMARY_CSV_COLUMNS) <= set(header) and len(header) == len(set(header))  # no column twice
    assert [int(r["run_id"]) for r in rows] == ids
    first = rows[0]
    assert first["sweep_id"] == str(sid) and first["engine.dtype"] == "float32" and first["repeat"] == "0"
    assert first["concurrency"] == "1" and first["request_rate"] == ""  # closed loop: empty, not 0
    assert first["input_len"] == "32" and first["output_len"] == str(OUT)  # not swept: the run's own
    assert float(first["output_throughput_tok_s"]) == pytest.approx(100.0)
    assert first["goodput_rps"] != "" and first["slo_met"] == "True"
    assert rows[3]["concurrency"] == "2" and rows[3]["repeat"] == "1"
    assert SWEEP_CSV_LEAD_COLUMNS == ("sweep_id", "input_len", "output_len", "concurrency", "request_rate", "repeat")


def test_sweep_csv_of_a_capacity_search_and_unknown_sweeps(store: Store) -> None:
    sid = _capacity(store)
    header, rows = _csv(sweep_csv(store, sid))
    assert tuple(header) == sweep_csv_columns()
    assert [r["request_rate"] for r in rows] == ["2", "4", "8", "6", "7"]  # the probed rates
    assert rows[-1]["status"] == "failed" and rows[-1]["output_throughput_tok_s"] == ""
    with pytest.raises(MoEBenchError, match="no sweep 99"):
        sweep_csv(store, 99)


# --- in a real browser --------------------------------------------------------------------------------


@pytest.mark.slow
def test_html_report_renders_in_chromium(curve: tuple[Store, int], tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    from playwright.sync_api import sync_playwright

    store, sid = curve
    path = tmp_path / "report.html"
    path.write_bytes(html_report(store, f"sweep:{sid}"))
    errors: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(path.as_uri())
            page.wait_for_function(
                "document.querySelectorAll('.js-plotly-plot svg.main-svg').length > 0 && "
                "[...document.querySelectorAll('.js-plotly-plot')].every(d => d.querySelector('svg.main-svg'))",
                timeout=30_000,
            )
            rendered = page.evaluate(
                "[...document.querySelectorAll('.js-plotly-plot')].filter(d => d.querySelector('svg.main-svg')).length"
            )
            markers = page.evaluate("document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length")
            title = page.title()
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert rendered == 4
    assert markers >= 5 * 2  # at least the p50 and p99 markers of the five points
    assert title == f"Sweep {sid}: curve {EVIL}"  # the escaped name reads back as the text itself


def test_a_disturbed_point_is_flagged_in_the_table_the_figure_and_the_report(store: Store) -> None:
    """A point measured while the host was busy (c=4: 71.5 tok/s against 146-158 from the CLI) was
    flagged nowhere: its table row says why, the chart rings it, the HTML report shows the column."""
    import dataclasses

    sid = _sweep(store, concurrency=[1, 2, 4])
    ids = {c: _run(store, sid, {"concurrency": c, "repeat": 0}, tput=50.0 * c, ttft=10.0 * c) for c in (1, 2, 4)}
    run = store.get_run(ids[4])
    assert run is not None and run.summary is not None
    busy = dataclasses.replace(run.summary, disturbance="other processes used 1.4 cores (pytest 1.2)")
    store.finish_run(ids[4], "completed", summary=busy)
    points = _points(store, sid)
    rows = {r["concurrency"]: r for r in sweep_table(points)}
    assert rows[4]["disturbed"] == f"run {ids[4]}: other processes used 1.4 cores (pytest 1.2)"
    assert rows[1]["disturbed"] == rows[2]["disturbed"] == ""
    ring = _trace(latency_throughput_figure(points, None, "ttft_ms"), "disturbed")
    assert list(ring.x) == pytest.approx([200.0]) and "pytest 1.2" in ring.customdata[0]
    page = html_report(store, f"sweep:{sid}").decode()
    assert "disturbed (why)" in page and "other processes used 1.4 cores" in page


def test_html_report_of_a_run_carries_its_moe_routing(store: Store) -> None:
    """A run with a routing record (the H200 example): the MoE section with the per-run figures and
    the EP-rank chart; a run without one has no such section."""
    from bench.bundle import import_bundle_file
    from bench.metrics import moe
    from bench.report.html import html_report

    root = Path(__file__).resolve().parents[2]
    with_routing = import_bundle_file(store, root / "examples" / "h200-latency-bs1.json")
    without = import_bundle_file(store, root / "examples" / "h100-fast-latency-bs1.json")
    page = html_report(store, str(with_routing)).decode()
    what = moe.eplb_whatif(store.artifact(with_routing, "expert_routing"), 8, 8)
    assert "<h2>MoE routing</h2>" in page or ">MoE routing<" in page
    assert f"{what.eplb_balancedness:.3g}"[:4] in page and "EP 8: tokens per rank" in page
    assert "MoE routing" not in html_report(store, str(without)).decode()

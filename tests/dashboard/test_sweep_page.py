"""The Sweep page (and the sweep parts of Results) through AppTest, over real stored sweeps.

The stored sweeps are real: :class:`bench.sweep.task.SweepTask` against the stub OpenAI server
(which slows with load, so TTFT crosses the SLO at a known concurrency), in a data folder of
this module. One test drives the page itself on the real tiny model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from bench.sweep.spec import CapacitySpec, SweepSpec, sweep_points
from bench.sweep.task import SweepTask
from dashboard.data import fmt_unit
from engines.settings import get_settings
from tests.dashboard.synthetic import add_synthetic_run
from tests.dashboard.test_pages import _frame, _no_exception, _poll, _texts

SWEEP_PAGE = "app_pages/sweep.py"
RESULTS_PAGE = "app_pages/results.py"
SLO = "ttft_ms:p99<=50"  # the stub adds 20 ms of TTFT per other stream: passes up to c=3, fails from c=4


@pytest.fixture(scope="module")
def sweep_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A data folder holding one finished concurrency sweep, one capacity search and a plain run."""
    from bench.stub_server import start_stub_server

    folder = tmp_path_factory.mktemp("sweep-data")
    store = Store(folder / "moebench.sqlite")
    url, proc = start_stub_server(itl_ms=1.0, load_ms=20.0)
    try:
        base = {
            "engine": {"kind": "openai", "base_url": url},
            "workload": {"source": "builtin", "output_len": 4},
            "requests": 8,
            "server_metrics": False,
            "slos": [SLO],
        }
        sweep = SweepTask(SweepSpec.build(base=base, concurrency=[1, 2, 3, 4, 6], name="c-sweep"), store).begin()
        snap = sweep.wait(300)
        assert snap.status == "completed", snap.error
        cap = SweepTask(
            CapacitySpec.build(base=base, axis="concurrency", start=1, maximum=16, budget=6, name="cap"), store
        ).begin()
        cap_snap = cap.wait(300)
        assert cap_snap.status == "completed", cap_snap.error
    finally:
        proc.stop()
    plain = add_synthetic_run(store, 8, name="not in a sweep")
    points = sweep_points(store, snap.sweep_id)  # type: ignore[arg-type]
    info = {
        "folder": folder,
        "sweep_id": snap.sweep_id,
        "capacity_id": cap_snap.sweep_id,
        "sweep_runs": sorted(r.id for p in points for r in p.runs),
        "capacity_runs": sorted(r.id for r in store.sweep_runs(cap_snap.sweep_id)),  # type: ignore[arg-type]
        "plain_run": plain,
        "capacity_result": cap_snap.result,
    }
    store.close()
    yield info


@pytest.fixture
def use_sweep_data(sweep_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Point the app at the module's data folder for this test."""
    monkeypatch.setenv("MOEBENCH_DATA_DIR", str(sweep_data["folder"]))
    return sweep_data


def _downloads(at: Any) -> list[str]:
    return [e.proto.label for e in at.get("download_button")]


def _charts(at: Any) -> list[dict[str, Any]]:
    """The plotly figures on the page, as their JSON specs."""
    import json

    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _chart_titles(at: Any) -> list[str]:
    out = []
    for spec in _charts(at):
        title = spec.get("layout", {}).get("title", {})
        out.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return out


def test_sweep_page_without_an_engine_says_so(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test(SWEEP_PAGE)
    _no_exception(at)
    assert at.title[0].value == "Sweep"
    assert at.button(key="w.btn.start").disabled
    text = _texts(at)
    assert "Load a model on the Engine & Model page first." in text
    assert "No sweep yet" in text
    assert not at.error  # the default form is valid: nothing to complain about
    # The plan of the default sweep is computed without an engine too.
    at.text_input(key="w.values.concurrency").set_value("1,2,4").run()
    assert not at.error


def test_a_bad_value_list_is_a_one_line_error(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test(SWEEP_PAGE)
    at.text_input(key="w.values.concurrency").set_value("1,2,x").run()
    _no_exception(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert msg.startswith("Concurrency values: numbers above 0") and "'1,2,x'" in msg and "\n" not in msg
    assert at.button(key="w.btn.start").disabled

    at.text_input(key="w.values.concurrency").set_value("0,4").run()
    assert len(at.error) == 1 and "above 0" in at.error[0].value

    at.radio(key="w.type").set_value("lengths").run()
    at.text_input(key="w.values.lengths").set_value("128-64").run()
    assert len(at.error) == 1 and at.error[0].value.startswith("Input:output lengths: token pairs like")

    at.radio(key="w.type").set_value("rate").run()
    at.text_input(key="w.values.rate").set_value("0.5..8").run()
    _no_exception(at)
    assert not at.error
    assert "5 points × 1 repeat = 5 runs of 32 requests each" in _texts(at)  # 0.5, 1, 2, 4, 8

    at.radio(key="w.type").set_value("capacity").run()
    at.selectbox(key="w.slo_preset").set_value("none").run()
    assert len(at.error) == 1 and "needs at least one SLO" in at.error[0].value
    at.text_area(key="w.slo_text").set_value("ttft:p99<=fast").run()
    assert len(at.error) == 1 and "is not METRIC:STAT<=LIMIT" in at.error[0].value


def test_a_stored_sweep_shows_charts_table_recommendations_and_downloads(
    app_test: Callable[..., Any], use_sweep_data: dict[str, Any]
) -> None:
    at = app_test(SWEEP_PAGE)
    _no_exception(at)
    at.selectbox(key="w.view").set_value(use_sweep_data["sweep_id"]).run()
    _no_exception(at)
    text = _texts(at)
    assert f"Sweep #{use_sweep_data['sweep_id']} · c\\-sweep · completed" in text  # the name as text (data.plain)
    assert "SLOs: TTFT p99 ≤ 50 ms" in text

    # The table: one row per point, with the SLO verdict and its runs.
    table = _frame(at, "concurrency")
    assert list(table["concurrency"]) == [1, 2, 3, 4, 6]
    assert list(table["SLOs met"]) == ["yes", "yes", "yes", "no", "no"]  # TTFT p99 crosses 50 ms at c=4
    assert table["output (tok/s)"].notna().all() and table["goodput (req/s)"].notna().all()
    assert "output min (tok/s)" not in table.columns  # one repeat per point: no spread columns
    assert sorted(int(r.strip("#")) for cell in table["runs"] for r in cell.split(", ")) == use_sweep_data["sweep_runs"]

    # Recommendations: the best point is the highest throughput among those that met the SLO (read
    # off the table), the lowest latency the lowest TTFT p50.
    assert "Recommendations" in text and ":gray-badge[TTFT p99 ≤ 50 ms]" in text
    met = table[table["SLOs met"] == "yes"]
    best = int(met.loc[met["output (tok/s)"].idxmax(), "concurrency"])
    fastest = int(table.loc[table["TTFT p50 (ms)"].idxmin(), "concurrency"])
    badges = [m.value for m in at.markdown if m.value.startswith(":blue-badge[")]
    assert badges[:2] == [f":blue-badge[concurrency={best}]", f":blue-badge[concurrency={fastest}]"]
    assert "Best throughput within the SLOs" in text and "Lowest latency" in text and "Knee" in text

    # The charts: TTFT and TPOT against throughput (with the SLO line), per accelerator vs per user, goodput.
    titles = _chart_titles(at)
    prefixes = ["TTFT vs output throughput", "TPOT vs", "Output tok/s per accelerator vs tok/s per user",
                "Throughput and goodput vs concurrency"]  # fmt: skip
    assert len(titles) == 4 and all(t.startswith(p) for t, p in zip(titles, prefixes, strict=True)), titles
    # A stub server reached by URL records no deployment: its runs are left out of that chart, with a note.
    assert "accelerators not recorded (a server reached by URL), left out" in text
    ttft = _charts(at)[0]
    assert any(s.get("y0") == 50 and s.get("y1") == 50 for s in ttft["layout"].get("shapes", []))  # SLO line
    p99 = next(t for t in ttft["data"] if t.get("name") == "TTFT p99")
    assert len(p99["x"]) == 5 and all(x > 0 for x in p99["x"])

    assert _downloads(at) == ["Sweep CSV", "HTML report"]


def test_a_capacity_search_shows_its_card_and_figure(
    app_test: Callable[..., Any], use_sweep_data: dict[str, Any]
) -> None:
    at = app_test(SWEEP_PAGE)
    at.selectbox(key="w.view").set_value(use_sweep_data["capacity_id"]).run()
    _no_exception(at)
    res = use_sweep_data["capacity_result"]
    text = _texts(at)
    assert f"Capacity search #{use_sweep_data['capacity_id']} · cap · completed" in text
    verdict = res["verdict"]
    assert "passes at concurrency" in verdict and f"**{verdict[0].upper()}{verdict[1:]}**" in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Passes at"] == str(int(res["passes_at"]))
    assert metrics["Fails at"] == str(int(res["fails_at"]))
    assert metrics["Runs used"] == f"{res['runs']} of 6"
    assert res["fails_at"] - res["passes_at"] == 1 and "one step (1) wide" in text
    (title,) = _chart_titles(at)
    assert title.startswith("Capacity search: probes against the SLOs: passes at")
    probes = _frame(at, "probe")
    assert list(probes["probe"]) == list(range(1, res["runs"] + 1))
    assert list(probes["passed"]) == ["yes" if p["passed"] else "no" for p in res["probes"]]
    assert _downloads(at) == ["Sweep CSV", "HTML report"]


def test_results_page_filters_runs_by_sweep(app_test: Callable[..., Any], use_sweep_data: dict[str, Any]) -> None:
    at = app_test(RESULTS_PAGE)
    _no_exception(at)
    everything = set(_frame(at, "run_id")["run_id"])
    sweep_runs, cap_runs = set(use_sweep_data["sweep_runs"]), set(use_sweep_data["capacity_runs"])
    assert everything == sweep_runs | cap_runs | {use_sweep_data["plain_run"]}
    table = _frame(at, "run_id")
    by_run = dict(zip(table["run_id"], table["sweep"], strict=True))
    assert by_run[min(sweep_runs)] == f"sweep #{use_sweep_data['sweep_id']} · c-sweep"
    assert by_run[min(cap_runs)] == f"capacity #{use_sweep_data['capacity_id']} · cap"
    assert by_run[use_sweep_data["plain_run"]] == ""

    sweep_box = at.selectbox(key="r.sweep")
    assert sweep_box.options[:2] == ["all runs", "runs outside any sweep"]
    sweep_box.set_value(use_sweep_data["sweep_id"]).run()
    _no_exception(at)
    assert set(_frame(at, "run_id")["run_id"]) == sweep_runs
    at.selectbox(key="r.sweep").set_value("none").run()
    assert set(_frame(at, "run_id")["run_id"]) == {use_sweep_data["plain_run"]}
    at.selectbox(key="r.sweep").set_value(use_sweep_data["capacity_id"]).run()
    assert set(_frame(at, "run_id")["run_id"]) == cap_runs
    at.selectbox(key="r.sweep").set_value("all").run()
    assert set(_frame(at, "run_id")["run_id"]) == everything

    # From the Sweep page, "Its runs" opens Results filtered to the sweep.
    at.switch_page(SWEEP_PAGE).run()
    at.selectbox(key="w.view").set_value(use_sweep_data["sweep_id"]).run()
    at.button(key="w.btn.results").click().run()
    _no_exception(at)
    assert at.title[0].value == "Results"
    assert set(_frame(at, "run_id")["run_id"]) == sweep_runs


def _judge(store: Store, run_id: int, slos: list[str], seed: int) -> Any:
    """Re-summarize a synthetic run with ``slos`` (as a run with SLOs is summarized)."""
    from bench.metrics.summary import summarize
    from tests.dashboard.synthetic import synthetic_records

    summary = summarize(synthetic_records(40, seed=seed), peak_memory_gib=0.5, max_concurrency=4, slos=slos)
    store.finish_run(run_id, "completed", summary=summary)
    return summary


def test_compare_page_shows_goodput_only_where_runs_have_slos(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    slos = ["ttft_ms:p99<=25"]  # the synthetic TTFTs are 10-30 ms: some requests are good, some not
    native = add_synthetic_run(store, 40, name="native, SLOs")
    vllm = add_synthetic_run(store, 40, engine="vllm", seed=1, name="vllm, SLOs")
    plain_vllm = add_synthetic_run(store, 40, engine="vllm", seed=2, name="vllm, no SLOs")
    plain_native = add_synthetic_run(store, 40, seed=3, name="native, no SLOs")
    cuda = add_synthetic_run(store, 40, accelerator="cuda", device="NVIDIA H100", seed=5)
    _judge(store, cuda, slos, 5)
    s_native, s_vllm = _judge(store, native, slos, 0), _judge(store, vllm, slos, 1)
    assert 0 < s_native.goodput_rps < s_native.request_throughput_rps
    at = app_test("app_pages/compare.py")
    at.selectbox(key="c.native").set_value(native).run()
    at.selectbox(key="c.vllm").set_value(vllm).run()
    _no_exception(at)
    measured = _frame(at, "native (measured)")
    assert list(measured["metric"])[3] == "Goodput (requests within the SLOs)"
    row = measured.iloc[3]
    assert row["native (measured)"] == f"{fmt_unit(s_native.goodput_rps, 'req/s')} (ttft_ms:p99<=25)"
    assert row["vLLM (measured)"] == f"{fmt_unit(s_vllm.goodput_rps, 'req/s')} (ttft_ms:p99<=25)"
    gain = s_vllm.goodput_rps / s_native.goodput_rps
    assert row["gain (measured)"] == f"{gain:.2f}x"
    assert len(_frame(at, "native (book)")) == 3  # the book has no goodput: its table is unchanged
    # The accelerator table: goodput beside the throughput, for the CUDA run that has SLOs.
    at.selectbox(key="c.acc.cuda").set_value(cuda).run()
    acc = _frame(at, "measured run")
    assert list(acc.columns[2:4]) == ["throughput", "goodput"]
    assert acc["goodput"].iloc[0].endswith("req/s (ttft_ms:p99<=25)") and set(acc["goodput"].iloc[1:]) == {"-"}

    # A vLLM run without SLOs: its cell says so and no gain is made up.
    at.selectbox(key="c.vllm").set_value(plain_vllm).run()
    row = _frame(at, "native (measured)").iloc[3]
    assert row["vLLM (measured)"] == "no SLOs set" and row["gain (measured)"] == "-"
    # No picked run with SLOs: no goodput row.
    at.selectbox(key="c.native").set_value(plain_native).run()
    measured = _frame(at, "native (measured)")
    assert len(measured) == 3 and "Goodput (requests within the SLOs)" not in list(measured["metric"])
    store.close()


def test_a_sweep_started_on_the_page_runs_live_and_blocks_other_runs(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.selectbox(key="e.accelerator").set_value("cpu").run()
        at.button(key="e.btn.load").click().run()
        _poll(at, lambda a: ":green-badge[:material/check: ready]" in _texts(a), what="the engine to load")
    at.switch_page(SWEEP_PAGE).run()
    _no_exception(at)
    at.text_input(key="w.values.concurrency").set_value("1,2").run()
    at.number_input(key="w.requests").set_value(40).run()
    at.number_input(key="w.input_len").set_value(16).run()
    at.number_input(key="w.output_len").set_value(16).run()
    at.text_input(key="w.name").set_value("page sweep").run()
    assert "2 points × 1 repeat = 2 runs of 40 requests each" in _texts(at)
    before = {s.id for s in session_store.list_sweeps()}
    at.button(key="w.btn.start").click().run()
    _no_exception(at)
    holder = services.get_sweep_holder()
    snap = holder.snapshot()
    assert snap is not None and snap.sweep_id not in before

    # While it runs (two runs of 40 requests take seconds on the CPU): the live panel with its Stop
    # button, the sweep in the sidebar, and the other pages refuse to start a run, with the reason.
    at.run()
    assert holder.active(), holder.snapshot()
    assert at.button(key="w.btn.stop") is not None and at.button(key="w.btn.start").disabled
    other = app_test("app_pages/concurrency.py")
    assert other.button(key="concurrency.btn.start").disabled
    assert "A sweep is in progress" in _texts(other)
    assert any(f"**Sweep** #{snap.sweep_id}" in m.value for m in other.sidebar.markdown)
    other.switch_page("app_pages/engine.py").run()
    assert other.button(key="e.btn.unload").disabled  # the sweep's engine stays loaded

    deadline = time.monotonic() + 180
    while holder.active() and time.monotonic() < deadline:
        time.sleep(0.3)
    final = holder.snapshot()
    assert final is not None and final.status == "completed", final
    _poll(at, lambda a: f"Sweep #{final.sweep_id} · page sweep · completed" in _texts(a), what="the sweep to end")
    runs = session_store.sweep_runs(final.sweep_id)  # type: ignore[arg-type]
    assert [r.sweep_point for r in runs] == [{"concurrency": 1, "repeat": 0}, {"concurrency": 2, "repeat": 0}]
    assert all(r.status == "completed" and r.summary and r.summary.completed == 40 for r in runs)
    assert all(r.summary and r.summary.slos for r in runs)  # the default SLO preset reached the runs
    table = _frame(at, "concurrency")
    assert list(table["concurrency"]) == [1, 2]
    assert len(_charts(at)) == 4
    # The runs were handed to the job manager: the sidebar and run pages saw them as runs in progress.
    latest = services.get_job_manager().latest("concurrency")
    assert latest is not None and latest.run_id == runs[-1].id

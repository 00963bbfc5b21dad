"""The serving chart (output tok/s per accelerator against tok/s per user), its $ and J per million output
tokens and the sweep CSV's serving columns, recomputed by hand from stored data: the two H100 example
sweeps (vLLM and native, imported as a user imports them) and a CPU sweep made here on the real tiny model.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.serving import (
    FROM_TPOT,
    best_at_target,
    name_curves,
    serving_curve,
    serving_rows,
    sweep_curve,
    target_caption,
)
from bench.bundle import import_file
from bench.metrics.cost import DEFAULT_PRICES, card_of, parse_prices, price_table
from bench.report.csv_export import SWEEP_CSV_SERVING_COLUMNS, sweep_csv, sweep_csv_columns
from bench.report.figures import serving_pareto_figure
from bench.report.html import html_report
from bench.store import Store
from bench.sweep.spec import SweepSpec, sweep_points
from bench.sweep.task import SweepTask
from engines.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VLLM, NATIVE = "h100-vllm-sweep.sweep.json", "h100-fast-sweep.sweep.json"
NO_PRICES_ENV = ""  # the tests read the defaults, whatever the environment sets


def _by_hand(name: str) -> dict[int, dict[str, Any]]:
    """Each run of an example bundle, from the file's own JSON (not through the product's readers):
    concurrency -> tok/s per user (1000 / TPOT p50: these runs predate interactivity_tok_s), accelerators
    (TP x PP x DP of the recorded vLLM deployment; the native engine without expert parallelism: 1), output
    tok/s per accelerator, $/M at $2 per H100-hour and J/M."""
    bundle = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    out = {}
    for entry in bundle["runs"]:
        run = entry["run"]
        summary = json.loads(run["summary_json"])
        engine = json.loads(run["engine_json"])
        dep = engine.get("deployment")
        acc = dep["tensor_parallel_size"] * dep["pipeline_parallel_size"] * dep["data_parallel_size"] if dep else 1
        tput = summary["output_throughput_tok_s"]
        jpt = summary.get("joules_per_output_token")
        assert summary.get("interactivity_tok_s") is None  # stored before it existed: derived from TPOT
        out[json.loads(run["sweep_point"])["concurrency"]] = {
            "x": 1000.0 / summary["tpot_ms"]["p50"],
            "acc": acc,
            "y": tput / acc,
            "usd": 2.00 * acc / (tput * 3600.0) * 1e6,
            "jm": None if jpt is None else jpt * 1e6,
        }
    return out


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    from bench.stub_server import start_stub_server

    url, proc = start_stub_server(itl_ms=1.0)
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def h100(tmp_path: Path) -> tuple[Store, int, int]:
    store = Store(tmp_path / "moebench.sqlite")
    _, vllm = import_file(store, EXAMPLES / VLLM)
    _, native = import_file(store, EXAMPLES / NATIVE)
    return store, vllm, native


def test_prices_are_declared_once_with_their_source_and_overridable() -> None:
    assert set(DEFAULT_PRICES) == {"h100", "h200", "ascend-910b", "mlu590", "cpu"}
    assert all(p.source and p.assumption and p.usd_per_hour > 0 for p in DEFAULT_PRICES.values())
    assert "arXiv:2412.19437" in DEFAULT_PRICES["h100"].source
    table = price_table({"h200": 3.5, "cuda": 1.0}, settings_text="h100=2.5")
    assert table["h100"].usd_per_hour == 2.5 and "MOEBENCH_ACCELERATOR_PRICES" in table["h100"].source
    assert table["h200"].usd_per_hour == 3.5 and table["h200"].source.startswith("set by the user")
    assert table["cuda"].usd_per_hour == 1.0 and table["mlu590"] == DEFAULT_PRICES["mlu590"]
    with pytest.raises(ConfigError, match="CARD=DOLLARS_PER_HOUR"):
        parse_prices("h100=two")
    assert card_of("cuda", {"device": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert card_of("npu", {"device": "Ascend910B3"}) == "ascend-910b"
    assert card_of("cuda", {"device": "cuda"}) == "cuda"  # an unnamed device: no default price
    assert card_of("cpu", {}) == "cpu"


def test_each_plotted_figure_of_the_h100_sweeps_is_recomputed_by_hand(h100: tuple[Store, int, int]) -> None:
    store, vllm_id, native_id = h100
    prices = price_table(settings_text=NO_PRICES_ENV)
    curves = [sweep_curve(store.get_sweep(i), sweep_points(store, i)) for i in (vllm_id, native_id)]  # type: ignore[arg-type]
    names = name_curves(curves, {k: v.name for k, v in prices.items()})
    assert names == [f"#{vllm_id} h100-vllm-sweep · vllm · H100", f"#{native_id} h100-fast-sweep · native · H100"]
    fig = serving_pareto_figure(curves, 20.0, prices, names)
    for curve, name, bundle in zip(curves, names, (VLLM, NATIVE), strict=True):
        hand = _by_hand(bundle)
        assert curve.card == "h100" and not curve.notes and curve.derived
        got = {p.point["concurrency"]: p for p in curve.points}
        assert sorted(got) == sorted(hand) == [1, 8, 32, 128]
        for c, h in hand.items():
            p = got[c]
            assert p.per_user_from == FROM_TPOT and p.accelerators == h["acc"] == 1
            assert p.per_user_tok_s == pytest.approx(h["x"]) and p.per_accelerator_tok_s == pytest.approx(h["y"])
            assert p.usd_per_million(prices) == pytest.approx(h["usd"])
            assert p.joules_per_million == (None if h["jm"] is None else pytest.approx(h["jm"]))
        # Every point plotted where the hand put it; the front (each point here: more users, less each) joined.
        (every,) = [t for t in fig.data if t.name == name and t.showlegend is False]
        (front,) = [t for t in fig.data if t.name == name and t.mode == "lines+markers+text"]
        plotted = sorted(zip(every.x, every.y, strict=True))
        assert [v for xy in plotted for v in xy] == pytest.approx(
            [v for xy in sorted((h["x"], h["y"]) for h in hand.values()) for v in xy]
        )
        assert list(front.x) == pytest.approx(sorted(h["x"] for h in hand.values()))
        assert list(front.text) == ["c=128", "c=32", "c=8", "c=1"]
        # The knee of throughput vs concurrency (Kneedle), by hand: scaled load (c-1)/127, scaled throughput
        # (t-t1)/(t128-t1); the largest y-x above 0.1.
        t = {c: h["y"] for c, h in hand.items()}
        bend = {c: (t[c] - t[1]) / (t[128] - t[1]) - (c - 1) / 127 for c in t}
        assert curve.knee is not None and curve.knee.point["concurrency"] == max(bend, key=bend.__getitem__) == 32
        # The best at >= 20 tok/s per user: every point serves more than 20, so the most per accelerator.
        best = best_at_target(curve, 20.0)
        assert best is not None and best.per_accelerator_tok_s == pytest.approx(max(t.values()))
        hover = next(h for h in front.customdata if h.startswith("c=128"))
        assert f"${hand[128]['usd']:.3g} per M output tokens at $2.00/accelerator-hour (assumption)" in hover
        assert "1000 / TPOT p50 (derived)" in hover
    vllm_hand, native_hand = _by_hand(VLLM), _by_hand(NATIVE)
    assert vllm_hand[128]["jm"] is not None and native_hand[128]["jm"] is None  # only the vLLM sweep read power
    caption = target_caption(curves, names, 20.0, prices)
    assert f"{vllm_hand[128]['y']:,.0f} output tok/s per accelerator at c=128" in caption
    assert f"{native_hand[128]['y']:,.0f} output tok/s per accelerator at c=128" in caption
    assert "assumption" in caption and "$2.00 per H100-hour" in caption
    stars = [t for t in fig.data if t.legendgroup == "best"]
    assert [s.y[0] for s in stars] == pytest.approx([vllm_hand[128]["y"], native_hand[128]["y"]])
    assert [s.name for s in fig.layout.shapes] == [None] and fig.layout.shapes[0].x0 == 20.0  # the target line
    assert "1000 / TPOT p50" in fig.layout.xaxis.title.text and "tok/s per user" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.title.text == "output tok/s per accelerator (tok/s)"
    rows = serving_rows(curves, names, prices)
    assert len(rows) == 8 and all(r["on_front"] for r in rows) and sum(r["knee"] for r in rows) == 2
    # A higher target than a sweep reaches: the caption says how far it got.
    native_top = max(h["x"] for h in native_hand.values())
    high = target_caption(curves, names, 250.0, prices)
    assert f"no point reaches 250 tok/s per user (at most {native_top:.0f} tok/s per user)" in high


def test_the_html_report_overlays_a_second_sweep(h100: tuple[Store, int, int]) -> None:
    store, vllm_id, native_id = h100
    page = html_report(store, f"sweep:{vllm_id}", overlay=[native_id], target_tok_s_per_user=50.0).decode()
    assert "Throughput per accelerator vs interactivity" in page
    assert "Best throughput at ≥ 50 tok/s per user" in page
    assert "h100-fast-sweep · native · H100" in page and "h100-vllm-sweep · vllm · H100" in page
    assert "$ per M output tokens" in page and "J per M output tokens" in page


def test_the_sweep_csv_has_the_serving_columns_checked_by_hand(h100: tuple[Store, int, int]) -> None:
    store, vllm_id, _ = h100
    prices = price_table({"h100": 3.0}, settings_text=NO_PRICES_ENV)
    data = sweep_csv(store, vllm_id, prices)
    reader = csv.DictReader(io.StringIO(data.decode("utf-8")))
    assert tuple(reader.fieldnames or ()) == sweep_csv_columns()
    assert sweep_csv_columns()[-len(SWEEP_CSV_SERVING_COLUMNS) :] == SWEEP_CSV_SERVING_COLUMNS
    rows = {int(r["concurrency"]): r for r in reader}
    hand = _by_hand(VLLM)
    for c, h in hand.items():
        r = rows[c]
        assert r["accelerators"] == "1" and r["card"] == "h100" and r["price_usd_per_accelerator_hour"] == "3"
        assert float(r["output_tok_s_per_accelerator"]) == pytest.approx(h["y"], rel=1e-4)
        assert float(r["tok_s_per_user_p50"]) == pytest.approx(h["x"], rel=1e-4)
        assert r["tok_s_per_user_from"] == "1000 / tpot_ms_p50"
        assert float(r["usd_per_million_output_tokens"]) == pytest.approx(h["usd"] * 3.0 / 2.0, abs=5e-5)  # 4 decimals
        assert float(r["joules_per_million_output_tokens"]) == pytest.approx(h["jm"], rel=1e-4)
    # c=128 by hand from the bundle's figures: 11070.1 tok/s on one H100 at $3/h -> $0.0753 per M
    assert float(rows[128]["usd_per_million_output_tokens"]) == pytest.approx(3.0 / (11070.1 * 3600) * 1e6, abs=5e-5)


def test_a_cpu_sweep_of_the_real_tiny_model_beside_a_server_of_unknown_size(
    store: Store, native_engine: object, stub_url: str, h100: tuple[Store, int, int]
) -> None:
    """A CPU sweep counts the host as one accelerator; a stub server reached by URL records no deployment,
    so its runs are left out with a note, never guessed."""
    base = {
        "engine": {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"},
        "workload": {"source": "random", "input_len": 16, "output_len": 8},
        "requests": 4,
        "server_metrics": False,
    }
    snap = SweepTask(SweepSpec.build(base=base, concurrency=[1, 2], name="cpu"), store, engine=native_engine).begin()
    done = snap.wait(300)
    assert done.status == "completed", done.error
    cpu = sweep_curve(store.get_sweep(done.sweep_id), sweep_points(store, done.sweep_id))  # type: ignore[arg-type]
    assert cpu.card == "cpu" and len(cpu.points) == 2 and not cpu.notes
    for p in cpu.points:
        (run,) = [store.get_run(i) for i in p.run_ids]
        s = run.summary  # type: ignore[union-attr]
        assert p.accelerators == 1 and p.per_accelerator_tok_s == pytest.approx(s.output_throughput_tok_s)
        inter = s.interactivity_tok_s
        want = inter.p50 if inter is not None and inter.p50 is not None else 1000.0 / s.tpot_ms.p50
        assert p.per_user_tok_s == pytest.approx(want)
        assert p.usd_per_million(price_table(settings_text="")) == pytest.approx(
            DEFAULT_PRICES["cpu"].usd_per_hour / (s.output_throughput_tok_s * 3600) * 1e6
        )
    stub_base = {**base, "engine": {"kind": "openai", "base_url": stub_url}}
    stub = SweepTask(SweepSpec.build(base=stub_base, concurrency=[1], name="stub"), store).begin().wait(300)
    assert stub.status == "completed", stub.error
    left = serving_curve(sweep_points(store, stub.sweep_id), "stub")  # type: ignore[arg-type]
    assert not left.points and "accelerators not recorded" in left.notes[0] and "left out" in left.notes[0]
    # Overlaid on an H100 sweep: both drawn, the stub named only in the notes.
    h_store, vllm_id, _ = h100
    h = sweep_curve(h_store.get_sweep(vllm_id), sweep_points(h_store, vllm_id))  # type: ignore[arg-type]
    fig = serving_pareto_figure([h, cpu, left], 20.0, price_table(settings_text=""))
    assert len([t for t in fig.data if t.mode == "lines+markers+text"]) == 2


def test_the_serving_columns_are_documented_in_order() -> None:
    doc = (EXAMPLES.parent / "docs" / "reports.md").read_text(encoding="utf-8")
    section = doc.split("### Sweep CSV serving columns", 1)[1].split("\n#", 1)[0]
    names = [line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `")]
    assert tuple(names) == SWEEP_CSV_SERVING_COLUMNS

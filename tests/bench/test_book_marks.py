"""The book's platforms as reference marks (issue 48, item 1): ratios of a measured figure, labelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.analysis import book_marks as bm
from bench.analysis.reference import ACCELERATOR_TABLE, platform_of
from bench.bundle import import_bundle_file, read_bundle
from bench.report.figures import latency_throughput_figure, run_throughput_figure
from bench.report.html import html_report
from bench.store import Store
from bench.sweep.spec import sweep_points
from tests.dashboard.synthetic import add_synthetic_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _import(store: Store, name: str) -> int:
    path = EXAMPLES / name
    import_bundle_file(store, path, read_bundle(path))
    return max(r.id for r in store.list_runs())


def test_the_h100_example_run_puts_the_910b_and_the_mlu590_where_the_book_does(store: Store) -> None:
    run_id = _import(store, "h100-fast-concurrency-128.json")
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    assert run.engine_info["device"] == "NVIDIA H100 80GB HBM3" and bm.run_platform(run) == ACCELERATOR_TABLE[0]
    book = bm.book_marks(run)
    assert book.drawn and not book.reference and book.note is None and book.source_run_id == run.id
    s = run.summary
    tput = {m.platform.card: m for m in book.marks("output_throughput_tok_s")}
    assert set(tput) == {"910B", "MLU590"}  # the run's own card is measured, not marked
    # Hand-computed from the book's table (8.3.3): 70 / 60 % throughput, 120 / 150 % latency, 80 / 70 % memory.
    assert tput["910B"].value == pytest.approx(0.70 * s.output_throughput_tok_s)
    assert tput["MLU590"].value == pytest.approx(0.60 * s.output_throughput_tok_s)
    assert tput["910B"].label == "book: Ascend 910B (70 %)" and tput["MLU590"].label == "book: Cambricon MLU590 (60 %)"
    ttft = {m.platform.card: m.value for m in book.marks("ttft_ms_p50")}
    assert ttft == pytest.approx({"910B": 1.20 * s.ttft_ms.p50, "MLU590": 1.50 * s.ttft_ms.p50})
    tpot = {m.platform.card: m.value for m in book.marks("tpot_ms_p99")}
    assert tpot == pytest.approx({"910B": 1.20 * s.tpot_ms.p99, "MLU590": 1.50 * s.tpot_ms.p99})
    e2e = {m.platform.card: m for m in book.marks("e2e_ms_mean")}
    assert e2e["910B"].value == pytest.approx(1.20 * s.e2e_ms.mean) and e2e["910B"].label.endswith("(120 %)")
    assert s.peak_memory_gib is not None
    mem = {m.platform.card: m.value for m in book.marks("peak_memory_gib")}
    assert mem == pytest.approx({"910B": 0.80 * s.peak_memory_gib, "MLU590": 0.70 * s.peak_memory_gib})
    assert all(m.measured == s.output_throughput_tok_s for m in tput.values())  # a ratio of the measured figure
    # Drawn in legend group "book", never in a measured trace.
    fig = run_throughput_figure([(0.0, 100.0), (1.0, s.output_throughput_tok_s)], book)
    marks = [t for t in fig.data if t.legendgroup == bm.BOOK_GROUP]
    assert [t.name for t in marks] == ["book: Ascend 910B (70 %)", "book: Cambricon MLU590 (60 %)"]
    assert all(t.line.dash == "dashdot" for t in marks)
    assert list(marks[0].y) == pytest.approx([0.7 * s.output_throughput_tok_s] * 2)
    assert not any(t.legendgroup == bm.BOOK_GROUP for t in fig.data if t not in marks)


def test_a_cpu_run_without_a_reference_gets_the_note_and_no_marks(store: Store) -> None:
    run_id = add_synthetic_run(store, 10)
    run = store.get_run(run_id)
    assert run is not None and bm.run_platform(run) is None
    assert bm.default_reference(store.list_runs()) is None  # no H100 example imported
    book = bm.book_marks(run)
    assert not book.drawn and book.off_platform and book.marks("output_throughput_tok_s") == ()
    assert book.note is not None and "none of the book's platforms" in book.note and "\n" not in book.note
    assert book.caption == book.note
    fig = run_throughput_figure([(0.0, 1.0), (1.0, 2.0)], book)
    assert not any(t.legendgroup == bm.BOOK_GROUP for t in fig.data)
    page = html_report(store, str(run_id)).decode()
    assert "No book marks: this ran on x86_64" in page


def test_a_cpu_run_takes_its_marks_from_the_imported_h100_example(store: Store) -> None:
    cpu_id = add_synthetic_run(store, 10)
    ref_id = _import(store, "h100-fast-concurrency-128.json")
    reference = bm.default_reference(store.list_runs())
    assert reference is not None and reference.id == ref_id and reference.summary is not None
    cpu = store.get_run(cpu_id)
    assert cpu is not None
    book = bm.book_marks(cpu, reference)
    assert book.drawn and book.reference and book.source_run_id == ref_id
    tput = {m.platform.card: m for m in book.marks("output_throughput_tok_s")}
    r = reference.summary.output_throughput_tok_s
    assert tput["H100"].measured_mark and tput["H100"].value == pytest.approx(r)
    assert tput["H100"].label == f"reference: run #{ref_id} (NVIDIA H100, measured)"
    assert tput["910B"].value == pytest.approx(0.70 * r) and tput["MLU590"].value == pytest.approx(0.60 * r)
    page = html_report(store, str(cpu_id)).decode()
    assert "book: Ascend 910B (70 %)" in page and f"reference run #{ref_id}" in page


def test_a_910b_run_rebases_the_book_and_an_h200_is_no_h100() -> None:
    assert platform_of("cuda", "NVIDIA H200") is None and platform_of("cpu", "NVIDIA H100") is None
    assert platform_of("npu", "Ascend910B3").card == "910B" and platform_of("mlu", "MLU590-M9").card == "MLU590"
    base = platform_of("npu", "Ascend 910B")
    book = bm.BookMarks(1, base, 1, "Ascend 910B", False, (ACCELERATOR_TABLE[0], ACCELERATOR_TABLE[2]),
                        {"output_throughput_tok_s": 700.0, "ttft_ms_p50": 120.0})  # fmt: skip
    h100, mlu = book.marks("output_throughput_tok_s")
    assert h100.value == pytest.approx(1000.0) and mlu.value == pytest.approx(600.0)
    assert h100.label == "book: NVIDIA H100 (143 % of the 910B)"
    assert [m.value for m in book.marks("ttft_ms_p50")] == pytest.approx([100.0, 150.0])


def test_the_h100_example_sweep_draws_each_point_where_the_book_puts_the_others(store: Store) -> None:
    from bench.bundle import import_sweep

    path = EXAMPLES / "h100-fast-sweep.sweep.json"
    import_sweep(store, read_bundle(path))
    sweep = store.list_sweeps()[0]
    runs = store.sweep_runs(sweep.id)
    book = bm.sweep_marks(runs)
    assert book.drawn and [r.card for r in book.platforms] == ["910B", "MLU590"]
    points = sweep_points(store, sweep.id)
    fig = latency_throughput_figure(points, None, "ttft_ms", book=book)
    traces = [t for t in fig.data if t.legendgroup == bm.BOOK_GROUP]
    assert traces and all(t.line.dash == "dashdot" for t in traces)
    p99 = next(t for t in traces if t.name.startswith("book: Ascend 910B") and t.line.width == 1.5)
    measured = [(p.mean("output_throughput_tok_s"), p.mean("ttft_ms_p99")) for p in points]
    measured = [(x, y) for x, y in measured if x is not None and y is not None]
    assert list(p99.x) == pytest.approx([0.7 * x for x, _ in measured])
    assert list(p99.y) == pytest.approx([1.2 * y for _, y in measured])
    assert p99.name == "book: Ascend 910B (70 % throughput, 120 % latency)"

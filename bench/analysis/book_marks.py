"""The book's three platforms (chapter 8, section 8.3.3) as reference marks on a run's charts.

For a run on one of the book's cards (NVIDIA H100, Ascend 910B, Cambricon MLU590, told by the
device the run recorded), a mark puts each of the other two platforms where the book's ratios
place it relative to the run's measured figure: an H100 run at 1,000 output tok/s marks the
Ascend 910B at 700 tok/s (the book's 70 %) and its TTFT p50 of 100 ms at 120 ms (120 %). For a
run on any other accelerator (a CPU), the marks stand on a chosen reference run on one of the
three cards (by default the imported H100 example run :data:`DEFAULT_REFERENCE_NAME`), or, when
there is none, a one-line note says why nothing is drawn.

A mark is always a ratio of a measured figure, labelled as the book's ("book: Ascend 910B
(70 %)"); it is never shown as a measurement nor combined with measured points. The ratios
are :data:`bench.analysis.reference.ACCELERATOR_TABLE`'s, rebased to the run's platform by
:func:`bench.analysis.reference.book_accelerator_pct` (the Compare page's definitions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.analysis.reference import ACCELERATOR_TABLE, AcceleratorRow, book_accelerator_pct, platform_of
from bench.metrics.summary import RunSummary
from bench.store.rows import RunRow

BOOK_GROUP = "book"  # the legend group every mark is drawn in
DEFAULT_REFERENCE_NAME = "h100-fast-concurrency-128"  # examples/h100-fast-concurrency-128.json, once imported

# The measured figures a mark can scale (RunSummary.flat() keys), with their labels and units.
LATENCY_FIGURES: tuple[str, ...] = tuple(
    f"{m}_{s}" for m in ("ttft_ms", "tpot_ms", "e2e_ms") for s in ("mean", "p50", "p90", "p99")
)
MARKED_FIGURES: tuple[str, ...] = ("output_throughput_tok_s", *LATENCY_FIGURES, "peak_memory_gib")


def book_column(figure: str) -> str | None:
    """The book's column (:data:`bench.analysis.reference.ACCELERATOR_METRICS`) that scales a measured
    figure: ``throughput_pct`` for output tok/s, ``latency_pct`` for TTFT, TPOT and E2E statistics,
    ``memory_pct`` for peak memory; None for a figure the book has no column for."""
    if figure == "output_throughput_tok_s":
        return "throughput_pct"
    if figure in LATENCY_FIGURES:
        return "latency_pct"
    if figure == "peak_memory_gib":
        return "memory_pct"
    return None


def figure_text(figure: str) -> str:
    """``output tok/s``, ``TTFT p50``, ``E2E mean``, ``peak memory``."""
    if figure == "output_throughput_tok_s":
        return "output tok/s"
    if figure == "peak_memory_gib":
        return "peak memory"
    metric, _, stat = figure.rpartition("_")
    return f"{metric.removesuffix('_ms').upper()} {stat}"


def figure_unit(figure: str) -> str:
    return {"output_throughput_tok_s": "tok/s", "peak_memory_gib": "GiB"}.get(figure, "ms")


def summary_figures(summary: RunSummary | None) -> dict[str, float]:
    """The measured figures of :data:`MARKED_FIGURES` a summary has (none before a request completed)."""
    if summary is None or summary.completed == 0:
        return {}
    flat = summary.flat()
    out: dict[str, float] = {}
    for key in MARKED_FIGURES:
        v = flat.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[key] = float(v)
    return out


def run_platform(run: RunRow) -> AcceleratorRow | None:
    """The book's platform a run ran on (its accelerator kind and recorded device name)."""
    return platform_of(run.accelerator, run.engine_info.get("device"))


def device_text(run: RunRow) -> str:
    """The run's recorded device, else its accelerator kind."""
    return str(run.engine_info.get("device") or f"{run.accelerator} (device not recorded)")


@dataclass(frozen=True)
class Mark:
    """One platform's book mark for one figure: ``value`` = ``measured`` × ``pct`` / 100."""

    platform: AcceleratorRow
    figure: str
    pct: float  # the book's figure of ``platform`` as % of the base platform's
    measured: float  # the measured figure of :attr:`BookMarks.source_run_id`
    value: float
    label: str  # "book: Ascend 910B (70 %)"; a reference run's own figure: "reference: run #3 (NVIDIA H100, measured)"
    measured_mark: bool = False  # the reference run's own figure (measured, 100 %), not a book ratio

    @property
    def hover(self) -> str:
        """What the mark is, in one line: the ratio, the measured figure and the result."""
        unit = figure_unit(self.figure)
        what = figure_text(self.figure)
        if self.measured_mark:
            return f"{self.label}: {what} {self.measured:,.4g} {unit}"
        ratio = f"{self.pct:.0f} % × measured {what} {self.measured:,.4g} {unit}"
        return f"{self.label}: {ratio} = {self.value:,.4g} {unit}"


@dataclass(frozen=True)
class BookMarks:
    """The book's platforms set against one run: where the marks stand and what they scale.

    ``base`` is the platform whose measured figures the marks scale: the run's own card, or a
    reference run's (``reference`` True). ``figures`` are that run's measured figures;
    ``note`` says in one line why nothing is drawn (then ``platforms`` is empty)."""

    run_id: int | None
    base: AcceleratorRow | None = None
    source_run_id: int | None = None  # the run whose measured figures are scaled
    source_device: str = ""
    reference: bool = False  # the marks stand on a chosen reference run, not on the run itself
    platforms: tuple[AcceleratorRow, ...] = ()  # the platforms marked (the base too when reference)
    figures: Mapping[str, float] = field(default_factory=dict)
    note: str | None = None
    off_platform: bool = False  # the run (or sweep) ran on none of the book's platforms: a reference run is needed

    @property
    def drawn(self) -> bool:
        return bool(self.platforms) and self.base is not None

    def pct(self, row: AcceleratorRow, figure: str) -> float | None:
        """The book's figure of ``row`` as % of the base platform's, for ``figure``'s column."""
        column = book_column(figure)
        if column is None or self.base is None:
            return None
        return book_accelerator_pct(row, self.base)[column]

    def scale(self, row: AcceleratorRow, figure: str, measured: float | None) -> float | None:
        """``measured`` (a figure of the base platform) where the book's ratios put ``row``."""
        pct = self.pct(row, figure)
        return None if pct is None or measured is None else measured * pct / 100.0

    def is_measured(self, row: AcceleratorRow) -> bool:
        """The reference run's own platform: its mark is the reference run's measured figure."""
        return self.reference and row == self.base

    def label(self, row: AcceleratorRow, *figures: str) -> str:
        """``book: Ascend 910B (70 %)``; over two figures of different columns ``book: Ascend 910B
        (70 % throughput, 120 % latency)``; rebased off the H100: ``book: NVIDIA H100 (143 % of the
        910B)``; the reference run's own: ``reference: run #3 (NVIDIA H100, measured)``."""
        if self.is_measured(row):
            return f"reference: run #{self.source_run_id} ({row.short}, measured)"
        columns = list(dict.fromkeys(c for f in figures if (c := book_column(f)) is not None))
        assert self.base is not None
        pcts = book_accelerator_pct(row, self.base)
        of = "" if self.base == ACCELERATOR_TABLE[0] else f" of the {self.base.card}"
        if len(columns) == 1:
            return f"book: {row.short} ({pcts[columns[0]]:.0f} %{of})"
        parts = ", ".join(f"{pcts[c]:.0f} % {c.removesuffix('_pct')}" for c in columns)
        return f"book: {row.short} ({parts}{of})"

    def marks(self, figure: str) -> tuple[Mark, ...]:
        """Each marked platform's mark for ``figure`` (none when the run did not measure it)."""
        measured = self.figures.get(figure)
        if not self.drawn or measured is None or book_column(figure) is None:
            return ()
        out = []
        for row in self.platforms:
            pct = self.pct(row, figure)
            assert pct is not None
            own = self.is_measured(row)
            out.append(
                Mark(row, figure, 100.0 if own else pct, measured, measured * (1.0 if own else pct / 100.0),
                     self.label(row, figure), own)
            )  # fmt: skip
        return tuple(out)

    @property
    def caption(self) -> str:
        """One line under a chart: what the marks stand on, or why there are none."""
        if not self.drawn:
            return self.note or "no book marks"
        assert self.base is not None
        names = ", ".join(r.short for r in self.platforms if not self.is_measured(r))
        where = (
            f"on reference run #{self.source_run_id} ({self.source_device}), a {self.base.short} run"
            if self.reference
            else f"on this run's measured figures ({self.source_device}: the {self.base.short})"
        )
        return (
            f"Book marks (dash-dot, legend group 'book'): {names} where the book's table (chapter 8, 8.3.3: "
            f"throughput 100/70/60 %, latency 100/120/150 %, memory 100/80/70 % for H100/910B/MLU590) puts "
            f"them, {where}. Ratios of measured figures, not measurements."
        )

    def rows(self, figures: Sequence[str] = MARKED_FIGURES) -> list[dict[str, Any]]:
        """One table row per mark: platform, figure, the book's %, the measured figure it scales and the mark."""
        out = []
        for figure in figures:
            for m in self.marks(figure):
                out.append(
                    {
                        "mark": m.label,
                        "figure": f"{figure_text(figure)} ({figure_unit(figure)})",
                        "book %": None if m.measured_mark else round(m.pct, 1),
                        f"measured (run #{self.source_run_id})": m.measured,
                        "mark value": m.value,
                    }
                )
        return out


def book_marks(
    run: RunRow,
    reference: RunRow | None = None,
    summary: RunSummary | None = None,
) -> BookMarks:
    """The book's marks for ``run``: on its own measured figures (``summary``, default the run's
    stored one; a live or replayed run passes its summary so far) when it ran on one of the book's
    three cards, else on ``reference``'s (a run on one of the three), else a note saying why none."""
    own = run_platform(run)
    if own is not None:
        figures = summary_figures(summary if summary is not None else run.summary)
        if not figures:
            return BookMarks(run.id, note="No book marks yet: no request of this run has completed.")
        others = tuple(r for r in ACCELERATOR_TABLE if r != own)
        return BookMarks(run.id, own, run.id, device_text(run), False, others, figures)
    return reference_marks(run.id, device_text(run), reference)


def reference_marks(run_id: int | None, device: str, reference: RunRow | None) -> BookMarks:
    """Marks for a run (or sweep) on no book platform (``device``): the three platforms on
    ``reference``'s measured figures, or a note saying why none are drawn."""
    cards = "/".join(r.card for r in ACCELERATOR_TABLE)
    if reference is None:
        return BookMarks(
            run_id,
            off_platform=True,
            note=f"No book marks: this ran on {device}, none of the book's platforms ({cards}), and no reference "
            f"run on one of them is chosen (import the H100 example run {DEFAULT_REFERENCE_NAME} or pick one).",
        )
    base = run_platform(reference)
    if base is None:
        return BookMarks(
            run_id,
            off_platform=True,
            note=f"No book marks: the reference run #{reference.id} ran on {device_text(reference)}, none of the "
            f"book's platforms ({cards}).",
        )
    figures = summary_figures(reference.summary)
    if not figures:
        return BookMarks(
            run_id, off_platform=True, note=f"No book marks: the reference run #{reference.id} measured nothing."
        )
    return BookMarks(run_id, base, reference.id, device_text(reference), True, ACCELERATOR_TABLE, figures, None, True)


def sweep_marks(runs: Sequence[RunRow], reference: RunRow | None = None) -> BookMarks:
    """Marks for a sweep's runs: the platform of its completed runs, whose points the figures scale
    one by one (``figures`` stays empty: each point carries its own), or ``reference``'s marks
    when the sweep ran on no book platform."""
    done = [r for r in runs if r.status == "completed" and r.summary is not None]
    if not done:
        return BookMarks(None, note="No book marks yet: no run of this sweep has completed.")
    platforms = {run_platform(r) for r in done}
    own = next(iter(platforms)) if len(platforms) == 1 else None
    if own is not None:
        return BookMarks(None, own, None, device_text(done[0]), False, tuple(r for r in ACCELERATOR_TABLE if r != own))
    if len(platforms) > 1:
        return BookMarks(None, note="No book marks: this sweep's runs ran on more than one kind of device.")
    return reference_marks(None, device_text(done[0]), reference)


def reference_candidates(runs: Sequence[RunRow]) -> list[RunRow]:
    """Completed runs on one of the book's cards, newest first (a reference run's picker);
    profile runs are left out (the profiler slows them down)."""
    ok = [
        r
        for r in runs
        if r.status == "completed" and r.summary is not None and r.mode != "profile" and run_platform(r) is not None
    ]
    return sorted(ok, key=lambda r: (r.created_at, r.id), reverse=True)


def default_reference(runs: Sequence[RunRow]) -> RunRow | None:
    """The imported H100 example run (:data:`DEFAULT_REFERENCE_NAME`), newest first; None when it is
    not in the store."""
    return next((r for r in reference_candidates(runs) if r.name == DEFAULT_REFERENCE_NAME), None)

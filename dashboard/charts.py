"""Pure chart builders: pandas DataFrame in, plotly Figure out (no Streamlit here).

One template (``moebench``) and one colour set give every chart the same look. Builders
never read the store themselves: callers pass a bounded window of per-request rows or
per-second series (see :mod:`dashboard.data`), and builders downsample what they draw
to at most ``MAX_POINTS`` points, so a 100k-request run draws as fast as a small one.
Every axis title carries its unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.analysis.book_marks import BookMarks
from bench.metrics.records import CANCELLED
from bench.report.figures import book_lines
from bench.report.style import COLORS, MODE_SYMBOLS, P50_COLOR, P99_COLOR, PRIMARY, engine_color, register_template

if TYPE_CHECKING:
    from bench.metrics.slo import Slo

BOOK_COLOR = "#94A3B8"  # slate: the book's figures
MEASURED_COLOR = PRIMARY  # this project's measurements
SLO_COLOR = "#B45309"  # amber: a service-level objective's limit
LIMIT_COLOR = "#047857"  # green: the hardware's limit (bench.metrics.run_limits)
MAX_POINTS = 2000  # the most markers a chart draws
TEMPLATE_NAME = "moebench"


def _register_template() -> None:
    register_template(
        TEMPLATE_NAME,
        margin={"l": 56, "r": 16, "t": 48, "b": 48},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1.0},
    )


_register_template()


def _figure(title: str, height: int = 320) -> go.Figure:
    # The template goes in with the layout: a bare go.Figure() would first deep-copy plotly's
    # default template (every trace type's defaults), then replace it (half of a live
    # redraw's build time at 100k requests: studies/dashboard_render.py).
    return go.Figure(layout={"template": TEMPLATE_NAME, "title": title, "height": height})


def empty_figure(title: str, message: str = "waiting for data", height: int = 320) -> go.Figure:
    """A blank chart that says why it is blank (no made-up points)."""
    fig = _figure(title, height)
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14, "color": "#6B7280"}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def downsample(df: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``max_points`` rows, evenly spaced, always keeping the last row."""
    n = len(df)
    if n <= max_points:
        return df
    step = -(-n // max_points)  # ceil
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx[-1] = n - 1
    return df.iloc[idx]


def _has(df: pd.DataFrame | None, *columns: str) -> bool:
    return (
        df is not None
        and not df.empty
        and all(c in df.columns for c in columns)
        and df[list(columns)].notna().any().all()
    )


def _slo_in_view(limit: float, lo: float, hi: float) -> bool:
    """Whether a limit lies close enough to the data (``lo``..``hi``) to draw it without
    squashing the data: within one data span (at least half of ``hi``) of it. A 2 s SLO on
    10 ms TTFTs would otherwise leave the requests in a sliver at one edge of the chart."""
    reach = max(hi - lo, 0.5 * abs(hi), 1e-9)
    return lo - reach <= limit <= hi + reach


def _off_chart_note(fig: go.Figure, slo: Slo, text: str, right: bool, row: int) -> None:
    """An SLO too far from the data to draw: its label at the chart's edge, pointing its way."""
    fig.add_annotation(
        text=text, name=f"slo:{slo.text}", showarrow=False, x=1.0 if right else 0.0, y=1.0,
        xref="paper", yref="paper", xanchor="right" if right else "left", yanchor="top", yshift=-18 * row,
        font={"color": SLO_COLOR, "size": 12}, bgcolor="rgba(255,255,255,0.85)",
    )  # fmt: skip


def _slo_vlines(fig: go.Figure, slos: Sequence[Slo], metric: str, lo: float, hi: float) -> None:
    """A dashed vertical line at each ``metric`` SLO's limit (a histogram of ``metric``), labelled
    along the line; an SLO far off the data (see :func:`_slo_in_view`) is a note at that edge."""
    mine = [s for s in slos if s.metric == metric]
    off = [s for s in mine if not _slo_in_view(float(s.limit_ms), lo, hi)]
    for row, slo in enumerate(off):
        right = float(slo.limit_ms) > hi
        _off_chart_note(fig, slo, f"{slo.label} (off the chart) →" if right else f"← {slo.label} (off the chart)",
                        right, row)  # fmt: skip
    for slo in (s for s in mine if s not in off):
        v = float(slo.limit_ms)
        fig.add_shape(
            type="line", name=f"slo:{slo.text}", x0=v, x1=v, y0=0, y1=1, xref="x", yref="paper",
            line={"color": SLO_COLOR, "width": 2, "dash": "dash"},
        )  # fmt: skip
        # Along the line, below the edge notes (which span the chart's top corner).
        fig.add_annotation(
            text=slo.label, name=f"slo:{slo.text}", showarrow=False, x=v, y=1.0, xref="x", yref="paper",
            textangle=-90, xanchor="left", yanchor="top", xshift=2, yshift=-18 * len(off),
            font={"color": SLO_COLOR, "size": 11}, bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip


def _slo_hlines(fig: go.Figure, slos: Sequence[Slo], metrics: Sequence[str], hi: float) -> None:
    """A dashed horizontal line at each SLO on one of ``metrics`` (a latency axis from 0 to the
    data's ``hi``), labelled above it at the left; one far above the data is a note at the top."""
    off = 0
    for slo in (s for s in slos if s.metric in metrics):
        v = float(slo.limit_ms)
        if _slo_in_view(v, 0.0, hi):
            fig.add_shape(
                type="line", name=f"slo:{slo.text}", x0=0, x1=1, y0=v, y1=v, xref="paper", yref="y",
                line={"color": SLO_COLOR, "width": 2, "dash": "dash"},
            )  # fmt: skip
            fig.add_annotation(
                text=slo.label, name=f"slo:{slo.text}", showarrow=False, x=0.0, y=v, xref="paper", yref="y",
                xanchor="left", yanchor="bottom", font={"color": SLO_COLOR, "size": 11},
                bgcolor="rgba(255,255,255,0.85)",
            )  # fmt: skip
        else:
            _off_chart_note(fig, slo, f"{slo.label} (above the chart) ↑", True, off)
            off += 1


def hardware_limit(fig: go.Figure, value: float, label: str, axis: str, lo: float, hi: float) -> None:
    """The hardware's limit (:mod:`bench.metrics.run_limits`) on a chart whose data span ``lo``..``hi``:
    a dotted line at ``value`` on the ``axis`` ("x" or "y") when it lies near the data, else
    its label at the chart's edge on its side, so a limit 50x away never squashes the data.
    Every shape and note carries the name ``limit``."""
    near = _slo_in_view(value, lo, hi)
    if not near:
        above = value > hi
        arrow = ("→" if above else "←") if axis == "x" else ("↑" if above else "↓")
        where = "above" if axis == "y" and above else "below" if axis == "y" else "off"
        text = f"{label} ({where} the chart) {arrow}" if above else f"{arrow} {label} ({where} the chart)"
        fig.add_annotation(
            text=text, name="limit", showarrow=False, xref="paper", yref="paper",
            x=1.0 if (above or axis == "y") else 0.0, y=0.0 if axis == "y" and not above else 1.0,
            xanchor="right" if (above or axis == "y") else "left",
            yanchor="bottom" if axis == "y" and not above else "top", yshift=-34 if axis == "x" else 0,
            font={"color": LIMIT_COLOR, "size": 12}, bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
        return
    line = {"color": LIMIT_COLOR, "width": 2, "dash": "dot"}
    if axis == "x":
        fig.add_shape(type="line", name="limit", x0=value, x1=value, y0=0, y1=1, xref="x", yref="paper", line=line)
        fig.add_annotation(
            text=label, name="limit", showarrow=False, x=value, y=0.5, xref="x", yref="paper", textangle=-90,
            xanchor="right", font={"color": LIMIT_COLOR, "size": 11}, bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    else:
        fig.add_shape(type="line", name="limit", x0=0, x1=1, y0=value, y1=value, xref="paper", yref="y", line=line)
        fig.add_annotation(
            text=label, name="limit", showarrow=False, x=1.0, y=value, xref="paper", yref="y", xanchor="right",
            yanchor="bottom", font={"color": LIMIT_COLOR, "size": 11}, bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip


# --- per-request charts ------------------------------------------------------------------


def latency_over_time(
    samples: pd.DataFrame, title: str = "Per-request latency over time", slos: Sequence[Slo] = ()
) -> go.Figure:
    """E2E and TTFT of each finished request (ms) against its finish time (s since run start).

    ``slos``: those on E2E or TTFT are drawn as dashed horizontal lines at their limits.
    """
    if not _has(samples, "end_s", "e2e_ms"):
        return empty_figure(title, "no finished request yet")
    errors = samples["error"].fillna("") if "error" in samples.columns else None
    ok = samples[errors == ""] if errors is not None else samples
    failed = samples[(errors != "") & (errors != CANCELLED)] if errors is not None else samples.iloc[0:0]
    cancelled = samples[errors == CANCELLED] if errors is not None else samples.iloc[0:0]
    ok = downsample(ok)
    fig = _figure(title)
    fig.add_trace(
        go.Scatter(
            x=ok["end_s"],
            y=ok["e2e_ms"],
            mode="markers",
            name="E2E",
            marker={"size": 6, "color": COLORS[0], "opacity": 0.75},
            hovertemplate="finished %{x:.2f} s<br>E2E %{y:.1f} ms<extra></extra>",
        )
    )
    if "ttft_ms" in ok.columns and ok["ttft_ms"].notna().any():
        fig.add_trace(
            go.Scatter(
                x=ok["end_s"], y=ok["ttft_ms"], mode="markers", name="TTFT",
                marker={"size": 5, "color": COLORS[1], "opacity": 0.75},
                hovertemplate="finished %{x:.2f} s<br>TTFT %{y:.1f} ms<extra></extra>",
            )
        )  # fmt: skip
    if not failed.empty:
        failed = downsample(failed)
        fig.add_trace(
            go.Scatter(
                x=failed["end_s"], y=failed["e2e_ms"], mode="markers", name="failed",
                marker={"size": 7, "color": COLORS[4], "symbol": "x"},
                hovertemplate="failed at %{x:.2f} s<extra></extra>",
            )
        )  # fmt: skip
    if not cancelled.empty:
        cancelled = downsample(cancelled)
        fig.add_trace(
            go.Scatter(
                x=cancelled["end_s"], y=cancelled["e2e_ms"], mode="markers", name="cancelled",
                marker={"size": 6, "color": "#9CA3AF", "symbol": "circle-open"},
                hovertemplate="cancelled at %{x:.2f} s (the run was stopped)<extra></extra>",
            )
        )  # fmt: skip
    fig.update_xaxes(title="time since run start (s)")
    fig.update_yaxes(title="latency (ms)")
    if slos:
        drawn = ["e2e_ms"] + (["ttft_ms"] if "ttft_ms" in ok.columns and ok["ttft_ms"].notna().any() else [])
        tops = [float(ok[c].max()) for c in drawn if ok[c].notna().any()]
        if not failed.empty and failed["e2e_ms"].notna().any():
            tops.append(float(failed["e2e_ms"].max()))
        _slo_hlines(fig, slos, drawn, max(tops, default=0.0))
    return fig


def distribution(
    samples: pd.DataFrame,
    column: str,
    title: str,
    unit: str = "ms",
    p50: float | None = None,
    p99: float | None = None,
    color: str = PRIMARY,
    slos: Sequence[Slo] = (),
    limit: tuple[float, str] | None = None,
) -> go.Figure:
    """Histogram of one per-request column, with p50 and p99 marked; ``limit`` (value, label):
    the hardware's limit on this column (:func:`hardware_limit`).

    ``p50``/``p99`` default to the percentiles of the rows given; pass the run summary's
    to mark the whole run's percentiles on a window of it. ``slos``: those on this column's
    metric are drawn as dashed vertical lines at their limits.
    """
    if not _has(samples, column):
        return empty_figure(title, f"no {column.removesuffix('_ms').upper()} value yet")
    values = samples[column].dropna()
    if "error" in samples.columns:
        values = samples.loc[samples["error"].fillna("") == "", column].dropna()
    if values.empty:
        return empty_figure(title, "no successful request yet")
    p50 = float(values.quantile(0.5)) if p50 is None else p50
    p99 = float(values.quantile(0.99)) if p99 is None else p99
    fig = _figure(title)
    fig.add_trace(
        go.Histogram(
            x=values, nbinsx=40, marker={"color": color, "line": {"color": "white", "width": 1}}, opacity=0.85,
            name=title, showlegend=False, hovertemplate=f"%{{x}} {unit}<br>%{{y}} requests<extra></extra>",
        )
    )  # fmt: skip
    # Labels point away from each other (p50 to the left of its line, p99 to the right), and
    # p99's sits one line higher, so close percentiles never print over each other.
    marks = ((p50, "p50", P50_COLOR, "right", 0), (p99, "p99", P99_COLOR, "left", 14))
    fig.update_layout(
        shapes=[
            {"type": "line", "x0": v, "x1": v, "y0": 0, "y1": 1, "xref": "x", "yref": "paper",
             "line": {"color": c, "width": 2, "dash": "dash"}}
            for v, _, c, _, _ in marks
        ],
        annotations=[
            {"x": v, "y": 1.0, "xref": "x", "yref": "paper", "text": f"{label} {v:.1f} {unit}", "showarrow": False,
             "yanchor": "bottom", "xanchor": anchor, "yshift": shift, "font": {"color": c, "size": 12}}
            for v, label, c, anchor, shift in marks
        ],
    )  # fmt: skip
    fig.update_xaxes(title=f"{column.removesuffix('_ms').upper()} ({unit})")
    fig.update_yaxes(title="requests")
    # The tallest bar holds at most every value: whole-number ticks while that is small.
    counts, _ = np.histogram(values, bins=min(40, max(1, len(values))))
    integer_ticks(fig, float(counts.max()) if len(counts) else 1.0)
    fig.update_layout(bargap=0.02)
    if slos:
        _slo_vlines(fig, slos, column, float(values.min()), float(values.max()))
    if limit is not None:
        hardware_limit(fig, limit[0], limit[1], "x", float(values.min()), float(values.max()))
    return fig


# --- per-second series ---------------------------------------------------------------------


def series(ts: pd.DataFrame, name: str) -> pd.DataFrame:
    """One series (``t_s``, ``value``) out of the long time-series frame, in time order."""
    if ts is None or ts.empty:
        return pd.DataFrame({"t_s": [], "value": []})
    out = ts.loc[ts["name"] == name, ["t_s", "value"]].dropna().sort_values("t_s")
    return out.reset_index(drop=True)


DASHES: tuple[str, ...] = ("solid", "dot", "dash", "dashdot")


def mark_replay(fig: go.Figure, text: str) -> go.Figure:
    """Label a chart drawn from a stored run played back, so it is never taken for a live one. The badge
    sits in a row of its own above the plot's percentile labels and legend (the p99 label hid under it)."""
    fig.update_layout(margin={"t": 76})
    fig.add_annotation(
        text=text, name="replay", showarrow=False, x=1.0, y=1.0, xref="paper", yref="paper", xanchor="right",
        yanchor="bottom", yshift=42, font={"size": 11, "color": "#7C3AED"}, bgcolor="#F5F3FF",
        bordercolor="#C4B5FD", borderpad=3,
    )  # fmt: skip
    return fig


# The book's marks each live chart carries (dashboard.data.live_figures' keys): the summary figures they
# scale and the axis they stand on ("y": a horizontal line; "x": a vertical one on a histogram).
LIVE_BOOK_FIGURES: dict[str, tuple[tuple[str, ...], str]] = {
    "throughput": (("output_throughput_tok_s",), "y"),
    "latency": (("e2e_ms_p50",), "y"),
    "ttft": (("ttft_ms_p50",), "x"),
    "tpot": (("tpot_ms_p50",), "x"),
    "memory": (("peak_memory_gib",), "y"),
}


def _data_top(fig: go.Figure, axis: str) -> float:
    """The highest value the figure's own traces draw on ``axis`` (0 when none)."""
    top = 0.0
    for t in fig.data:
        values = getattr(t, axis, None)
        if values is None:
            continue
        nums = pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()
        if not nums.empty:
            top = max(top, float(nums.max()))
    return top


def book_marks_on_live(figs: dict[str, go.Figure], book: BookMarks | None) -> None:
    """Draw the book's platforms (:mod:`bench.analysis.book_marks`) on the live charts (the Latency,
    Concurrency and Replay pages' :func:`dashboard.data.live_figures`): output tok/s on the throughput
    chart, E2E p50 on the latency chart, TTFT and TPOT p50 on their histograms, peak memory on the
    memory chart, each a dash-dot line in legend group ``book``. A chart still waiting for data
    gets none; a run with no marks (``book.note``) gets none (the page shows the note)."""
    if book is None or not book.drawn:
        return
    for key, (figures, axis) in LIVE_BOOK_FIGURES.items():
        fig = figs.get(key)
        if fig is None or not fig.data:
            continue
        marks = [m for f in figures for m in book.marks(f)]
        if not marks:
            continue
        data_top = _data_top(fig, axis)
        top = book_lines(fig, marks, axis, data_top or None)
        if top > data_top:
            (fig.update_yaxes if axis == "y" else fig.update_xaxes)(range=[0, top * 1.1])
        fig.update_layout(
            showlegend=True,
            legend={"orientation": "h", "yanchor": "top", "y": -0.36, "xanchor": "left", "x": 0.0},
            margin={"b": 110},
        )


def integer_ticks(fig: go.Figure, top: float, axis: str = "y", **where: int) -> None:
    """Whole-number ticks for a count axis: a step of 1 up to 10, and never a fractional label
    above (a histogram of 3 requests must not read 0.5, 1.5, 2.5 requests)."""
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    if top <= 10:
        update(dtick=1, tick0=0, tickformat="d", rangemode="tozero", **where)
    else:
        update(tickformat=",d", rangemode="tozero", **where)


def line_chart(
    ts: pd.DataFrame,
    names: Sequence[tuple[str, str]],
    title: str,
    y_title: str,
    fill: bool = False,
    shape: str = "linear",
    empty_message: str = "no sample yet (series are sampled about once a second)",
    integer: bool = False,
    height: int = 320,
) -> go.Figure:
    """Lines for ``names`` ((series name, legend label), ...) against seconds since run start.

    Each line has its own colour and dash, so series that coincide (allocated = reserved
    = peak on CPU, where all three are the process RSS) stay distinguishable. ``integer``:
    the values are counts (whole-number ticks). Legends sit under the plot, never over
    its title."""
    parts = [(label, series(ts, name)) for name, label in names]
    parts = [(label, s) for label, s in parts if not s.empty]
    if not parts:
        return empty_figure(title, empty_message, height)
    fig = _figure(title, height)
    for i, (label, s) in enumerate(parts):
        s = downsample(s)
        fig.add_trace(
            go.Scatter(
                x=s["t_s"], y=s["value"], name=label, mode="lines+markers" if len(s) < 60 else "lines",
                line={"color": COLORS[i % len(COLORS)], "width": 2, "shape": shape, "dash": DASHES[i % len(DASHES)]},
                marker={"size": 5},
                fill="tozeroy" if fill and i == 0 else None, fillcolor="rgba(79,70,229,0.08)",
                hovertemplate=f"%{{x:.1f}} s<br>{label}: %{{y:.3g}}<extra></extra>",
            )
        )  # fmt: skip
    fig.update_xaxes(title="time since run start (s)", rangemode="tozero")
    fig.update_yaxes(title=y_title)
    if integer:
        integer_ticks(fig, max(float(s["value"].max()) for _, s in parts))
    if len(parts) == 1:
        fig.update_layout(showlegend=False)
    else:
        fig.update_layout(
            legend={"orientation": "h", "yanchor": "top", "y": -0.36, "xanchor": "left", "x": 0.0},
            margin={"b": 96},
        )
    return fig


def throughput_over_time(
    ts: pd.DataFrame, series_name: str = "output_tok_s", limit: tuple[float, str] | None = None
) -> go.Figure:
    """Output tokens per second; ``limit`` (value, label): the hardware's (:func:`hardware_limit`)."""
    fig = line_chart(ts, [(series_name, "output tokens/s")], "Output tokens per second", "tokens/s", fill=True)
    values = series(ts, series_name)
    if limit is not None and not values.empty:
        hardware_limit(fig, limit[0], limit[1], "y", 0.0, float(values["value"].max()))
    return fig


def in_flight_over_time(ts: pd.DataFrame, series_name: str = "in_flight") -> go.Figure:
    return line_chart(ts, [(series_name, "in flight")], "Requests in flight", "requests", shape="hv", integer=True)


def memory_over_time(ts: pd.DataFrame, names: Sequence[tuple[str, str]], reported: bool = True) -> go.Figure:
    """``reported=False``: the run is sampling and the engine has no memory to report (a remote server)."""
    message = (
        "no sample yet (series are sampled about once a second)"
        if reported
        else "this engine reports no memory (a remote server: see its telemetry)"
    )
    return line_chart(ts, names, "Memory over time", "memory (GiB)", empty_message=message)


# --- comparing runs -------------------------------------------------------------------------

COMPARE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("output_throughput_tok_s", "Output throughput", "tokens/s"),
    ("request_throughput_rps", "Request throughput", "req/s"),
    ("ttft_ms_p50", "TTFT p50", "ms"),
    ("ttft_ms_p99", "TTFT p99", "ms"),
    ("tpot_ms_p50", "TPOT p50", "ms"),
    ("e2e_ms_p99", "E2E p99", "ms"),
    ("peak_memory_gib", "Peak memory", "GiB"),
)


def compare_bars(runs: pd.DataFrame, metrics: Sequence[tuple[str, str, str]] = COMPARE_METRICS) -> go.Figure:
    """Small multiples: one bar panel per metric, one bar per run, coloured by engine.

    Bars are named by run id (``#12``: short, never rotated or cut); the legend maps colours
    to engines and the hover text gives the whole label (``label`` column). A run without a
    value for a metric gets no bar (never a zero standing in for "unknown").
    """
    title = "Selected runs side by side"
    if runs is None or runs.empty:
        return empty_figure(title, "select runs to compare")
    metrics = [m for m in metrics if m[0] in runs.columns and runs[m[0]].notna().any()]
    if not metrics:
        return empty_figure(title, "the selected runs have no measured summary")
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=[f"{label} ({unit})" for _, label, unit in metrics],
        vertical_spacing=0.2 if rows > 1 else 0.1, horizontal_spacing=0.08,
    )  # fmt: skip
    ids = [f"#{int(r)}" for r in runs["run_id"]] if "run_id" in runs.columns else runs["label"].astype(str).tolist()
    labels = runs["label"].astype(str).tolist()
    engines = runs["engine"].astype(str).tolist() if "engine" in runs.columns else ["run"] * len(runs)
    for i, (col, label, unit) in enumerate(metrics):
        r, c = i // cols + 1, i % cols + 1
        values = runs[col]
        fig.add_trace(
            go.Bar(
                x=ids, y=values, marker={"color": [engine_color(e) for e in engines]}, name=label, showlegend=False,
                text=[_short(v) for v in values], textposition="outside", cliponaxis=False, customdata=labels,
                hovertemplate=f"%{{customdata}}<br>{label}: %{{y:.4g}} {unit}<extra></extra>",
            ),
            row=r, col=c,
        )  # fmt: skip
        top = float(values.max()) if values.notna().any() else 1.0
        fig.update_yaxes(title_text=unit, row=r, col=c, range=[0, top * 1.22 or 1.0])  # room for the value labels
        fig.update_xaxes(type="category", tickangle=0, row=r, col=c)
    # The legend: one entry per engine, drawn by empty traces (the bars carry no legend).
    for engine in dict.fromkeys(engines):
        fig.add_trace(
            go.Bar(x=[None], y=[None], name=engine, marker={"color": engine_color(engine)}, showlegend=True),
            row=1, col=1,
        )  # fmt: skip
    fig.update_layout(
        template=TEMPLATE_NAME, title=title, height=300 * rows + 90, showlegend=True, margin={"t": 110},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.06, "xanchor": "right", "x": 1.0, "title": "engine"},
    )  # fmt: skip
    return fig


def _short(v: float | None) -> str:
    if v is None or pd.isna(v):
        return ""
    v = float(v)
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def latency_throughput_scatter(
    runs: pd.DataFrame,
    x: str = "output_throughput_tok_s",
    y: str = "e2e_ms_p99",
    highlight: Sequence[int] = (),
    x_title: str = "output throughput (tokens/s)",
    y_title: str = "E2E p99 latency (ms)",
) -> go.Figure:
    """Every run with a summary as a point, coloured by engine and shaped by mode;
    ``highlight`` (run ids) drawn larger and named by id (the hover gives the whole label)."""
    title = "Latency vs throughput"
    if not _has(runs, x, y):
        return empty_figure(title, "no run with a measured summary")
    data = runs.dropna(subset=[x, y])
    data = downsample(data)
    chosen = data["run_id"].isin(list(highlight))
    engines = data["engine"].astype(str) if "engine" in data.columns else pd.Series("run", index=data.index)
    modes = data["mode"].astype(str) if "mode" in data.columns else pd.Series("", index=data.index)
    fig = _figure(title, 400)
    hover = "%{customdata}<br>%{x:.4g} tokens/s<br>%{y:.4g} ms<extra></extra>"
    for (engine, mode), idx in data.groupby([engines, modes], sort=True).groups.items():
        part = data.loc[idx]
        big = chosen.loc[idx]
        fig.add_trace(
            go.Scatter(
                x=part[x], y=part[y], mode="markers+text", name=f"{engine} · {mode}" if mode else engine,
                customdata=part["label"], hovertemplate=hover,
                text=[f"#{int(r)}" if b else "" for r, b in zip(part["run_id"], big, strict=True)],
                textposition="top center", cliponaxis=False,
                marker={
                    "color": engine_color(engine), "symbol": MODE_SYMBOLS.get(mode, "circle"),
                    "size": [15 if b else 9 for b in big], "opacity": [1.0 if b else 0.55 for b in big],
                    "line": {"color": "white", "width": 1},
                },
            )
        )  # fmt: skip
    # Head-room so the labels of the largest points stay inside the plot.
    fig.update_xaxes(title=x_title, range=[0, float(data[x].max()) * 1.2 or 1.0])
    fig.update_yaxes(title=y_title, range=[0, float(data[y].max()) * 1.25 or 1.0])
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0}, margin={"b": 96}
    )
    return fig


def book_vs_measured_gains(rows: pd.DataFrame, title: str = "Improvement factor: book vs measured") -> go.Figure:
    """Grouped bars of a gain factor (x) per metric, from the book and from measured runs.

    ``rows``: ``metric``, ``book``, ``measured`` (None when not measured: no bar is drawn),
    optional ``book_text``/``measured_text`` labels.
    """
    if rows is None or rows.empty:
        return empty_figure(title, "nothing to compare")
    fig = _figure(title, 340)
    fig.add_trace(
        go.Bar(
            x=rows["metric"], y=rows["book"], name="book", marker={"color": BOOK_COLOR},
            text=rows.get("book_text"), textposition="outside", cliponaxis=False,
        )
    )  # fmt: skip
    if rows["measured"].notna().any():
        fig.add_trace(
            go.Bar(
                x=rows["metric"], y=rows["measured"], name="measured", marker={"color": MEASURED_COLOR},
                text=rows.get("measured_text"), textposition="outside", cliponaxis=False,
            )
        )  # fmt: skip
    else:
        fig.add_annotation(
            text="no measured pair yet", showarrow=False, x=1.0, y=1.0, xref="paper", yref="paper",
            xanchor="right", yanchor="top", font={"color": "#6B7280"},
        )  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#9CA3AF", "dash": "dot"})
    fig.update_layout(barmode="group", bargap=0.35, showlegend=True)
    fig.update_yaxes(title="improvement (x)")
    return fig


def relative_bars(rows: pd.DataFrame, title: str) -> go.Figure:
    """Grouped bars of % values per metric (``metric`` column) for each other column (a platform)."""
    columns = [c for c in rows.columns if c != "metric"]
    if rows.empty or not columns:
        return empty_figure(title, "nothing to compare")
    fig = _figure(title, 340)
    for i, col in enumerate(columns):
        vals = rows[col]
        fig.add_trace(
            go.Bar(
                x=rows["metric"], y=vals, name=col, marker={"color": COLORS[i % len(COLORS)]},
                text=[f"{v:.0f}%" if pd.notna(v) else "" for v in vals], textposition="outside", cliponaxis=False,
            )
        )  # fmt: skip
    fig.add_hline(y=100, line={"color": "#9CA3AF", "dash": "dot"})
    fig.update_layout(
        barmode="group",
        bargap=0.3,
        legend={"orientation": "h", "y": -0.18, "x": 0.5, "xanchor": "center", "yanchor": "top"},
    )
    fig.update_yaxes(title="% of the reference platform")
    return fig


# --- profiling -------------------------------------------------------------------------------

# One colour per bottleneck category, the same in every chart (engines.profiling.CATEGORIES order).
CATEGORY_COLORS: dict[str, str] = {
    "attention_kv": "#4F46E5",  # indigo
    "moe_routing": "#F59E0B",  # amber
    "routed_experts": "#10B981",  # emerald
    "shared_experts": "#14B8A6",  # teal
    "dense_mlp": "#0EA5E9",  # sky
    "quantization": "#8B5CF6",  # violet
    "communication": "#EF4444",  # red
    "sampling": "#EC4899",  # pink
    "other": "#94A3B8",  # slate
}
WEIGHTS_COLOR = "#6B7280"


def breakdown_bars(frame: pd.DataFrame, basis: str = "cpu", title: str = "Where the time goes") -> go.Figure:
    """One stacked horizontal bar per run: each category's share (%) of the run's profiled time.

    ``frame`` (long, from :func:`dashboard.profile_data.breakdown_frame`): ``run`` (label), ``category``,
    ``ms``, ``share_pct``, ``total_ms``; categories stack in the order they first appear, each
    with its :data:`CATEGORY_COLORS` colour. ``basis`` ("cpu" | "device") names the time in the
    axis title. Categories with no time in any run get no legend entry.
    """
    if frame is None or frame.empty:
        return empty_figure(title, "no profile run with a breakdown picked")
    runs = list(dict.fromkeys(frame["run"].astype(str)))
    what = "device (kernel) time" if basis == "device" else "CPU time"
    plot_h = 64 * len(runs) + 24
    top, bottom = 48, 150  # below the plot: tick labels, the axis title, then the legend
    fig = _figure(title, height=plot_h + top + bottom)
    for i, category in enumerate(dict.fromkeys(frame["category"])):
        part = frame[frame["category"] == category].set_index("run").reindex(runs)
        if not (part["ms"].fillna(0) > 0).any():
            continue
        share = part["share_pct"].fillna(0.0)
        fig.add_trace(
            go.Bar(
                y=runs, x=share, orientation="h", name=str(category),
                marker={"color": CATEGORY_COLORS.get(str(category), COLORS[i % len(COLORS)]),
                        "line": {"color": "white", "width": 1}},
                text=[f"{v:.0f}%" if v >= 6 else "" for v in share], textposition="inside",
                insidetextanchor="middle", textfont={"color": "white", "size": 12},
                customdata=part["ms"].fillna(0.0),
                hovertemplate=f"%{{y}}<br>{category}: %{{x:.1f}}% · %{{customdata:.2f}} ms<extra></extra>",
            )
        )  # fmt: skip
    totals = frame.drop_duplicates("run").set_index("run").reindex(runs)["total_ms"]
    fig.update_layout(
        barmode="stack",
        bargap=0.3,
        margin={"l": 16, "r": 24, "t": top, "b": bottom},
        legend={"orientation": "h", "x": 0.0, "xanchor": "left", "y": -84 / plot_h, "yanchor": "top",
                "traceorder": "normal"},
    )  # fmt: skip
    fig.update_xaxes(title=f"share of profiled {what} (%)", range=[0, 100], ticksuffix="%")
    # Each run's label carries its total, so the bars can use the full width.
    fig.update_yaxes(
        autorange="reversed",
        automargin=True,
        tickvals=runs,
        ticktext=[f"{run}<br><span style='font-size:11px;color:#6B7280'>{_short(t)} ms total</span>"
                  for run, t in totals.items()],
    )  # fmt: skip
    return fig


def routing_heatmap(routing: dict | None, title: str = "Tokens routed to each expert") -> go.Figure:
    """Layer x expert heat map of the tokens a run's gates sent to each routed expert.

    ``routing``: the ``expert_routing`` artifact (``layers``, ``counts`` [layer][expert], ...).
    """
    if not routing or not routing.get("counts"):
        return empty_figure(title, "this run recorded no expert routing")
    layers = [str(x) for x in routing["layers"]]
    counts = routing["counts"]
    n = len(counts[0]) if counts else 0
    fig = _figure(title, height=max(260, 130 + 22 * len(layers)))
    fig.add_trace(
        go.Heatmap(
            z=counts, x=list(range(n)), y=layers, colorscale="Viridis", xgap=1, ygap=1,
            colorbar={"title": {"text": "tokens", "side": "right"}, "thickness": 14},
            hovertemplate="%{y} · expert %{x}<br>%{z} tokens<extra></extra>",
            texttemplate="%{z}" if n * len(layers) <= 160 else None, textfont={"size": 11},
        )
    )  # fmt: skip
    fig.update_xaxes(title=f"routed expert (0-{n - 1})", showgrid=False, dtick=1 if n <= 32 else None)
    fig.update_yaxes(title="MoE layer", autorange="reversed", showgrid=False, type="category", automargin=True)
    return fig


def routing_imbalance(routing: dict | None, title: str = "Load imbalance per layer (max / mean)") -> go.Figure:
    """Bar per MoE layer of the busiest expert's tokens over the mean per expert; 1.0 is perfectly balanced."""
    if not routing or not routing.get("imbalance"):
        return empty_figure(title, "this run recorded no expert routing")
    layers = [str(x) for x in routing["layers"]]
    if all(x.startswith("layer ") for x in layers):
        layers = [x.removeprefix("layer ") for x in layers]  # the axis title says "MoE layer"
    values = [None if v is None else float(v) for v in routing["imbalance"]]
    fig = _figure(title, height=320)
    fig.add_trace(
        go.Bar(
            x=layers, y=values, marker={"color": COLORS[3]}, name="max / mean", showlegend=False,
            hovertemplate="%{x}<br>busiest expert: %{y:.2f}x the mean<extra></extra>",
        )
    )  # fmt: skip
    fig.add_hline(
        y=1.0, line={"color": P50_COLOR, "dash": "dash", "width": 2},
        annotation_text="1.0 = perfectly balanced", annotation_position="top right",
        annotation_font={"color": P50_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
    )  # fmt: skip
    fig.update_xaxes(title="MoE layer", type="category")
    fig.update_yaxes(title="busiest expert / mean (x)", rangemode="tozero")
    return fig


def eplb_balancedness(
    df: pd.DataFrame,
    title: str = "Served: EPLB balancedness over the run (mean / max tokens per EP rank)",
    rearranged_at: Sequence[float] = (),
    latency: pd.DataFrame | None = None,
) -> go.Figure:
    """A served deployment's expert balance over time, as its server reports it; 1.0 is even;
    a dotted line where the server's EPLB moved experts (``rearranged_at``, s); with
    ``latency`` (t_s, value: mean TPOT ms per window) that on a second axis, so a rebalance's
    effect on the requests shows on one timeline."""
    if df is None or df.empty:
        return empty_figure(title, "this run has no EPLB balancedness (a vLLM server launched with EPLB logs it)")
    fig = _figure(title, height=320)
    fig.add_trace(
        go.Scatter(
            x=df["t_s"], y=df["value"], mode="lines+markers", line={"color": COLORS[0], "width": 2},
            name="balancedness", showlegend=False,
            hovertemplate="t = %{x:.1f} s<br>balancedness %{y:.3f}<extra></extra>",
        )
    )  # fmt: skip
    fig.add_hline(
        y=1.0, line={"color": P50_COLOR, "dash": "dash", "width": 2},
        annotation_text="1.0 = every rank equally busy", annotation_position="bottom right",
        annotation_font={"color": P50_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
    )  # fmt: skip
    for i, t in enumerate(rearranged_at):
        fig.add_vline(
            x=t, line={"color": P99_COLOR, "dash": "dot", "width": 2},
            annotation_text="experts rearranged" if i == 0 else "", annotation_position="top left",
            annotation_font={"color": P99_COLOR, "size": 11},
        )  # fmt: skip
    if latency is not None and not latency.empty:
        fig.add_trace(
            go.Scatter(
                x=latency["t_s"], y=latency["value"], mode="lines", yaxis="y2", name="TPOT (mean per window)",
                line={"color": COLORS[2], "width": 2, "dash": "dash"},
                hovertemplate="t = %{x:.1f} s<br>TPOT %{y:.2f} ms (mean of the requests ending then)<extra></extra>",
            )
        )  # fmt: skip
        fig.update_layout(
            yaxis2={"title": "TPOT, ms", "overlaying": "y", "side": "right", "rangemode": "tozero", "showgrid": False},
            legend={"orientation": "h", "y": -0.25},
        )
        fig.data[0].showlegend = True
    fig.update_xaxes(title="time since start (s)")
    fig.update_yaxes(title="mean / max tokens per rank", range=[0, 1.05], selector={"anchor": "x"})
    return fig


def routing_groups(routing: dict | None, title: str = "Expert-group selections per layer") -> go.Figure:
    """Layer x group heat map: how many tokens selected each expert group (group-limited routing).

    A token selects a group when any of its top-k experts lies in it. Meaningful when n_group > 1.
    """
    if not routing or not routing.get("group_counts") or int(routing.get("n_group", 1) or 1) <= 1:
        return empty_figure(title, "this model routes without expert groups (n_group = 1)")
    layers = [str(x) for x in routing["layers"]]
    groups = routing["group_counts"]
    n = len(groups[0])
    fig = _figure(title, height=max(240, 130 + 22 * len(layers)))
    fig.add_trace(
        go.Heatmap(
            z=groups, x=[f"group {g}" for g in range(n)], y=layers, colorscale="Blues", xgap=1, ygap=1,
            colorbar={"title": {"text": "tokens", "side": "right"}, "thickness": 14},
            texttemplate="%{z}", textfont={"size": 11},
            hovertemplate="%{y} · %{x}<br>selected by %{z} tokens<extra></extra>",
        )
    )  # fmt: skip
    fig.update_xaxes(title="expert group", showgrid=False)
    fig.update_yaxes(title="MoE layer", autorange="reversed", showgrid=False, type="category", automargin=True)
    return fig


def memory_timeline(
    ts: pd.DataFrame,
    names: Sequence[tuple[str, str]],
    weights_gib: float | None = None,
    y_title: str = "memory (GiB)",
    title: str = "Memory timeline",
) -> go.Figure:
    """Allocated / reserved / peak memory (GiB) over the run, with the model weights as a labelled line.

    What lies above the ``weights`` line is activations, KV cache and runtime overhead.
    """
    fig = line_chart(ts, names, title, y_title)
    if not fig.data:
        return fig
    fig.update_layout(showlegend=True)
    if weights_gib is not None:
        top = max((max(t.y) for t in fig.data if t.y is not None and len(t.y)), default=0.0)
        # Label below the line, clear of the memory lines just above it, unless it sits on the x axis.
        where = "bottom left" if top and weights_gib > 0.1 * top else "top left"
        fig.add_hline(
            y=float(weights_gib), line={"color": WEIGHTS_COLOR, "dash": "dash", "width": 2},
            annotation_text=f"weights {weights_gib:.3g} GiB", annotation_position=where,
            annotation_font={"color": WEIGHTS_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    return fig

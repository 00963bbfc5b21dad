"""Figures of sweeps, capacity searches and runs (plotly; no Streamlit): :func:`latency_throughput_figure`
(TTFT or TPOT p50/p99 against output tok/s, with SLO lines and the knee), :func:`serving_pareto_figure`
(output tok/s per accelerator against tok/s per user, sweeps overlaid), :func:`goodput_figure` (req/s
against the load), :func:`capacity_figure` (a capacity search's probes and the bracket it proved),
:func:`run_throughput_figure`, and :func:`book_lines` (the book's platforms as dash-dot reference marks,
:mod:`bench.analysis.book_marks`). The CLI's HTML report and the dashboard's Sweep and Replay pages draw
the same figures."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from bench.analysis.book_marks import BOOK_GROUP, BookMarks, Mark, figure_unit
from bench.analysis.reference import AcceleratorRow
from bench.analysis.serving import (
    DEFAULT_TARGET_TOK_S_PER_USER,
    FROM_INTERACTIVITY,
    ServingCurve,
    ServingPoint,
    best_at_target,
    name_curves,
)
from bench.analysis.sweep_analysis import (
    as_slos,
    axis_title,
    fmt_num,
    knee_of_line,
    line_label,
    load_axis_of,
    load_value_text,
    point_label,
    short_label,
    split_lines,
    spread_err,
    varying_keys,
)
from bench.metrics.catalogue import METRICS
from bench.metrics.cost import Price
from bench.metrics.moe import EpWhatIf
from bench.metrics.slo import Slo
from bench.report.style import COLORS, P50_COLOR, P99_COLOR, PRIMARY, register_template
from bench.store.rows import RunRow, SweepRow
from bench.sweep.spec import PointResult

# --- look: the shared palette and template (bench/report/style.py), with the report's own colours
PASS_COLOR = "#16A34A"
FAIL_COLOR = "#DC2626"
OTHER_COLOR = "#94A3B8"  # slate: points off the Pareto front
SLO_COLOR = "#374151"  # a limit, not a measurement: dark grey, dashed
KNEE_COLOR = "#F59E0B"
TEMPLATE_NAME = "moebench_report"
# The book's platforms (bench.analysis.book_marks): a colour per vendor, dash-dot (SLOs are dashed, limits dotted).
BOOK_COLORS: dict[str, str] = {"cuda": "#65A30D", "npu": "#BE123C", "mlu": "#0891B2"}
BOOK_DASH = "dashdot"
BOOK_OFF_SCALE = 5.0  # a mark this many times above the data is listed in the legend, hidden, not drawn to scale


def _register_template() -> None:
    register_template(TEMPLATE_NAME, margin={"l": 64, "r": 24, "t": 56, "b": 56})


_register_template()


def _figure(title: str, height: int) -> go.Figure:
    return go.Figure(layout={"template": TEMPLATE_NAME, "title": title, "height": height})


def _empty(title: str, message: str, height: int = 360) -> go.Figure:
    """A blank chart that says why it is blank."""
    fig = _figure(title, height)
    fig.add_annotation(
        text=escape_text(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
        font={"size": 14, "color": "#6B7280"},
    )  # fmt: skip
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _legend_below(fig: go.Figure, height: int, top: int = 56, bottom: int = 120) -> None:
    # The legend sits under the x axis title (a fixed number of pixels below the plot), so it
    # never covers the title, the curves or their labels; a long legend wraps, and the figure
    # grows by a row (about 22 px) for each line of it past the first.
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    width = sum(len(t.name) * 7 + 50 for t in shown)  # about 7 px a character, 50 for the symbol
    extra = 22 * max(0, -(-width // 900) - 1)
    plot_h = max(80, height - top - bottom)
    fig.update_layout(
        height=height + extra,
        margin={"t": top, "b": bottom + extra},
        legend={"orientation": "h", "x": 0.0, "xanchor": "left", "y": -64 / plot_h, "yanchor": "top"},
    )


def _hover_labels(points: Sequence[PointResult]) -> list[str]:
    out = []
    for p in points:
        n = len(p.summaries)
        out.append(escape_text(point_label(p.point)) + (f"<br>mean of {n} repeats" if n > 1 else ""))
    return out


def _error(plus: list[float | None], minus: list[float | None], color: str) -> dict[str, Any] | None:
    if all(v is None for v in plus):
        return None
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "color": color,
            "thickness": 1.2, "width": 4}  # fmt: skip


# An SLO more than this many times above the highest measured value is not drawn to scale (it would
# flatten the data into the axis): it is named at the chart's top edge with an arrow, as off the scale.
SLO_OFF_SCALE = 5.0


def _slo_lines(fig: go.Figure, slos: Sequence[Slo], data_top: float) -> float:
    """A dashed line per SLO within reach of the data; an SLO far above it (:data:`SLO_OFF_SCALE`) a
    labelled arrow at the top edge instead. Returns the y-axis top the data and the lines need."""
    top = data_top
    near = [s for s in slos if data_top <= 0 or s.limit_ms <= data_top * SLO_OFF_SCALE]
    far = [s for s in slos if s not in near]
    for slo in near:
        top = max(top, slo.limit_ms)
        fig.add_hline(
            y=slo.limit_ms, name=f"SLO {slo.label}", line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=escape_text(slo.label), annotation_position="top left",
            annotation_font={"color": SLO_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    if far:
        text = "; ".join(f"{escape_text(s.label)} (above the chart)" for s in far)
        fig.add_annotation(
            x=0.99, xref="x domain", y=0.99, yref="y domain", text=f"▲ SLO {text}", showarrow=False,
            xanchor="right", yanchor="top", font={"color": SLO_COLOR, "size": 12}, bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    return top


def book_color(row: AcceleratorRow) -> str:
    """The colour of a book platform's marks."""
    return BOOK_COLORS.get(row.accelerator, SLO_COLOR)


def _book_shown(fig: go.Figure, label: str) -> bool:
    return any(t.legendgroup == BOOK_GROUP and t.name == label and t.showlegend is not False for t in fig.data)


def book_lines(fig: go.Figure, marks: Sequence[Mark], axis: str = "y", data_top: float | None = None) -> float:
    """The book's marks as dash-dot reference lines across the whole plot: horizontal at each mark's
    value (``axis="y"``: a throughput, latency or memory axis) or vertical (``axis="x"``: a histogram's
    value axis), each a trace named by its label in legend group ``book``. A mark more than
    :data:`BOOK_OFF_SCALE` times above ``data_top`` is listed in the legend (value and "off the scale"),
    hidden until clicked, so it never flattens the measured data. Returns the axis top the drawn marks need."""
    top = data_top or 0.0
    for m in marks:
        off = bool(data_top) and m.value > (data_top or 0.0) * BOOK_OFF_SCALE
        span = [0.0, 1.0]
        at = [m.value, m.value]
        # The line spans the plot on a hidden [0, 1] axis laid over the data's, whatever the data's range.
        other = "x9" if axis == "y" else "y9"
        fig.update_layout(
            {
                ("xaxis9" if axis == "y" else "yaxis9"): {
                    "overlaying": "x" if axis == "y" else "y",
                    "range": [0, 1],
                    "visible": False,
                    "fixedrange": True,
                }
            }
        )
        unit = figure_unit(m.figure)
        fig.add_trace(
            go.Scatter(
                x=span if axis == "y" else at, y=at if axis == "y" else span, mode="lines",
                name=m.label + (f" · {m.value:,.4g} {unit}, off the scale" if off else ""),
                legendgroup=BOOK_GROUP, legendgrouptitle_text="book (ratios of measured figures)",
                visible="legendonly" if off else True, showlegend=not _book_shown(fig, m.label),
                line={"color": book_color(m.platform), "dash": BOOK_DASH, "width": 1.8},
                hovertemplate=escape_text(m.hover) + "<extra></extra>",
                **({"xaxis": other} if axis == "y" else {"yaxis": other}),
            )
        )  # fmt: skip
        if not off:
            top = max(top, m.value)
    return top


def _book_latency(
    fig: go.Figure, book: BookMarks, lines: Sequence[Sequence[PointResult]], metric: str, x_top: float, y_top: float
) -> tuple[float, float]:
    """The book's platforms on a latency-vs-throughput figure. On the run's own card: each line's points
    moved where the book's ratios put each other platform (x × its throughput %, y × its latency %),
    dash-dot; on a reference run: one marker per platform (its p50 to p99, joined). Returns the new tops."""
    tput = "output_throughput_tok_s"
    for row in book.platforms:
        color = book_color(row)
        if not book.reference:
            for line in lines:
                for stat in ("p50", "p99"):
                    pts = [(p.mean(tput), p.mean(f"{metric}_{stat}")) for p in line]
                    pts = [(x, y) for x, y in pts if x is not None and y is not None]
                    if not pts:
                        continue
                    xs = [book.scale(row, tput, x) or 0.0 for x, _ in pts]
                    ys = [book.scale(row, f"{metric}_{stat}", y) or 0.0 for _, y in pts]
                    label = book.label(row, tput, f"{metric}_{stat}")
                    fig.add_trace(
                        go.Scatter(
                            x=xs, y=ys, mode="lines+markers", name=label, legendgroup=BOOK_GROUP,
                            legendgrouptitle_text="book (ratios of measured figures)", legendrank=3000,
                            showlegend=not _book_shown(fig, label),
                            line={"color": color, "dash": BOOK_DASH, "width": 1.5 if stat == "p99" else 1.0},
                            marker={"size": 6, "symbol": "diamond-open", "color": color},
                            hovertemplate=f"{escape_text(label)}, {stat}: %{{x:,.4g}} output tok/s, "
                            f"%{{y:,.4g}} ms<br>(the measured point × the book's ratios)<extra></extra>",
                        )
                    )  # fmt: skip
                    x_top, y_top = max(x_top, *xs), max(y_top, *ys)
            continue
        x_mark = next((m for m in book.marks(tput) if m.platform == row), None)
        y_marks = [m for s in ("p50", "p99") for m in book.marks(f"{metric}_{s}") if m.platform == row]
        if x_mark is None or not y_marks:
            continue
        ys = [m.value for m in y_marks]
        off = x_mark.value > x_top * BOOK_OFF_SCALE or max(ys) > y_top * BOOK_OFF_SCALE
        name = book.label(row, tput, f"{metric}_p50")
        fig.add_trace(
            go.Scatter(
                x=[x_mark.value] * len(ys), y=ys, mode="lines+markers",
                name=name + (f" · {x_mark.value:,.4g} tok/s, {max(ys):,.4g} ms: off the scale" if off else ""),
                legendgroup=BOOK_GROUP, legendgrouptitle_text="book (ratios of measured figures)", legendrank=3000,
                visible="legendonly" if off else True,
                line={"color": color, "dash": BOOK_DASH, "width": 1.5},
                marker={"size": 10, "symbol": "diamond-open" if not x_mark.measured_mark else "diamond",
                        "color": color, "line": {"width": 2}},
                customdata=[escape_text(f"{x_mark.hover}<br>{m.hover}") for m in y_marks],
                hovertemplate="%{customdata}<extra></extra>",
            )
        )  # fmt: skip
        if not off:
            x_top, y_top = max(x_top, x_mark.value), max(y_top, *ys)
    return x_top, y_top


def _top_value(p: PointResult, metric: str) -> float | None:
    """The point's marker height on a latency chart: its p99, else its p50."""
    return next((v for s in ("p99", "p50") if (v := p.mean(f"{metric}_{s}")) is not None), None)


def latency_throughput_figure(
    points: Sequence[PointResult],
    slos: Sequence[Slo | str] | None = None,
    metric: str = "ttft_ms",
    load_axis: str | None = None,
    book: BookMarks | None = None,
) -> go.Figure:
    """``metric`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``itl_ms``) p50 and p99 (ms) against
    output tok/s, one marker per point labelled with its load, error bars from the repeats'
    min-max (where a point has more than one), a dashed line per SLO on ``metric`` and an amber
    ring on each line's knee (:func:`knee`). ``load_axis`` defaults to :func:`load_axis_of`;
    without one the points are labelled with their values and not joined. ``book``
    (:func:`bench.analysis.book_marks.sweep_marks`): the book's platforms, dash-dot, in legend group
    ``book``."""
    name = metric.removesuffix("_ms").upper()
    title = f"{name} vs output throughput"
    axis = load_axis or load_axis_of(points)
    height = 460
    lines = [[p for p in line if p.mean("output_throughput_tok_s") is not None] for line in split_lines(points, axis)]
    lines = [ln for ln in lines if any(p.mean(f"{metric}_{s}") is not None for p in ln for s in ("p50", "p99"))]
    if not lines:
        return _empty(title, f"no point with a measured {name} and output throughput", height)
    fig = _figure(title, height)
    multi = len(lines) > 1
    varying = varying_keys([p for ln in lines for p in ln])
    y_top = 0.0
    for li, line in enumerate(lines):
        xs = [p.mean("output_throughput_tok_s") for p in line]
        x_err = [spread_err(p, "output_throughput_tok_s") for p in line]
        suffix = f" · {escape_text(line_label(line, axis, varying))}" if multi else ""
        k = knee_of_line(line, axis)[0] if axis else None
        ky = (
            None if k is None else next((v for s in ("p99", "p50") if (v := k.mean(f"{metric}_{s}")) is not None), None)
        )
        if k is not None and ky is not None:  # a ring drawn first, so under the curve's own marker and label
            fig.add_trace(
                go.Scatter(
                    x=[k.mean("output_throughput_tok_s")], y=[ky], mode="markers", name="knee", legendgroup="knee",
                    legendrank=2000, showlegend=not any(t.name == "knee" for t in fig.data),
                    marker={"symbol": "circle-open", "size": 22, "color": KNEE_COLOR, "line": {"width": 3}},
                    customdata=_hover_labels([k]),
                    hovertemplate="knee of throughput vs load<br>%{customdata}<extra></extra>",
                )
            )  # fmt: skip
        for stat in ("p50", "p99"):
            key = f"{metric}_{stat}"
            ys = [p.mean(key) for p in line]
            if all(y is None for y in ys):
                continue
            y_err = [spread_err(p, key) for p in line]
            y_top = max(y_top, *[(y or 0.0) + (e[0] or 0.0) for y, e in zip(ys, y_err, strict=True)])
            color = (P50_COLOR if stat == "p50" else P99_COLOR) if not multi else COLORS[li % len(COLORS)]
            labelled = stat == "p99"
            fig.add_trace(
                go.Scatter(
                    x=xs, y=ys, name=f"{name} {stat}{suffix}",
                    mode=("lines+" if axis else "") + ("markers+text" if labelled else "markers"),
                    text=[escape_text(load_value_text(axis, p.point.get(axis)) if axis
                                      else short_label(p.point, varying)) for p in line] if labelled else None,
                    # alternate sides: neighbouring points at low load sit close together
                    textposition=["top left" if i % 2 == 0 else "bottom right" for i in range(len(line))],
                    textfont={"size": 11, "color": "#374151"}, cliponaxis=False,
                    line={"color": color, "width": 2, "dash": "solid" if stat == "p99" else "dot"},
                    marker={"size": 8 if labelled else 6, "color": color, "line": {"color": "white", "width": 1}},
                    error_y=_error([e[0] for e in y_err], [e[1] for e in y_err], color),
                    error_x=_error([e[0] for e in x_err], [e[1] for e in x_err], color) if labelled else None,
                    customdata=_hover_labels(line),
                    hovertemplate=f"%{{customdata}}<br>%{{x:,.4g}} output tok/s<br>{name} {stat} %{{y:,.4g}} ms"
                    "<extra></extra>",
                )
            )  # fmt: skip
    shaky = [(p, y) for line in lines for p in line if p.disturbed and (y := _top_value(p, metric)) is not None]
    if shaky:  # a point measured while disturbed: ringed in grey, the reason in its hover
        fig.add_trace(
            go.Scatter(
                x=[p.mean("output_throughput_tok_s") for p, _ in shaky], y=[y for _, y in shaky], mode="markers",
                name="disturbed", legendrank=2001,
                marker={"symbol": "square-open", "size": 20, "color": OTHER_COLOR, "line": {"width": 2}},
                customdata=[escape_text(p.disturbed) for p, _ in shaky],
                hovertemplate="measured while disturbed:<br>%{customdata}<extra></extra>",
            )
        )  # fmt: skip
    x_top = max((p.mean("output_throughput_tok_s") or 0.0) + (spread_err(p, "output_throughput_tok_s")[0] or 0.0)
                for line in lines for p in line)  # fmt: skip
    if book is not None and book.drawn and metric != "itl_ms":
        x_top, y_top = _book_latency(fig, book, lines, metric, x_top, y_top)
    y_top = _slo_lines(fig, [s for s in as_slos(slos) if s.metric == metric], y_top)
    # Head-room: the load labels above the highest markers and the SLO labels stay inside.
    fig.update_xaxes(title="output throughput (tokens/s)", range=[0, x_top * 1.12 or 1.0])
    fig.update_yaxes(title=f"{name} (ms)", range=[0, y_top * 1.18 or 1.0])
    _legend_below(fig, height)
    return fig


def serving_pareto_figure(
    curves: Sequence[ServingCurve],
    target_tok_s_per_user: float | None = DEFAULT_TARGET_TOK_S_PER_USER,
    prices: Mapping[str, Price] | None = None,
    names: Sequence[str] | None = None,
) -> go.Figure:
    """Output tok/s per accelerator against tok/s per user (interactivity), InferenceMAX's and vLLM's
    ``plot_pareto`` chart: one colour per curve (a sweep: engine, card and options in the legend), its
    Pareto front joined and filled, the other points open, the knee of throughput vs load ringed, the
    interactivity target a dashed vertical line and each curve's best point at it starred. The hover
    gives $ and J per million output tokens (:mod:`bench.metrics.cost`; the price is an assumption
    and says so). Labels and units from the metric catalogue."""
    x_metric, y_metric = METRICS["interactivity_tok_s"], METRICS["output_tok_s_per_accelerator"]
    title = f"{y_metric.label[:1].upper()}{y_metric.label[1:]} vs {x_metric.label} (interactivity)"
    height = 500
    prices = prices or {}
    drawn = [c for c in curves if c.points]
    if not drawn:
        notes = "; ".join(n for c in curves for n in c.notes[:2])
        why = "no point with a measured TPOT and a known accelerator count" + (f": {notes}" if notes else "")
        return _empty(title, why, height)
    labels = list(names) if names is not None else name_curves(curves)
    label_of = {id(c): n for c, n in zip(curves, labels, strict=True)}
    fig = _figure(title, height)
    for i, c in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        name = escape_text(label_of[id(c)])
        hover = [_serving_hover(p, prices) for p in c.points]
        hover_of = {id(p): h for p, h in zip(c.points, hover, strict=True)}
        fig.add_trace(  # every point, open: the front's own markers are drawn over them, filled
            go.Scatter(
                x=[p.per_user_tok_s for p in c.points], y=[p.per_accelerator_tok_s for p in c.points],
                mode="markers", name=name, legendgroup=f"curve{i}", showlegend=False,
                marker={"size": 9, "color": "white", "symbol": "circle", "line": {"color": color, "width": 2}},
                customdata=hover, hovertemplate=f"<b>{name}</b><br>%{{customdata}}<extra></extra>",
            )
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[p.per_user_tok_s for p in c.front], y=[p.per_accelerator_tok_s for p in c.front],
                mode="lines+markers+text", name=name, legendgroup=f"curve{i}",
                line={"color": color, "width": 2.5}, text=[escape_text(p.label) for p in c.front],
                textposition="top right", textfont={"size": 11, "color": color}, cliponaxis=False,
                marker={"size": 11, "color": color, "line": {"color": "white", "width": 1.5}},
                customdata=[hover_of[id(p)] for p in c.front],
                hovertemplate=f"<b>{name}</b> · Pareto front<br>%{{customdata}}<extra></extra>",
            )
        )  # fmt: skip
        if c.knee is not None:
            fig.add_trace(
                go.Scatter(
                    x=[c.knee.per_user_tok_s], y=[c.knee.per_accelerator_tok_s], mode="markers", name="knee",
                    legendgroup="knee", legendrank=2000, showlegend=not any(t.name == "knee" for t in fig.data),
                    marker={"symbol": "circle-open", "size": 24, "color": KNEE_COLOR, "line": {"width": 3}},
                    customdata=[escape_text(c.knee.label)],
                    hovertemplate=f"knee of throughput vs load: {name}, %{{customdata}}<extra></extra>",
                )
            )  # fmt: skip
        best = best_at_target(c, target_tok_s_per_user) if target_tok_s_per_user else None
        if best is not None:
            fig.add_trace(
                go.Scatter(
                    x=[best.per_user_tok_s], y=[best.per_accelerator_tok_s], mode="markers",
                    name=f"best at ≥ {target_tok_s_per_user:g} tok/s per user", legendgroup="best", legendrank=2001,
                    showlegend=not any(t.legendgroup == "best" for t in fig.data),
                    marker={"symbol": "star", "size": 18, "color": KNEE_COLOR, "line": {"color": color, "width": 1.5}},
                    customdata=[_serving_hover(best, prices)],
                    hovertemplate=f"<b>best at the target</b>: {name}<br>%{{customdata}}<extra></extra>",
                )
            )  # fmt: skip
    xs = [p.per_user_tok_s for c in drawn for p in c.points]
    ys = [p.per_accelerator_tok_s for c in drawn for p in c.points]
    x_top = max([*xs, target_tok_s_per_user or 0.0]) * 1.15
    if target_tok_s_per_user:
        fig.add_vline(
            x=target_tok_s_per_user, line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=f"target ≥ {target_tok_s_per_user:g} tok/s per user", annotation_position="top right",
            annotation_font={"color": SLO_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    derived = any(c.derived for c in drawn)
    x_title = f"{x_metric.label} ({x_metric.unit}), p50" + (
        "; 1000 / TPOT p50 for runs stored before interactivity_tok_s" if derived else ""
    )
    fig.update_xaxes(title=x_title, range=[0, x_top or 1.0])
    fig.update_yaxes(title=f"{y_metric.label} ({y_metric.unit})", range=[0, max(ys) * 1.18 or 1.0])
    _legend_below(fig, height)
    return fig


def _serving_hover(p: ServingPoint, prices: Mapping[str, Price]) -> str:
    """A point's hover: its values, where tok/s per user came from, $ and J per million output tokens."""
    origin = "interactivity p50" if p.per_user_from == FROM_INTERACTIVITY else "1000 / TPOT p50 (derived)"
    usd = p.usd_per_million(prices)
    price = prices.get(p.card)
    cost = (
        f"${usd:.3g} per M output tokens at ${price.usd_per_hour:.2f}/accelerator-hour "
        f"({'assumption' if price.assumption else 'list price'})"
        if usd is not None and price is not None
        else f"$ per M: no price for '{p.card}'"
    )
    energy = (
        f"{p.joules_per_million:,.4g} J per M output tokens"
        if p.joules_per_million is not None
        else ("energy not measured")
    )
    runs = ", ".join(str(i) for i in p.run_ids)
    return (
        f"{escape_text(p.label)}<br>{fmt_num(p.per_user_tok_s)} tok/s per user ({origin})<br>"
        f"{fmt_num(p.per_accelerator_tok_s)} output tok/s per accelerator × {p.accelerators} = "
        f"{fmt_num(p.output_tok_s)} tok/s<br>{escape_text(cost)}<br>{energy}<br>run {runs}"
    )


def goodput_figure(points: Sequence[PointResult], load_axis: str | None = None) -> go.Figure:
    """Request throughput and goodput (req/s) against the load; for a request-rate sweep also
    the offered load (y = x), which a server that keeps up follows."""
    axis = load_axis or load_axis_of(points)
    title = f"Throughput and goodput vs {axis_title(axis).split(' (')[0]}"
    height = 440
    lines = [[p for p in ln if p.mean("request_throughput_rps") is not None] for ln in split_lines(points, axis)]
    lines = [ln for ln in lines if ln]
    if not lines:
        return _empty(title, "no point with a measured request throughput", height)
    fig = _figure(title, height)
    multi = len(lines) > 1
    varying = varying_keys([p for ln in lines for p in ln])
    any_goodput = False
    top = 0.0
    for li, line in enumerate(lines):
        xs = [p.point.get(axis) if axis else escape_text(point_label(p.point)) for p in line]
        suffix = f" · {escape_text(line_label(line, axis, varying))}" if multi else ""
        for key, label, color, dash in (
            ("request_throughput_rps", "throughput", PRIMARY, "solid"),
            ("goodput_rps", "goodput", P50_COLOR, "dash"),
        ):
            ys = [p.mean(key) for p in line]
            if all(y is None for y in ys):
                continue
            any_goodput |= key == "goodput_rps"
            err = [spread_err(p, key) for p in line]
            top = max(top, *[(y or 0.0) + (e[0] or 0.0) for y, e in zip(ys, err, strict=True)])
            c = COLORS[li % len(COLORS)] if multi else color
            fig.add_trace(
                go.Scatter(
                    x=xs, y=ys, name=f"{label}{suffix}", mode="lines+markers",
                    line={"color": c, "width": 2, "dash": dash}, marker={"size": 8, "color": c},
                    error_y=_error([e[0] for e in err], [e[1] for e in err], c),
                    customdata=_hover_labels(line),
                    hovertemplate=f"%{{customdata}}<br>{label} %{{y:,.4g}} req/s<extra></extra>",
                )
            )  # fmt: skip
    if axis == "request_rate":
        rates = [float(p.point["request_rate"]) for ln in lines for p in ln]
        fig.add_trace(
            go.Scatter(
                x=[0, max(rates)], y=[0, max(rates)], mode="lines", name="offered load",
                line={"color": OTHER_COLOR, "dash": "dot", "width": 1.5}, hoverinfo="skip",
            )
        )  # fmt: skip
        top = max(top, max(rates))
    if not any_goodput:
        fig.add_annotation(
            text="no SLOs set: no goodput", showarrow=False, x=1.0, y=1.0, xref="paper", yref="paper",
            xanchor="right", yanchor="bottom", font={"color": "#6B7280", "size": 12},
        )  # fmt: skip
    fig.update_xaxes(title=axis_title(axis), rangemode="tozero", type=None if axis else "category")
    fig.update_yaxes(title="requests per second (req/s)", range=[0, top * 1.12 or 1.0])
    _legend_below(fig, height)
    return fig


def capacity_figure(sweep: SweepRow, runs: Sequence[RunRow]) -> go.Figure:
    """A capacity search: one panel per SLO, each probe at (probed value, the SLO's statistic
    measured by its run), green when the probe passed and red when it failed, labelled with
    its order (1 = first probe); the SLO limit dashed and the proven bracket (passes at X,
    fails at Y) shaded. A probe whose run measured nothing gets a dotted vertical line."""
    from plotly.subplots import make_subplots

    res = sweep.result or {}
    probes = list(res.get("probes") or [])
    axis = res.get("axis") or sweep.config.get("axis") or "rate"
    slos = as_slos(res.get("slos") or (sweep.config.get("base") or {}).get("slos") or [])
    title = "Capacity search: probes against the SLOs"
    if not probes:
        return _empty(title, "no probe has finished yet")
    if not slos:
        return _empty(title, "the search has no SLO to draw")
    by_id = {r.id: r for r in runs}
    n = len(slos)
    panel_h = 280
    height = 56 + 150 + panel_h * n
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.1 if n > 1 else 0.0)
    fig.update_layout(template=TEMPLATE_NAME, title=title, height=height)
    values = [float(p["value"]) for p in probes]
    lo, hi = res.get("passes_at"), res.get("fails_at")
    missing: list[tuple[int, dict[str, Any]]] = []
    for row, slo in enumerate(slos, start=1):
        key = f"{slo.metric}_{slo.stat}"
        pts = []
        for order, probe in enumerate(probes, start=1):
            run = by_id.get(int(probe.get("run_id") or 0))
            flat = run.summary.flat() if run is not None and run.summary is not None else {}
            v = flat.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                pts.append((order, probe, float(v)))
            elif row == 1:
                missing.append((order, probe))
        top = max([v for _, _, v in pts] + [slo.limit_ms])
        for passed, label, color in ((True, "passed", PASS_COLOR), (False, "failed", FAIL_COLOR)):
            sel = [d for d in pts if bool(d[1].get("passed")) is passed]
            if not sel:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[float(d[1]["value"]) for d in sel], y=[d[2] for d in sel], mode="markers+text",
                    name=label, legendgroup=label, showlegend=not any(t.name == label for t in fig.data),
                    text=[str(d[0]) for d in sel], textposition="top center", cliponaxis=False,
                    textfont={"size": 12, "color": color},
                    marker={"size": 13, "color": color, "symbol": "circle" if passed else "x",
                            "line": {"color": "white", "width": 1}},
                    customdata=[f"probe {d[0]}: {escape_text(load_value_text(axis, d[1]['value']))}<br>"
                                f"{escape_text(d[1].get('why') or '')}" for d in sel],
                    hovertemplate=f"%{{customdata}}<br>{escape_text(slo.figure)} %{{y:,.4g}} {slo.unit}"
                    "<extra></extra>",
                ),
                row=row, col=1,
            )  # fmt: skip
        fig.add_hline(
            y=slo.limit_ms, row=row, col=1, name=f"SLO {slo.label}",
            line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=escape_text(slo.label), annotation_position="top left",
            annotation_font={"color": SLO_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
        fig.update_yaxes(title_text=f"{escape_text(slo.figure)} ({slo.unit})", range=[0, top * 1.2], row=row, col=1)
        if lo is not None and hi is not None:
            fig.add_vrect(
                x0=float(lo), x1=float(hi), row=row, col=1, name="bracket", fillcolor=PASS_COLOR, opacity=0.1,
                line_width=0, layer="below",
            )  # fmt: skip
    if lo is not None and hi is not None:  # the bracket is said in the title: no label over the probes
        fig.update_layout(
            title=f"{title}: passes at {escape_text(load_value_text(axis, lo))}, fails at "
            f"{escape_text(load_value_text(axis, hi))} (shaded)"
        )
    elif lo is not None:
        fig.update_layout(title=f"{title}: passes up to {escape_text(load_value_text(axis, lo))}")
    for order, probe in missing:
        fig.add_vline(
            x=float(probe["value"]), row="all", col=1, name="no data",
            line={"color": FAIL_COLOR, "dash": "dot", "width": 1},
        )  # fmt: skip
        fig.add_annotation(
            text=f"{order}: no data", x=float(probe["value"]), y=0.0, xref="x", yref="paper", yanchor="bottom",
            showarrow=False, font={"size": 11, "color": FAIL_COLOR}, textangle=-90, xshift=-8,
        )  # fmt: skip
    span = max(values) - min(values) if len(values) > 1 else max(values)
    fig.update_xaxes(range=[max(0.0, min(values) - 0.08 * span), max(values) + 0.08 * span])
    fig.update_xaxes(title_text=axis_title(axis), row=n, col=1)
    _legend_below(fig, height, top=72, bottom=150)
    return fig


def run_throughput_figure(series: Sequence[tuple[float, float | None]], book: BookMarks | None = None) -> go.Figure:
    """A run's per-second output tok/s (``(t_s, value)`` pairs, seconds since the run's start); ``book``
    (:func:`bench.analysis.book_marks.book_marks`): the book's platforms' output tok/s as dash-dot lines."""
    title = "Output tokens per second"
    height = 340
    pts = [(t, v) for t, v in series if v is not None]
    if not pts:
        return _empty(title, "this run has no per-second series", height)
    fig = _figure(title, height)
    fig.add_trace(
        go.Scatter(
            x=[t for t, _ in pts], y=[v for _, v in pts], mode="lines+markers" if len(pts) < 60 else "lines",
            name="output tokens/s", line={"color": PRIMARY, "width": 2}, marker={"size": 5},
            fill="tozeroy", fillcolor="rgba(79,70,229,0.08)",
            hovertemplate="%{x:.1f} s<br>%{y:,.4g} output tok/s<extra></extra>",
        )
    )  # fmt: skip
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title="time since run start (s)", rangemode="tozero")
    fig.update_yaxes(title="output tokens/s")
    if book is not None and book.drawn:
        marks = book.marks("output_throughput_tok_s")
        if marks:
            top = book_lines(fig, marks, "y", max(v for _, v in pts))
            fig.update_yaxes(range=[0, top * 1.12 or 1.0])
            fig.update_layout(showlegend=True)
            _legend_below(fig, height, bottom=110)
    return fig


# --- recommendations -------------------------------------------------------------------------------


def escape_text(value: Any) -> str:
    """``value`` as HTML text (hover labels, the report page)."""
    return html.escape(str(value), quote=True)


def ep_rank_figure(what: EpWhatIf) -> go.Figure:
    """Tokens per expert-parallel rank over the run's MoE layers, as % of the mean rank: the
    contiguous placement beside the EPLB what-if (:func:`bench.metrics.moe.eplb_whatif`)."""
    now = what.rank_loads.sum(axis=0)
    then = what.eplb_rank_loads.sum(axis=0)
    mean = float(now.mean()) or 1.0
    ranks = [f"rank {r}" for r in range(what.ep)]
    title = (
        f"EP {what.ep}: tokens per rank, % of the mean · balancedness {_fmt3(what.balancedness)} contiguous, "
        f"{_fmt3(what.eplb_balancedness)} with EPLB ({what.redundant} redundant)"
    )
    fig = _figure(title, height=340)
    fig.add_trace(
        go.Bar(
            x=ranks, y=100.0 * now / mean, name="contiguous experts (no EPLB)", marker={"color": COLORS[3]},
            hovertemplate="%{x}<br>%{y:.0f} % of the mean<extra>contiguous</extra>",
        )
    )  # fmt: skip
    fig.add_trace(
        go.Bar(
            x=ranks, y=100.0 * then / mean, name=f"EPLB what-if, {what.redundant} redundant",
            marker={"color": COLORS[0]},
            hovertemplate="%{x}<br>%{y:.0f} % of the mean<extra>EPLB</extra>",
        )
    )  # fmt: skip
    fig.add_hline(y=100.0, line={"color": P50_COLOR, "dash": "dash", "width": 2})
    fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.2})
    fig.update_yaxes(title="tokens, % of the mean rank", rangemode="tozero")
    return fig


def _fmt3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"

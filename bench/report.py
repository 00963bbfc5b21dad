"""Reports of sweeps, capacity searches and single runs: tables, figures, recommendations,
a self-contained HTML file and the sweep CSV.

Pure functions over stored data (no Streamlit): stored rows in, plotly figures, dicts or
bytes out. The CLI (``python -m bench report TARGET --html out.html``) and the dashboard's
Sweep page call the same functions.

- :func:`sweep_table`: one row per sweep point, the means over its repeats (and the
  output throughput's min-max spread), its SLO verdict and run ids.
- Figures: :func:`latency_throughput_figure` (TTFT or TPOT p50/p99 against output tok/s,
  with SLO lines and the knee), :func:`pareto_figure` (tok/s one user sees against tok/s
  overall), :func:`goodput_figure` (req/s against the load), :func:`capacity_figure`
  (a capacity search's probes and the bracket it proved), :func:`run_throughput_figure`.
- :func:`knee` and :func:`recommendations`: where to run (definitions in their docstrings).
- :func:`html_report`: the whole report of a run or a sweep as one HTML file (plotly.js
  inlined once, so it opens offline).
- :func:`sweep_csv`: every run of a sweep with its point (columns:
  :data:`SWEEP_CSV_LEAD_COLUMNS`, then the summary columns).

Numbers are never made up: a value that was not measured is an empty cell or no marker.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from bench.metrics import METRIC_DEFINITIONS, PERCENTILES, RunSummary
from bench.plot_style import COLORS, P50_COLOR, P99_COLOR, PRIMARY, register_template
from bench.slo import Slo, judge_summary, parse_slos
from bench.store import SUMMARY_CSV_COLUMNS, RunRow, Store, SweepRow, rows_to_csv
from bench.sweep import PointResult, sweep_points
from engines.errors import MoEBenchError

# --- look: the shared palette and template (bench/plot_style.py), with the report's own colours
PASS_COLOR = "#16A34A"
FAIL_COLOR = "#DC2626"
OTHER_COLOR = "#94A3B8"  # slate: points off the Pareto front
SLO_COLOR = "#374151"  # a limit, not a measurement: dark grey, dashed
KNEE_COLOR = "#F59E0B"
TEMPLATE_NAME = "moebench_report"
LOAD_AXES: tuple[str, ...] = ("request_rate", "concurrency")
KNEE_MIN_BEND = 0.1  # see knee()


def _register_template() -> None:
    register_template(TEMPLATE_NAME, margin={"l": 64, "r": 24, "t": 56, "b": 56})


_register_template()


def _figure(title: str, height: int) -> go.Figure:
    return go.Figure(layout={"template": TEMPLATE_NAME, "title": title, "height": height})


def _empty(title: str, message: str, height: int = 360) -> go.Figure:
    """A blank chart that says why it is blank."""
    fig = _figure(title, height)
    fig.add_annotation(
        text=_esc(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
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


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# --- formatting -----------------------------------------------------------------------------
def _num(v: float | None) -> str:
    """A short number for text: 1,234 / 56.7 / 0.123; empty for None."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    v = float(v)
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _ms(v: float | None) -> str:
    """A latency for a sentence: 850 ms, 1.4 s."""
    if v is None:
        return "not measured"
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{_num(v)} ms"


def _load_value_text(axis: str | None, value: Any) -> str:
    """A marker label: c=16 (concurrency), 8 req/s (request rate)."""
    if value is None:
        return ""
    if axis in ("request_rate", "rate"):
        return f"{float(value):g} req/s"
    if axis == "concurrency":
        return f"c={int(value)}"
    return str(value)


def _axis_title(axis: str | None) -> str:
    if axis in ("request_rate", "rate"):
        return "request rate (req/s)"
    if axis == "concurrency":
        return "concurrency (requests in flight)"
    return "sweep point"


def point_label(point: dict[str, Any]) -> str:
    """``concurrency=16, input_len=128, max_num_seqs=32`` (the repeat left out)."""
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in point.items() if k != "repeat") or "(base)"


# --- points, lines, SLOs ---------------------------------------------------------------------
def load_axis_of(points: Sequence[PointResult]) -> str | None:
    """The load axis of a sweep's points: ``request_rate`` if swept, else ``concurrency``, else None."""
    keys = {k for p in points for k in p.point}
    return next((a for a in LOAD_AXES if a in keys), None)


def split_lines(points: Sequence[PointResult], load_axis: str | None) -> list[list[PointResult]]:
    """The sweep's lines: points sharing every value but the load, each sorted by load. Without a
    load axis (a sweep of lengths or engine options only), one group of every point, in order."""
    if load_axis is None:
        return [list(points)] if points else []
    groups: dict[str, list[PointResult]] = {}
    for p in points:
        key = repr(sorted((k, repr(v)) for k, v in p.point.items() if k != load_axis))
        groups.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: _load_sort_key(p.point.get(load_axis))) for g in groups.values()]


def _load_sort_key(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else float("inf")


def _varying(points: Sequence[PointResult]) -> set[str]:
    """The swept keys whose value differs between the points (the rest say nothing new)."""
    keys = {k for p in points for k in p.point}
    return {k for k in keys if len({repr(p.point.get(k)) for p in points}) > 1}


def _short_label(point: dict[str, Any], keys: set[str]) -> str:
    """The point's values of ``keys`` only (all of them when that leaves nothing), the load
    written short (``c=16``, ``8 req/s``) so labels on a crowded chart do not overlap."""
    shown = {k: v for k, v in point.items() if k in keys} or point
    parts = [
        _load_value_text(k, v) if k in ("concurrency", "request_rate") else f"{k.removeprefix('engine.')}={v}"
        for k, v in shown.items()
        if k != "repeat"
    ]
    return ", ".join(parts) or "(base)"


def _line_label(line: Sequence[PointResult], load_axis: str | None, varying: set[str] | None = None) -> str:
    if not line:
        return ""
    keys = {k for k in line[0].point if k != load_axis and (varying is None or k in varying)}
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in line[0].point.items() if k in keys)


def _as_slos(slos: Sequence[Slo | str] | None) -> list[Slo]:
    if not slos:
        return []
    texts = [s for s in slos if isinstance(s, str)]
    return [s for s in slos if isinstance(s, Slo)] + parse_slos(texts)


def sweep_slos(sweep: SweepRow) -> list[Slo]:
    """The SLOs a sweep or capacity search was run with (its base config's, or the result's)."""
    texts = (sweep.config.get("base") or {}).get("slos") or sweep.result.get("slos") or []
    return parse_slos(texts)


def _repeat_met(summary: RunSummary, slos: Sequence[Slo]) -> bool | None:
    """One repeat's verdict on ``slos``: the run's own exact verdict when it was judged on the
    same SLOs, else the summary's statistics (None when a statistic is not in the summary)."""
    if summary.slo_met is not None and set(summary.slos or ()) == {s.text for s in slos}:
        return summary.slo_met
    if summary.completed == 0:
        return False  # a run with no completed request fails every SLO (bench.slo)
    verdicts = judge_summary(summary.flat(), slos)
    if any(v.value is None for v in verdicts):
        return None
    return all(v.ok for v in verdicts)


def _point_met(p: PointResult, slos: Sequence[Slo]) -> bool | None:
    """Every repeat met every SLO; None without SLOs, without a repeat, or when one is unknown."""
    if not slos or not p.summaries:
        return None
    verdicts = [_repeat_met(s, slos) for s in p.summaries]
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True


def _spread_err(p: PointResult, key: str) -> tuple[float | None, float | None]:
    """(plus, minus) error-bar lengths from the repeats' min-max, or (None, None) with one repeat."""
    mean, spread = p.mean(key), p.spread(key)
    if len(p.summaries) < 2 or mean is None or spread is None:
        return None, None
    return spread[1] - mean, mean - spread[0]


# --- the table ---------------------------------------------------------------------------------
TABLE_METRICS: tuple[tuple[str, str], ...] = (
    ("output_throughput_tok_s", "output (tok/s)"),
    ("output_throughput_tok_s_min", "output min (tok/s)"),
    ("output_throughput_tok_s_max", "output max (tok/s)"),
    ("request_throughput_rps", "requests (req/s)"),
    ("goodput_rps", "goodput (req/s)"),
    ("ttft_ms_p50", "TTFT p50 (ms)"),
    ("ttft_ms_p99", "TTFT p99 (ms)"),
    ("tpot_ms_p50", "TPOT p50 (ms)"),
    ("tpot_ms_p99", "TPOT p99 (ms)"),
    ("e2e_ms_p99", "E2E p99 (ms)"),
    ("failed", "failed requests"),
    ("slo_met", "SLOs met"),
    ("run_ids", "runs"),
)
_POINT_HEADERS = {
    "input_len": "input_len (tokens)",
    "output_len": "output_len (tokens)",
    "concurrency": "concurrency",
    "request_rate": "request rate (req/s)",
}


def sweep_table(points: Sequence[PointResult], slos: Sequence[Slo | str] | None = None) -> list[dict[str, Any]]:
    """One row per point: its swept values, ``repeats`` (completed runs), the means over the
    repeats of the summary metrics in :data:`TABLE_METRICS` (``output_throughput_tok_s_min``/
    ``_max``: the spread), ``failed`` (failed requests, summed), ``slo_met`` (every repeat met
    every SLO; None without SLOs or when a statistic was not measured) and ``run_ids`` (all
    runs, whatever their status). Missing values are None."""
    parsed = _as_slos(slos)
    rows = []
    for p in points:
        row: dict[str, Any] = dict(p.point)
        spread = p.spread("output_throughput_tok_s")
        row["repeats"] = len(p.summaries)
        row["output_throughput_tok_s"] = p.mean("output_throughput_tok_s")
        row["output_throughput_tok_s_min"] = spread[0] if spread else None
        row["output_throughput_tok_s_max"] = spread[1] if spread else None
        for key in ("request_throughput_rps", "goodput_rps", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
                    "tpot_ms_p99", "e2e_ms_p99"):  # fmt: skip
            row[key] = p.mean(key)
        row["failed"] = sum(s.failed for s in p.summaries) if p.summaries else None
        row["slo_met"] = _point_met(p, parsed)
        row["run_ids"] = [r.id for r in p.runs]
        rows.append(row)
    return rows


def table_columns(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(key, header with unit) for :func:`sweep_table`'s rows, point values first."""
    metric_keys = {k for k, _ in TABLE_METRICS} | {"repeats"}
    point_keys = list(dict.fromkeys(k for r in rows for k in r if k not in metric_keys))
    cols = [(k, _POINT_HEADERS.get(k, k.removeprefix("engine."))) for k in point_keys]
    return [*cols, ("repeats", "repeats"), *TABLE_METRICS]


# --- knee and Pareto front ------------------------------------------------------------------------
def _knee_of_line(line: Sequence[PointResult], load_axis: str) -> tuple[PointResult | None, str]:
    data = [
        (float(p.point[load_axis]), t, p)
        for p in line
        if isinstance(p.point.get(load_axis), (int, float)) and (t := p.mean("output_throughput_tok_s")) is not None
    ]
    data.sort(key=lambda d: d[0])
    if len(data) < 3:
        return None, "fewer than 3 points with a measured throughput"
    x0, x1 = data[0][0], data[-1][0]
    ys = [d[1] for d in data]
    lo, hi = min(ys), max(ys)
    if x1 <= x0 or hi <= lo:
        return None, "throughput does not change with the load"
    bends = [(y - lo) / (hi - lo) - (x - x0) / (x1 - x0) for x, y, _ in data]
    i = max(range(len(bends)), key=lambda k: bends[k])
    if bends[i] <= KNEE_MIN_BEND:
        return None, "throughput still grows about in proportion to the load (no bend)"
    return data[i][2], ""


def knee(points: Sequence[PointResult], load_axis: str | None) -> PointResult | None:
    """The knee of output throughput against the load (Kneedle, Satopää et al. 2011).

    The line's points (with a measured mean output tok/s) are sorted by load, both
    coordinates are scaled to 0..1 (load: first to last; throughput: min to max), and the
    knee is the point whose scaled throughput lies furthest above the straight line
    ``y = x`` (the chord of a rising curve): ``max(y_n - x_n)``. Beyond it more load buys
    little throughput. None with fewer than 3 such points, without a load axis, when the
    throughput is flat, or when no point is more than :data:`KNEE_MIN_BEND` (0.1) above
    the chord (throughput still grows about in proportion to the load).

    Points that differ in more than the load (several lines, e.g. two prompt lengths) are
    split into lines (:func:`split_lines`); the knee of the line reaching the highest
    throughput is returned.
    """
    return _knee(points, load_axis)[0]


def _knee(points: Sequence[PointResult], load_axis: str | None) -> tuple[PointResult | None, str]:
    if load_axis is None:
        return None, "the sweep has no load axis (concurrency or request rate)"
    lines = split_lines(points, load_axis)
    best = max(lines, key=lambda ln: max((p.mean("output_throughput_tok_s") or 0.0 for p in ln), default=0.0))
    return _knee_of_line(best, load_axis)


def _per_user_tok_s(p: PointResult) -> float | None:
    tpot = p.mean("tpot_ms_mean")
    return 1000.0 / tpot if tpot is not None and tpot > 0 else None


def pareto_front(points: Sequence[PointResult]) -> list[PointResult]:
    """The points no other point beats on both output tok/s overall and tok/s per user
    (1000 / mean TPOT), sorted by output tok/s."""
    data = [
        (x, y, p)
        for p in points
        if (x := p.mean("output_throughput_tok_s")) is not None and (y := _per_user_tok_s(p)) is not None
    ]
    data.sort(key=lambda d: (-d[0], -d[1]))
    front, best_y = [], float("-inf")
    for x, y, p in data:
        if y > best_y:  # nothing with at least this throughput is as fast per user
            front.append((x, p))
            best_y = y
    return [p for _, p in sorted(front, key=lambda d: d[0])]


# --- figures -----------------------------------------------------------------------------------
def _hover_labels(points: Sequence[PointResult]) -> list[str]:
    out = []
    for p in points:
        n = len(p.summaries)
        out.append(_esc(point_label(p.point)) + (f"<br>mean of {n} repeats" if n > 1 else ""))
    return out


def _error(plus: list[float | None], minus: list[float | None], color: str) -> dict[str, Any] | None:
    if all(v is None for v in plus):
        return None
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "color": color,
            "thickness": 1.2, "width": 4}  # fmt: skip


def latency_throughput_figure(
    points: Sequence[PointResult],
    slos: Sequence[Slo | str] | None = None,
    metric: str = "ttft_ms",
    load_axis: str | None = None,
) -> go.Figure:
    """``metric`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``itl_ms``) p50 and p99 (ms) against
    output tok/s, one marker per point labelled with its load, error bars from the repeats'
    min-max (where a point has more than one), a dashed line per SLO on ``metric`` and an amber
    ring on each line's knee (:func:`knee`). ``load_axis`` defaults to :func:`load_axis_of`;
    without one the points are labelled with their values and not joined."""
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
    varying = _varying([p for ln in lines for p in ln])
    y_top = 0.0
    for li, line in enumerate(lines):
        xs = [p.mean("output_throughput_tok_s") for p in line]
        x_err = [_spread_err(p, "output_throughput_tok_s") for p in line]
        suffix = f" · {_esc(_line_label(line, axis, varying))}" if multi else ""
        k = _knee_of_line(line, axis)[0] if axis else None
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
            y_err = [_spread_err(p, key) for p in line]
            y_top = max(y_top, *[(y or 0.0) + (e[0] or 0.0) for y, e in zip(ys, y_err, strict=True)])
            color = (P50_COLOR if stat == "p50" else P99_COLOR) if not multi else COLORS[li % len(COLORS)]
            labelled = stat == "p99"
            fig.add_trace(
                go.Scatter(
                    x=xs, y=ys, name=f"{name} {stat}{suffix}",
                    mode=("lines+" if axis else "") + ("markers+text" if labelled else "markers"),
                    text=[_esc(_load_value_text(axis, p.point.get(axis)) if axis else _short_label(p.point, varying))
                          for p in line] if labelled else None,
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
    for slo in _as_slos(slos):
        if slo.metric != metric:
            continue
        y_top = max(y_top, slo.limit_ms)
        fig.add_hline(
            y=slo.limit_ms, name=f"SLO {slo.label}", line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=_esc(slo.label), annotation_position="top left",
            annotation_font={"color": SLO_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
    x_top = max((p.mean("output_throughput_tok_s") or 0.0) + (_spread_err(p, "output_throughput_tok_s")[0] or 0.0)
                for line in lines for p in line)  # fmt: skip
    # Head-room: the load labels above the highest markers and the SLO labels stay inside.
    fig.update_xaxes(title="output throughput (tokens/s)", range=[0, x_top * 1.12 or 1.0])
    fig.update_yaxes(title=f"{name} (ms)", range=[0, y_top * 1.18 or 1.0])
    _legend_below(fig, height)
    return fig


def pareto_figure(points: Sequence[PointResult]) -> go.Figure:
    """Output tok/s one user sees (1000 / mean TPOT) against output tok/s overall; the Pareto
    front (:func:`pareto_front`) highlighted and joined, the other points grey, every point
    labelled with its swept values."""
    title = "Per-user speed (1000 / mean TPOT) vs total throughput"
    height = 480
    data = [
        (x, y, p)
        for p in points
        if (x := p.mean("output_throughput_tok_s")) is not None and (y := _per_user_tok_s(p)) is not None
    ]
    if not data:
        return _empty(title, "no point with a measured TPOT and output throughput", height)
    front = pareto_front(points)
    front_ids = {id(p) for p in front}
    fig = _figure(title, height)
    others = [d for d in data if id(d[2]) not in front_ids]
    varying = _varying([d[2] for d in data])
    hover = "%{customdata}<br>%{x:,.4g} output tok/s overall<br>%{y:,.4g} tok/s per user<extra></extra>"
    if others:
        fig.add_trace(
            go.Scatter(
                x=[d[0] for d in others], y=[d[1] for d in others], mode="markers+text", name="other points",
                text=[_esc(_short_label(d[2].point, varying)) for d in others], textposition="bottom center",
                textfont={"size": 10, "color": "#6B7280"}, cliponaxis=False,
                marker={"size": 9, "color": OTHER_COLOR, "line": {"color": "white", "width": 1}},
                customdata=_hover_labels([d[2] for d in others]), hovertemplate=hover,
            )
        )  # fmt: skip
    fx = [p.mean("output_throughput_tok_s") or 0.0 for p in front]
    fy = [_per_user_tok_s(p) for p in front]
    x_top = max(d[0] for d in data)
    # Labels alternate above and below the front, so neighbours do not print over each other, and
    # lean left in the right quarter, so none runs off the chart.
    where = [f"{'top' if i % 2 == 0 else 'bottom'} {'left' if x > 0.75 * x_top else 'right'}" for i, x in enumerate(fx)]
    fig.add_trace(
        go.Scatter(
            x=fx, y=fy, mode="lines+markers+text", name="Pareto front", line={"color": PRIMARY, "width": 2},
            text=[_esc(_short_label(p.point, varying)) for p in front], textposition=where,
            textfont={"size": 11, "color": PRIMARY}, cliponaxis=False,
            marker={"size": 12, "color": PRIMARY, "line": {"color": "white", "width": 2}},
            customdata=_hover_labels(front), hovertemplate=hover,
        )
    )  # fmt: skip
    y_top = max(d[1] for d in data)
    fig.update_xaxes(title="output throughput, all users (tokens/s)", range=[0, x_top * 1.15 or 1.0])
    fig.update_yaxes(title="per-user speed (tokens/s)", range=[0, y_top * 1.2 or 1.0])
    _legend_below(fig, height)
    return fig


def goodput_figure(points: Sequence[PointResult], load_axis: str | None = None) -> go.Figure:
    """Request throughput and goodput (req/s) against the load; for a request-rate sweep also
    the offered load (y = x), which a server that keeps up follows."""
    axis = load_axis or load_axis_of(points)
    title = f"Throughput and goodput vs {_axis_title(axis).split(' (')[0]}"
    height = 440
    lines = [[p for p in ln if p.mean("request_throughput_rps") is not None] for ln in split_lines(points, axis)]
    lines = [ln for ln in lines if ln]
    if not lines:
        return _empty(title, "no point with a measured request throughput", height)
    fig = _figure(title, height)
    multi = len(lines) > 1
    varying = _varying([p for ln in lines for p in ln])
    any_goodput = False
    top = 0.0
    for li, line in enumerate(lines):
        xs = [p.point.get(axis) if axis else _esc(point_label(p.point)) for p in line]
        suffix = f" · {_esc(_line_label(line, axis, varying))}" if multi else ""
        for key, label, color, dash in (
            ("request_throughput_rps", "throughput", PRIMARY, "solid"),
            ("goodput_rps", "goodput", P50_COLOR, "dash"),
        ):
            ys = [p.mean(key) for p in line]
            if all(y is None for y in ys):
                continue
            any_goodput |= key == "goodput_rps"
            err = [_spread_err(p, key) for p in line]
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
    fig.update_xaxes(title=_axis_title(axis), rangemode="tozero", type=None if axis else "category")
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
    slos = _as_slos(res.get("slos") or (sweep.config.get("base") or {}).get("slos") or [])
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
                    customdata=[f"probe {d[0]}: {_esc(_load_value_text(axis, d[1]['value']))}<br>"
                                f"{_esc(d[1].get('why') or '')}" for d in sel],
                    hovertemplate=f"%{{customdata}}<br>{_esc(slo.label.split(' ≤')[0])} %{{y:,.4g}} ms"
                    "<extra></extra>",
                ),
                row=row, col=1,
            )  # fmt: skip
        fig.add_hline(
            y=slo.limit_ms, row=row, col=1, name=f"SLO {slo.label}",
            line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=_esc(slo.label), annotation_position="top left",
            annotation_font={"color": SLO_COLOR, "size": 12}, annotation_bgcolor="rgba(255,255,255,0.85)",
        )  # fmt: skip
        fig.update_yaxes(title_text=f"{_esc(slo.label.split(' ≤')[0])} (ms)", range=[0, top * 1.2], row=row, col=1)
        if lo is not None and hi is not None:
            fig.add_vrect(
                x0=float(lo), x1=float(hi), row=row, col=1, name="bracket", fillcolor=PASS_COLOR, opacity=0.1,
                line_width=0, layer="below",
            )  # fmt: skip
    if lo is not None and hi is not None:  # the bracket is said in the title: no label over the probes
        fig.update_layout(
            title=f"{title}: passes at {_esc(_load_value_text(axis, lo))}, fails at "
            f"{_esc(_load_value_text(axis, hi))} (shaded)"
        )
    elif lo is not None:
        fig.update_layout(title=f"{title}: passes up to {_esc(_load_value_text(axis, lo))}")
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
    fig.update_xaxes(title_text=_axis_title(axis), row=n, col=1)
    _legend_below(fig, height, top=72, bottom=150)
    return fig


def run_throughput_figure(series: Sequence[tuple[float, float | None]]) -> go.Figure:
    """A run's per-second output tok/s (``(t_s, value)`` pairs, seconds since the run's start)."""
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
    return fig


# --- recommendations -------------------------------------------------------------------------------
def _values_text(p: PointResult) -> str:
    parts = [f"{_num(p.mean('output_throughput_tok_s'))} output tok/s"]
    for key, label in (("ttft_ms_p99", "TTFT p99"), ("tpot_ms_p99", "TPOT p99")):
        v = p.mean(key)
        if v is not None:
            parts.append(f"{label} {_ms(v)}")
    return ", ".join(parts)


def _pick(p: PointResult | None, text: str, rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {"point": dict(p.point) if p else None, "row": rows.get(id(p)) if p else None, "text": text}


def _closest(points: Sequence[PointResult], slos: Sequence[Slo]) -> str:
    """The point nearest to meeting the SLOs (smallest worst value / limit), as text."""
    best: tuple[float, PointResult, str] | None = None
    for p in points:
        row = {f"{s.metric}_{s.stat}": p.mean(f"{s.metric}_{s.stat}") for s in slos}
        verdicts = judge_summary(row, slos)
        if not verdicts or any(v.margin is None for v in verdicts):
            continue
        worst = max(verdicts, key=lambda v: v.margin or 0.0)
        assert worst.margin is not None
        if best is None or worst.margin < best[0]:
            label = worst.slo.label.split(" ≤")[0]
            best = (worst.margin, p, f"{label} {_ms(worst.value)}, {worst.margin - 1:.0%} over")
    if best is None:
        return ""
    return f"; closest: {point_label(best[1].point)} ({best[2]})"


def recommendations(
    points: Sequence[PointResult], slos: Sequence[Slo | str] | None = None, load_axis: str | None = None
) -> dict[str, Any]:
    """Where to run, from a sweep's points. Three picks, each ``{"point", "row", "text"}``
    (``point``/``row``: the point's values and its :func:`sweep_table` row, None when there is
    no such point; ``text``: one sentence):

    - ``best``: the highest mean output tok/s among the points that met every SLO
      (``slo_met``, every repeat); with no SLOs, the highest overall, and the sentence says so;
      when no point met them, ``point`` is None and the sentence says "No point meets the
      SLOs" (and which came closest).
    - ``lowest_latency``: the lowest mean TTFT p50 (a tie goes to the higher throughput).
    - ``knee``: :func:`knee` of output tok/s against the load.

    Also ``slos`` (their labels), ``met_any`` (None without SLOs) and ``texts`` (the three
    sentences in order)."""
    parsed = _as_slos(slos)
    axis = load_axis or load_axis_of(points)
    measured = [p for p in points if p.mean("output_throughput_tok_s") is not None]
    rows = {id(p): r for p, r in zip(points, sweep_table(points, parsed), strict=True)}
    slo_text = ", ".join(s.label for s in parsed)
    met_any: bool | None = None
    if not measured:
        best = _pick(None, "No point has a completed run yet.", rows)
    elif not parsed:
        p = max(measured, key=lambda q: q.mean("output_throughput_tok_s") or 0.0)
        best = _pick(p, f"Best throughput (no SLOs set, so over every point): {point_label(p.point)}, "
                        f"{_values_text(p)}", rows)  # fmt: skip
    else:
        verdicts = {id(p): _point_met(p, parsed) for p in measured}
        ok = [p for p in measured if verdicts[id(p)] is True]
        met_any = bool(ok)
        if ok:
            p = max(ok, key=lambda q: q.mean("output_throughput_tok_s") or 0.0)
            best = _pick(p, f"Best throughput within the SLOs: {point_label(p.point)}, {_values_text(p)}", rows)
        else:
            unknown = sum(1 for p in measured if verdicts[id(p)] is None)
            extra = f"; {unknown} point(s) could not be judged (statistic not measured)" if unknown else ""
            best = _pick(None, f"No point meets the SLOs ({slo_text}){_closest(measured, parsed)}{extra}.", rows)
    with_ttft = [p for p in measured if p.mean("ttft_ms_p50") is not None]
    if with_ttft:
        p = min(with_ttft, key=lambda q: (q.mean("ttft_ms_p50") or 0.0, -(q.mean("output_throughput_tok_s") or 0.0)))
        low = _pick(
            p,
            f"Lowest latency: {point_label(p.point)}, TTFT p50 {_ms(p.mean('ttft_ms_p50'))} "
            f"(p99 {_ms(p.mean('ttft_ms_p99'))}), {_num(p.mean('output_throughput_tok_s'))} output tok/s",
            rows,
        )
    else:
        low = _pick(None, "Lowest latency: no point measured a TTFT.", rows)
    k, why = _knee(points, axis)
    axis_name = _axis_title(axis).split(" (")[0]
    if k is not None:
        kn = _pick(
            k,
            f"Knee of output throughput vs {axis_name}: {point_label(k.point)}, "
            f"{_num(k.mean('output_throughput_tok_s'))} output tok/s (beyond it more load adds little throughput)",
            rows,
        )
    else:
        kn = _pick(None, f"No knee: {why}.", rows)
    return {
        "best": best,
        "lowest_latency": low,
        "knee": kn,
        "slos": [s.label for s in parsed],
        "met_any": met_any,
        "texts": [best["text"], low["text"], kn["text"]],
    }


# --- the sweep CSV ------------------------------------------------------------------------------------
SWEEP_CSV_LEAD_COLUMNS: tuple[str, ...] = (
    "sweep_id",
    "input_len",
    "output_len",
    "concurrency",
    "request_rate",
    "repeat",
)  # each swept engine option's ``engine.<option>`` column goes between request_rate and repeat


def sweep_csv_columns(engine_options: Sequence[str] = ()) -> tuple[str, ...]:
    """The sweep CSV's columns: the lead (engine options before ``repeat``), then the summary
    CSV's (:data:`bench.store.SUMMARY_CSV_COLUMNS`) minus the two the lead already has."""
    lead = [*SWEEP_CSV_LEAD_COLUMNS[:-1], *(f"engine.{o.removeprefix('engine.')}" for o in engine_options), "repeat"]
    return (*lead, *(c for c in SUMMARY_CSV_COLUMNS if c not in lead))


def _sweep_csv_row(sweep_id: int, run: RunRow, engine_keys: Sequence[str]) -> dict[str, Any]:
    point = dict(run.sweep_point or {})
    if "rate" in point:  # a capacity probe on the rate axis
        point["request_rate"] = point.pop("rate")
    row = run.summary_row()
    workload = run.config.get("workload") or {}
    exact = (workload.get("source") or "random") == "random"  # other sources' lengths are not input_len
    row.update(
        sweep_id=sweep_id,
        input_len=point.get("input_len", workload.get("input_len") if exact else None),
        output_len=point.get("output_len", workload.get("output_len") if exact else None),
        concurrency=point.get("concurrency", row.get("concurrency")),
        request_rate=point.get("request_rate", row.get("request_rate") or run.config.get("request_rate")),
        repeat=point.get("repeat"),
    )
    engine = run.config.get("engine") or {}
    for key in engine_keys:
        row[key] = point.get(key, engine.get(key.removeprefix("engine.")))
    return row


def sweep_csv(store: Store, sweep_id: int) -> bytes:
    """One row per run of a sweep or capacity search, in run order (columns:
    :func:`sweep_csv_columns`): the sweep id, the point (a value not swept is the run's own;
    ``input_len``/``output_len`` only for random prompts), the repeat, then the run's summary."""
    if store.get_sweep(sweep_id) is None:
        raise MoEBenchError(f"no sweep {sweep_id} in {store.path}")
    runs = store.sweep_runs(sweep_id)
    engine_keys = sorted({k for r in runs for k in (r.sweep_point or {}) if k.startswith("engine.")})
    columns = sweep_csv_columns(engine_keys)
    return rows_to_csv(columns, [_sweep_csv_row(sweep_id, r, engine_keys) for r in runs])


# --- the HTML report ------------------------------------------------------------------------------------
_TARGET_RUN = re.compile(r"(?:run:)?(\d+)")
_TARGET_SWEEP = re.compile(r"(?:sweep:|capacity:|s)(\d+)")


def parse_target(target: str) -> tuple[str, int]:
    """``"12"``/``"run:12"`` -> ("run", 12); ``"sweep:3"``/``"s3"``/``"capacity:3"`` -> ("sweep", 3)."""
    text = str(target).strip().lower()
    if m := _TARGET_RUN.fullmatch(text):
        return "run", int(m.group(1))
    if m := _TARGET_SWEEP.fullmatch(text):
        return "sweep", int(m.group(1))
    shown = str(target) if len(str(target)) <= 60 else str(target)[:57] + "..."
    raise MoEBenchError(
        f"bad report target {shown!r}: give a run (12 or run:12) or a sweep or capacity search (sweep:3 or s3)"
    )


_CSS = """
body{font-family:Inter,'Source Sans Pro','Segoe UI',system-ui,sans-serif;color:#1F2937;margin:0;background:#F8FAFC}
main{max-width:1180px;margin:0 auto;padding:28px 32px 64px}
h1{font-size:26px;margin:0 0 4px;color:#111827}
h2{font-size:19px;margin:36px 0 12px;color:#111827;border-bottom:1px solid #E5E7EB;padding-bottom:6px}
.meta{color:#6B7280;font-size:13px;margin-bottom:8px}
.card{background:white;border:1px solid #E5E7EB;border-radius:10px;padding:14px 18px;margin:12px 0}
.figure{background:white;border:1px solid #E5E7EB;border-radius:10px;padding:8px;margin:14px 0}
table{border-collapse:collapse;font-size:13px;background:white;width:100%}
th,td{border-bottom:1px solid #EEF0F6;padding:6px 10px;text-align:left;vertical-align:top}
th{background:#F1F5F9;font-weight:600;color:#374151;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even) td{background:#FAFBFD}
.scroll{overflow-x:auto}
table.kv th{width:240px}
ul.rec{margin:0;padding-left:20px} ul.rec li{margin:6px 0}
.ok{color:#166534;font-weight:600}.bad{color:#B91C1C;font-weight:600}
.warn{background:#FFFBEB;border-color:#FCD34D}
dl.defs dt{font-family:ui-monospace,Menlo,monospace;font-size:13px;margin-top:8px;color:#111827}
dl.defs dd{margin:2px 0 0 18px;font-size:13px;color:#374151}
code{font-family:ui-monospace,Menlo,monospace;font-size:12px}
"""


def _cell(v: Any) -> tuple[str, bool]:
    """(escaped text, is a number) for a table cell; None is an empty cell."""
    if v is None:
        return "", False
    if isinstance(v, bool):
        return ("yes" if v else "no"), False
    if isinstance(v, (int, float)):
        return _esc(_num(v)), True
    if isinstance(v, (list, tuple)):
        return _esc(", ".join(str(x) for x in v)), False
    if isinstance(v, dict):
        return _esc(", ".join(f"{k}={x}" for k, x in v.items() if x not in (None, "", [], {}))), False
    return _esc(v), False


def _table(columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for _, h in columns)
    body = []
    for row in rows:
        cells = []
        for key, _ in columns:
            text, numeric = _cell(row.get(key))
            cells.append(f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _kv_table(items: Sequence[tuple[str, Any]]) -> str:
    rows = []
    for k, v in items:
        text, _ = _cell(v)
        rows.append(f"<tr><th>{_esc(k)}</th><td>{text}</td></tr>")
    return f'<table class="kv">{"".join(rows)}</table>'


class _Page:
    """An HTML report being built: sections in order, figures as divs over one plotly.js."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{_esc(text)}</h2>")

    def figure(self, fig: go.Figure) -> None:
        self.figures += 1
        div = fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=f"figure-{self.figures}",
            config={"displaylogo": False, "responsive": True},
        )  # fmt: skip
        self.parts.append(f'<div class="figure">{div}</div>')

    def render(self) -> bytes:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs() if self.figures else ""
        head = (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(self.title)}</title><style>{_CSS}</style>"
            + (f'<script type="text/javascript">{js}</script>' if js else "")
            + "</head><body><main>"
        )
        return (head + "".join(self.parts) + "</main></body></html>").encode("utf-8")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else ""


def _header(page: _Page, meta: Sequence[tuple[str, Any]]) -> None:
    page.add(f"<h1>{_esc(page.title)}</h1>")
    shown = [f"{_esc(k)}: {_cell(v)[0]}" for k, v in meta if v not in (None, "")]
    page.add(f'<div class="meta">{" · ".join(shown)}</div>')


def _definitions(page: _Page) -> None:
    page.h2("Metric definitions")
    items = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in METRIC_DEFINITIONS.items())
    page.add(
        f'<div class="card"><dl class="defs">{items}</dl><p class="meta">Latencies are in ms, throughputs per '
        "second of the run's wall-clock duration; a value that was not measured is an empty cell. Sweep tables "
        "show the mean over a point's repeats.</p></div>"
    )


def _config_items(config: dict[str, Any], run: RunRow | None) -> list[tuple[str, Any]]:
    engine = dict(config.get("engine") or {})
    items: list[tuple[str, Any]] = [
        ("engine", run.engine if run else engine.get("kind")),
        ("model", run.model if run else engine.get("model")),
        ("accelerator", run.accelerator if run else engine.get("accelerator")),
        ("engine options", {k: v for k, v in engine.items() if k not in ("kind", "model", "accelerator")}),
        ("mode", config.get("mode")),
        ("workload", config.get("workload")),
        ("requests", config.get("requests")),
        ("concurrency", config.get("concurrency")),
        ("request rate (req/s)", config.get("request_rate")),
        ("duration (s)", config.get("duration_s")),
        ("SLOs", [s.label for s in _as_slos(config.get("slos") or [])] or None),
    ]
    return [(k, v) for k, v in items if v not in (None, {}, [])]


def _run_report(store: Store, run: RunRow) -> bytes:
    from bench.recorder import SERIES_OUTPUT_TOK_S

    page = _Page(f"Run {run.id}: {run.name}" if run.name else f"Run {run.id}")
    in_sweep = f"{run.sweep_id} ({point_label(run.sweep_point or {})})" if run.sweep_id else None
    _header(page, [("generated", _when(time.time())), ("status", run.status), ("created", _when(run.created_at)),
                   ("finished", _when(run.finished_at)), ("mode", run.mode), ("sweep", in_sweep)])  # fmt: skip
    if run.error:
        page.add(f'<div class="card warn">{_esc(run.error)}</div>')
    page.h2("Configuration")
    page.add(f'<div class="card">{_kv_table(_config_items(run.config, run))}</div>')
    s = run.summary
    if s is None:
        page.add('<div class="card warn">This run has no summary (it measured nothing).</div>')
    else:
        for warning in (s.load_warning, s.burst_warning):
            if warning:
                page.add(f'<div class="card warn">{_esc(warning)}</div>')
        slos = _as_slos(s.slos or [])
        if slos:
            page.h2("SLOs")
            verdicts = judge_summary(s.flat(), slos)
            met = "met" if s.slo_met else "not met"
            lis = "".join(
                f'<li><span class="{"ok" if v.ok else "bad"}">{"ok" if v.ok else "FAILED"}</span> '
                f"{_esc(v.slo.label)}: {_esc(_ms(v.value))}</li>"
                for v in verdicts
            )
            page.add(
                f'<div class="card"><p>SLOs <span class="{"ok" if s.slo_met else "bad"}">{met}</span> '
                f"(each statistic over all completed requests); goodput {_esc(_num(s.goodput_rps))} req/s "
                f"({_esc(_num(s.good_requests))} good requests).</p><ul class=rec>{lis}</ul></div>"
            )
        page.h2("Summary")
        flat = s.flat()
        summary_items = [
            ("requests", flat.get("requests")), ("completed", flat.get("completed")), ("failed", flat.get("failed")),
            ("duration (s)", flat.get("duration_s")), ("prompt tokens", flat.get("prompt_tokens")),
            ("output tokens", flat.get("output_tokens")),
            ("output throughput (tok/s)", flat.get("output_throughput_tok_s")),
            ("total throughput (tok/s)", flat.get("total_throughput_tok_s")),
            ("request throughput (req/s)", flat.get("request_throughput_rps")),
            ("goodput (req/s)", flat.get("goodput_rps")), ("SLOs met", flat.get("slo_met")),
            ("peak memory (GiB)", flat.get("peak_memory_gib")),
            ("usage mismatches (requests)", flat.get("usage_mismatches")),
        ]  # fmt: skip
        page.add(f'<div class="card">{_kv_table(summary_items)}</div>')
        page.h2("Latency percentiles (ms)")
        stats = ["mean", *(f"p{q}" for q in PERCENTILES), "max"]
        lat_rows = []
        for metric, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
            st = getattr(s, metric)
            lat_rows.append({"metric": label, "count": st.count, **{k: getattr(st, k) for k in stats}})
        if s.send_lag_ms is not None:
            st = s.send_lag_ms
            lat_rows.append({"metric": "send lag", "count": st.count, **{k: getattr(st, k) for k in stats}})
        cols = [("metric", "metric"), ("count", "values"), *((k, f"{k} (ms)") for k in stats)]
        page.add(_table(cols, lat_rows))
    page.h2("Output throughput over time")
    series = [(t, v) for t, _, v in store.timeseries(run.id, [SERIES_OUTPUT_TOK_S])]
    page.figure(run_throughput_figure(series))
    _definitions(page)
    return page.render()


def _sweep_config_items(sweep: SweepRow, first: RunRow | None) -> list[tuple[str, Any]]:
    cfg = sweep.config
    items = _config_items(cfg.get("base") or {}, first)
    if sweep.kind == "capacity":
        unit = " (req/s)" if cfg.get("axis") == "rate" else ""
        items += [
            ("search axis", "request rate" if cfg.get("axis") == "rate" else cfg.get("axis")),
            (f"first probe{unit}", cfg.get("start")),
            (f"maximum{unit}", cfg.get("maximum")),
            (f"resolution{unit}", cfg.get("step")),
            ("run budget", cfg.get("budget")),
            ("max failed requests (fraction)", cfg.get("max_error_rate")),
        ]
    else:
        swept = [
            ("swept concurrency", cfg.get("concurrency")),
            ("swept request rate (req/s)", cfg.get("request_rate")),
            ("swept (input_len, output_len)", [f"({a}, {b})" for a, b in cfg.get("lengths") or []]),
            *((f"swept engine {k}", v) for k, v in (cfg.get("engine_axis") or {}).items()),
            ("repeats per point", cfg.get("repeats")),
            ("stop on saturation (gain)", cfg.get("stop_on_saturation")),
            ("stop on errors (fraction)", cfg.get("stop_on_errors")),
            ("stop on SLO margin (fraction)", cfg.get("stop_on_slo_margin")),
        ]
        items += swept
    return [(k, v) for k, v in items if v not in (None, [], {})]


def _sweep_report(store: Store, sweep: SweepRow) -> bytes:
    runs = store.sweep_runs(sweep.id)
    what = "Capacity search" if sweep.kind == "capacity" else "Sweep"
    page = _Page(f"{what} {sweep.id}: {sweep.name}" if sweep.name else f"{what} {sweep.id}")
    _header(page, [("generated", _when(time.time())), ("status", sweep.status), ("created", _when(sweep.created_at)),
                   ("finished", _when(sweep.finished_at)), ("runs", len(runs))])  # fmt: skip
    if sweep.error:
        page.add(f'<div class="card warn">{_esc(sweep.error)}</div>')
    page.h2("Configuration")
    first = next((r for r in runs), None)
    page.add(f'<div class="card">{_kv_table(_sweep_config_items(sweep, first))}</div>')
    if sweep.kind == "capacity":
        res = sweep.result or {}
        page.h2("Verdict")
        verdict = res.get("verdict") or "the search has not finished"
        converged = res.get("converged")
        note = (
            "" if converged is None
            else " The bracket is one step wide." if converged
            else " The bracket is wider than one step (budget or maximum reached)."
        )  # fmt: skip
        page.add(f'<div class="card"><p>{_esc(verdict)}.{_esc(note)}</p></div>')
        page.figure(capacity_figure(sweep, runs))
        page.h2("Probes")
        by_id = {r.id: r for r in runs}
        rows = []
        for i, probe in enumerate(res.get("probes") or [], start=1):
            run = by_id.get(int(probe.get("run_id") or 0))
            flat = run.summary.flat() if run is not None and run.summary is not None else {}
            rows.append({
                "probe": i, "value": probe.get("value"), "passed": probe.get("passed"), "why": probe.get("why"),
                "run_id": probe.get("run_id"), "output_throughput_tok_s": flat.get("output_throughput_tok_s"),
                "goodput_rps": flat.get("goodput_rps"), "ttft_ms_p99": flat.get("ttft_ms_p99"),
                "tpot_ms_p99": flat.get("tpot_ms_p99"), "failed": flat.get("failed"),
            })  # fmt: skip
        axis = res.get("axis") or sweep.config.get("axis")
        cols = [("probe", "probe"), ("value", _axis_title(axis)), ("passed", "passed"), ("why", "verdict"),
                ("run_id", "run"), ("output_throughput_tok_s", "output (tok/s)"), ("goodput_rps", "goodput (req/s)"),
                ("ttft_ms_p99", "TTFT p99 (ms)"), ("tpot_ms_p99", "TPOT p99 (ms)"),
                ("failed", "failed requests")]  # fmt: skip
        page.add(_table(cols, rows))
    else:
        points = sweep_points(store, sweep.id)
        slos = sweep_slos(sweep)
        axis = load_axis_of(points)
        rec = recommendations(points, slos, axis)
        page.h2("Recommendations")
        lis = "".join(f"<li>{_esc(t)}</li>" for t in rec["texts"])
        page.add(f'<div class="card"><ul class="rec">{lis}</ul></div>')
        stopped = (sweep.result or {}).get("stopped") or []
        if stopped:
            lis = "".join(f"<li>after {_esc(point_label(s.get('after') or {}))}: {_esc(s.get('reason'))}</li>"
                          for s in stopped)  # fmt: skip
            page.add(f'<div class="card warn"><p>Lines stopped early:</p><ul class="rec">{lis}</ul></div>')
        page.h2("Charts")
        page.figure(latency_throughput_figure(points, slos, "ttft_ms", axis))
        page.figure(latency_throughput_figure(points, slos, "tpot_ms", axis))
        page.figure(pareto_figure(points))
        page.figure(goodput_figure(points, axis))
        page.h2("Points")
        rows = sweep_table(points, slos)
        page.add(_table(table_columns(rows), rows))
    _definitions(page)
    return page.render()


def html_report(store: Store, target: str) -> bytes:
    """A self-contained HTML report (UTF-8 bytes) of a run (``"12"``, ``"run:12"``) or of a sweep
    or capacity search (``"sweep:3"``, ``"s3"``): the configuration, the recommendations or
    the capacity verdict, the figures, the tables and the metric definitions; for a run, its
    summary, latency percentiles and per-second output tok/s. plotly.js is inlined once, so
    the file opens offline. Every text from the data is HTML-escaped.
    Raises :class:`MoEBenchError` for a bad or unknown target."""
    kind, ident = parse_target(target)
    if kind == "run":
        run = store.get_run(ident)
        if run is None:
            raise MoEBenchError(f"no run {ident} in {store.path}")
        return _run_report(store, run)
    sweep = store.get_sweep(ident)
    if sweep is None:
        raise MoEBenchError(f"no sweep or capacity search {ident} in {store.path}")
    return _sweep_report(store, sweep)

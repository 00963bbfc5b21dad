"""Sweep analysis as numbers: points grouped into lines, the table of points, the knee, the Pareto
front and the recommendations (definitions in their docstrings). Pure functions over stored sweep
points; the figures and the HTML page that show them are :mod:`bench.report`.

Numbers are never made up: a value that was not measured is an empty cell or no marker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.metrics.slo import Slo, judge_summary, parse_slos
from bench.metrics.summary import RunSummary
from bench.store.rows import SweepRow
from bench.sweep.spec import PointResult

LOAD_AXES: tuple[str, ...] = ("request_rate", "concurrency")
KNEE_MIN_BEND = 0.1  # see knee()


# --- formatting -----------------------------------------------------------------------------
def fmt_num(v: float | None) -> str:
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


def fmt_ms(v: float | None) -> str:
    """A latency for a sentence: 850 ms, 1.4 s."""
    if v is None:
        return "not measured"
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{fmt_num(v)} ms"


def load_value_text(axis: str | None, value: Any) -> str:
    """A marker label: c=16 (concurrency), 8 req/s (request rate)."""
    if value is None:
        return ""
    if axis in ("request_rate", "rate"):
        return f"{float(value):g} req/s"
    if axis == "concurrency":
        return f"c={int(value)}"
    return str(value)


def axis_title(axis: str | None) -> str:
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


def varying_keys(points: Sequence[PointResult]) -> set[str]:
    """The swept keys whose value differs between the points (the rest say nothing new)."""
    keys = {k for p in points for k in p.point}
    return {k for k in keys if len({repr(p.point.get(k)) for p in points}) > 1}


def short_label(point: dict[str, Any], keys: set[str]) -> str:
    """The point's values of ``keys`` only (all of them when that leaves nothing), the load
    written short (``c=16``, ``8 req/s``) so labels on a crowded chart do not overlap."""
    shown = {k: v for k, v in point.items() if k in keys} or point
    parts = [
        load_value_text(k, v) if k in ("concurrency", "request_rate") else f"{k.removeprefix('engine.')}={v}"
        for k, v in shown.items()
        if k != "repeat"
    ]
    return ", ".join(parts) or "(base)"


def line_label(line: Sequence[PointResult], load_axis: str | None, varying: set[str] | None = None) -> str:
    if not line:
        return ""
    keys = {k for k in line[0].point if k != load_axis and (varying is None or k in varying)}
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in line[0].point.items() if k in keys)


def as_slos(slos: Sequence[Slo | str] | None) -> list[Slo]:
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
        return False  # a run with no completed request fails every SLO (bench.metrics.slo)
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


def spread_err(p: PointResult, key: str) -> tuple[float | None, float | None]:
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
    ("disturbed", "disturbed (why)"),
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
    parsed = as_slos(slos)
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
        row["disturbed"] = p.disturbed  # a figure measured while the host or the client was disturbed
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
def knee_of_line(line: Sequence[PointResult], load_axis: str) -> tuple[PointResult | None, str]:
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
    return knee_of_line(best, load_axis)


def per_user_tok_s(p: PointResult) -> float | None:
    tpot = p.mean("tpot_ms_mean")
    return 1000.0 / tpot if tpot is not None and tpot > 0 else None


def pareto_front(points: Sequence[PointResult]) -> list[PointResult]:
    """The points no other point beats on both output tok/s overall and tok/s per user
    (1000 / mean TPOT), sorted by output tok/s."""
    data = [
        (x, y, p)
        for p in points
        if (x := p.mean("output_throughput_tok_s")) is not None and (y := per_user_tok_s(p)) is not None
    ]
    data.sort(key=lambda d: (-d[0], -d[1]))
    front, best_y = [], float("-inf")
    for x, y, p in data:
        if y > best_y:  # nothing with at least this throughput is as fast per user
            front.append((x, p))
            best_y = y
    return [p for _, p in sorted(front, key=lambda d: d[0])]


# --- figures -----------------------------------------------------------------------------------


def _values_text(p: PointResult) -> str:
    parts = [f"{fmt_num(p.mean('output_throughput_tok_s'))} output tok/s"]
    for key, label in (("ttft_ms_p99", "TTFT p99"), ("tpot_ms_p99", "TPOT p99")):
        v = p.mean(key)
        if v is not None:
            parts.append(f"{label} {fmt_ms(v)}")
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
            label = worst.slo.figure
            shown = fmt_ms(worst.value) if worst.slo.unit == "ms" else f"{worst.value:.4g} {worst.slo.unit}"
            best = (
                worst.margin,
                p,
                f"{label} {shown}, {worst.margin - 1:.0%} {'short' if worst.slo.at_least else 'over'}",
            )
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
    parsed = as_slos(slos)
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
            f"Lowest latency: {point_label(p.point)}, TTFT p50 {fmt_ms(p.mean('ttft_ms_p50'))} "
            f"(p99 {fmt_ms(p.mean('ttft_ms_p99'))}), {fmt_num(p.mean('output_throughput_tok_s'))} output tok/s",
            rows,
        )
    else:
        low = _pick(None, "Lowest latency: no point measured a TTFT.", rows)
    k, why = _knee(points, axis)
    axis_name = axis_title(axis).split(" (")[0]
    if k is not None:
        kn = _pick(
            k,
            f"Knee of output throughput vs {axis_name}: {point_label(k.point)}, "
            f"{fmt_num(k.mean('output_throughput_tok_s'))} output tok/s (beyond it more load adds little throughput)",
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

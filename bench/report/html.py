"""The whole report of a run or a sweep as one self-contained HTML file (plotly.js inlined once,
so it opens offline): ``python -m bench report TARGET --html out.html``."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from bench.analysis.book_marks import BookMarks, book_marks, default_reference, sweep_marks
from bench.analysis.serving import (
    DEFAULT_TARGET_TOK_S_PER_USER,
    SERVING_TABLE_COLUMNS,
    name_curves,
    serving_rows,
    sweep_curve,
    target_caption,
)
from bench.analysis.sweep_analysis import (
    as_slos,
    axis_title,
    fmt_ms,
    fmt_num,
    load_axis_of,
    point_label,
    recommendations,
    sweep_slos,
    sweep_table,
    table_columns,
)
from bench.metrics.catalogue import DEFINITIONS, METRICS, Metric, latency_rows
from bench.metrics.cost import Price, price_table
from bench.metrics.records import PERCENTILES
from bench.metrics.slo import judge_summary
from bench.report.figures import (
    capacity_figure,
    escape_text,
    goodput_figure,
    latency_throughput_figure,
    run_throughput_figure,
    serving_pareto_figure,
)
from bench.store import Store
from bench.store.rows import RunRow, SweepRow
from bench.sweep.spec import PointResult, sweep_points
from engines.errors import MoEBenchError

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
        return escape_text(fmt_num(v)), True
    if isinstance(v, (list, tuple)):
        return escape_text(", ".join(str(x) for x in v)), False
    if isinstance(v, dict):
        return escape_text(", ".join(f"{k}={x}" for k, x in v.items() if x not in (None, "", [], {}))), False
    return escape_text(v), False


def _table(columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>{escape_text(h)}</th>" for _, h in columns)
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
        rows.append(f"<tr><th>{escape_text(k)}</th><td>{text}</td></tr>")
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
        self.parts.append(f"<h2>{escape_text(text)}</h2>")

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
            f"<title>{escape_text(self.title)}</title><style>{_CSS}</style>"
            + (f'<script type="text/javascript">{js}</script>' if js else "")
            + "</head><body><main>"
        )
        return (head + "".join(self.parts) + "</main></body></html>").encode("utf-8")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else ""


def _header(page: _Page, meta: Sequence[tuple[str, Any]]) -> None:
    page.add(f"<h1>{escape_text(page.title)}</h1>")
    shown = [f"{escape_text(k)}: {_cell(v)[0]}" for k, v in meta if v not in (None, "")]
    page.add(f'<div class="meta">{" · ".join(shown)}</div>')


def _definitions(page: _Page) -> None:
    page.h2("Metric definitions")
    items = "".join(f"<dt>{escape_text(k)}</dt><dd>{escape_text(v)}</dd>" for k, v in DEFINITIONS.items())
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
        ("SLOs", [s.label for s in as_slos(config.get("slos") or [])] or None),
    ]
    return [(k, v) for k, v in items if v not in (None, {}, [])]


def _reference(store: Store, book_reference: int | None) -> RunRow | None:
    """The reference run for the book's marks of a run on another accelerator: the one asked for, else
    the imported H100 example run (:func:`bench.analysis.book_marks.default_reference`)."""
    if book_reference is not None:
        run = store.get_run(book_reference)
        if run is None:
            raise MoEBenchError(f"no run {book_reference} (the book's reference run) in {store.path}")
        return run
    return default_reference(store.list_runs())


_BOOK_FIGURES = ("output_throughput_tok_s", "ttft_ms_p50", "tpot_ms_p50", "e2e_ms_mean", "peak_memory_gib")


def _book_section(page: _Page, book: BookMarks) -> None:
    """The book's platforms set against the run: what the marks stand on, or the note why none."""
    page.h2("The book's platforms (chapter 8, 8.3.3)")
    if not book.drawn:
        page.add(f'<div class="card"><p>{escape_text(book.caption)}</p></div>')
        return
    page.add(f'<div class="card"><p>{escape_text(book.caption)}</p></div>')
    rows = book.rows(_BOOK_FIGURES)
    cols = [(k, k) for k in rows[0]] if rows else []
    page.add(_table(cols, rows))


def _run_report(store: Store, run: RunRow, book: BookMarks | None = None) -> bytes:
    from bench.run.recorder import SERIES_OUTPUT_TOK_S

    page = _Page(f"Run {run.id}: {run.name}" if run.name else f"Run {run.id}")
    in_sweep = f"{run.sweep_id} ({point_label(run.sweep_point or {})})" if run.sweep_id else None
    _header(page, [("generated", _when(time.time())), ("status", run.status), ("created", _when(run.created_at)),
                   ("finished", _when(run.finished_at)), ("mode", run.mode), ("sweep", in_sweep)])  # fmt: skip
    if run.error:
        page.add(f'<div class="card warn">{escape_text(run.error)}</div>')
    page.h2("Configuration")
    page.add(f'<div class="card">{_kv_table(_config_items(run.config, run))}</div>')
    s = run.summary
    if s is None:
        page.add('<div class="card warn">This run has no summary (it measured nothing).</div>')
    else:
        for warning in (s.load_warning, s.burst_warning, s.reasoning_warning):
            if warning:
                page.add(f'<div class="card warn">{escape_text(warning)}</div>')
        slos = as_slos(s.slos or [])
        if slos:
            page.h2("SLOs")
            verdicts = judge_summary(s.flat(), slos)
            met = "met" if s.slo_met else "not met"
            lis = "".join(
                f'<li><span class="{"ok" if v.ok else "bad"}">{"ok" if v.ok else "FAILED"}</span> '
                f"{escape_text(v.slo.label)}: {escape_text(fmt_ms(v.value))}</li>"
                for v in verdicts
            )
            page.add(
                f'<div class="card"><p>SLOs <span class="{"ok" if s.slo_met else "bad"}">{met}</span> '
                f"(each statistic over all completed requests); goodput {escape_text(fmt_num(s.goodput_rps))} req/s "
                f"({escape_text(fmt_num(s.good_requests))} good requests).</p><ul class=rec>{lis}</ul></div>"
            )
        page.h2("Summary")
        flat = s.flat()
        summary_items = [(_label(METRICS[name]), flat.get(name)) for name in _REPORT_FIGURES]
        summary_items += _serving_items(s, store.artifact(run.id, "energy"))
        page.add(f'<div class="card">{_kv_table(summary_items)}</div>')
        page.h2("Latency percentiles (ms)")
        stats = ["mean", *(f"p{q}" for q in PERCENTILES), "max"]
        lat_rows = []
        for m in latency_rows(s):
            st = getattr(s, m.name)
            lat_rows.append({"metric": m.label, "count": st.count, **{k: getattr(st, k) for k in stats}})
        cols = [("metric", "metric"), ("count", "values"), *((k, f"{k} (ms)") for k in stats)]
        page.add(_table(cols, lat_rows))
    if book is not None:
        _book_section(page, book)
    page.h2("Output throughput over time")
    series = [(t, v) for t, _, v in store.timeseries(run.id, [SERIES_OUTPUT_TOK_S])]
    page.figure(run_throughput_figure(series, book))
    _moe_section(page, store, run)
    _definitions(page)
    return page.render()


# The run's figures at the head of its report, in order (labels and units: bench.metrics.catalogue).
_REPORT_FIGURES = (
    "requests",
    "completed",
    "failed",
    "duration_s",
    "prompt_tokens",
    "output_tokens",
    "output_throughput_tok_s",
    "total_throughput_tok_s",
    "request_throughput_rps",
    "accelerators",
    "output_tok_s_per_accelerator",
    "goodput_rps",
    "slo_met",
    "peak_memory_gib",
    "usage_mismatches",
)


def _label(m: Metric) -> str:
    """``output throughput (tok/s)``: a figure's label with its unit (none for counts)."""
    return f"{m.label} ({m.unit})" if m.unit not in ("", "tok") else m.label


def _serving_items(s: Any, energy: Any) -> list[tuple[str, Any]]:
    """Summary rows for speculative decoding, reasoning and energy (only those the run has), and the
    reason a run has no energy figure."""
    items: list[tuple[str, Any]] = []
    if s.spec_acceptance_rate is not None:
        per = " ".join(f"{v:.0%}" for v in s.spec_accepted_per_pos or ())
        items += [
            ("speculative acceptance rate", f"{s.spec_acceptance_rate:.1%}"),
            ("speculative acceptance length (tokens/step)", s.spec_acceptance_length),
            ("acceptance by draft position", per or "-"),
        ]
    if s.reasoning_tokens is not None:
        items += [
            ("reasoning tokens", s.reasoning_tokens),
            ("answer tokens", s.answer_tokens),
            ("answer throughput (tok/s)", s.answer_throughput_tok_s),
            ("reasoning-count mismatches (requests)", s.reasoning_mismatches),
        ]
    if s.energy_j is not None:
        items += [
            ("energy over the measured window (J)", s.energy_j),
            ("energy per output token (J)", s.joules_per_output_token),
            ("output tokens per joule", s.output_tokens_per_j),
            ("mean / peak power (W)", f"{s.power_avg_w or 0:.1f} / {s.power_peak_w or 0:.1f}"),
            ("goodput per watt (req/J)", s.goodput_per_w),
        ]
    elif isinstance(energy, dict) and energy.get("reason"):
        items.append(("energy", f"not measured: {energy['reason']}"))
    return items


def _moe_section(page: _Page, store: Store, run: RunRow) -> None:
    """The run's expert routing on an expert-parallel deployment (EP 8, 8 redundant experts for
    EPLB), when the engine reported routing."""
    from bench.metrics import moe
    from bench.report.figures import ep_rank_figure
    from bench.run.artifacts import ARTIFACT_ROUTING
    from engines.errors import ConfigError

    routing = store.artifact(run.id, ARTIFACT_ROUTING)
    if not routing:
        return
    try:
        what = moe.eplb_whatif(routing, moe.RUN_EP, moe.RUN_EP)
    except ConfigError as exc:
        page.h2("MoE routing")
        page.add(f'<div class="card warn">{escape_text(str(exc))}</div>')
        return
    figures = moe.run_figures(routing)
    page.h2("MoE routing")
    page.add(
        '<div class="card">'
        + _kv_table(
            [
                ("MoE layers x experts", f"{len(routing['counts'])} x {len(routing['counts'][0])}"),
                ("busiest expert / mean, worst layer (moe_imbalance_max)", figures["moe_imbalance_max"]),
                (f"busiest EP {moe.RUN_EP} rank / mean, worst layer (ep_rank_imbalance)", figures["ep_rank_imbalance"]),
                (f"balancedness at EP {moe.RUN_EP}, contiguous experts", what.balancedness),
                (f"balancedness with EPLB, {moe.RUN_EP} redundant (eplb_balancedness_whatif)", what.eplb_balancedness),
            ]
        )
        + "</div>"
    )
    page.figure(ep_rank_figure(what))


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


def _serving_section(
    page: _Page,
    store: Store,
    sweep: SweepRow,
    points: Sequence[PointResult],
    overlay: Sequence[int],
    target_tok_s_per_user: float,
    prices: Mapping[str, Price] | None,
) -> None:
    """Output tok/s per accelerator against tok/s per user, this sweep and the ``overlay`` sweeps, with
    the best throughput at the target, the table of $ and J per million output tokens and the notes."""
    table = price_table() if prices is None else prices
    curves = [sweep_curve(sweep, points)]
    for other_id in overlay:
        other = store.get_sweep(int(other_id))
        if other is None:
            raise MoEBenchError(f"no sweep {other_id} in {store.path} to overlay")
        if other.id != sweep.id:
            curves.append(sweep_curve(other, sweep_points(store, other.id)))
    names = name_curves(curves, {k: v.name for k, v in table.items()})
    page.h2("Throughput per accelerator vs interactivity")
    page.figure(serving_pareto_figure(curves, target_tok_s_per_user or None, table, names))
    notes = [n for c in curves for n in c.notes]
    caption = target_caption(curves, names, target_tok_s_per_user, table) if target_tok_s_per_user > 0 else ""
    page.add(
        f'<div class="card"><p>{escape_text(caption)}</p>'
        + "".join(f'<p class="meta">{escape_text(n)}</p>' for n in notes)
        + '<p class="meta">Prices per accelerator-hour are assumptions (bench/metrics/cost.py; '
        "MOEBENCH_ACCELERATOR_PRICES overrides them); J per million output tokens only where the run measured "
        "its energy.</p></div>"
    )
    page.add(_table(SERVING_TABLE_COLUMNS, serving_rows(curves, names, table)))


def _sweep_report(
    store: Store,
    sweep: SweepRow,
    overlay: Sequence[int] = (),
    target_tok_s_per_user: float = DEFAULT_TARGET_TOK_S_PER_USER,
    prices: Mapping[str, Price] | None = None,
    book: bool = True,
    book_reference: int | None = None,
) -> bytes:
    runs = store.sweep_runs(sweep.id)
    what = "Capacity search" if sweep.kind == "capacity" else "Sweep"
    page = _Page(f"{what} {sweep.id}: {sweep.name}" if sweep.name else f"{what} {sweep.id}")
    _header(page, [("generated", _when(time.time())), ("status", sweep.status), ("created", _when(sweep.created_at)),
                   ("finished", _when(sweep.finished_at)), ("runs", len(runs))])  # fmt: skip
    if sweep.error:
        page.add(f'<div class="card warn">{escape_text(sweep.error)}</div>')
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
        page.add(f'<div class="card"><p>{escape_text(verdict)}.{escape_text(note)}</p></div>')
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
        cols = [("probe", "probe"), ("value", axis_title(axis)), ("passed", "passed"), ("why", "verdict"),
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
        lis = "".join(f"<li>{escape_text(t)}</li>" for t in rec["texts"])
        page.add(f'<div class="card"><ul class="rec">{lis}</ul></div>')
        stopped = (sweep.result or {}).get("stopped") or []
        if stopped:
            lis = "".join(
                f"<li>after {escape_text(point_label(s.get('after') or {}))}: {escape_text(s.get('reason'))}</li>"
                for s in stopped
            )
            page.add(f'<div class="card warn"><p>Lines stopped early:</p><ul class="rec">{lis}</ul></div>')
        page.h2("Charts")
        marks = sweep_marks(runs) if book else None
        if marks is not None and marks.off_platform:
            marks = sweep_marks(runs, _reference(store, book_reference))
        page.figure(latency_throughput_figure(points, slos, "ttft_ms", axis, marks))
        page.figure(latency_throughput_figure(points, slos, "tpot_ms", axis, marks))
        if marks is not None:
            page.add(f'<div class="card"><p>{escape_text(marks.caption)}</p></div>')
        page.figure(goodput_figure(points, axis))
        _serving_section(page, store, sweep, points, overlay, target_tok_s_per_user, prices)
        page.h2("Points")
        rows = sweep_table(points, slos)
        cols = [c for c in table_columns(rows) if c[0] != "disturbed" or any(r.get("disturbed") for r in rows)]
        page.add(_table(cols, rows))
    _definitions(page)
    return page.render()


def html_report(
    store: Store,
    target: str,
    overlay: Sequence[int] = (),
    target_tok_s_per_user: float = DEFAULT_TARGET_TOK_S_PER_USER,
    prices: Mapping[str, Price] | None = None,
    book: bool = True,
    book_reference: int | None = None,
) -> bytes:
    """A self-contained HTML report (UTF-8 bytes) of a run (``"12"``, ``"run:12"``) or of a sweep
    or capacity search (``"sweep:3"``, ``"s3"``): the configuration, the recommendations or
    the capacity verdict, the figures, the tables and the metric definitions; for a run, its
    summary, latency percentiles and per-second output tok/s. A sweep's output tok/s per
    accelerator against tok/s per user overlays the ``overlay`` sweeps and names the best
    throughput at ``target_tok_s_per_user``, with $ per million output tokens at ``prices``
    (default: :func:`bench.metrics.cost.price_table`). plotly.js is inlined once, so
    the file opens offline. Every text from the data is HTML-escaped. ``book``: the book's three
    platforms (:mod:`bench.analysis.book_marks`) as dash-dot marks and a table, on the run's own figures,
    or for a run on another accelerator on run ``book_reference`` (default: the imported H100 example run),
    or a one-line note why none.
    Raises :class:`MoEBenchError` for a bad or unknown target."""
    kind, ident = parse_target(target)
    if kind == "run":
        run = store.get_run(ident)
        if run is None:
            raise MoEBenchError(f"no run {ident} in {store.path}")
        marks = book_marks(run) if book else None
        if marks is not None and marks.off_platform:
            marks = book_marks(run, _reference(store, book_reference))
        return _run_report(store, run, marks)
    sweep = store.get_sweep(ident)
    if sweep is None:
        raise MoEBenchError(f"no sweep or capacity search {ident} in {store.path}")
    return _sweep_report(store, sweep, overlay, target_tok_s_per_user, prices, book, book_reference)

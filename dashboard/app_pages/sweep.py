"""Sweep page: many runs over a grid of loads, or a capacity search, drawn live with a verdict.

The form builds a :class:`bench.sweep.spec.SweepSpec` (a concurrency list, a request-rate list or
input/output lengths) or a :class:`bench.sweep.spec.CapacitySpec` on the engine loaded on the
Engine & Model page; :class:`dashboard.services.SweepHolder` runs it in the background. The
panel below reads the store (never the worker) and draws :mod:`bench.report.figures`, table
and recommendations as each point completes, and any stored sweep afterwards.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pandas as pd
import streamlit as st

from bench.analysis.book_marks import BookMarks, default_reference, reference_candidates, sweep_marks
from bench.analysis.serving import (
    DEFAULT_TARGET_TOK_S_PER_USER,
    SERVING_TABLE_COLUMNS,
    name_curves,
    serving_rows,
    sweep_curve,
    target_caption,
)
from bench.analysis.sweep_analysis import point_label, recommendations, sweep_slos, sweep_table, table_columns
from bench.config import RunConfig, field_bounds
from bench.metrics.cost import Price, price_table
from bench.report.csv_export import sweep_csv
from bench.report.figures import (
    capacity_figure,
    goodput_figure,
    latency_throughput_figure,
    serving_pareto_figure,
)
from bench.report.html import html_report
from bench.store import SweepRow
from bench.sweep.axes import length_pairs, number_list
from bench.sweep.spec import CapacitySpec, SweepSpec, sweep_points
from bench.sweep.task import SweepSnapshot
from bench.workloads import WorkloadSpec
from dashboard import data, services, ui
from engines.errors import ConfigError, MoEBenchError, WorkloadError

TYPES = {
    "concurrency": "Concurrency list",
    "rate": "Request-rate list",
    "lengths": "Input/output lengths",
    "capacity": "Capacity search",
}
DEFAULTS: dict[str, Any] = {
    "w.type": "concurrency",
    "w.values.concurrency": "1,2,4,8,16,32",
    "w.values.rate": "1,2,4,8,16",
    "w.values.lengths": "128:64,512:128,1024:256",
    "w.concurrency": 8,
    "w.cap": 256,
    "w.size": "requests",
    "w.requests": 32,
    "w.duration": 30.0,
    "w.source": "random",
    "w.input_len": 128,
    "w.output_len": 64,
    "w.warmup": RunConfig.model_fields["warmup"].default,
    "w.repeats": 1,
    "w.slo_preset": "mlperf-server",
    "w.slo_text": "",
    "w.stop_sat_on": False,
    "w.stop_sat": 0.05,
    "w.stop_err_on": False,
    "w.stop_err": 0.1,
    "w.stop_slo_on": False,
    "w.stop_slo": 0.5,
    "w.cap_axis": "concurrency",
    "w.cap_start": 1.0,
    "w.cap_max": 256.0,
    "w.cap_step": 1.0,
    "w.cap_budget": CapacitySpec.model_fields["budget"].default,
    "w.cap_errors": 0.0,
    "w.name": "",
    "w.server_metrics": False,
    "w.target": DEFAULT_TARGET_TOK_S_PER_USER,
    "w.overlay": [],
}
PICKS = (
    ("best", ":material/workspace_premium:", "Best throughput within the SLOs"),
    ("lowest_latency", ":material/bolt:", "Lowest latency"),
    ("knee", ":material/ssid_chart:", "Knee of throughput vs load"),
)

ss = st.session_state
for _key, _value in DEFAULTS.items():
    ss.setdefault(_key, _value)

st.title("Sweep")
st.caption(
    "One run per point of a grid — a list of concurrencies, of request rates or of input/output lengths — on the "
    "loaded engine, each stored as a normal run; or a **capacity search** for the highest load that still meets "
    "the SLOs (doubling until a probe fails, then bisecting). Points fill the charts as they finish."
)

slot = services.get_engine_slot()
manager = services.get_job_manager()
holder = services.get_sweep_holder()
store = services.get_store()
state = slot.state()


# --- the form --------------------------------------------------------------------------------------


def _numbers(text: str, kind: type, label: str) -> list[Any]:
    """``1,2,4`` / ``1..32`` (doubling) / ``8..64+8`` (stepping), as the CLI reads its lists."""
    try:
        return list(number_list(kind, "values")(text))
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{label}: {str(exc).removeprefix('--values takes ')}") from None


def _lengths(text: str) -> list[tuple[int, int]]:
    try:
        return length_pairs(text)
    except argparse.ArgumentTypeError:
        raise ConfigError(f"Input:output lengths: token pairs like 128:64,512:128, got '{text.strip()}'") from None


def _form() -> None:
    """The widgets; their values are read from session_state by :func:`_build`."""
    st.radio("Sweep type", list(TYPES), key="w.type", format_func=TYPES.get, horizontal=True)
    kind = ss["w.type"]
    c1, c2, c3 = st.columns([2, 1, 1])
    if kind == "concurrency":
        c1.text_input(
            "Concurrency values",
            key="w.values.concurrency",
            help="Comma-separated, or 1..32 (doubling: 1,2,4,...,32) or 8..64+8 (stepping)",
        )
    elif kind == "rate":
        c1.text_input(
            "Request rates (req/s)",
            key="w.values.rate",
            help="Poisson arrivals (open loop). Comma-separated, or 1..32 (doubling) or 2..20+2 (stepping)",
        )
    elif kind == "lengths":
        c1.text_input(
            "Input:output lengths (tokens)",
            key="w.values.lengths",
            help="IN:OUT pairs of random prompts, e.g. 128:64,512:128",
        )
    else:
        c1.radio(
            "Search",
            ["concurrency", "rate"],
            key="w.cap_axis",
            horizontal=True,
            format_func={"concurrency": "Highest concurrency", "rate": "Highest request rate (Poisson)"}.get,
        )
    if kind == "lengths":
        c2.number_input("Concurrency", step=1, key="w.concurrency", **field_bounds("concurrency"))
    if kind == "rate" or (kind == "capacity" and ss["w.cap_axis"] == "rate"):
        c2.number_input(
            "Most requests in flight",
            step=16,
            key="w.cap",
            **{**field_bounds("concurrency"), "help": "The in-flight cap of the open loop"},
        )
    c3.number_input("Repeats per point", step=1, key="w.repeats", disabled=kind == "capacity",
                    **field_bounds("repeats", SweepSpec))  # fmt: skip

    if kind == "capacity":
        k1, k2, k3, k4, k5 = st.columns(5)
        unit = " (req/s)" if ss["w.cap_axis"] == "rate" else ""
        k1.number_input(f"Start{unit}", step=1.0, key="w.cap_start", **field_bounds("start", CapacitySpec))
        k2.number_input(f"Maximum{unit}", step=16.0, key="w.cap_max", **field_bounds("maximum", CapacitySpec))
        k3.number_input(f"Step{unit}", step=1.0, key="w.cap_step", **field_bounds("step", CapacitySpec))
        k4.number_input("Budget (runs)", step=1, key="w.cap_budget", **field_bounds("budget", CapacitySpec))
        k5.number_input(
            "Max failed share", step=0.01, key="w.cap_errors", **field_bounds("max_error_rate", CapacitySpec)
        )

    _each_run_inputs(kind)
    ui.slo_inputs("w.")
    if kind != "capacity":
        st.markdown("**Early stops** (off unless ticked): a line of points ends at the first point that trips one")
        e1, e2, e3 = st.columns(3)
        for col, name, key, step in (
            (e1, "stop_on_saturation", "sat", 0.01),
            (e2, "stop_on_errors", "err", 0.01),
            (e3, "stop_on_slo_margin", "slo", 0.1),
        ):
            on = col.checkbox(
                {"sat": "When saturated", "err": "On errors", "slo": "When an SLO is broken by a margin"}[key],
                key=f"w.stop_{key}_on",
            )
            col.number_input(
                {"sat": "Least gain (fraction)", "err": "Most failed (fraction)", "slo": "Margin (fraction)"}[key],
                step=step,
                key=f"w.stop_{key}",
                disabled=not on,
                label_visibility="collapsed",
                **field_bounds(name, SweepSpec),
            )
    n1, n2 = st.columns([3, 2], vertical_alignment="bottom")
    n1.text_input("Name (optional)", key="w.name", max_chars=80)
    n2.checkbox(
        "Scrape server metrics",
        key="w.server_metrics",
        help="Read the server's /metrics once a second (vLLM, Triton). Off by default: each scrape costs the server "
        "some CPU.",
    )


def _each_run_inputs(kind: str) -> None:
    """The widgets of each run of the sweep: prompts, lengths, run length, warm-up."""
    st.markdown("**Each run**")
    r1, r2, r3, r4, r5 = st.columns(5)
    random_only = kind == "lengths"
    r1.radio(
        "Prompts",
        ["random", "builtin"],
        key="w.source",
        format_func={"random": "Random, exact length", "builtin": "Built-in set"}.get,
        disabled=random_only,
        help="A lengths sweep always uses random prompts of exactly the input length.",
    )
    lengths_swept = kind == "lengths"
    r2.number_input(
        "Input length (tokens)",
        step=16,
        key="w.input_len",
        disabled=lengths_swept or ss["w.source"] != "random",
        **field_bounds("input_len", WorkloadSpec),
    )
    r2.number_input(
        "Output length (tokens)",
        step=8,
        key="w.output_len",
        disabled=lengths_swept,
        **field_bounds("output_len", WorkloadSpec),
    )
    r3.radio(
        "Run length",
        ["requests", "duration"],
        key="w.size",
        format_func={"requests": "Requests", "duration": "Duration"}.get,
    )
    if ss["w.size"] == "requests":
        r4.number_input("Requests per run", step=8, key="w.requests", **field_bounds("requests"))
    else:
        r4.number_input("Seconds per run", step=10.0, key="w.duration", **field_bounds("duration_s"))
    r5.number_input("Warm-up requests", step=1, key="w.warmup", **field_bounds("warmup"))


def _build(engine: dict[str, Any]) -> tuple[SweepSpec | CapacitySpec, str]:
    """The spec the form describes on ``engine``, and what it will do in one line; ConfigError otherwise."""
    kind = ss["w.type"]
    slos = ui.checked_slos("w.")
    workload: dict[str, Any] = {
        "source": "random" if kind == "lengths" else ss["w.source"],
        "input_len": int(ss["w.input_len"]),
        "output_len": int(ss["w.output_len"]),
    }
    base: dict[str, Any] = {
        "engine": engine,
        "mode": "concurrency",
        "workload": workload,
        "warmup": int(ss["w.warmup"]),
        "temperature": float(ss["s.temperature"]),
        "top_p": float(ss["s.top_p"]),
        "ignore_eos": True,
        "server_metrics": bool(ss["w.server_metrics"]),
        "slos": slos,
    }
    if ss["w.size"] == "requests":
        base["requests"] = int(ss["w.requests"])
        each = f"{int(ss['w.requests']):,} requests"
    else:
        base["duration_s"] = float(ss["w.duration"])
        each = f"{float(ss['w.duration']):g} s"
    name = str(ss["w.name"]).strip()
    if kind == "capacity":
        if not slos:
            raise ConfigError("A capacity search needs at least one SLO: pick a preset or write one")
        axis = ss["w.cap_axis"]
        if axis == "rate":
            base["concurrency"] = int(ss["w.cap"])
        spec: SweepSpec | CapacitySpec = CapacitySpec.build(
            base=base,
            axis=axis,
            start=float(ss["w.cap_start"]),
            maximum=float(ss["w.cap_max"]),
            step=float(ss["w.cap_step"]),
            budget=int(ss["w.cap_budget"]),
            max_error_rate=float(ss["w.cap_errors"]),
            name=name,
        )
        what = "request rate" if axis == "rate" else "concurrency"
        return spec, (
            f"At most {int(ss['w.cap_budget'])} runs of {each}: the {what} doubles from {float(ss['w.cap_start']):g} "
            f"(up to {float(ss['w.cap_max']):g}) until a probe breaks an SLO, then bisects to within "
            f"{float(ss['w.cap_step']):g}."
        )
    axes: dict[str, Any] = {}
    if kind == "concurrency":
        axes["concurrency"] = _numbers(ss["w.values.concurrency"], int, "Concurrency values")
    elif kind == "rate":
        axes["request_rate"] = _numbers(ss["w.values.rate"], float, "Request rates")
        base["concurrency"] = int(ss["w.cap"])
    else:
        axes["lengths"] = _lengths(ss["w.values.lengths"])
        base["concurrency"] = int(ss["w.concurrency"])
    stops = {
        name: float(ss[f"w.stop_{key}"])
        for name, key in (("stop_on_saturation", "sat"), ("stop_on_errors", "err"), ("stop_on_slo_margin", "slo"))
        if ss[f"w.stop_{key}_on"]
    }
    repeats = int(ss["w.repeats"])
    spec = SweepSpec.build(base=base, repeats=repeats, name=name, **axes, **stops)
    points = len(spec.points())
    runs = points * repeats
    return spec, (
        f"{points} point{'s' * (points != 1)} × {repeats} repeat{'s' * (repeats != 1)} = {runs} run"
        f"{'s' * (runs != 1)} of {each} each" + (f"; early stops: {', '.join(stops)}" if stops else "")
    )


def _blocked() -> str | None:
    if services.viewer():
        return "Viewer mode: sweeps are started by the operator."
    if not state.ready:
        return "Load a model on the Engine & Model page first."
    if holder.active():
        return "A sweep is in progress; stop it below or wait for it to finish."
    job = manager.active()
    if job is not None:
        return f"A {job.config.mode} run is in progress; stop it or wait for it to finish."
    return None


# The form folds away once there is a sweep to look at; the Start row below it stays in view.
with st.expander(
    "Define a sweep", icon=":material/tune:", expanded=not holder.active() and not store.list_sweeps(limit=1)
):
    _form()
with st.container(border=True):
    spec: SweepSpec | CapacitySpec | None = None
    try:
        spec, plan = _build(dict(state.options or {"kind": "native"}))
    except MoEBenchError as exc:
        ui.show_error(exc)
    b1, b2 = st.columns([1, 3], vertical_alignment="center")
    blocked = _blocked()
    start = b1.button(
        "Start capacity search" if ss["w.type"] == "capacity" else "Start sweep",
        type="primary",
        icon=":material/play_arrow:",
        key="w.btn.start",
        disabled=blocked is not None or spec is None,
        width="stretch",
    )
    with b2:
        if spec is not None:
            st.caption(plan)
        if blocked:
            st.caption(blocked)
            if not state.ready:
                st.page_link(ui.PAGE_ENGINE, label="Engine & Model", icon=":material/memory:")
        else:
            o = state.options or {}
            st.caption(f"On the loaded engine: {o.get('kind')} · {state.info.get('model')} · {o.get('accelerator')}")

if start and spec is not None and blocked is None:
    try:
        engine = slot.engine()
        if engine is None:
            raise WorkloadError("the engine is no longer loaded; load it again")
        task = holder.start(spec, engine)
    except MoEBenchError as exc:
        ui.show_error(exc)
    else:
        ui.set_choice("w.view", task.sweep_id)  # shown once it ends
        st.rerun()  # redraw everything (the sidebar too) with the sweep running


# --- the sweep: live, or a stored one --------------------------------------------------------------


def _open_results(sweep_id: int) -> None:
    ui.set_choice("r.sweep", sweep_id)


def _header(sweep: SweepRow, runs: int) -> None:
    what = "Capacity search" if sweep.kind == "capacity" else "Sweep"
    icon = ui.STATUS_ICONS.get(sweep.status, "")
    named = f" · {data.plain(sweep.name)}" if sweep.name else ""
    st.markdown(f"#### {icon} {what} #{sweep.id}{named} · {sweep.status}")
    h, d1, d2, d3 = st.columns([3.4, 1, 1, 1], vertical_alignment="center")
    h.caption(_describe(sweep, runs))
    sid = sweep.id
    d1.download_button(
        "Sweep CSV",
        data=lambda: sweep_csv(store, sid, _page_prices()),
        file_name=f"moebench-sweep-{sid}.csv",
        mime="text/csv",
        icon=":material/download:",
        key="w.btn.csv",
        on_click="ignore",
        width="stretch",
        help="One row per run: the swept values, the repeat, then the run's summary (units in the column names)",
    )
    d2.download_button(
        "HTML report",
        data=lambda: html_report(
            store,
            f"sweep:{sid}",
            _overlay_ids(sweep),
            float(ss["w.target"]),
            _page_prices(),
            book=bool(ss.get("w.book", True)),
            book_reference=ss.get("w.book.ref"),
        ),
        file_name=f"moebench-sweep-{sid}.html",
        mime="text/html",
        icon=":material/description:",
        key="w.btn.html",
        on_click="ignore",
        width="stretch",
        help="The whole sweep in one self-contained file (opens offline)",
    )
    if d3.button("Its runs", icon=":material/table_chart:", key="w.btn.results", on_click=_open_results,
                 args=(sid,), width="stretch", help="Open the Results page filtered to this sweep's runs"):  # fmt: skip
        st.switch_page(ui.PAGE_RESULTS)


def _describe(sweep: SweepRow, runs: int) -> str:
    """Started when, on what, with which workload and SLOs: one line."""
    cfg = sweep.config
    base = cfg.get("base") or {}
    engine = base.get("engine") or {}
    w = base.get("workload") or {}
    parts = [time.strftime("%Y-%m-%d %H:%M", time.localtime(sweep.created_at)), f"{runs} run{'s' * (runs != 1)}"]
    parts.append(" · ".join(str(x) for x in (engine.get("kind"), engine.get("model"), engine.get("accelerator")) if x))
    source = w.get("source", "random")
    if cfg.get("lengths"):
        parts.append("random prompts, lengths swept")
    elif source == "random":
        parts.append(f"random prompts, {w.get('input_len', '?')} → {w.get('output_len', '?')} tokens")
    else:
        parts.append(f"{source} prompts, {w.get('output_len', '?')} output tokens")
    if base.get("duration_s"):
        parts.append(f"{base['duration_s']:g} s per run")
    elif base.get("requests"):
        parts.append(f"{base['requests']:,} requests per run")
    slos = sweep_slos(sweep)
    parts.append("SLOs: " + ", ".join(s.label for s in slos) if slos else "no SLOs")
    return " · ".join(p for p in parts if p)


def _progress(snap: SweepSnapshot) -> None:
    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    total = max(1, snap.runs_total)
    limit = " (at most)" if snap.kind == "capacity" else ""
    with c1:
        st.progress(
            min(1.0, snap.runs_done / total), text=f"{snap.phase} · {snap.runs_done}/{snap.runs_total} runs{limit}"
        )
        task = holder.current()
        job = task.current_job() if task is not None else None
        js = job.snapshot() if job is not None else None
        if js is not None and js.active and snap.current_point:
            st.caption(
                f"Now: {point_label(snap.current_point)} · run #{js.run_id} · {js.status} · "
                f"{js.done:,}/{js.total:,} requests · {js.failed} failed · {data.fmt_duration(js.elapsed_s)}"
            )
    c2.button(
        "Stop", icon=":material/stop:", key="w.btn.stop", on_click=holder.cancel, width="stretch",
        disabled=services.viewer(),
    )  # fmt: skip


def _pick_caption(key: str, row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    parts = [data.fmt_unit(row.get("output_throughput_tok_s"), "output tok/s")]
    if key == "lowest_latency":
        parts.append(
            f"TTFT p50 {data.fmt_unit(row.get('ttft_ms_p50'), 'ms')} (p99 {data.fmt_num(row.get('ttft_ms_p99'))})"
        )
    else:
        parts.append(f"TTFT p99 {data.fmt_unit(row.get('ttft_ms_p99'), 'ms')}")
        parts.append(f"TPOT p99 {data.fmt_unit(row.get('tpot_ms_p99'), 'ms')}")
    if row.get("goodput_rps") is not None:
        parts.append(f"goodput {data.fmt_unit(row.get('goodput_rps'), 'req/s')}")
    return " · ".join(parts)


def _recommendations(rec: dict[str, Any], stopped: list[dict[str, Any]]) -> None:
    with st.container(border=True, key="w-recommendations"):
        slos = rec.get("slos") or []
        badges = " ".join(f":gray-badge[{s}]" for s in slos) if slos else ":gray-badge[no SLOs set]"
        st.markdown(f"##### :material/recommend: Recommendations &nbsp; {badges}")
        cols = st.columns(3)
        for col, (key, icon, title) in zip(cols, PICKS, strict=True):
            pick = rec[key]
            with col:
                st.markdown(f"{icon} **{title}**", help=pick["text"])
                if pick["point"] is not None:
                    st.markdown(f":blue-badge[{point_label(pick['point'])}]")
                    st.caption(_pick_caption(key, pick["row"]))
                else:
                    (st.warning if key == "best" and rec.get("met_any") is False else st.caption)(pick["text"])
        if stopped:
            lines = "\n".join(f"- after **{point_label(s.get('after') or {})}**: {s.get('reason')}" for s in stopped)
            st.warning(f"Lines stopped early:\n{lines}", icon=":material/front_hand:")


# Columns of the sweep table shown only with "All columns" (the page is narrower than all of them).
TABLE_DETAIL_COLUMNS = ("repeats", "requests (req/s)", "TTFT p50 (ms)", "TPOT p50 (ms)")
_SHORT_HEADERS = {"output range (tok/s)": "range (tok/s)", "failed requests": "failed", "requests (req/s)": "req/s"}


def _column(header: str) -> Any:
    """A sweep-table column: numbers formatted by unit; a few headers shortened on screen."""
    label = _SHORT_HEADERS.get(header, header)
    if header.endswith("(ms)") or header in ("output (tok/s)",):
        return st.column_config.NumberColumn(label, format="%.1f", help=header)
    if header.endswith("(req/s)"):
        return st.column_config.NumberColumn(label, format="%.2f", help=header)
    return st.column_config.Column(label, help=header)


def _overlay_ids(sweep: SweepRow) -> list[int]:
    """The other stored sweeps chosen to overlay on the serving chart (still stored, not this one)."""
    stored = {s.id for s in store.list_sweeps(limit=200)}
    return [int(i) for i in ss.get("w.overlay", []) if int(i) in stored and int(i) != sweep.id]


def _page_prices() -> dict[str, Price]:
    """The price table with the prices set on this page (a card with no default and 0 set: no price)."""
    base = price_table()
    given = {k.removeprefix("w.price."): float(v) for k, v in ss.items() if str(k).startswith("w.price.")}
    return price_table({c: v for c, v in given.items() if v > 0 or c in base})


def _price_inputs(cards: list[str]) -> None:
    """A number input per card on the chart (defaults and their sources: bench.metrics.cost)."""
    base = price_table()
    for col, card in zip(st.columns(max(1, len(cards))), cards, strict=False):
        known = base.get(card)
        col.number_input(
            f"$ per {known.name if known else card}-hour",
            min_value=0.0,
            max_value=1000.0,
            step=0.1,
            value=known.usd_per_hour if known else 0.0,
            key=f"w.price.{card}",
            format="%.3f",
            help=(
                f"An assumption, not a measurement. Default {known.text}"
                if known
                else f"No default price for '{card}' (the run did not name its device): 0 leaves $ per M empty"
            ),
        )


def _serving(sweep: SweepRow, points: list[Any]) -> None:
    """Output tok/s per accelerator against tok/s per user: this sweep and the chosen ones overlaid, the
    interactivity target, the best throughput at it, and a table of $ and J per million output tokens."""
    st.markdown("##### Throughput per accelerator vs interactivity")
    others = [s for s in store.list_sweeps(limit=200) if s.id != sweep.id]
    ss["w.overlay"] = [i for i in ss.get("w.overlay", []) if i in {s.id for s in others}]
    c1, c2 = st.columns([3, 1])
    c1.multiselect(
        "Overlay other sweeps",
        [s.id for s in others],
        key="w.overlay",
        format_func=lambda i: next((data.sweep_label(s) for s in others if s.id == i), f"sweep #{i}"),
        help="Draw other stored sweeps on the same axes (engines, cards, options), each with its Pareto front",
    )
    c2.number_input(
        "Target (tok/s per user)",
        min_value=0.0,
        max_value=10000.0,
        step=5.0,
        key="w.target",
        help="The interactivity each user must see; the caption names each sweep's best throughput at it",
    )
    curves = [sweep_curve(sweep, points)]
    for other_id in _overlay_ids(sweep):
        other = store.get_sweep(other_id)
        if other is not None:
            curves.append(sweep_curve(other, sweep_points(store, other_id)))
    _price_inputs(sorted({c.card for c in curves if c.card}))
    prices = _page_prices()
    target = float(ss["w.target"])
    names = name_curves(curves, {k: v.name for k, v in prices.items()})
    left, right = st.columns([3, 2])
    with left:
        ui.chart(serving_pareto_figure(curves, target or None, prices, names), "w.chart.serving")
    with right:
        rows = serving_rows(curves, names, prices)
        headers = dict(SERVING_TABLE_COLUMNS)
        frame = pd.DataFrame(
            [{headers[k]: (", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]
        )
        st.dataframe(
            frame,
            hide_index=True,
            key="w.serving_table",
            width="stretch",
            column_config={
                "tok/s per user": st.column_config.NumberColumn(format="%.1f"),
                "output tok/s per accelerator": st.column_config.NumberColumn(format="%.0f"),
                "$ per M output tokens": st.column_config.NumberColumn(format="%.4f", help="An assumed price"),
                "J per M output tokens": st.column_config.NumberColumn(format="%.0f"),
            },
        )
    if target:
        st.caption(target_caption(curves, names, target, prices))
    for note in (n for c in curves for n in c.notes):
        st.caption(note)


def _book(sweep: SweepRow) -> BookMarks | None:
    """The toggle "show the book's platforms" and, for a sweep on none of them, its reference-run picker;
    the sweep's book marks (:func:`bench.analysis.book_marks.sweep_marks`), None when switched off."""
    ss.setdefault("w.book", True)
    k1, k2 = st.columns([1, 3], vertical_alignment="bottom")
    if not k1.toggle(
        "show the book's platforms",
        key="w.book",
        help="The book's H100 / Ascend 910B / MLU590 table (chapter 8, 8.3.3) as dash-dot marks: each point moved "
        "where the book's ratios put the other platforms, or a reference run's for a sweep on another accelerator. "
        "Ratios of measured figures, never measurements.",
    ):
        return None
    runs = store.sweep_runs(sweep.id)
    book = sweep_marks(runs)
    if not book.off_platform:
        return book
    candidates = {r.id: r for r in reference_candidates(store.list_runs(limit=500))}
    if ss.get("w.book.ref") not in (None, *candidates):
        del ss["w.book.ref"]
    if "w.book.ref" not in ss:
        first = default_reference(list(candidates.values()))
        ss["w.book.ref"] = first.id if first is not None else None
    ref_id = k2.selectbox(
        "Reference run for the book's marks",
        [None, *candidates],
        key="w.book.ref",
        format_func=lambda i: "none" if i is None else data.run_label(candidates[i]),
        help="This sweep ran on none of the book's platforms: the marks stand on a run that did",
    )
    return sweep_marks(runs, candidates.get(ref_id) if ref_id is not None else None)


def _sweep_body(sweep: SweepRow, live: bool) -> None:
    points = sweep_points(store, sweep.id)
    slos = sweep_slos(sweep)
    if not any(p.summaries for p in points):
        st.info(
            "Waiting for the first point to finish…" if live else "No run of this sweep completed.",
            icon=":material/hourglass_top:" if live else ":material/info:",
        )
        return
    rec = recommendations(points, slos)
    _recommendations(rec, list((sweep.result or {}).get("stopped") or []))
    book = _book(sweep)
    left, right = st.columns(2)
    with left:
        ui.chart(latency_throughput_figure(points, slos, "ttft_ms", book=book), "w.chart.ttft")
    with right:
        ui.chart(latency_throughput_figure(points, slos, "tpot_ms", book=book), "w.chart.tpot")
    if book is not None:
        st.caption(book.caption)
    _serving(sweep, points)
    ui.chart(goodput_figure(points), "w.chart.goodput")
    t1, t2 = st.columns([4, 1], vertical_alignment="bottom")
    t1.markdown("##### Points")
    every = t2.toggle("All columns", key="w.table_all", help="Also the p50s, the request rate and the repeats")
    rows = sweep_table(points, slos)
    frame = data.sweep_frame(rows, table_columns(rows))
    shown = [h for h in frame.columns if every or h not in TABLE_DETAIL_COLUMNS]
    st.dataframe(
        frame,
        hide_index=True,
        key="w.table",
        width="stretch",
        column_order=shown,
        column_config={h: _column(h) for h in frame.columns},
    )
    counts = {r.get("repeats") for r in rows}
    if counts == {1}:  # one run per point: its own figures, no mean
        st.caption("One run per point; a value that was not measured is an empty cell.")
    else:
        per_point = f"the {counts.pop()} repeats of each point" if len(counts) == 1 else "each point's repeats"
        st.caption(f"Means over {per_point}; a value that was not measured is an empty cell.")


def _capacity_body(sweep: SweepRow, live: bool) -> None:
    res = sweep.result or {}
    runs = store.sweep_runs(sweep.id)
    axis = res.get("axis") or sweep.config.get("axis") or "rate"

    def shown(v: Any) -> str:
        if v is None:
            return "-"
        return f"{float(v):g} req/s" if axis == "rate" else f"{int(v)}"

    with st.container(border=True, key="w-capacity"):
        verdict = res.get("verdict") or ("searching…" if live else "the search did not finish")
        st.markdown("##### :material/verified: Capacity")
        st.markdown(f"**{verdict[:1].upper()}{verdict[1:]}**")
        m1, m2, m3 = st.columns(3)
        m1.metric("Passes at", shown(res.get("passes_at")), help="The highest probe that met every SLO")
        m2.metric("Fails at", shown(res.get("fails_at")), help="The lowest probe that broke an SLO or failed")
        budget = sweep.config.get("budget")
        m3.metric("Runs used", f"{res.get('runs', len(runs))}" + (f" of {budget}" if budget else ""))
        converged = res.get("converged")
        if converged is True:
            st.caption(f"The bracket is one step ({sweep.config.get('step', 1):g}) wide.")
        elif converged is False:
            st.caption("The bracket is wider than one step: the budget or the maximum was reached first.")
    ui.chart(capacity_figure(sweep, runs), "w.chart.capacity")
    probes = data.probes_frame(res, runs)
    if not probes.empty:
        st.markdown("##### Probes")
        st.dataframe(
            probes,
            hide_index=True,
            key="w.probes",
            width="stretch",
            # The verdict already says each SLO's value: its TTFT/TPOT p99 columns would repeat it.
            column_order=[c for c in probes.columns if c not in ("TTFT p99 (ms)", "TPOT p99 (ms)")],
            column_config={h: _column(h) for h in probes.columns},
        )


sweeping = holder.active()


@st.fragment(run_every=1.0 if sweeping else None)
def _live_progress(drawn: int) -> None:
    """The progress line, once a second. The charts stay outside: a whole-page redraw when a
    run finishes (``drawn`` is the finished-run count they show), not a redraw every second,
    so watching a sweep costs the machine (and the server it measures) little CPU."""
    snap = holder.snapshot()
    if snap is None or not snap.active or snap.runs_done != drawn:
        st.rerun()  # ended, or a point finished: one full redraw with the new charts
    _progress(snap)
    if snap.error:
        st.error(snap.error, icon=":material/error:")


def _panel() -> None:
    snap = holder.snapshot()
    live = snap is not None and snap.active
    if live:
        assert snap is not None
        sweep = store.get_sweep(snap.sweep_id) if snap.sweep_id is not None else None
        if sweep is None:
            st.info("Starting the sweep…", icon=":material/hourglass_top:")
            _live_progress(snap.runs_done)
            return
    else:
        sweeps = store.list_sweeps(limit=200)
        if not sweeps:
            st.info("No sweep yet. Define one above and press Start.", icon=":material/info:")
            return
        by_id = {s.id: s for s in sweeps}
        if ss.get("w.view") not in by_id:
            ss.pop("w.view", None)
        chosen = st.selectbox(
            "Stored sweeps and capacity searches",
            list(by_id),
            key="w.view",
            format_func=lambda i: (
                f"{data.sweep_label(by_id[i])} · {by_id[i].status} · "
                + time.strftime("%Y-%m-%d %H:%M", time.localtime(by_id[i].created_at))
            ),
        )
        sweep = by_id[chosen]
    runs = len(store.sweep_runs(sweep.id))
    _header(sweep, runs)
    if live:
        assert snap is not None
        _live_progress(snap.runs_done)
    if sweep.error and sweep.status != "completed":
        (st.warning if sweep.status in ("cancelled", "interrupted") else st.error)(sweep.error)
    if sweep.kind == "capacity":
        _capacity_body(sweep, live)
    else:
        _sweep_body(sweep, live)


_panel()

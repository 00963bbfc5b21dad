"""Compare page: the book's tables (8.2.4, 8.3.3) beside measured runs, never mixed."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.analysis import reference as ref
from bench.analysis.compare import (
    EFFICIENCY_DEVICE_TELEMETRY,
    EFFICIENCY_KV_CACHE,
    MEMORY_EFFICIENCY_DEFINITION,
    MEMORY_EFFICIENCY_TELEMETRY_DEFINITION,
    RunMemory,
    common_memory,
    default_pair,
    gain_context,
    is_vllm,
    memory_efficiency,
    mismatch,
    run_memory,
)
from bench.config import RunConfig, field_bounds
from bench.store import RunRow
from bench.workloads import WorkloadSpec
from dashboard import charts, data, services, ui
from engines.base import engine_class
from engines.errors import MoEBenchError

st.title("Compare with the book")
st.caption(
    "The book's figures are shown as printed, labelled **book**; figures from runs stored here are labelled "
    "**measured**. A gain is computed from two book values or from two measured runs, never from one of each."
)

store = services.get_store()


task = services.get_compare_task()  # the process's comparison: outlives pages and sessions
cstate = task.state()
# A comparison finished: put its two runs in the pickers below, once per session and comparison.
if not cstate.running and cstate.task and st.session_state.get("c.compare-applied") != cstate.task:
    st.session_state["c.compare-applied"] = cstate.task
    if cstate.native_run_id is not None:
        st.session_state["c.native"] = cstate.native_run_id
    if cstate.vllm_run_id is not None:
        st.session_state["c.vllm"] = cstate.vllm_run_id

# Profile runs are left out: the profiler's overhead makes their latencies no fair comparison.
runs = [r for r in store.list_runs() if r.status == "completed" and r.summary is not None and r.mode != "profile"]
by_id = {r.id: r for r in runs}


def _label(run_id: int | None) -> str:
    if run_id is None:
        return "none"
    r = by_id[run_id]
    return data.run_label(r) + (f" · {r.name}" if r.name else "")  # run_label names the device off the CPU


def _pick(title: str, candidates: list[RunRow], key: str, missing: str) -> RunRow | None:
    """A run picker; says ``missing`` when there is nothing to pick."""
    if not candidates:
        st.selectbox(title, ["none"], key=key + ".empty", disabled=True)
        st.info(missing, icon=":material/hourglass_empty:")
        return None
    ids: list[int | None] = [r.id for r in candidates]
    if key in st.session_state and st.session_state[key] not in ids:
        del st.session_state[key]
    chosen = st.selectbox(title, ids, key=key, format_func=_label)
    return by_id.get(chosen) if chosen is not None else None


def _not_comparable(differences: list[str], what: str = "") -> None:
    """The one line that stands where a gain would be, naming each workload field that differs."""
    st.error(f"Not comparable{f' ({what})' if what else ''}: " + "; ".join(differences), icon=":material/block:")


# --- 8.2.4: native vs vLLM ---------------------------------------------------------------------

st.header("Native inference vs vLLM")
st.caption(f"Book: {ref.SOURCE_ENGINES.cite()}")

ss = st.session_state
for _k, _v in {
    "c.run.mode": "concurrency",
    "c.run.requests": 8,
    "c.run.concurrency": 2,
    "c.run.input_len": 32,
    "c.run.output_len": 16,
    "c.run.base_url": "",
    "c.run.kv_gib": 1.0,
}.items():
    ss.setdefault(_k, _v)


def _start_compare() -> None:
    """Button callback: build the workload and start both runs in the background."""
    if services.viewer():
        ss["c.compare-error"] = services.VIEWER_REASON
        return
    loaded = services.get_engine_slot().state()
    opts = loaded.options or {}
    base = {k: opts[k] for k in ("model", "accelerator", "dtype", "trust_remote_code") if k in opts}
    vllm_opts: dict = {}
    if str(ss["c.run.base_url"]).strip():
        vllm_opts["base_url"] = str(ss["c.run.base_url"]).strip()
    elif base.get("accelerator", "cpu") == "cpu":
        vllm_opts["cpu_kvcache_space_gib"] = float(ss["c.run.kv_gib"])
    try:
        config = RunConfig.build(
            engine={"kind": "native", **base},
            mode=ss["c.run.mode"],
            workload={
                "source": "random",
                "input_len": int(ss["c.run.input_len"]),
                "output_len": int(ss["c.run.output_len"]),
            },
            requests=int(ss["c.run.requests"]),
            concurrency=int(ss["c.run.concurrency"]),
            sample_interval_s=0.25,  # finer KV-cache sampling: short runs would miss their peak
        )
        task.start(config, vllm_opts)
    except MoEBenchError as exc:
        ss["c.compare-error"] = str(exc)


with st.container(border=True):
    st.markdown("**Run native vs vLLM on one workload**")
    st.caption(
        "The way to fill the measured table: runs one random-prompt workload on the native engine, then on vLLM "
        "(one after the other, each loading its own copy of the model), and picks both runs below. Model, "
        "accelerator and dtype come from the engine loaded on the Engine & Model page (the tiny model on CPU when "
        "none is loaded)."
    )
    vllm_avail = engine_class("vllm").availability()
    blocked = None
    if services.viewer():
        blocked = "Viewer mode: comparisons are run by the operator."
    elif cstate.running:
        blocked = "A comparison is running."
    elif (busy := services.busy_reason()) is not None:
        blocked = busy
    elif not vllm_avail.ok and not str(ss["c.run.base_url"]).strip():
        blocked = f"vLLM is unavailable: {vllm_avail.reason}"
    g1, g2 = st.columns([1, 3], vertical_alignment="center")
    g1.button(
        "Run native vs vLLM",
        type="primary",
        icon=":material/compare_arrows:",
        key="c.btn.compare",
        on_click=_start_compare,
        disabled=blocked is not None,
        width="stretch",
    )
    if blocked and not cstate.running:
        (g2.error if blocked.startswith("vLLM") else g2.caption)(blocked)
    else:
        load = "one request at a time" if ss["c.run.mode"] == "latency" else f"concurrency {ss['c.run.concurrency']}"
        g2.caption(
            f"{ss['c.run.mode']}: {ss['c.run.requests']} requests, {load}, "
            f"{ss['c.run.input_len']} → {ss['c.run.output_len']} tokens (random prompts)"
        )
    with st.expander("Workload and vLLM options", icon=":material/tune:"):
        f1, f2, f3, f4 = st.columns(4)
        f1.selectbox("Mode", ["concurrency", "latency"], key="c.run.mode")
        f2.number_input("Requests", step=1, key="c.run.requests", **field_bounds("requests"))
        f3.number_input(
            "Concurrency",
            step=1,
            key="c.run.concurrency",
            disabled=ss["c.run.mode"] == "latency",
            **field_bounds("concurrency"),
        )
        f1.number_input(
            "Input length (tokens)", step=16, key="c.run.input_len", **field_bounds("input_len", WorkloadSpec)
        )
        f2.number_input(
            "Output length (tokens)", step=8, key="c.run.output_len", **field_bounds("output_len", WorkloadSpec)
        )
        f4.number_input(
            "vLLM CPU KV cache (GiB)",
            min_value=0.25,
            max_value=512.0,
            step=0.25,
            key="c.run.kv_gib",
            help="VLLM_CPU_KVCACHE_SPACE for a vLLM server launched on the CPU",
        )
        f3.text_input(
            "vLLM server URL (optional)",
            key="c.run.base_url",
            placeholder="http://host:8000/v1",
            help="Use a running vLLM server instead of launching one",
        )
    error = ss.pop("c.compare-error", None)
    if error:
        st.error(error, icon=":material/error:")

    @st.fragment(run_every=1.0 if cstate.running else None)
    def _compare_status() -> None:
        now = task.state()
        if cstate.running and not now.running:
            st.rerun()  # finished: one full redraw fills the table below
        if now.status == "idle":
            return
        s1, s2 = st.columns([4, 1], vertical_alignment="bottom")
        icon = {"running": ":material/progress_activity:", "done": ":material/check_circle:"}.get(
            now.status, ":material/error:"
        )
        s1.progress(now.fraction, text=f"{icon} native vs vLLM · {now.status} · {now.message}")
        if now.running:
            s2.button(
                "Stop", icon=":material/stop:", key="c.btn.compare-stop", on_click=services.cancel, args=(task,),
                width="stretch", disabled=services.viewer(),
            )  # fmt: skip
        if now.error:
            st.error(now.error, icon=":material/error:")
        for note in now.notes:
            st.error(note, icon=":material/error:")
        if now.status == "done":
            ids = ", ".join(f"#{i}" for i in (now.native_run_id, now.vllm_run_id) if i is not None)
            st.caption(f"Runs {ids} are stored; completed ones are picked in the table below.")

    _compare_status()

# By default the pickers hold the latest native and vLLM runs of one workload (bench.analysis.compare.default_pair);
# a choice of the user's (or the runs a comparison just made) stays while its runs exist.
pair = default_pair(runs)
for _key, _side, _member in (("c.native", lambda r: r.engine == "native", 0), ("c.vllm", is_vllm, 1)):
    if _key in ss and (ss[_key] not in by_id or not _side(by_id[ss[_key]])):
        del ss[_key]
    if _key not in ss and pair is not None:
        ss[_key] = pair[_member].id
    if _key not in ss:  # no pair: the newest run of that side that is no tuning-ablation row
        _first = data.newest_shown_first([r for r in runs if _side(r)])
        if _first is not None:
            ss[_key] = _first.id


def _pick_pair(native_id: int, vllm_id: int) -> None:
    ss["c.native"], ss["c.vllm"] = native_id, vllm_id


c1, c2, c3 = st.columns(3)
with c1:
    native = _pick(
        "Measured native run",
        [r for r in runs if r.engine == "native"],
        "c.native",
        "no measured native run yet: press Run native vs vLLM above",
    )
with c2:
    vllm = _pick(
        "Measured vLLM run",
        [r for r in runs if is_vllm(r)],
        "c.vllm",
        "no measured vLLM run yet: press Run native vs vLLM above",
    )
with c3:
    lat_metric = st.selectbox(
        "Latency statistic for 'P99 latency'",
        list(ref.LATENCY_METRICS),
        key="c.latency-metric",
        format_func=ref.LATENCY_METRICS.get,
        help="The book does not say which latency it reports; pick the measured statistic whose p99 stands for it.",
    )

# A gain is a ratio of two runs of one workload; between different workloads it measures the workloads too.
differences = mismatch(native, vllm) if native is not None and vllm is not None else []
comparable = native is not None and vllm is not None and not differences
if differences:
    _not_comparable(differences)
    if pair is not None:
        st.button(
            f"Pick runs #{pair[0].id} and #{pair[1].id} (one workload)",
            icon=":material/join_inner:",
            key="c.btn.pick-pair",
            on_click=_pick_pair,
            args=(pair[0].id, pair[1].id),
        )
if pair is None and native is not None and vllm is not None:
    st.info(
        "No native run and vLLM run share a workload yet: press **Run native vs vLLM** above to run both on the "
        "same workload.",
        icon=":material/info:",
    )

# Memory efficiency: the engine's KV-cache use, else tensor memory / device memory in use (telemetry);
# each figure carries the definition that measured it.
eff_native = memory_efficiency(store, native) if native else (None, None)
eff_vllm = memory_efficiency(store, vllm) if vllm else (None, None)
measured_native = ref.measured_engine_values(native.summary if native else None, lat_metric, eff_native[0])
measured_vllm = ref.measured_engine_values(vllm.summary if vllm else None, lat_metric, eff_vllm[0])
eff_sources = {"native": eff_native[1], "vLLM": eff_vllm[1]}


def _measured_cell(row: ref.EngineRow, run: RunRow | None, value: float | None, who: str) -> str:
    if run is None:
        return "no measured vLLM run yet" if who == "vLLM" else "no measured native run yet"
    if value is None:
        return "not measured"
    if row.key == "memory_efficiency" and eff_sources[who] == EFFICIENCY_DEVICE_TELEMETRY:
        return f"{data.fmt_unit(value, row.unit)} ({EFFICIENCY_DEVICE_TELEMETRY})"  # the KV-cache figure: unlabelled
    return data.fmt_unit(value, row.unit)


_no_gain = "not comparable" if differences else "-"
book_rows, measured_rows, gain_rows = [], [], []
for row in ref.ENGINE_TABLE:
    book_rows.append(
        {
            "metric": row.metric,
            "native (book)": f"{data.fmt_num(row.native)} {row.unit}",
            "vLLM (book)": f"{data.fmt_num(row.vllm)} {row.unit}",
            "gain (book)": row.book_gain_text + ("" if row.gain != "points" else " (points)"),
        }
    )
    # Two memory efficiencies of different definitions (KV cache, device telemetry) make no gain.
    other_definitions = (
        row.key == "memory_efficiency"
        and None not in (measured_native[row.key], measured_vllm[row.key])
        and eff_native[1] != eff_vllm[1]
    )
    mg = (
        ref.gain(row.gain, measured_native[row.key], measured_vllm[row.key])
        if comparable and not other_definitions
        else None
    )
    gain_text = "definitions differ" if comparable and other_definitions else _no_gain
    measured_rows.append(
        {
            "metric": row.metric
            + (f" [{lat_metric.removesuffix('_ms').upper()} p99]" if row.key == "p99_latency" else ""),
            "native (measured)": _measured_cell(row, native, measured_native[row.key], "native"),
            "vLLM (measured)": _measured_cell(row, vllm, measured_vllm[row.key], "vLLM"),
            "gain (measured)": ref.format_gain(row.gain, mg) if mg is not None else gain_text,
        }
    )
    if row.gain == "points":
        continue  # percentage points do not share an axis with factors; the tables show them
    gain_rows.append(
        {
            "metric": row.metric,
            "book": ref.book_gain(row),
            "book_text": ref.format_gain(row.gain, ref.book_gain(row)),
            "measured": mg,
            "measured_text": ref.format_gain(row.gain, mg) if mg is not None else None,
        }
    )


def _goodput(run: RunRow | None) -> float | None:
    """The run's goodput (req/s), only where it ran with SLOs (None otherwise: nothing is made up)."""
    s = run.summary if run is not None else None
    return s.goodput_rps if s is not None and s.slos else None


def _goodput_cell(run: RunRow | None) -> str:
    if run is None:
        return "-"
    if run.summary is None or not run.summary.slos:
        return "no SLOs set"
    slos = ", ".join(run.summary.slos)
    return f"{data.fmt_unit(run.summary.goodput_rps, 'req/s')} ({slos})"


# Goodput is measured only: the book has no such figure, so its row is in the measured table alone
# (below the book's three), and only when a picked run has SLOs. A gain needs both runs judged on the
# same SLOs.
if _goodput(native) is not None or _goodput(vllm) is not None:
    g_native, g_vllm = _goodput(native), _goodput(vllm)
    same_slos = comparable and set(native.summary.slos or ()) == set(vllm.summary.slos or ())
    g_gain = ref.gain("ratio_up", g_native, g_vllm) if same_slos else None
    measured_rows.append(
        {
            "metric": "Goodput (requests within the SLOs)",
            "native (measured)": _goodput_cell(native),
            "vLLM (measured)": _goodput_cell(vllm),
            "gain (measured)": ref.format_gain("ratio_up", g_gain) if g_gain is not None else _no_gain,
        }
    )

left, right = st.columns([4, 5])
with left:
    st.markdown("**Book** (chapter 8, section 8.2.4)")
    st.dataframe(pd.DataFrame(book_rows), hide_index=True, key="c.engine-book")
with right:
    st.markdown("**Measured** (runs stored here)")
    st.dataframe(pd.DataFrame(measured_rows), hide_index=True, key="c.engine-measured")
if comparable and native is not None and vllm is not None:
    kv_pct = eff_vllm[0] if eff_vllm[1] == EFFICIENCY_KV_CACHE else None
    st.info(gain_context(native, vllm, kv_pct), icon=":material/lightbulb:")
with st.expander("How memory efficiency is measured", icon=":material/help:"):
    st.caption(
        "Memory efficiency (measured), a plain figure: "
        + MEMORY_EFFICIENCY_DEFINITION
        + " A figure labelled (device telemetry): "
        + MEMORY_EFFICIENCY_TELEMETRY_DEFINITION
        + " A gain in points needs both figures of one definition."
    )
gains_fig = charts.book_vs_measured_gains(pd.DataFrame(gain_rows))
if differences:
    gains_fig.update_annotations(text="no measured gain: the picked runs' workloads differ")
ui.chart(gains_fig, "c.engine-gains")

# --- 8.3.3: accelerators -----------------------------------------------------------------------

st.header("Accelerators: NVIDIA, Ascend, Cambricon")
st.caption(
    f"Book: {ref.SOURCE_ACCELERATORS.cite()}. The book gives every figure relative to the NVIDIA H100 (= 100%); "
    "the measured percentages are relative to the run of the column picked as the baseline."
)

acc_rows = {r.accelerator: r for r in ref.ACCELERATOR_TABLE}
PCT_COLUMNS = {"throughput_pct": "throughput", "latency_pct": "latency", "memory_pct": "memory"}  # % column names


def _pick_acc(row: ref.AcceleratorRow) -> RunRow | None:
    """The run of one platform column: runs on its card first, then on other cards of its kind, then
    every other run.

    It starts on the newest run on its card (a tuning-ablation row only when there is nothing
    else), or on none when no run was measured on that card: an H200 run is not an H100 one,
    whatever their accelerator kind. Any run can still be picked by hand (one measured
    elsewhere, or imported), and "none" empties the column.
    """
    key, title = f"c.acc.{row.accelerator}", f"Measured run for the {row.platform} column"
    missing = f"no {row.platform} run measured yet"
    if not runs:
        st.selectbox(title, ["none"], key=key + ".empty", disabled=True)
        st.info(missing, icon=":material/hourglass_empty:")
        return None
    matching = [r for r in runs if ref.on_card(r.accelerator, r.engine_info.get("device"), row)]
    matching_ids = {r.id for r in matching}
    kind = [r.id for r in runs if r.accelerator == row.accelerator and r.id not in matching_ids]  # another card
    rest = [r.id for r in runs if r.accelerator != row.accelerator]
    ids: list[int | None] = [None, *(r.id for r in matching), *kind, *rest]
    if key in ss and ss[key] not in ids:
        del ss[key]
    if key not in ss:
        first = data.newest_shown_first(matching)
        ss[key] = first.id if first is not None else None

    def label(run_id: int | None) -> str:
        if run_id is None or run_id in matching_ids:
            return _label(run_id)
        other = by_id[run_id]
        if other.accelerator != row.accelerator:
            return _label(run_id) + f" · accelerator {other.accelerator}"
        return _label(run_id) + f" · no {row.card}"

    chosen = st.selectbox(title, ids, key=key, format_func=label)
    if chosen is None and not matching:
        st.info(f"{missing}: any other stored run can be picked above", icon=":material/hourglass_empty:")
    elif chosen is not None and chosen not in matching_ids:
        st.warning(f"Run #{chosen} was not measured on the column's card ({row.platform}).", icon=":material/warning:")
    return by_id.get(chosen) if chosen is not None else None


picked: dict[str, RunRow | None] = {}
cols = st.columns(len(ref.ACCELERATOR_TABLE))
for col, row in zip(cols, ref.ACCELERATOR_TABLE, strict=True):
    with col:
        picked[row.accelerator] = _pick_acc(row)
st.caption(
    "Each column lists the runs on its card first (newest first; the card is the device the run recorded), then "
    "every other completed run, so a run measured elsewhere (an openai-engine run against a remote Ascend or "
    "Cambricon server is stored with this client's accelerator) can stand in any column. A column starts on the "
    "newest run on its card (tuning-ablation rows only when there is nothing else), or empty when there is "
    "none; 'none', first in the list, empties it. Profile runs are left out (the profiler slows them down)."
)


def _baseline_label(acc: str) -> str:
    run = picked.get(acc)
    return f"{acc_rows[acc].platform} column" + (f" · run #{run.id}" if run is not None else " · no run picked")


base_acc = st.selectbox(
    "Baseline (= 100 %)",
    list(acc_rows),
    key="c.acc.baseline",
    format_func=_baseline_label,
    help="Which column's run the measured percentages are relative to. The book's percentages are rebased to "
    "that column's platform (book / book), so each row holds two figures of the same baseline.",
)


def _device(run: RunRow) -> str:
    """The device the run's engine reported, else its stored accelerator (a remote server's device is unknown)."""
    return str(run.engine_info.get("device") or f"accelerator {run.accelerator}, device not recorded")


base_row, base_run = acc_rows[base_acc], picked.get(base_acc)
base_name = f"run #{base_run.id} ({_device(base_run)})" if base_run is not None else f"the {base_row.platform} column"

book_acc = pd.DataFrame(
    [
        {
            "platform": r.platform,
            "throughput (book)": f"{r.throughput_pct:.0f}%",
            "latency (book)": f"{r.latency_pct:.0f}%",
            "memory (book)": f"{r.memory_pct:.0f}%",
        }
        for r in ref.ACCELERATOR_TABLE
    ]
)
memories: dict[str, RunMemory] = {acc: run_memory(store, run) for acc, run in picked.items() if run is not None}
show_device_memory = any(m.device_peak_gib is not None for m in memories.values())
base_vals = ref.measured_accelerator_values(base_run.summary if base_run else None)
measured_acc, rel_measured = [], {}
acc_differences: dict[str, list[str]] = {}  # a run whose workload is not the baseline run's gets no percentage


def _memory_cell(mem: RunMemory | None) -> str:
    value, source = mem.shown if mem is not None else (None, None)
    return f"{data.fmt_unit(value, 'GiB')} ({source})" if value is not None else "not measured"


def _memory_pct(mem: RunMemory, diff: list[str]) -> tuple[float | None, str]:
    """The run's memory as % of the baseline's, from one source both have, and its cell."""
    if base_run is None:
        return None, "-"
    if diff:
        return None, "not comparable"
    if mem.shown[0] is None:
        return None, "not measured"
    if memories[base_acc].shown[0] is None:
        return None, "baseline not measured"
    both = common_memory(memories[base_acc], mem)
    if both is None:
        return None, f"sources differ ({memories[base_acc].shown[1]} vs {mem.shown[1]})"
    pct = ref.relative_pct(both[0], both[1])
    return pct, f"{pct:.0f}% ({both[2]})" if pct is not None else "-"


def _energy_cell(run: RunRow) -> str:
    """J per output token over the measured window, with tokens/J and the mean power; the book has no
    energy figure, so this column has no book %."""
    s = run.summary
    if s is None or s.joules_per_output_token is None:
        return "not measured (no power read)"
    return (
        f"{s.joules_per_output_token:.3g} J/tok ({s.output_tokens_per_j or 0:.3g} tok/J, "
        f"{s.power_avg_w or 0:.0f} W mean)"
    )


for row in ref.ACCELERATOR_TABLE:
    run = picked.get(row.accelerator)
    vals = ref.measured_accelerator_values(run.summary if run else None)
    diff = mismatch(base_run, run) if run is not None and base_run is not None else []
    if diff and run is not None and base_run is not None:
        acc_differences[f"{row.platform} column's run #{run.id} against the baseline run #{base_run.id}"] = diff
    rel = {k: None if diff else ref.relative_pct(base_vals[k], vals[k]) for k in ("throughput_pct", "latency_pct")}
    mem_pct, mem_pct_cell = _memory_pct(memories[row.accelerator], diff) if run is not None else (None, "-")
    rel["memory_pct"] = mem_pct
    if run is not None and base_run is not None and not diff:
        rel_measured[f"{row.platform}: run #{run.id}"] = rel
    book = ref.book_accelerator_pct(row, base_row)
    no_pct = "not comparable" if diff else "-"
    cells: dict[str, str] = {
        "column": row.platform,
        "measured run": f"#{run.id} · {run.engine_info.get('device') or run.accelerator}" if run else "no run yet",
        "throughput": data.fmt_unit(vals["throughput_pct"], "tok/s") if run else "-",
        "mean E2E latency": data.fmt_unit(vals["latency_pct"], "ms") if run else "-",
        "peak memory": _memory_cell(memories[row.accelerator]) if run else "-",
    }
    if show_device_memory:  # beside the engine's own peak, the device memory in use (telemetry)
        device_gib = memories[row.accelerator].device_peak_gib if run else None
        device_cell = data.fmt_unit(device_gib, "GiB") if device_gib is not None else "not measured"
        cells["device memory in use (telemetry)"] = device_cell if run else "-"
    for key, name in PCT_COLUMNS.items():  # the measured % beside the book's, metric by metric
        if key == "memory_pct":
            cells[f"{name} % (measured)"] = mem_pct_cell
        else:
            cells[f"{name} % (measured)"] = f"{rel[key]:.0f}%" if rel[key] is not None else no_pct
        cells[f"{name} % (book)"] = f"{book[key]:.0f}%"
    cells["energy per output token"] = _energy_cell(run) if run else "-"
    measured_acc.append(cells)
    if _goodput(run) is not None:  # beside the throughput, only for runs with SLOs
        measured_acc[-1]["goodput"] = _goodput_cell(run)

acc_columns = list(dict.fromkeys(k for row in measured_acc for k in row))
if "goodput" in acc_columns:
    acc_columns.remove("goodput")
    acc_columns.insert(acc_columns.index("throughput") + 1, "goodput")
    for row in measured_acc:
        row.setdefault("goodput", "no SLOs set" if row["measured run"] != "no run yet" else "-")

st.markdown("**Book** (chapter 8, section 8.3.3, as printed: % of the NVIDIA H100)")
st.dataframe(book_acc, hide_index=True, key="c.acc-book")
st.markdown(f"**Measured** (absolute values, and % of the baseline: {data.plain(base_name)}, beside the book's %)")
st.dataframe(pd.DataFrame(measured_acc, columns=acc_columns), hide_index=True, key="c.acc-measured")
if base_run is None:
    st.info(
        f"Percentages need a run in the baseline column: no run is picked in the {base_row.platform} column.",
        icon=":material/info:",
    )
else:
    st.caption(
        f"Baseline (= 100 %): run #{base_run.id} in the {base_row.platform} column ({_device(base_run)}). The "
        f"book's % are its figures relative to the {base_row.platform}"
        + (" (as printed)." if base_row is ref.ACCELERATOR_TABLE[0] else " (book / book, rebased from the H100).")
    )
for what, diff in acc_differences.items():
    _not_comparable(diff, what)
st.caption(
    "Peak memory: the engine's own peak where it has one (torch peak: the device allocator's on CUDA, NPU or MLU; "
    "process RSS peak: the native engine on the CPU; server RSS peak: a server MoE Bench launched, host memory "
    "only), else the peak device memory in use from device telemetry (NVML, npu-smi, cnmon or exporters, summed "
    "over the devices read; every process on them counts); 'not measured' when the run has neither. Energy per "
    "output token: the devices' energy over the measured window (their own energy counters where they have one, "
    "else their power samples integrated; docs/metrics.md) / output tokens. Memory % "
    "compares two runs on a source both have (the same kind of engine peak, else device telemetry) and names it. "
    "Imported run bundles are listed in these pickers too: `python -m bench import FILE` imports one (exported "
    "with `python -m bench export RUN_ID --bundle --out FILE`, or examples/*.json), and the Results page offers "
    "to import the GPU example runs while the store is empty."
)

metric_names = [label for _, label, _ in ref.ACCELERATOR_METRICS]
book_rel = pd.DataFrame(
    {"metric": metric_names}
    | {
        r.platform: [ref.book_accelerator_pct(r, base_row)[k] for k, _, _ in ref.ACCELERATOR_METRICS]
        for r in ref.ACCELERATOR_TABLE
    }
)
g1, g2 = st.columns(2)
with g1:
    ui.chart(charts.relative_bars(book_rel, f"Book: % of {base_row.platform}"), "c.acc-book-chart")
with g2:
    measured_title = f"Measured: % of {base_name}"
    if rel_measured:
        measured_rel = pd.DataFrame(
            {"metric": metric_names}
            | {name: [rel[k] for k, _, _ in ref.ACCELERATOR_METRICS] for name, rel in rel_measured.items()}
        )
        ui.chart(charts.relative_bars(measured_rel, measured_title), "c.acc-measured-chart")
    else:
        ui.chart(
            charts.empty_figure(measured_title, "no run in the baseline column to compare against yet", 340),
            "c.acc-measured-chart",
        )

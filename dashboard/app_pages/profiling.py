"""Profiling page (seed 8.1.1 ``profile_inference``, 8.1.2 bottlenecks): operators, breakdown, routing, memory.

Starts a ``profile`` run on the loaded engine through the job manager, shows its progress and
live memory, and for any stored profile run (imported GPU examples included) draws the
operator table, the bottleneck breakdown, the expert routing and the memory timeline.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from bench.config import field_bounds
from bench.metrics import moe
from bench.report import figures
from bench.report.csv_export import operators_csv
from bench.workloads import WorkloadSpec
from dashboard import charts, data, profile_data, services, ui
from engines.errors import ConfigError, MoEBenchError

st.title("Profiling")
st.caption(
    "A short run under the PyTorch profiler — the book's `profile_inference` (section 8.1.1): which operators "
    "take the time, how it splits into attention, MoE routing, experts, ... (8.1.2's bottlenecks), how evenly "
    "tokens reach the experts, and where the memory goes. The native engine gives all of it; a vLLM server "
    "started with a profiler folder (`profiler_dir`) records its trace, read back into the operator table; other "
    "engines cannot be profiled."
)

# Profile runs stay small (see _form): at most this many requests and output tokens each.
PROFILE_MAX_REQUESTS = 1000
PROFILE_MAX_OUTPUT_LEN = 4096

store = services.get_store()
slot = services.get_engine_slot()
manager = services.get_job_manager()
ss = st.session_state
for key, value in {
    "p.source": "random",
    "p.input_len": 32,
    "p.output_len": 8,
    "p.requests": 2,
    "p.concurrency": 1,
    "p.warmup": 1,
    "p.with_stack": True,
    "p.name": "",
    "p.top_n": 25,
}.items():
    ss.setdefault(key, value)

ui.show_flash("p.flash")


# --- start a profile run ---------------------------------------------------------------------


def _form() -> dict:
    c1, c2, c3, c4 = st.columns(4)
    source = c1.radio(
        "Prompts",
        ["random", "builtin"],
        key="p.source",
        format_func={"random": "Random, exact length", "builtin": "Built-in set"}.get,
    )
    c2.number_input(
        "Input length (tokens)",
        step=16,
        key="p.input_len",
        disabled=source != "random",
        **field_bounds("input_len", WorkloadSpec),
    )
    # Tighter than RunConfig: the profiler keeps every operator event of every decode step in
    # memory until the run ends, and the trace and its analysis grow with them.
    c2.number_input(
        "Output length (tokens)",
        step=8,
        key="p.output_len",
        **{**field_bounds("output_len", WorkloadSpec), "max_value": PROFILE_MAX_OUTPUT_LEN},
    )
    c3.number_input(
        "Requests",
        step=1,
        key="p.requests",
        **{**field_bounds("requests"), "max_value": PROFILE_MAX_REQUESTS, "help": "Profiled requests: keep it small."},
    )
    c3.number_input("Concurrency", step=1, key="p.concurrency", **field_bounds("concurrency"))
    c4.number_input("Warm-up requests", step=1, key="p.warmup", **field_bounds("warmup"))
    c4.checkbox(
        "Record Python stacks",
        key="p.with_stack",
        help="with_stack=True: the trace shows the Python call stack of every operator (slower to analyse). "
        "Native engine only: a vLLM server's trace has stacks if it was started with the engine option "
        "profiler_with_stack.",
    )
    st.text_input("Run name (optional)", key="p.name", max_chars=80)
    return {
        "mode": "profile",
        "workload": {
            "source": source,
            "input_len": int(ss["p.input_len"]),
            "output_len": int(ss["p.output_len"]),
            "seed": 0,
        },
        "requests": int(ss["p.requests"]),
        "concurrency": int(ss["p.concurrency"]),
        "warmup": int(ss["p.warmup"]),
        "profile_with_stack": bool(ss["p.with_stack"]),
        "ignore_eos": True,
        "name": str(ss["p.name"]).strip(),
    }


state = slot.state()
active = manager.active()
with st.container(border=True):
    fields = _form()
    b1, b2 = st.columns([1, 3], vertical_alignment="center")
    blocked = ui.start_blocked_reason(state, active)
    start = b1.button(
        "Start profile run",
        type="primary",
        icon=":material/play_arrow:",
        key="p.btn.start",
        disabled=blocked is not None,
        width="stretch",
    )
    if blocked:
        b2.caption(blocked)
        if not state.ready:
            b2.page_link(ui.PAGE_ENGINE, label="Engine & Model", icon=":material/memory:")
    else:
        o = state.options or {}
        b2.caption(f"Profiles the loaded engine: {o.get('kind')} · {state.info.get('model')} · {o.get('accelerator')}")
if start and blocked is None and ui.submit_run(slot, manager, fields):  # then redraw with the new run
    st.rerun()  # redraw the form (Start disabled), the sidebar and the live panel with the new run

job = manager.latest("profile")
running = job is not None and ui.run_snapshot(job).active
if running:
    ss["p.watching"] = job.id  # this session saw the run in progress: show it here when it ends


@st.fragment(run_every=1.0 if running else None)
@ui.refreshing
def _live() -> None:
    """Progress, Stop and live memory of the profile run in progress (refreshes only while it runs)."""
    if job is None:
        return
    snap = ui.run_snapshot(job)
    if running and not snap.active:
        st.rerun()  # finished: one full redraw, so the new run shows below
    if not snap.active:
        return  # a finished run is picked below (with its error, if it failed)
    c1, c2 = st.columns([4, 1], vertical_alignment="bottom")
    with c1:
        st.markdown(f"#### {ui.STATUS_ICONS.get(snap.status, '')} Profile run #{snap.run_id} · {snap.status}")
        st.progress(
            min(1.0, snap.fraction),
            text=f"{snap.phase} · {snap.done}/{snap.total} requests · {data.fmt_duration(snap.elapsed_s)}",
        )
    with c2:
        st.button(
            "Stop", icon=":material/stop:", key="p.btn.stop", on_click=services.cancel, args=(job,), width="stretch",
            disabled=services.viewer(),
        )  # fmt: skip
    if snap.error:
        st.error(snap.error, icon=":material/error:")
    if snap.run_id is not None:
        ts = profile_data.memory_series(store, snap.run_id)
        ui.chart(charts.memory_timeline(ts, data.MEMORY_SERIES, title="Memory (live)"), "p.live-memory")


_live()

# --- examples --------------------------------------------------------------------------------


def _show(run_id: int) -> None:
    """Pick ``run_id`` in every picker (set explicitly: the browser keeps a widget's old choice otherwise),
    with its own time basis and no extra runs to compare."""
    ss["p.run"] = run_id
    ss["p.routing-run"] = run_id
    bases = profile_data.breakdown_basis(store.artifact(run_id, "profile_breakdown"))
    if bases:
        ss["p.basis"] = bases[0]
    ops = store.artifact(run_id, "profile_operators") or []
    on_device = "device" in bases or any(o.get("self_device_ms") for o in ops)  # a captured step: kernels only
    ss["p.op-sort"] = "self device time" if on_device else "self CPU time"
    ss["p.compare-runs"] = []


def _import_examples() -> None:
    try:
        services.require_operator()
        imported, skipped = profile_data.import_examples(store)
    except MoEBenchError as exc:
        ss["p.flash"] = ("error", str(exc))
        return
    if imported:
        ss["p.flash"] = ("success", f"Imported {len(imported)} example run(s): {', '.join(imported)}.")
        newest = profile_data.profile_runs(store, limit=50)
        # the newest profile whose time a breakdown splits (an eager step; a captured one has no scopes)
        shown = next(
            (r for r in newest if profile_data.breakdown_basis(store.artifact(r.id, "profile_breakdown"))), None
        )
        if shown or newest:
            _show((shown or newest[0]).id)
    else:
        ss["p.flash"] = ("success", f"The example runs are already here ({', '.join(skipped) or 'none found'}).")


examples = profile_data.example_names()
runs = profile_data.profile_runs(store)
have_examples = not profile_data.examples_missing(store)
with st.container(horizontal=True, vertical_alignment="center"):
    st.button(
        "Import the GPU example runs",
        icon=":material/upload:",
        key="p.btn.import-examples",
        on_click=_import_examples,
        disabled=not examples or services.viewer(),
        help="Real runs from examples/: on an NVIDIA H100 with the native engine's fastest configuration (a "
        "latency, a batched concurrency run, a profile with its trace, a sweep) and on an H200 with the eager "
        "baseline, so the pages show GPU figures without a GPU here. Already imported ones are skipped.",
    )
    st.caption(
        "Example runs keep their names (`h100-fast-…`, `h200-…`) and are marked *imported example*."
        if not have_examples
        else "The GPU example runs are imported (marked *imported example* below)."
    )


def _routing_table(routing: dict[str, Any] | None) -> None:
    """Per layer: routed tokens (the CLI's ``routing`` column, one definition), busiest and idlest expert."""
    tokens_help = f"{moe.ROUTED_TOKENS} ({moe.ROUTED_TOKENS_MEANING}); the CLI's `routing RUN` prints the same"
    st.dataframe(
        profile_data.routing_summary(routing),
        hide_index=True,
        key="p.routing-summary",
        column_config={"tokens": st.column_config.NumberColumn("tokens", help=tokens_help, format="%.0f")},
    )


def _ep_whatif(routing: dict[str, Any]) -> None:
    """This routing on an expert-parallel deployment: tokens per rank for an EP size the user
    picks, placed in contiguous blocks and as DeepSeek's EPLB would place them."""
    st.markdown("###### On an expert-parallel deployment")
    experts = int(routing.get("num_experts") or len(routing["counts"][0]))
    sizes = [e for e in moe.EP_SIZES if experts % e == 0 and e <= experts] or [1]
    c1, c2, c3 = st.columns([1, 1, 3], vertical_alignment="bottom")
    # Defaults go into session_state, never as index= too: init_state re-sets every p.* key each run, and a
    # widget with both logs Streamlit's "default value ... set via the Session State API" warning and stack.
    if ss.get("p.ep") not in sizes:
        ss["p.ep"] = 8 if 8 in sizes else sizes[0]
    ep = c1.selectbox("EP size (ranks)", sizes, key="p.ep")
    spare = sorted({r for r in (0, ep, 2 * ep, 4 * ep, experts // 2) if (experts + r) % ep == 0})
    if ss.get("p.redundant") not in spare:
        ss["p.redundant"] = spare[1] if len(spare) > 1 else spare[0]
    redundant = c2.selectbox(
        "Redundant experts (EPLB)", spare, key="p.redundant",
        help="Extra replicas of the busiest experts EPLB may place (DeepSeek-V3 serves 256 experts with 32 on EP 32)",
    )  # fmt: skip
    try:
        what = moe.eplb_whatif(routing, int(ep), int(redundant))
    except ConfigError as exc:
        st.warning(str(exc), icon=":material/warning:")
        return
    c3.caption(
        f"Balancedness (vLLM's: mean / max tokens per rank over the layers, 1 = even): **{what.balancedness:.3f}** "
        f"with experts in contiguous blocks, **{what.eplb_balancedness:.3f}** with EPLB's placement "
        f"(`python -m bench routing RUN --ep {ep} --redundant {redundant}` prints it per layer)."
    )
    ui.chart(figures.ep_rank_figure(what), "p.ep-ranks")


def _routing_view(run_id: int | None, own_routing: dict[str, Any] | None) -> None:
    """The routing tab: a run's routing record (``run_id``'s own is ``own_routing``; any run with
    one may be picked), its EP what-if, and a served deployment's EPLB balancedness."""
    if not routing_candidates:
        st.info(
            "No run recorded expert routing: native engine runs and managed Triton runs do, as do runs that ask a "
            "server for its routed experts (engine option routed_experts for SGLang, routing_pass for vLLM), runs "
            "against an SGLang server with its expert distribution recorder, and vLLM servers launched with EPLB.",
            icon=":material/info:",
        )
    else:
        routing_by_id = {r.id: r for r in routing_candidates}
        if run_id is not None and run_id not in routing_by_id:
            st.info(
                f"Run #{run_id} recorded no expert routing (a captured CUDA-graph step, a server that was not asked "
                "for its routed experts, or a run that ended first). Another run's routing can be picked below; "
                "its heat map is titled with its run.",
                icon=":material/info:",
            )
        if ss.get("p.routing-run") not in routing_by_id:
            ss["p.routing-run"] = run_id if run_id in routing_by_id else routing_ids[0]
        rid = st.selectbox(
            "Run (native, managed Triton and served routed-experts runs, SGLang recorder runs, vLLM EPLB runs)",
            routing_ids,
            key="p.routing-run",
            format_func=lambda i: profile_data.profile_run_label(routing_by_id[i], examples),
        )
        routing = own_routing if rid == run_id else store.artifact(rid, "expert_routing")
        if routing:
            st.caption(profile_data.routing_caption(routing))
        balance = profile_data.eplb_balancedness(store, rid)
        shown = routing
        windows = (routing or {}).get("windows") or []
        if len(windows) > 1:  # a served run's routing by time window: the heat map at any point of the run
            step = float(routing.get("window_s") or 10.0)
            labels = ["whole run"] + [f"{w['t_s']:.0f}-{w['t_s'] + step:.0f} s" for w in windows]
            if ss.get("p.routing-window") not in labels:
                ss["p.routing-window"] = "whole run"
            pick = st.select_slider("Routing over time", labels, key="p.routing-window")
            if pick != "whole run":
                window = windows[labels.index(pick) - 1]
                shown = {**routing, "counts": window["counts"]}
        if shown is routing and rid != run_id:  # another run's: its title says whose
            ui.chart(charts.routing_heatmap(routing, f"Tokens routed to each expert, run #{rid}"), "p.routing-heatmap")
        elif shown is routing:
            ui.chart(charts.routing_heatmap(routing), "p.routing-heatmap")
        else:
            ui.chart(charts.routing_heatmap(shown, f"Tokens routed to each expert, {pick}"), "p.routing-heatmap")
        others = [i for i in routing_ids if i != rid]
        other = st.selectbox(
            "Compare with another run's routing", [None, *others], key="p.routing-compare",
            format_func=lambda i: "none" if i is None else profile_data.profile_run_label(routing_by_id[i], examples),
            help="e.g. two workloads, or native against a served engine on the same prompts: do they route alike?",
        )  # fmt: skip
        if other is not None and routing:
            theirs = store.artifact(other, "expert_routing")
            overlap = moe.routing_overlap(routing, theirs) if theirs else None
            st.caption(
                "Not comparable: the two runs' models have different MoE layers or experts."
                if overlap is None
                else f"Routing overlap {overlap:.3f} (per layer, the share of tokens both runs send to the same "
                "experts, averaged: 1 = the same expert loads)."
            )
            if theirs:
                ui.chart(
                    charts.routing_heatmap(theirs, f"Tokens routed to each expert, run #{other}"), "p.routing-heat2"
                )
        r1, r2 = st.columns(2)
        with r1:
            ui.chart(charts.routing_imbalance(routing), "p.routing-imbalance")
        with r2:
            if routing and int(routing.get("n_group", 1) or 1) > 1:
                ui.chart(charts.routing_groups(routing), "p.routing-groups")
            else:
                _routing_table(routing)
        if routing and int(routing.get("n_group", 1) or 1) > 1:
            _routing_table(routing)
        if not balance.empty:
            moves = profile_data.eplb_rearrangements(store, rid)
            latency = profile_data.latency_by_window(store, rid)
            ui.chart(charts.eplb_balancedness(balance, rearranged_at=moves, latency=latency), "p.routing-eplb")
        if routing:
            _ep_whatif(routing)


# --- pick a stored profile run ---------------------------------------------------------------

routing_candidates = profile_data.routing_runs(store)
routing_ids = [r.id for r in routing_candidates]
if not runs:
    st.info(
        "The operator table, breakdown, routing and memory of the run in progress show here when it finishes."
        if running
        else "No profile run yet. Load the native engine and start one above, or import the GPU example runs.",
        icon=":material/info:",
    )
    if routing_candidates and not running:
        st.markdown("##### :material/hub: Expert routing of other runs")
        _routing_view(None, None)
    st.stop()

by_id = {r.id: r for r in runs}
finished = ui.run_snapshot(job) if job is not None and not running and ss.get("p.watching") == job.id else None
if finished is not None and finished.run_id in by_id:
    ss.pop("p.watching")  # the run this session watched has ended: show it (once)
    _show(finished.run_id)
if ss.get("p.run") not in by_id:
    _show(runs[0].id)


run_id = st.selectbox(
    "Profile run",
    list(by_id),
    key="p.run",
    format_func=lambda i: profile_data.profile_run_label(by_id[i], examples),
    on_change=lambda: _show(ss["p.run"]),
    help="Every stored profile run, newest first.",
)
run = by_id[run_id]
prof = profile_data.load_profile(store, run_id)
if run.error:
    (st.warning if run.status == "cancelled" else st.error)(run.error, icon=":material/error:")
if run.status != "completed" and prof.operators.empty and prof.breakdown is None and prof.routing is None:
    st.caption(f"Run #{run.id} {run.status} before the profiler produced anything to show.")
    st.stop()
if run.name in examples:
    st.markdown(
        f":violet-badge[:material/inventory_2: imported example] recorded on "
        f"**{run.engine_info.get('device', run.accelerator)}** · {run.engine_info.get('dtype', '')} · "
        f"{data.fmt_params(run.engine_info.get('parameters'))} parameters"
    )


ops_tab, breakdown_tab, routing_tab, memory_tab = st.tabs(
    [
        ":material/table_rows: Operators",
        ":material/stacked_bar_chart: Bottlenecks",
        ":material/hub: Expert routing",
        ":material/memory: Memory",
    ]
)

# --- a. operators ----------------------------------------------------------------------------

with ops_tab:
    ops = prof.operators
    if ops.empty:
        st.info(
            "No operator table: the native engine's profile runs have one; "
            + (
                "this run ended before the profiler finished."
                if run.engine == "native"
                else f"this {run.engine} run's server trace was not found or could not be read "
                "(runs recorded before MoE Bench read vLLM traces have the trace alone; download it below)."
            ),
            icon=":material/info:",
        )
    else:
        device, memory = profile_data.has_device_times(ops), profile_data.has_memory(ops)
        shown = profile_data.OPERATOR_SORTS
        sorts = [s for s in shown if (device or "device" not in s) and (memory or "memory" not in s)]
        if ss.get("p.op-sort") not in sorts:
            ss["p.op-sort"] = sorts[0]
        o1, o2, o3 = st.columns([2, 3, 2])
        sort = o1.selectbox("Sort by", sorts, key="p.op-sort", help="largest first")
        most = min(200, max(5, len(ops)))
        ss["p.top_n"] = min(int(ss.get("p.top_n", 25)), most)  # a shorter table than the last one
        if len(ops) > 5:
            top_n = o2.slider("Top N operators", min_value=5, max_value=most, key="p.top_n")
        else:  # nothing to choose: every row is shown
            top_n = len(ops)
            o2.caption(f"All {len(ops)} operators.")
        search = o3.text_input("Filter", key="p.op-filter", placeholder="e.g. aten::mm, gemm")
        shown = ops[ops["operator"].str.contains(search.strip(), case=False, regex=False)] if search.strip() else ops
        top = profile_data.top_operators(shown, sort, top_n)
        st.caption(
            f"{len(top)} of {len(ops):,} operator rows "
            + (
                "(grouped by input shape). Times in ms, memory in MiB "
                "(self memory can be negative: an op that frees more than it allocates). "
                if memory
                else f"read from the {run.engine} server's trace (by name: a trace holds no input shapes or "
                "memory). Times in ms. "
            )
            + ("Device times are kernel times on the accelerator." if device else "CPU run: no device times.")
        )
        num = st.column_config.NumberColumn
        order = ["rank", "operator", "input_shapes", "calls", "self_cpu_ms", "cpu_total_ms"]
        if not memory:
            order.remove("input_shapes")
        if device:
            order += ["self_device_ms", "device_total_ms"] + (["device_memory_mib"] if memory else [])
        order += (["cpu_memory_mib"] if memory else []) + ["share_pct"]
        st.dataframe(
            top,
            hide_index=True,
            key="p.operators",
            column_order=order,
            column_config={
                "rank": num("#", format="%d", width="small"),
                "operator": st.column_config.TextColumn("operator", width="large"),
                "input_shapes": st.column_config.TextColumn("input shapes", width="medium"),
                "calls": num("calls", format="%d"),
                "self_cpu_ms": num("self CPU (ms)", format="%.3f"),
                "cpu_total_ms": num("CPU total (ms)", format="%.3f"),
                "self_device_ms": num("self device (ms)", format="%.3f"),
                "device_total_ms": num("device total (ms)", format="%.3f"),
                "cpu_memory_mib": num("self CPU mem (MiB)", format="%.2f"),
                "device_memory_mib": num("self device mem (MiB)", format="%.2f"),
                "share_pct": st.column_config.ProgressColumn(
                    f"share of {sort}", format="%.1f%%", min_value=0.0, max_value=100.0
                ),
            },
        )
    d1, d2, d3 = st.columns([1, 1, 2], vertical_alignment="center")
    if not ops.empty:

        def _operators_csv() -> bytes:
            return operators_csv(store, run_id)

        d1.download_button(
            "Operator CSV",
            data=_operators_csv,
            file_name=f"moebench-operators-run{run_id}.csv",
            mime="text/csv",
            icon=":material/download:",
            key="p.btn.operators-csv",
            on_click="ignore",
            width="stretch",
        )
    trace = prof.trace
    if trace.path is None:
        d3.caption("This run recorded no trace file.")
    elif not trace.exists:
        d3.warning(
            f"The trace file `{trace.path.name}` is not in this data folder's traces (deleted, or recorded "
            "elsewhere): only traces MoE Bench keeps there are offered.",
            icon=":material/draft:",
        )
    else:
        trace_path = trace.path

        def _trace_bytes() -> bytes:
            return trace_path.read_bytes()

        size_mib = trace_path.stat().st_size / 2**20
        d2.download_button(
            f"Trace ({size_mib:.1f} MiB)",
            data=_trace_bytes,
            file_name=trace_path.name,
            mime=trace.mime,
            icon=":material/download:",
            key="p.btn.trace",
            on_click="ignore",
            width="stretch",
        )
        d3.caption(f"`{trace_path.name}`: open it in [Perfetto](https://ui.perfetto.dev) or chrome://tracing.")

# --- b. bottleneck breakdown -----------------------------------------------------------------

with breakdown_tab:
    others = [i for i in by_id if i != run_id and profile_data.breakdown_basis(store.artifact(i, "profile_breakdown"))]
    if "p.compare-runs" in ss:
        ss["p.compare-runs"] = [i for i in ss["p.compare-runs"] if i in others]
    b1, b2 = st.columns([3, 1])
    extra = b1.multiselect(
        "Compare with other profile runs",
        others,
        key="p.compare-runs",
        format_func=lambda i: profile_data.profile_run_label(by_id[i], examples),
        placeholder="add profile runs to stack their bars beside this one",
    )
    picked = [run_id, *extra]
    arts = {i: (prof.breakdown if i == run_id else store.artifact(i, "profile_breakdown")) for i in picked}
    bases = profile_data.breakdown_basis(prof.breakdown)
    if not bases:
        note = (prof.breakdown or {}).get("note")
        st.info(
            (note[0].upper() + note[1:] + ".")
            if note
            else "No bottleneck breakdown for this run: only the native engine's profile runs classify operator time.",
            icon=":material/info:",
        )
    else:
        if ss.get("p.basis") not in bases:
            ss["p.basis"] = bases[0]
        basis = b2.radio(
            "Time basis",
            bases,
            key="p.basis",
            horizontal=True,
            format_func={"device": "device time", "cpu": "CPU time"}.get,
            help="Device time: kernel time on the accelerator. CPU time: host time of the ops (incl. launching "
            "kernels). A CPU run has CPU time only.",
        )
        labels = {i: profile_data.short_run_label(by_id[i]) for i in picked}
        frame = profile_data.breakdown_frame([(labels[i], arts[i]) for i in picked], basis)
        missing = [labels[i] for i in picked if basis not in profile_data.breakdown_basis(arts[i])]
        if missing:
            st.caption(f"Left out (no {basis} time recorded): {', '.join(missing)}.")
        ui.chart(charts.breakdown_bars(frame, basis), "p.breakdown")
        table = profile_data.breakdown_table(frame)
        st.dataframe(
            table,
            hide_index=True,
            key="p.breakdown-table",
            column_config={
                c: st.column_config.NumberColumn(c, format="%.1f%%" if c.endswith("(%)") else "%.2f")
                for c in table.columns
                if c != "category"
            },
        )
        st.caption(
            "Each bar is one run's profiled time (the requests' generate scopes) split by category; the shares add "
            "up to 100%. Time that no rule claims is *other*."
        )
    comm = store.artifact(run_id, "communication")
    if isinstance(comm, dict) and comm.get("ranks"):
        st.markdown(
            f"**Expert parallelism: {comm['world']} ranks ({comm['backend']})**: "
            f"{comm['moe_layer_exchanges']:,} MoE layer exchanges, {comm['bytes'] / 1e6:,.3f} MB between ranks"
        )
        st.dataframe(
            profile_data.communication_frame(comm),
            hide_index=True,
            key="p.comm-table",
            column_config={
                "sent (MB)": st.column_config.NumberColumn(format="%.3f"),
                "received (MB)": st.column_config.NumberColumn(format="%.3f"),
                "all-to-all (ms)": st.column_config.NumberColumn(format="%.1f", help="time inside the all-to-alls"),
                "experts (ms)": st.column_config.NumberColumn(format="%.1f", help="this rank's routed experts"),
                "GB/s": st.column_config.NumberColumn(format="%.4g", help="bytes sent and received / all-to-all time"),
            },
        )
        st.caption(
            "Rank 0 (this process) serves every request; the other ranks hold only their share of the routed experts. "
            "Bytes count what crossed to another rank; GB/s is bytes sent and received over the time inside the "
            "all-to-alls, waiting for the peers included. The *communication* bar is rank 0's collectives as its "
            "profiler saw them."
        )
    with st.expander("How time is classified", icon=":material/rule:"):
        st.markdown(
            "Forward hooks wrap each classified module in a `moe_bench::<category>` scope; the first matching "
            "**module** rule wins. **op** rules move matching operators out of the enclosing category "
            "(quantization, collectives); **op_outside** rules apply only outside any module scope."
        )
        st.dataframe(
            profile_data.rules_table(),
            hide_index=True,
            key="p.rules",
            column_config={
                "pattern": st.column_config.TextColumn("pattern (regex)", width="medium"),
                "why": st.column_config.TextColumn("why", width="large"),
            },
        )

# --- c. expert routing -----------------------------------------------------------------------

with routing_tab:
    _routing_view(run_id, prof.routing)

# --- d. memory timeline ----------------------------------------------------------------------

with memory_tab:
    weights = run.engine_info.get("weights_gib")
    weights = float(weights) if weights is not None else None
    cpu = run.accelerator == "cpu"
    peak = run.summary.peak_memory_gib if run.summary is not None else None
    m1, m2, m3 = st.columns(3)
    m1.metric("Model weights", data.fmt_unit(weights, "GiB"), help="engine_info['weights_gib'] of the run")
    m2.metric(
        "Peak memory",
        data.fmt_unit(peak, "GiB"),
        help="the highest peak sampled while the requests ran: a point on the timeline below (the profile's "
        "analysis afterwards is in neither)",
    )
    m3.metric(
        "Above the weights at peak",
        data.fmt_unit(peak - weights if peak is not None and weights is not None else None, "GiB"),
        help="activations + KV cache + runtime (allocator caches, CUDA context on a GPU; the interpreter on CPU)",
    )
    ts = profile_data.memory_series(store, run_id)
    ui.chart(
        charts.memory_timeline(
            ts,
            data.MEMORY_SERIES,
            weights,
            y_title="process RSS (GiB)" if cpu else "memory (GiB)",
            title="Memory timeline" + (" (process RSS)" if cpu else ""),
        ),
        "p.memory",
    )
    if cpu:
        st.caption(
            "On CPU the figures are the process's resident set size (RSS): allocated = reserved = RSS, and they "
            "include the Python interpreter and libraries, so most of it is not the model. Sampled about once a "
            "second (a short run has few points)."
        )
    else:
        st.caption(
            "Allocated: tensors alive; reserved: what the caching allocator holds; peak: the most allocated since "
            "the run started. Above the *weights* line: activations, KV cache and runtime. Sampled about once a "
            "second."
        )

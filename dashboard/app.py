"""MoE Bench dashboard: the router. ``make run`` serves it through ``dashboard/serve.py`` (the host guard).

Builds ``st.navigation`` over ``dashboard/app_pages/`` (one file per page, UI only) and
draws the shared sidebar: the loaded engine, its memory and the run (or sweep) in progress.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the project root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import services, ui  # noqa: E402

st.set_page_config(page_title="MoE Bench", page_icon=":material/speed:", layout="wide")
if os.environ.get("MOEBENCH_GUARDED") != "1":
    # `streamlit run dashboard/app.py` skips serve.py's host guard and access token.
    st.error(
        "Start the dashboard with `make run` (`streamlit run dashboard/serve.py`): this entry point has no host "
        "guard and no access token, so it serves nothing.",
        icon=":material/lock:",
    )
    st.stop()

PAGES = {
    "Setup": [
        st.Page(ui.PAGE_ENGINE, title="Engine & Model", icon=":material/memory:", default=True),
    ],
    "Benchmark": [
        st.Page(ui.PAGE_LATENCY, title="Latency", icon=":material/timer:"),
        st.Page(ui.PAGE_CONCURRENCY, title="Concurrency", icon=":material/stacked_line_chart:"),
        st.Page(ui.PAGE_SWEEP, title="Sweep", icon=":material/ssid_chart:"),
        st.Page(ui.PAGE_PROFILING, title="Profiling", icon=":material/troubleshoot:"),
        st.Page(ui.PAGE_TUNING, title="Tuning", icon=":material/tune:"),
    ],
    "Analysis": [
        st.Page(ui.PAGE_RESULTS, title="Results", icon=":material/table_chart:"),
        st.Page(ui.PAGE_COMPARE, title="Compare with the book", icon=":material/compare_arrows:"),
        st.Page(ui.PAGE_REPLAY, title="Replay a run", icon=":material/replay:"),
    ],
}

page = st.navigation(PAGES)
ui.init_state(page.url_path)
with ui.one_refresh():  # the sidebar and the page draw a running job from one snapshot
    with st.sidebar:
        st.markdown("### :material/speed: MoE Bench")
        st.caption("DeepSeek MoE inference benchmarks")
        if services.viewer():
            st.markdown(":violet-badge[:material/visibility: viewer mode]")
            st.caption("Read-only: results and live runs are shown; nothing can be started, stopped or deleted here.")
        ui.sidebar()
    page.run()

"""Latency page (seed 8.1.1 ``benchmark_latency``): sequential requests after a warm-up."""

from __future__ import annotations

import streamlit as st

from dashboard import ui

st.title("Latency")
st.caption(
    "Sequential requests, one at a time, after unrecorded warm-up requests — the book's `benchmark_latency` "
    "(section 8.1.1), with TTFT, TPOT and end-to-end latency per request."
)
ui.run_page("latency")

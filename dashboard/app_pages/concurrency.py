"""Concurrency page (seed 8.4.1 ``ConcurrencyTester``): many requests with a cap on those in flight."""

from __future__ import annotations

import streamlit as st

from dashboard import ui

st.title("Concurrency")
st.caption(
    "Requests sent by a fixed number of workers, so at most *concurrency* are in flight — the book's "
    "`ConcurrencyTester` (section 8.4.1) — or, with a request rate, arriving as a Poisson/gamma process "
    "capped at that concurrency. Throughput is output tokens over wall-clock time."
)
ui.run_page("concurrency")

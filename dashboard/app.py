"""MoE Bench dashboard (placeholder until the dashboard issue lands)."""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="MoE Bench", layout="wide")
st.title("MoE Bench")
st.write("Use `python -m bench run ...` for now; the dashboard is being built.")

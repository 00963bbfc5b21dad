"""The Streamlit dashboard: the only package that imports streamlit."""

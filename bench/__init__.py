"""What is measured: workloads, runs, metrics, the results store and the CLI.

Nothing in this package imports streamlit.
"""

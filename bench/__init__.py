"""What is measured: workloads, runs, metrics, sweeps, analysis, reports and the CLI, in wings.

Bottom to top (a wing imports only wings below it; ``tests/test_layering.py`` holds the order):
``metrics`` < ``workloads`` < ``config`` < ``store`` < ``bundle`` < ``stub_server`` < ``send`` < ``run``
< ``sweep`` < ``analysis`` < ``report`` < ``cli``. Nothing in this package imports streamlit.
"""

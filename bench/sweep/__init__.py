"""Many runs with a verdict: sweeps over concurrency, rate, lengths and engine options, and the
capacity search for the highest load that meets the SLOs (:mod:`~bench.sweep.spec`,
:mod:`~bench.sweep.task`), with the parsers of their axis values (:mod:`~bench.sweep.axes`)."""

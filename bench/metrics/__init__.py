"""What a run measured and what it could have measured: per-request records and the metric
definitions (:mod:`~bench.metrics.records`), run summaries and spreads (:mod:`~bench.metrics.summary`),
SLOs and goodput (:mod:`~bench.metrics.slo`), the client-bound rule (:mod:`~bench.metrics.client_bound`),
and the physical limits: accelerator specs, the CPU measured, model shapes and the roofline, and a
run's limits (:mod:`~bench.metrics.run_limits`). The lowest wing: it imports only ``engines``."""

"""``python -m bench`` / ``moebench``: the headless face of MoE Bench, one module per command group
(:mod:`~bench.cli.run`, :mod:`~bench.cli.sweep`, :mod:`~bench.cli.compare`), their shared helpers in
:mod:`~bench.cli.common` and the parser in :mod:`~bench.cli.main`. The top wing: nothing in ``bench``
imports it."""

"""studies/cpu_bandwidth.py prints its figures (the same measurement as bench.metrics.cpu_limits)."""

from __future__ import annotations

import pytest

from studies import cpu_bandwidth


def test_the_benchmark_script_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert cpu_bandwidth.main(["--rounds", "1", "--array-mib", "8", "--matmul-n", "64"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "read (sum)" in out and "random-v2-lite-shape on NVIDIA H200" in out

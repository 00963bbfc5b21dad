"""The parity benchmark's stall bookkeeping (the benchmark itself runs real vLLM; see the README)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.benchmarks.parity_vllm import _stalls, _worst_stall


def test_a_stall_counts_for_the_windows_it_overlaps(tmp_path: Path) -> None:
    log = tmp_path / "stalls.txt"
    log.write_text("100.500 400\n200.000 250\n")  # end time, length in ms
    stalls = _stalls(log)
    assert stalls == [(100.5, 400.0), (200.0, 250.0)]
    assert _worst_stall(stalls, [(100.0, 100.2)]) == 400.0  # the stall began at 100.1, inside
    assert _worst_stall(stalls, [(99.0, 100.05), (199.5, 199.9)]) == 250.0  # only the second overlaps
    assert _worst_stall(stalls, [(101.0, 150.0)]) == 0.0
    assert _worst_stall([], [(0.0, 1e12)]) == 0.0


def test_engine_opt_values_parse_as_json_or_stay_strings() -> None:
    import argparse

    from bench.benchmarks.parity_vllm import _engine_opt

    parser = argparse.ArgumentParser()
    assert _engine_opt("async_client=false", parser) == ("async_client", False)
    assert _engine_opt("max_connections=64", parser) == ("max_connections", 64)
    assert _engine_opt("endpoint=chat", parser) == ("endpoint", "chat")
    with pytest.raises(SystemExit):
        _engine_opt("no-equals-sign", parser)

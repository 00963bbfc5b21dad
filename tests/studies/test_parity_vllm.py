"""The parity benchmark's stall bookkeeping (the benchmark itself runs real vLLM; see the README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.parity_vllm import read_stalls, worst_stall


def test_a_stall_counts_for_the_windows_it_overlaps(tmp_path: Path) -> None:
    log = tmp_path / "stalls.txt"
    log.write_text("100.500 400\n200.000 250\n")  # end time, length in ms
    stalls = read_stalls(log)
    assert stalls == [(100.5, 400.0), (200.0, 250.0)]
    assert worst_stall(stalls, [(100.0, 100.2)]) == 400.0  # the stall began at 100.1, inside
    assert worst_stall(stalls, [(99.0, 100.05), (199.5, 199.9)]) == 250.0  # only the second overlaps
    assert worst_stall(stalls, [(101.0, 150.0)]) == 0.0
    assert worst_stall([], [(0.0, 1e12)]) == 0.0


def test_engine_opt_values_parse_as_json_or_stay_strings() -> None:
    import argparse

    from studies.parity_vllm import engine_opt

    parser = argparse.ArgumentParser()
    assert engine_opt("async_client=false", parser) == ("async_client", False)
    assert engine_opt("max_connections=64", parser) == ("max_connections", 64)
    assert engine_opt("endpoint=chat", parser) == ("endpoint", "chat")
    with pytest.raises(SystemExit):
        engine_opt("no-equals-sign", parser)

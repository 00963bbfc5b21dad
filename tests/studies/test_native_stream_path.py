"""studies/native_stream_path.py runs through the product's runner on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies import native_stream_path


def test_the_stream_path_benchmark_runs_both_loops_through_the_runner(tiny_model: Path, capsys: Any) -> None:
    """``studies/native_stream_path.py``: its stand-in decoder streams every token of
    every request through the real runner in both loops (it raises if a token is lost)."""
    assert native_stream_path.main(["--batches", "3", "--step-ms", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 3 | 1 |")]
    assert [r.split(" | ")[2] for r in rows] == ["sync", "pipelined"]

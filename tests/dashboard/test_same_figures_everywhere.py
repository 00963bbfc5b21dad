"""One run, one figure, wherever it is read (issue 46): the CLI's summary, the summary CSV, the
Results page, the HTML report and the vllm-json export give the same output tok/s and TTFT p99
for a real run of the tiny model made through the CLI."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.sweep_analysis import fmt_num
from bench.store import Store
from engines.settings import get_settings

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_same_run_reads_the_same_everywhere(
    app_test: Callable[..., Any], fresh_data_dir: Path, tiny_model: Path, tmp_path: Path
) -> None:
    db = str(get_settings().db_path)
    printed = _bench("--db", db, "run", "--engine", "native", "--model", str(tiny_model), "--requests", "6",
                     "--concurrency", "2", "--input-len", "16", "--output-len", "6")  # fmt: skip
    run = Store(db).list_runs()[0]
    s = run.summary
    assert s is not None and s.completed == 6
    tok_s, ttft_p99 = s.output_throughput_tok_s, s.ttft_ms.p99
    assert ttft_p99 is not None
    # 1. the CLI summary (its own rounding: tok/s to 2 places, ms to 2 places)
    assert f"{tok_s:.2f} output tok/s" in printed
    row = next(line for line in printed.splitlines() if line.startswith("TTFT ms"))
    assert float(row.split()[6]) == pytest.approx(ttft_p99, abs=0.005)  # mean p50 p90 p95 p99 max
    # 2. the summary CSV
    path = tmp_path / "s.csv"
    _bench("--db", db, "export", str(run.id), "--csv", str(path), "--summary")
    got = next(csv.DictReader(path.open(encoding="utf-8")))
    assert float(got["output_throughput_tok_s"]) == pytest.approx(tok_s, rel=1e-4)
    assert float(got["ttft_ms_p99"]) == pytest.approx(ttft_p99, rel=1e-4)
    # 3. vllm bench serve's JSON
    vpath = tmp_path / "v.json"
    _bench("--db", db, "export", str(run.id), "--csv", str(vpath), "--format", "vllm-json")
    vllm = json.loads(vpath.read_text(encoding="utf-8"))
    assert vllm["output_throughput"] == pytest.approx(tok_s) and vllm["p99_ttft_ms"] == pytest.approx(ttft_p99)
    # 4. the HTML report shows the stored figure, formatted as its tables format numbers
    html = tmp_path / "r.html"
    _bench("--db", db, "report", str(run.id), "--html", str(html))
    page = html.read_text(encoding="utf-8")
    assert re.search(rf"output throughput \(tok/s\)</th><td>{re.escape(fmt_num(tok_s))}<", page)
    # 5. the Results page's table
    at = app_test("app_pages/results.py")
    assert not at.exception
    table = next(df.value for df in at.dataframe if "output tok/s" in df.value.columns or "run_id" in df.value.columns)
    col = "output tok/s" if "output tok/s" in table.columns else "output_throughput_tok_s"
    assert float(table[col].iloc[0]) == pytest.approx(tok_s, rel=1e-3)

"""The third hostile round, imports and traces (issue 45, section 2; the idempotent import of
section 3): trace files that would make a replay wait forever or read without bound, peer result
files that broke ``bench runs``, bundle fields that broke pages and reports, a sweep import cut
mid-way, unbounded reads, and the same file imported twice. Each test fails without its fix; the
files are made here and go through the real CLI (:func:`tests.hostile.clirun.bench`)."""

from __future__ import annotations

import copy
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.trace import MAX_GAP_S, TraceRow, offsets
from engines.errors import WorkloadError
from tests.hostile.clirun import ROOT, bench, cli_env

EXAMPLES = ROOT / "examples"
SWEEP = EXAMPLES / "h100-fast-sweep.sweep.json"
ROUTED = EXAMPLES / "h200-latency-bs1.json"
PEERS = ROOT / "tests" / "data" / "peers"
MIB = 2**20


def _db(tmp_path: Path) -> Path:
    return tmp_path / "results.sqlite"


def _counts(db: Path) -> tuple[int, int]:
    """(sweeps, runs) stored in ``db`` (0, 0 for a file not made yet)."""
    if not db.exists():
        return 0, 0
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "runs" not in tables:
            return 0, 0
        return con.execute("SELECT COUNT(*) FROM sweeps").fetchone()[0], con.execute(
            "SELECT COUNT(*) FROM runs"
        ).fetchone()[0]
    finally:
        con.close()


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# --- 1. traces: bounded times and gaps, strict Azure times, bounded lines, not-a-file said ---------


TRACES = {
    "jsonl-1e18": ("t.jsonl", '{"timestamp": 0, "input_length": 16, "output_length": 4}\n'
                              '{"timestamp": 1e18, "input_length": 16, "output_length": 4}\n'),
    "jsonl-two-days": ("t.jsonl", '{"timestamp": 0, "input_length": 16, "output_length": 4}\n'
                                  '{"timestamp": 172800000, "input_length": 16, "output_length": 4}\n'),
    "jsonl-400-digit-timestamp": ("t.jsonl", '{"timestamp": 0, "input_length": 16, "output_length": 4}\n'
                                             '{"timestamp": ' + "9" * 400 + ', "input_length": 16, '
                                             '"output_length": 4}\n'),
    "jsonl-400-digit-length": ("t.jsonl", '{"timestamp": 0, "input_length": ' + "9" * 400 + ', "output_length": 4}\n'),
    "azure-inf-fraction": ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,16,4\n"
                                    "2023-11-16 18:15:47.5e400,16,4\n"),
    "azure-exponent": ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.9e9,16,4\n"),
    "azure-underscore": ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1_0,16,4\n"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TRACES))
def test_a_trace_that_would_wait_forever_or_overflow_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    """Before: `trace info` printed `gaps inf ms` (and a replay waited forever), or an
    OverflowError traceback; now one line naming the file's line."""
    name, text = TRACES[case]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    r = bench("trace", "info", str(path), data_dir=tmp_path)
    assert r.returncode != 0, r.stdout
    line = r.one_error()
    assert f"{name} line" in line and "inf" not in r.stdout


def test_a_replay_scaled_past_a_day_between_requests_is_refused() -> None:
    rows = [TraceRow(0.0, 16, 4, line=1), TraceRow(3600.0, 16, 4, line=2)]
    assert offsets(rows, 1.0) == [0.0, 3600.0]
    with pytest.raises(WorkloadError, match=r"trace line 2: due .* over the 86,400 s a replay may wait"):
        offsets(rows, MAX_GAP_S)  # an hour times a day


def test_a_jsonl_trace_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    """Format detection skipped the BOM but the first row's JSON did not: `not a JSON object`."""
    path = tmp_path / "bom.jsonl"
    rows = "".join(json.dumps({"timestamp": 10 * i, "input_length": 16, "output_length": 4}) + "\n" for i in range(3))
    path.write_bytes(b"\xef\xbb\xbf" + rows.encode())
    r = bench("trace", "info", str(path), data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "requests      3 over 0.020 s" in r.stdout


def test_a_trace_line_without_an_end_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """300 MB without a newline (a sparse file: no disk used) reached 685 MB of memory before the
    1 MiB line check; now the line is read with that limit."""
    path = tmp_path / "one-line.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"timestamp": 0, "prompt": "')
        fh.truncate(300 * MIB)
    r = bench("trace", "info", str(path), data_dir=tmp_path)
    assert "line 1: over the 1,048,576 bytes a line may hold" in r.one_error()
    assert r.peak_rss < 250 * MIB, f"peak {r.peak_rss / MIB:.0f} MiB"


def test_a_fifo_given_as_a_trace_is_said_to_be_no_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    r = bench("trace", "info", str(fifo), data_dir=tmp_path)
    assert "is not a regular file" in r.one_error()


# --- 2. a peer file without some figures lists with a dash; an impossible one is refused ---------


VLLM_NO_LATENCY = {"date": "20261207-120000", "backend": "openai", "model_id": "m", "duration": 1.0, "completed": 10,
                   "failed": 0, "total_input_tokens": 100, "total_output_tokens": 100,
                   "request_throughput": 10.0}  # fmt: skip


def _aiperf_without_output_rate() -> dict[str, Any]:
    doc = json.loads((PEERS / "aiperf-concurrency.json").read_text())
    doc.pop("output_token_throughput")
    return doc


def _guidellm(change: str) -> dict[str, Any]:
    doc = json.loads((PEERS / "guidellm-concurrent.json").read_text())
    bench0 = doc["benchmarks"][0]
    if change == "duration 0":
        bench0["duration"] = 0
    else:
        bench0["metrics"].pop("output_token_count")
    return doc


@pytest.mark.parametrize(
    "make",
    [lambda: VLLM_NO_LATENCY, _aiperf_without_output_rate, lambda: _guidellm("no output_token_count")],
    ids=["vllm-no-latency", "aiperf-no-output-rate", "guidellm-no-output-count"],
)
def test_a_peer_file_without_some_figures_imports_and_runs_still_lists(tmp_path: Path, make: Any) -> None:
    """Before: the import worked, then `bench runs` died on None.__format__ for the whole store."""
    db = _db(tmp_path)
    path = _write(tmp_path / "peer.json", make())
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = bench("runs", "--db", str(db), data_dir=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "\u2013" in listed.stdout.splitlines()[1]  # the figure the file lacks: a dash


def test_a_guidellm_file_of_duration_zero_is_refused(tmp_path: Path) -> None:
    db = _db(tmp_path)
    path = _write(tmp_path / "peer.json", _guidellm("duration 0"))
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert "benchmarks[0].duration is 0: a run that took no time has no rates" in r.one_error()
    assert _counts(db) == (0, 0)


# --- 3. every imported field checked against what the store writes --------------------------------


def _sweep_doc() -> dict[str, Any]:
    return json.loads(SWEEP.read_text())


def _bad_sweep(change: str) -> tuple[dict[str, Any], str]:
    doc = _sweep_doc()
    run0 = doc["runs"][0]["run"]
    if change == "sweep_point":
        run0["sweep_point"] = '{"concurrency":[1,2],"repeat":"x"}'
        return doc, "run 0: the run's sweep_point"
    if change == "config_json":
        doc["sweep"]["config_json"] = '{"base":5}'
        return doc, "the sweep's config_json: base is not a run config"
    if change == "run config_json":
        run0["config_json"] = '{"workload": 5}'
        return doc, "the run's config_json: workload is '5', not an object"
    if change == "created_at":
        doc["sweep"]["created_at"] = 1e300
        return doc, "the sweep's created_at is '1e+300', not a time"
    if change == "finished_at":
        doc["sweep"]["finished_at"] = "yesterday"
        return doc, "the sweep's finished_at is 'yesterday', not a time"
    assert change == "created_at NaN"
    doc["sweep"]["created_at"] = float("nan")
    return doc, "the sweep's created_at is 'nan', not a time"


@pytest.mark.parametrize(
    "change", ["sweep_point", "config_json", "run config_json", "created_at", "finished_at", "created_at NaN"]
)
def test_a_sweep_bundle_with_a_bad_field_is_refused_naming_it(tmp_path: Path, change: str) -> None:
    """Before: imported, then the Sweep page and `report sweep:N` raised for every visitor (and NaN
    said the database was damaged)."""
    db = _db(tmp_path)
    doc, reason = _bad_sweep(change)
    path = _write(tmp_path / "bad.sweep.json", doc)
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert reason in r.one_error()
    assert _counts(db) == (0, 0)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("n_group", "x", "the artifact expert_routing has n_group 'x', not a whole number >= 1"),
        ("layers", 5, "the artifact expert_routing has layers that are not 26 labels"),
        ("counts", [[1, 2], [3]], "the artifact expert_routing has counts whose rows are not all 2 experts wide"),
    ],
)
def test_a_run_bundle_with_a_bad_routing_record_is_refused(tmp_path: Path, key: str, value: Any, reason: str) -> None:
    """Before: imported, then the Profiling page, `routing N` and `report N` raised."""
    db = _db(tmp_path)
    doc = json.loads(ROUTED.read_text())
    doc["artifacts"]["expert_routing"][key] = value
    path = _write(tmp_path / "bad.json", doc)
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert reason in r.one_error()
    assert _counts(db) == (0, 0)


# --- 4. a sweep import is one transaction -----------------------------------------------------------


def _big_sweep(tmp_path: Path, runs: int = 200) -> Path:
    doc = _sweep_doc()
    one = doc["runs"][0]
    one["samples"] = one["samples"][:40]
    many = []
    for i in range(runs):
        run = copy.deepcopy(one)
        run["run"]["name"] = f"point {i}"
        many.append(run)
    doc["runs"] = many
    return _write(tmp_path / "big.sweep.json", doc)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_sweep_import_killed_mid_way_leaves_all_or_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    """Before: killed as its first runs appeared, the store kept the sweep and part of its runs."""
    db = _db(tmp_path)
    path = _big_sweep(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "import", str(path), "--db", str(db)],
        cwd=ROOT, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    start = time.monotonic()
    try:
        # Kill as soon as a run is visible to another reader, or a while after the file exists
        # (an import that writes one transaction shows nothing until it commits).
        seen_file = None
        while proc.poll() is None and time.monotonic() - start < 120:
            if db.exists() and seen_file is None:
                seen_file = time.monotonic()
            try:
                if _counts(db)[1] > 0 or (seen_file is not None and time.monotonic() - seen_file > 1.0):
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.01)
        was_running = proc.poll() is None
        proc.send_signal(sig)  # our own child, by its handle
    finally:
        proc.communicate(timeout=60)
    assert was_running, "the import ended before it could be killed"
    assert _counts(db) in ((0, 0), (1, 200)), _counts(db)


# --- 5. bounded reads and figures; one line, not a traceback --------------------------------------


def test_a_tiny_vllm_file_claiming_a_hundred_million_requests_stays_small(tmp_path: Path) -> None:
    """Before: `[True] * n` took 846 MB for 1e8 (a MemoryError traceback for 1e12)."""
    db = _db(tmp_path)
    for completed in (100_000_000, 1e12):
        path = _write(tmp_path / "claims.json", {**VLLM_NO_LATENCY, "completed": completed})
        r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert r.peak_rss < 300 * MIB, f"peak {r.peak_rss / MIB:.0f} MiB"


def test_a_vllm_file_with_every_ttft_null_imports(tmp_path: Path) -> None:
    doc = json.loads((PEERS / "vllm-bench-serve-detailed.json").read_text())
    doc["ttfts"] = [None] * len(doc["ttfts"])
    for k in [k for k in doc if k.endswith("_ttft_ms")]:
        doc.pop(k)
    path = _write(tmp_path / "null-ttfts.json", doc)
    r = bench("import", str(path), "--db", str(_db(tmp_path)), data_dir=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["dev-zero-link", "fifo"])
def test_an_import_of_a_device_or_pipe_is_refused_unread(tmp_path: Path, kind: str) -> None:
    """Before: a link to /dev/zero read until MemoryError (the size cap trusted st_size, 0), a FIFO hung."""
    path = tmp_path / "x.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    r = bench("import", str(path), "--db", str(_db(tmp_path)), data_dir=tmp_path)
    assert "not a regular file" in r.one_error()
    assert r.peak_rss < 300 * MIB


# --- 6. the same file twice is one run or sweep ----------------------------------------------------


@pytest.mark.parametrize("path", [ROUTED, SWEEP], ids=["run", "sweep"])
def test_importing_the_same_file_twice_makes_one_run_or_sweep(tmp_path: Path, path: Path) -> None:
    db = _db(tmp_path)
    first = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert first.returncode == 0, first.stderr
    counts = _counts(db)
    again = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert again.returncode == 0, again.stderr
    kind, made = first.stdout.split(" as ")[-1].split()
    assert f"already imported as {kind} {made}" in again.stdout
    assert _counts(db) == counts

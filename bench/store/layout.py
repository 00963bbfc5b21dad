"""The store's file: its tables, the columns written per request, the rollups of the time
series, how chunk times are packed, and the check that a file is a MoE Bench store (bench.store
reads and writes it)."""

from __future__ import annotations

import array
import json
import math
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
SWEEP_STATUSES = ("running", "completed", "failed", "cancelled", "interrupted")
STATUSES = ("running", "completed", "failed", "cancelled", "interrupted")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL,
    mode TEXT NOT NULL,
    engine TEXT NOT NULL,
    model TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    concurrency INTEGER,
    config_json TEXT NOT NULL,
    engine_json TEXT NOT NULL DEFAULT '{}',
    summary_json TEXT,
    error TEXT,
    pid INTEGER,
    pid_started REAL,
    host TEXT,
    sweep_id INTEGER,
    sweep_point TEXT
);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL,
    config_json TEXT NOT NULL,
    result_json TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    pid INTEGER,
    pid_started REAL,
    host TEXT
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    ttft_ms REAL,
    tpot_ms REAL,
    itl_mean_ms REAL,
    e2e_ms REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    chunk_times_json TEXT NOT NULL,
    usage_output_tokens INTEGER,
    ttft_any_ms REAL,
    send_lag_ms REAL,
    itl_token_mean_ms REAL,
    reasoning_tokens INTEGER,
    answer_tokens INTEGER,
    usage_reasoning_tokens INTEGER,
    reasoning_ms REAL,
    chunk_tokens_json TEXT,
    reasoning_chunks INTEGER,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS timeseries (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_s REAL NOT NULL,
    name TEXT NOT NULL,
    value REAL
);
CREATE INDEX IF NOT EXISTS timeseries_run ON timeseries(run_id, name, t_s);
CREATE INDEX IF NOT EXISTS samples_run_end ON samples(run_id, end_s);
-- How many samples a run has, kept by add_samples and import_bundle: the live view's count
-- without a COUNT(*) over a million rows.
CREATE TABLE IF NOT EXISTS sample_counts (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    n INTEGER NOT NULL
);
-- Per-second series rolled up into 10 s and 100 s buckets as they are written (mean of the
-- non-empty values, n of them), so a long run's charts read a bounded number of points.
CREATE TABLE IF NOT EXISTS timeseries_rollup (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    level INTEGER NOT NULL,
    name TEXT NOT NULL,
    t_s REAL NOT NULL,
    value REAL NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (run_id, level, name, t_s)
);
CREATE TABLE IF NOT EXISTS artifacts (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    content_json TEXT NOT NULL,
    PRIMARY KEY (run_id, name)
);
"""

# Sample columns added after schema 2 (ALTER TABLE adds them to older files; NULL in old rows).
LATER_SAMPLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("itl_token_mean_ms", "REAL"),
    ("reasoning_tokens", "INTEGER"),
    ("answer_tokens", "INTEGER"),
    ("usage_reasoning_tokens", "INTEGER"),
    ("reasoning_ms", "REAL"),
    ("chunk_tokens_json", "TEXT"),
    ("reasoning_chunks", "INTEGER"),
)
SAMPLE_INSERT_COLUMNS: tuple[str, ...] = (
    "run_id", "seq", "request_id", "start_s", "end_s", "ttft_ms", "tpot_ms", "itl_mean_ms", "e2e_ms",
    "prompt_tokens", "output_tokens", "error", "chunk_times_json", "usage_output_tokens", "ttft_any_ms",
    "send_lag_ms", *(c for c, _ in LATER_SAMPLE_COLUMNS),
)  # fmt: skip
SAMPLE_INSERT = (
    f"INSERT OR REPLACE INTO samples ({', '.join(SAMPLE_INSERT_COLUMNS)}) "
    f"VALUES ({','.join('?' * len(SAMPLE_INSERT_COLUMNS))})"
)

OUR_TABLES = frozenset(
    {"runs", "samples", "timeseries", "artifacts", "sweeps", "sqlite_sequence", "sample_counts", "timeseries_rollup"}
)
ARTIFACT_TRACE = "profile_trace"  # {"path": a trace file under the store's traces/ folder}
# The other artifacts a run stores beside its records (Store.put_artifact)
ARTIFACT_OPERATORS = "profile_operators"
ARTIFACT_BREAKDOWN = "profile_breakdown"
ARTIFACT_ROUTING = "expert_routing"
ARTIFACT_ROUTING_ERROR = "expert_routing_error"  # {"error": why} when a server's routing could not be read
# {"sources": [{"source", "name"}], "missing": [reason, ...], "devices": ["dev0: NVIDIA H200 (nvml)", ...]}
ARTIFACT_DEVICE_TELEMETRY = "device_telemetry"
ARTIFACT_LOAD_GENERATORS = "load_generators"  # Ray runs: each sender actor's node, pid, clock offset
ARTIFACT_LIMITS = "limits"  # bench.metrics.run_limits.RunLimits.as_dict(), or {"reason": why there is none}
ARTIFACT_GC = "gc_pauses"  # bench.run.gc_watch.GcWatch.as_dict(): this process's GC pauses during the run
ARTIFACT_ENERGY = "energy"  # bench.metrics.energy.energy_of_run: per device, or {"reason": why there is none}
ARTIFACT_PREPARE = "engine_prepare"  # {"text", "seconds"}: what the engine did before the clock (graphs captured)
ARTIFACT_COMMUNICATION = "communication"  # engines.expert_parallel.ServingGroup.communication(): per rank, over the run
ARTIFACT_CLIENT_CPU = "client_cpu"  # bench.send.cpu_wait.combine: the sending loops' CPU and run-queue wait
TRACES_DIR = "traces"  # beside the store: the only folder a run's trace is served from
TRACE_MAX_BYTES = 2 * 2**30  # a trace copied in (an imported bundle's, a vLLM server's) is at most this

ROLLUP_LEVELS = (10, 100)  # seconds per bucket of the series' rollups (the raw series is 1 s)
ROLLUP_UPSERT = (
    "INSERT INTO timeseries_rollup VALUES (?,?,?,?,?,1) ON CONFLICT(run_id, level, name, t_s) DO UPDATE SET "
    "value = (value * n + excluded.value) / (n + 1), n = n + 1"
)


def rollup_rows(run_id: int, points: Sequence[tuple[float, str, float | None]]) -> list[tuple[Any, ...]]:
    """Upsert arguments that fold ``points`` into their 10 s and 100 s buckets (empty values skipped)."""
    return [
        (run_id, level, name, math.floor(t / level) * level, value)
        for t, name, value in points
        if isinstance(value, int | float) and isinstance(t, int | float) and math.isfinite(t) and math.isfinite(value)
        for level in ROLLUP_LEVELS
    ]


def pack_times(start_s: float, times: Sequence[float]) -> bytes:
    """Chunk times as stored: microseconds after the request's start, int32 (``b"i"``) or, for a
    request longer than 35 minutes, int64 (``b"q"``), little-endian, after a one-byte type code.
    The same 1 µs resolution as the JSON it replaces, at a quarter of the cost to write."""
    us = [round((t - start_s) * 1e6) for t in times]
    code = "i" if not us or (min(us) >= -(2**31) and max(us) < 2**31) else "q"
    arr = array.array(code, us)
    if sys.byteorder == "big":
        arr.byteswap()
    return code.encode() + arr.tobytes()


def unpack_times(start_s: float, stored: bytes | str) -> list[float]:
    """:func:`pack_times`'s bytes (or the JSON list of seconds that files before them hold) back
    to seconds since the run's start."""
    if isinstance(stored, str):
        return json.loads(stored)
    arr = array.array(chr(stored[0]))
    arr.frombytes(stored[1:])
    if sys.byteorder == "big":
        arr.byteswap()
    return [start_s + v / 1e6 for v in arr]


def refuse_foreign(path: Path) -> None:
    """Refuse, before writing anything (no tables, no WAL), a file that is not a MoE Bench store."""
    from engines.errors import ConfigError

    if path.exists() and path.is_dir():
        raise ConfigError(f"database '{path}' is a folder, not a file")
    if path.exists() and not path.is_file():  # /dev/null, /dev/full, a FIFO: SQLite would write a journal beside it
        raise ConfigError(f"database '{path}' is not a regular file (a device or a pipe): give a file path")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            run_cols = {r[1] for r in con.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"'{path}' is not a MoE Bench database (SQLite says: {exc})") from exc
    foreign = sorted(tables - OUR_TABLES)
    if foreign or ("runs" in tables and "config_json" not in run_cols):
        shown = ", ".join(foreign[:5]) or "runs (another application's)"
        raise ConfigError(
            f"'{path}' is another application's SQLite file (tables: {shown}); give MoE Bench a file of its own"
        )

"""SQLite store: runs, per-request samples and per-second time series, sweeps and artifacts.

Rows are written as they arrive (WAL mode, one connection per thread), so a reader
(the dashboard) sees a run grow and a crash loses nothing already measured. A run
left ``running`` by a process that no longer exists is marked ``interrupted`` when
a store is opened. Time series are kept long (``t_s, name, value``) so new series
(server metrics, device telemetry) need no schema change.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.metrics.enrich import RunInputs, enrich
from bench.metrics.records import RequestRecord
from bench.metrics.summary import RunSummary, summarize
from bench.store.layout import (
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_ENERGY,
    ARTIFACT_LIMITS,
    ARTIFACT_ROUTING,
    ARTIFACT_TRACE,
    LATER_SAMPLE_COLUMNS,
    ROLLUP_LEVELS,
    ROLLUP_UPSERT,
    SAMPLE_INSERT,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    STATUSES,
    SWEEP_STATUSES,
    TRACE_MAX_BYTES,
    TRACES_DIR,
    pack_times,
    refuse_foreign,
    rollup_rows,
    unpack_times,
)
from bench.store.rows import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS, RunRow, SweepRow, sweep_row

# Read from bench.store by the pages, the reports and the import (declared in bench.store.rows and
# bench.store.layout).
__all__ = [
    "ARTIFACT_TRACE",
    "REQUEST_CSV_COLUMNS",
    "ROLLUP_UPSERT",
    "STATUSES",
    "SUMMARY_CSV_COLUMNS",
    "SWEEP_STATUSES",
    "RunRow",
    "Store",
    "SweepRow",
    "pack_times",
    "rollup_rows",
    "unpack_times",
]


def _process_started(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - no such process (or no permission): treat as gone
        return None


class Store:
    """A SQLite results file. Safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from engines.errors import ConfigError

            raise ConfigError(f"cannot create the folder of database '{self.path}': {exc.strerror}") from exc
        refuse_foreign(self.path)
        self._local = threading.local()
        self._lock = threading.Lock()
        conn = self._conn()
        with self._lock:
            conn.executescript(SCHEMA_SQL)
            # Files from schema 1 lack the sweep columns of runs (CREATE IF NOT EXISTS keeps the old table).
            have = {r["name"] for r in conn.execute("PRAGMA table_info(runs)").fetchall()}
            for col, decl in (("sweep_id", "INTEGER"), ("sweep_point", "TEXT"), ("content_hash", "TEXT")):
                if col not in have:
                    conn.execute(f"ALTER TABLE runs ADD COLUMN {col} {decl}")
            if "content_hash" not in {r["name"] for r in conn.execute("PRAGMA table_info(sweeps)").fetchall()}:
                conn.execute("ALTER TABLE sweeps ADD COLUMN content_hash TEXT")
            have = {r["name"] for r in conn.execute("PRAGMA table_info(samples)").fetchall()}
            for col, decl in LATER_SAMPLE_COLUMNS:
                if col not in have:
                    conn.execute(f"ALTER TABLE samples ADD COLUMN {col} {decl}")
            conn.execute("CREATE INDEX IF NOT EXISTS runs_sweep ON runs(sweep_id)")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self.mark_interrupted()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.Error as exc:
                from engines.errors import ConfigError

                raise ConfigError(f"cannot open database '{self.path}': {exc}") from exc
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # --- runs -------------------------------------------------------------------------
    def create_run(
        self,
        *,
        mode: str,
        engine: str,
        model: str,
        accelerator: str,
        config: dict[str, Any],
        concurrency: int | None = None,
        name: str = "",
        sweep_id: int | None = None,
        sweep_point: dict[str, Any] | None = None,
    ) -> int:
        pid = os.getpid()
        cur = self._conn().execute(
            "INSERT INTO runs (name, created_at, status, mode, engine, model, accelerator, concurrency,"
            " config_json, pid, pid_started, host, sweep_id, sweep_point) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                name,
                time.time(),
                "running",
                mode,
                engine,
                model,
                accelerator,
                concurrency,
                json.dumps(config),
                pid,
                _process_started(pid),
                socket.gethostname(),
                sweep_id,
                json.dumps(sweep_point) if sweep_point is not None else None,
            ),
        )
        return int(cur.lastrowid or 0)

    def finish_run(
        self,
        run_id: int,
        status: str,
        summary: RunSummary | None = None,
        error: str | None = None,
    ) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status}")
        self._conn().execute(
            "UPDATE runs SET status=?, finished_at=?, summary_json=COALESCE(?, summary_json), error=? WHERE id=?",
            (status, time.time(), json.dumps(summary.as_dict()) if summary else None, error, run_id),
        )

    def set_summary(self, run_id: int, summary: RunSummary) -> None:
        """The summary so far of a run still running (a killed run keeps the last one)."""
        self._conn().execute(
            "UPDATE runs SET summary_json=? WHERE id=? AND status='running'", (json.dumps(summary.as_dict()), run_id)
        )

    def set_engine_info(self, run_id: int, info: dict[str, Any], model: str | None = None) -> None:
        self._conn().execute(
            "UPDATE runs SET engine_json=?, model=COALESCE(?, model) WHERE id=?",
            (json.dumps(info, default=str), model, run_id),
        )

    def mark_interrupted(self) -> int:
        """Mark ``running`` runs whose owning process is gone as ``interrupted``."""
        host = socket.gethostname()
        rows = self._conn().execute("SELECT id, pid, pid_started, host FROM runs WHERE status='running'").fetchall()
        gone = []
        for r in rows:
            if r["host"] != host:
                continue
            started = _process_started(int(r["pid"] or 0)) if r["pid"] else None
            if started is None or (r["pid_started"] is not None and abs(started - r["pid_started"]) > 1.0):
                gone.append(int(r["id"]))
        for run_id in gone:
            self._conn().execute(
                "UPDATE runs SET status='interrupted', error=COALESCE(error, ?) WHERE id=? AND status='running'",
                ("the process running it ended before it finished", run_id),
            )
            self._summarize_stored(run_id)
        for r in self._conn().execute("SELECT id, pid, pid_started, host FROM sweeps WHERE status='running'"):
            started = _process_started(int(r["pid"] or 0)) if r["pid"] else None
            if r["host"] == host and (
                started is None or (r["pid_started"] is not None and abs(started - r["pid_started"]) > 1.0)
            ):
                self._conn().execute(
                    "UPDATE sweeps SET status='interrupted', error=COALESCE(error, ?) WHERE id=? AND status='running'",
                    ("the process running it ended before it finished; resume it to run the points left", r["id"]),
                )
        return len(gone)

    def finish_lost_run(self, run_id: int, status: str, error: str) -> None:
        """Close a run whose measuring process is gone (an engine host that died): ``status`` with
        ``error``, and the exact summary of the requests it stored in place of its last live one."""
        self.finish_run(run_id, status, error=error)
        self._summarize_stored(run_id)

    def _summarize_stored(self, run_id: int) -> None:
        """The exact summary of a run's stored requests, in place of the last live one it wrote
        (up to a second older than what was measured when its process died), made whole as a
        finished run's is (bench.metrics.enrich: limits, MoE, speculative decoding, energy,
        per-accelerator throughput)."""

        records = self.records(run_id)
        run = self.get_run(run_id)
        if not records or run is None:
            return
        cfg, old = run.config, run.summary
        summary = summarize(
            records,
            peak_memory_gib=old.peak_memory_gib if old else None,
            max_concurrency=run.concurrency,
            request_rate=cfg.get("request_rate"),
            burstiness=cfg.get("burstiness"),
            slos=cfg.get("slos") or None,
            prefix_cache_hit_rate=old.prefix_cache_hit_rate if old else None,
        )
        done = enrich(summary, self.run_inputs(run), measure_cpu=False)
        self.put_artifact(run_id, ARTIFACT_LIMITS, done.limits)
        self.put_artifact(run_id, ARTIFACT_ENERGY, done.energy)
        self._conn().execute("UPDATE runs SET summary_json=? WHERE id=?", (json.dumps(done.summary.as_dict()), run_id))

    def run_inputs(self, run: RunRow) -> RunInputs:
        """What ``run`` stored beside its requests, as bench.metrics.enrich reads it."""
        return RunInputs(
            config=run.config,
            engine_info=run.engine_info,
            accelerator=run.accelerator,
            routing=self.artifact(run.id, ARTIFACT_ROUTING),
            device_telemetry=self.artifact(run.id, ARTIFACT_DEVICE_TELEMETRY),
            series_names=self.series_names(run.id),
            series=lambda names: self.timeseries(run.id, names),
            limits=self.artifact(run.id, ARTIFACT_LIMITS),
        )

    def _row(self, r: sqlite3.Row) -> RunRow:
        """A stored run; a row whose stored summary or JSON cannot be read is still listed (without
        its summary) and says why in its ``error``, so one bad row never hides the others."""
        bad: list[str] = []

        def loads(col: str, default: Any) -> Any:
            try:
                return json.loads(r[col]) if r[col] else default
            except (TypeError, ValueError, RecursionError):
                bad.append(col)
                return default

        summary = None
        if r["summary_json"]:
            try:
                summary = RunSummary.from_dict(json.loads(r["summary_json"]))
            except (TypeError, ValueError, KeyError, RecursionError, AttributeError):
                bad.append("summary_json")
        try:
            created = float(r["created_at"])
        except (TypeError, ValueError):
            created, bad = 0.0, [*bad, "created_at"]
        error = r["error"]
        if bad:
            error = f"this stored run is damaged ({', '.join(bad)} unreadable); " + (error or "")
        return RunRow(
            id=int(r["id"]),
            name=r["name"],
            created_at=created,
            finished_at=r["finished_at"],
            status=r["status"],
            mode=r["mode"],
            engine=r["engine"],
            model=r["model"],
            accelerator=r["accelerator"],
            concurrency=r["concurrency"],
            config=loads("config_json", {}),
            engine_info=loads("engine_json", {}),
            summary=summary,
            error=error.strip().rstrip(";") if error else error,
            sweep_id=r["sweep_id"],
            sweep_point=loads("sweep_point", None),
        )

    def get_run(self, run_id: int) -> RunRow | None:
        r = self._conn().execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return self._row(r) if r else None

    def list_runs(self, limit: int | None = None, statuses: Sequence[str] | None = None) -> list[RunRow]:
        """Newest first."""
        sql = "SELECT * FROM runs"
        args: list[Any] = []
        if statuses:
            sql += f" WHERE status IN ({','.join('?' * len(statuses))})"
            args.extend(statuses)
        sql += " ORDER BY id DESC"
        if limit:
            sql += " LIMIT ?"
            args.append(limit)
        return [self._row(r) for r in self._conn().execute(sql, args).fetchall()]

    def delete_runs(self, run_ids: Iterable[int]) -> int:
        ids = [int(i) for i in run_ids]
        if not ids:
            return 0
        q = ",".join("?" * len(ids))
        conn = self._conn()
        with self._lock:
            conn.execute("BEGIN")
            conn.execute(f"DELETE FROM samples WHERE run_id IN ({q})", ids)
            conn.execute(f"DELETE FROM timeseries WHERE run_id IN ({q})", ids)
            conn.execute(f"DELETE FROM timeseries_rollup WHERE run_id IN ({q})", ids)
            conn.execute(f"DELETE FROM sample_counts WHERE run_id IN ({q})", ids)
            conn.execute(f"DELETE FROM artifacts WHERE run_id IN ({q})", ids)
            cur = conn.execute(f"DELETE FROM runs WHERE id IN ({q}) AND status != 'running'", ids)
            conn.execute("COMMIT")
        return cur.rowcount

    # --- samples ----------------------------------------------------------------------
    def add_sample(self, run_id: int, seq: int, rec: RequestRecord) -> None:
        self.add_samples(run_id, [(seq, rec)])

    def add_samples(self, run_id: int, items: Sequence[tuple[int, RequestRecord]]) -> None:
        rows = []
        for seq, rec in items:
            row = rec.as_row()
            rows.append(
                (
                    run_id,
                    seq,
                    row["request_id"],
                    row["start_s"],
                    row["end_s"],
                    row["ttft_ms"],
                    row["tpot_ms"],
                    row["itl_mean_ms"],
                    row["e2e_ms"],
                    row["prompt_tokens"],
                    row["output_tokens"],
                    row["error"],
                    pack_times(rec.start_s, rec.chunk_times_s),
                    row["usage_output_tokens"],
                    row["ttft_any_ms"],
                    row["send_lag_ms"],
                    row["itl_token_mean_ms"],
                    row["reasoning_tokens"],
                    row["answer_tokens"],
                    row["usage_reasoning_tokens"],
                    row["reasoning_ms"],
                    None if rec.chunk_tokens is None else json.dumps(rec.chunk_tokens, separators=(",", ":")),
                    rec.reasoning_chunks,
                )
            )
        conn = self._conn()
        with self._lock:
            # IMMEDIATE: this transaction reads (the count, the rows a batch replaces) before it
            # writes; a deferred one would fail at once ("database is locked") when another
            # connection wrote after its read, instead of waiting its turn as a first write does.
            conn.execute("BEGIN IMMEDIATE")
            try:
                counted = conn.execute("SELECT 1 FROM sample_counts WHERE run_id=?", (run_id,)).fetchone()
                if counted is None:  # a run from a file before the counts (or its first batch)
                    conn.execute(
                        "INSERT INTO sample_counts VALUES (?, (SELECT COUNT(*) FROM samples WHERE run_id=?))",
                        (run_id, run_id),
                    )
                seqs = [r[1] for r in rows]
                again = 0  # a request stored again replaces its row: not one more
                for i in range(0, len(seqs), 900):
                    part = seqs[i : i + 900]
                    again += conn.execute(
                        f"SELECT COUNT(*) FROM samples WHERE run_id=? AND seq IN ({','.join('?' * len(part))})",
                        [run_id, *part],
                    ).fetchone()[0]
                conn.executemany(SAMPLE_INSERT, rows)
                conn.execute("UPDATE sample_counts SET n = n + ? WHERE run_id=?", (len(set(seqs)) - again, run_id))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def records(self, run_id: int) -> list[RequestRecord]:
        """All samples of a run as records (chunk times included), in arrival order."""
        rows = (
            self._conn()
            .execute(
                "SELECT request_id, start_s, end_s, chunk_times_json, prompt_tokens, output_tokens, error,"
                " usage_output_tokens, ttft_any_ms, send_lag_ms, chunk_tokens_json, reasoning_chunks,"
                " reasoning_tokens, usage_reasoning_tokens FROM samples WHERE run_id=? ORDER BY seq",
                (run_id,),
            )
            .fetchall()
        )
        return [
            RequestRecord(
                request_id=r["request_id"],
                start_s=r["start_s"],
                end_s=r["end_s"],
                chunk_times_s=unpack_times(r["start_s"], r["chunk_times_json"]),
                prompt_tokens=r["prompt_tokens"],
                output_tokens=r["output_tokens"],
                error=r["error"] or None,
                usage_output_tokens=r["usage_output_tokens"],
                first_any_token_s=None if r["ttft_any_ms"] is None else r["start_s"] + r["ttft_any_ms"] / 1000.0,
                send_lag_ms=r["send_lag_ms"],
                chunk_tokens=None if r["chunk_tokens_json"] is None else json.loads(r["chunk_tokens_json"]),
                reasoning_chunks=r["reasoning_chunks"] or 0,
                reasoning_tokens=r["reasoning_tokens"] or 0,
                usage_reasoning_tokens=r["usage_reasoning_tokens"],
            )
            for r in rows
        ]

    def sample_rows(self, run_ids: int | Sequence[int], limit: int | None = None) -> list[dict[str, Any]]:
        """Per-request rows (CSV columns). With ``limit``, the newest ``limit`` per call, oldest first."""
        ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
        if not ids:
            return []
        cols = ", ".join(REQUEST_CSV_COLUMNS)
        q = ",".join("?" * len(ids))
        if limit:
            sql = (
                f"SELECT * FROM (SELECT {cols}, seq FROM samples WHERE run_id IN ({q}) ORDER BY end_s DESC LIMIT ?)"
                " ORDER BY end_s"
            )
            args: list[Any] = [*ids, limit]
        else:
            sql = f"SELECT {cols}, seq FROM samples WHERE run_id IN ({q}) ORDER BY run_id, seq"
            args = ids
        return [{c: r[c] for c in REQUEST_CSV_COLUMNS} for r in self._conn().execute(sql, args).fetchall()]

    def windowed_means(self, run_id: int, column: str, step_s: float) -> list[tuple[float, float, int]]:
        """(window start s, mean of ``column`` over the successful requests that ended in it, count)
        for a per-request column (ttft_ms, tpot_ms, e2e_ms, itl_mean_ms), windows of ``step_s``."""
        if column not in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_mean_ms") or step_s <= 0:
            raise ValueError(f"no windowed means of {column!r} every {step_s} s")
        sql = (
            f"SELECT CAST(end_s / ? AS INTEGER) AS w, AVG({column}), COUNT({column}) FROM samples "
            f"WHERE run_id=? AND error='' AND {column} IS NOT NULL GROUP BY w ORDER BY w"
        )
        rows = self._conn().execute(sql, (step_s, run_id)).fetchall()
        return [(int(r[0]) * step_s, float(r[1]), int(r[2])) for r in rows]

    def sample_count(self, run_id: int) -> int:
        """How many requests a run stored (kept as they are written; counted for older files)."""
        row = self._conn().execute("SELECT n FROM sample_counts WHERE run_id=?", (run_id,)).fetchone()
        if row is not None:
            return int(row[0])
        return int(self._conn().execute("SELECT COUNT(*) FROM samples WHERE run_id=?", (run_id,)).fetchone()[0])

    # --- time series ------------------------------------------------------------------
    def add_points(self, run_id: int, points: Sequence[tuple[float, str, float | None]]) -> None:
        if not points:
            return
        conn = self._conn()
        with self._lock:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO timeseries VALUES (?,?,?,?)", [(run_id, t, n, v) for t, n, v in points])
            conn.executemany(ROLLUP_UPSERT, rollup_rows(run_id, points))
            conn.execute("COMMIT")

    def timeseries(
        self, run_id: int, names: Sequence[str] | None = None, level: int = 1
    ) -> list[tuple[float, str, float | None]]:
        """A run's per-second series, oldest first; ``level`` 10 or 100: the rollup's buckets
        instead (each point the bucket's mean, at the bucket's start; :meth:`series_level`)."""
        if level > 1:
            sql = "SELECT t_s, name, value FROM timeseries_rollup WHERE run_id=? AND level=?"
            args: list[Any] = [run_id, level]
        else:
            sql = "SELECT t_s, name, value FROM timeseries WHERE run_id=?"
            args = [run_id]
        if names:
            sql += f" AND name IN ({','.join('?' * len(names))})"
            args.extend(names)
        sql += " ORDER BY t_s"
        return [(r[0], r[1], r[2]) for r in self._conn().execute(sql, args).fetchall()]

    def series_level(self, run_id: int, max_points: int) -> int:
        """The finest bucket (1, 10 or 100 s) whose series keep under ``max_points`` points each,
        so a view's read is bounded by what it draws, not by the run's length; the span is read
        from the coarsest rollup (a row per 100 s per series). Files before the rollups: 1."""
        conn = self._conn()
        coarsest = ROLLUP_LEVELS[-1]
        row = conn.execute(
            "SELECT MIN(t_s), MAX(t_s) FROM timeseries_rollup WHERE run_id=? AND level=?", (run_id, coarsest)
        ).fetchone()
        if row is None or row[0] is None:
            return 1
        span = float(row[1]) - float(row[0]) + coarsest
        for level in (1, *ROLLUP_LEVELS):
            if span / level <= max_points:
                return level
        return coarsest

    def series_names(self, run_id: int) -> list[str]:
        """The names of a run's per-second series."""
        sql = "SELECT DISTINCT name FROM timeseries WHERE run_id=? ORDER BY name"
        return [r[0] for r in self._conn().execute(sql, (run_id,)).fetchall()]

    # --- artifacts (profiles, expert routing, trace paths) ------------------------------
    def put_artifact(self, run_id: int, name: str, content: Any) -> None:
        """Store a JSON-ready value under ``name`` for a run (replacing an older one)."""
        self._conn().execute(
            "INSERT OR REPLACE INTO artifacts VALUES (?,?,?)", (run_id, name, json.dumps(content, default=str))
        )

    def artifact(self, run_id: int, name: str) -> Any | None:
        r = (
            self._conn()
            .execute("SELECT content_json FROM artifacts WHERE run_id=? AND name=?", (run_id, name))
            .fetchone()
        )
        return json.loads(r[0]) if r else None

    # --- profile traces: files under traces/ beside the store, never a path from elsewhere
    @property
    def traces_dir(self) -> Path:
        return self.path.parent / TRACES_DIR

    def trace_path(self, run_id: int) -> Path | None:
        """The run's trace file, when it is one MoE Bench keeps: a regular file (not a link) inside
        this store's traces folder. A path an artifact names anywhere else is never served."""
        art = self.artifact(run_id, ARTIFACT_TRACE)
        raw = art.get("path") if isinstance(art, dict) else None
        if not isinstance(raw, str) or not raw:
            return None
        path = Path(raw)
        try:
            inside = path.resolve(strict=True).parent == self.traces_dir.resolve()
        except (OSError, RuntimeError):
            return None
        return path if inside and not path.is_symlink() and path.is_file() else None

    def adopt_trace(self, run_id: int, src: str | os.PathLike[str]) -> str | None:
        """Keep ``src`` as the run's trace: a file already in the traces folder is referenced, any
        other is copied in (at most :data:`TRACE_MAX_BYTES`, regular files only). None, or one line
        saying why the run keeps no trace."""
        import shutil

        src = Path(src)
        try:
            if src.is_symlink() or not src.is_file():
                return f"the trace {src.name} is not a regular file"
            size = src.stat().st_size
            folder = self.traces_dir
            if folder.is_dir() and src.resolve().parent == folder.resolve():
                self.put_artifact(run_id, ARTIFACT_TRACE, {"path": str(src)})
                return None
            if size > TRACE_MAX_BYTES:
                return f"the trace {src.name} is {size / 2**30:.1f} GiB, over the {TRACE_MAX_BYTES >> 30} GiB kept"
            folder.mkdir(parents=True, exist_ok=True)
            suffix = ".trace.json.gz" if src.name.endswith(".gz") else ".trace.json"
            dest = folder / f"{self.path.stem}-run{run_id}{suffix}"
            with src.open("rb") as fin, dest.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 2**20)
        except OSError as exc:
            return f"the trace {src.name} could not be kept: {exc.strerror or exc}"
        self.put_artifact(run_id, ARTIFACT_TRACE, {"path": str(dest)})
        return None

    def artifact_names(self, run_id: int) -> list[str]:
        rows = self._conn().execute("SELECT name FROM artifacts WHERE run_id=? ORDER BY name", (run_id,)).fetchall()
        return [r[0] for r in rows]

    # --- bundles: a whole run as one JSON document (examples/, moving runs between machines)
    def export_bundle(self, run_id: int) -> dict[str, Any]:
        """A run with its samples, time series and artifacts, JSON-ready."""
        from engines.errors import MoEBenchError

        r = self._conn().execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if r is None:
            raise MoEBenchError(f"no run with id {run_id} in {self.path}")
        run = {k: r[k] for k in r.keys() if k not in ("id", "pid", "pid_started", "host", "content_hash")}
        samples = [
            dict(x) for x in self._conn().execute("SELECT * FROM samples WHERE run_id=? ORDER BY seq", (run_id,))
        ]
        for x in samples:
            x.pop("run_id")
            if isinstance(x["chunk_times_json"], bytes):  # bundles keep the JSON list of seconds
                x["chunk_times_json"] = json.dumps(
                    [round(t, 6) for t in unpack_times(x["start_s"], x["chunk_times_json"])]
                )
        points = self.timeseries(run_id)
        arts = {n: self.artifact(run_id, n) for n in self.artifact_names(run_id)}
        return {"format": "moebench-run/1", "run": run, "samples": samples, "timeseries": points, "artifacts": arts}

    def export_sweep_bundle(self, sweep_id: int) -> dict[str, Any]:
        """A sweep (or capacity search) with every run it made, JSON-ready (``moebench-sweep/1``)."""
        from engines.errors import MoEBenchError

        r = self._conn().execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        if r is None:
            raise MoEBenchError(f"no sweep with id {sweep_id} in {self.path}")
        sweep = {k: r[k] for k in r.keys() if k not in ("id", "pid", "pid_started", "host", "content_hash")}
        runs = [self.export_bundle(run.id) for run in self.sweep_runs(sweep_id)]
        return {"format": "moebench-sweep/1", "sweep": sweep, "runs": runs}

    def columns(self, table: str) -> list[str]:
        """The columns of one of this file's tables, in order."""
        return [r[1] for r in self._conn().execute(f"PRAGMA table_info({table})")]

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One SQLite transaction on this thread's connection, under the store's lock: committed when
        the block ends, rolled back when it raises (or never committed when the process dies)."""
        conn = self._conn()
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def find_imported(self, kind: str, digest: str) -> int | None:
        """The run or sweep (``kind``) imported from content of hash ``digest``, or None."""
        table = {"run": "runs", "sweep": "sweeps"}[kind]
        r = self._conn().execute(f"SELECT id FROM {table} WHERE content_hash=? ORDER BY id LIMIT 1", (digest,))
        row = r.fetchone()
        return int(row[0]) if row else None

    # --- sweeps ------------------------------------------------------------------------
    def create_sweep(self, *, kind: str, config: dict[str, Any], name: str = "") -> int:
        """A sweep or capacity search; its runs point at it (``runs.sweep_id``)."""
        pid = os.getpid()
        cur = self._conn().execute(
            "INSERT INTO sweeps (kind, name, created_at, status, config_json, pid, pid_started, host)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (kind, name, time.time(), "running", json.dumps(config), pid, _process_started(pid), socket.gethostname()),
        )
        return int(cur.lastrowid or 0)

    def update_sweep(
        self,
        sweep_id: int,
        *,
        status: str | None = None,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Set the result so far; with a final ``status``, close the sweep. ``running`` re-opens
        it (a resumed sweep) under this process."""
        if status is not None and status not in SWEEP_STATUSES:
            raise ValueError(f"unknown sweep status {status}")
        conn = self._conn()
        if result is not None:
            conn.execute("UPDATE sweeps SET result_json=? WHERE id=?", (json.dumps(result, default=str), sweep_id))
        if status == "running":
            pid = os.getpid()
            conn.execute(
                "UPDATE sweeps SET status='running', finished_at=NULL, error=NULL, pid=?, pid_started=?, host=?"
                " WHERE id=?",
                (pid, _process_started(pid), socket.gethostname(), sweep_id),
            )
        elif status is not None:
            conn.execute(
                "UPDATE sweeps SET status=?, finished_at=?, error=? WHERE id=?", (status, time.time(), error, sweep_id)
            )

    def get_sweep(self, sweep_id: int) -> SweepRow | None:
        r = self._conn().execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        return sweep_row(r) if r else None

    def list_sweeps(self, limit: int | None = None) -> list[SweepRow]:
        """Newest first."""
        sql = "SELECT * FROM sweeps ORDER BY id DESC" + (" LIMIT ?" if limit else "")
        return [sweep_row(r) for r in self._conn().execute(sql, (limit,) if limit else ()).fetchall()]

    def sweep_runs(self, sweep_id: int) -> list[RunRow]:
        """The runs of a sweep, in the order they were made."""
        rows = self._conn().execute("SELECT * FROM runs WHERE sweep_id=? ORDER BY id", (sweep_id,)).fetchall()
        return [self._row(r) for r in rows]

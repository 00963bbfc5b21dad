"""The SQLite store on a real file: runs, samples, time series, CSV, interrupted runs."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.bundle import import_run
from bench.metrics.records import RequestRecord
from bench.metrics.summary import summarize
from bench.report.csv_export import requests_csv, summary_csv
from bench.store import Store
from bench.store.rows import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS


def _rec(i: int, err: str | None = None) -> RequestRecord:
    return RequestRecord(f"r{i}", i * 0.1, i * 0.1 + 0.5, [i * 0.1 + 0.1, i * 0.1 + 0.5], 8, 2, err)


def _run(store: Store) -> int:
    return store.create_run(
        mode="concurrency", engine="native", model="m", accelerator="cpu", config={"a": 1}, concurrency=2
    )


def test_run_lifecycle_samples_and_csv(store: Store) -> None:
    run_id = _run(store)
    assert store.get_run(run_id).status == "running"  # type: ignore[union-attr]
    recs = [_rec(0), _rec(1), _rec(2, "RequestFailed: HTTP 500")]
    for i, r in enumerate(recs):
        store.add_sample(run_id, i, r)
    store.add_points(run_id, [(1.0, "output_tok_s", 12.5), (1.0, "in_flight", 2.0)])
    store.finish_run(run_id, "completed", summarize(recs, peak_memory_gib=0.5))
    run = store.get_run(run_id)
    assert run is not None and run.status == "completed" and run.summary is not None
    assert run.summary.completed == 2 and run.summary.failed == 1
    assert store.records(run_id)[1].chunk_times_s == pytest.approx([0.2, 0.6])
    assert store.timeseries(run_id, ["output_tok_s"]) == [(1.0, "output_tok_s", 12.5)]

    rows = list(csv.DictReader(io.StringIO(requests_csv(store, run_id).decode())))
    assert list(rows[0]) == list(REQUEST_CSV_COLUMNS) and len(rows) == 3
    assert float(rows[0]["ttft_ms"]) == pytest.approx(100.0) and rows[2]["error"] == "RequestFailed: HTTP 500"
    summary = list(csv.DictReader(io.StringIO(summary_csv(store, [run_id]).decode())))
    assert list(summary[0]) == list(SUMMARY_CSV_COLUMNS) and len(summary) == 1
    assert summary[0]["completed"] == "2" and summary[0]["peak_memory_gib"] == "0.5"
    assert summary[0]["input_len"] == summary[0]["output_len"] == ""  # this run's config names no workload


def test_the_summary_csv_carries_the_workload_lengths(store: Store) -> None:
    """Two runs' rows say what each asked for, so a spreadsheet cannot set unlike runs side by side unnoticed."""
    ids = [
        store.create_run(mode="latency", engine="native", model="m", accelerator="cpu",
                         config={"workload": {"source": src, "input_len": i, "output_len": o}})
        for src, i, o in (("random", 128, 64), ("sharegpt", 256, 32))
    ]  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(summary_csv(store, ids).decode())))
    got = [(r["workload_source"], r["input_len"], r["output_len"]) for r in rows]
    assert got == [("random", "128", "64"), ("sharegpt", "256", "32")]


def test_bounded_window_returns_the_newest_rows_oldest_first(store: Store) -> None:
    run_id = _run(store)
    store.add_samples(run_id, [(i, _rec(i)) for i in range(50)])
    window = store.sample_rows(run_id, limit=10)
    assert [r["request_id"] for r in window] == [f"r{i}" for i in range(40, 50)]
    assert store.sample_count(run_id) == 50


def test_delete_keeps_running_runs(store: Store) -> None:
    done, live = _run(store), _run(store)
    store.finish_run(done, "failed", error="boom")
    assert store.delete_runs([done, live]) == 1
    assert store.get_run(done) is None and store.get_run(live) is not None


def test_bad_db_location_is_a_one_line_reason(tmp_path: Path) -> None:
    from engines.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot create the folder"):
        Store(blocker / "sub" / "db.sqlite")


@pytest.mark.slow
def test_killed_process_leaves_samples_and_an_interrupted_run(tmp_path: Path, tiny_model: Path) -> None:
    db = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "--db",
            str(db),
            "run",
            "--requests",
            "500",
            "--concurrency",
            "1",
            "--output-len",
            "16",
            "--quiet",
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 120
        count = 0
        while time.time() < deadline and proc.poll() is None:
            if db.exists():
                s = Store(db)
                runs = s.list_runs()
                count = s.sample_count(runs[0].id) if runs else 0
                s.close()
                if count >= 3 and runs[0].summary is not None:  # the live summary is stored every tick
                    break
            time.sleep(0.3)
        assert count >= 3, proc.stderr.read().decode() if proc.poll() is not None else "no samples in time"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = Store(db)  # opening marks runs of dead processes
    run = store.list_runs()[0]
    assert run.status == "interrupted" and "ended before it finished" in (run.error or "")
    assert store.sample_count(run.id) >= 3
    assert all(r.output_tokens == 16 for r in store.records(run.id))
    # What it measured up to its last tick is its summary: `runs` and the summary CSV show it.
    assert run.summary is not None and 1 <= run.summary.completed <= store.sample_count(run.id)
    assert run.summary.output_tokens == 16 * run.summary.completed
    assert run.summary_row()["requests"] == run.summary.requests


def test_bundle_round_trip_keeps_everything(store: Store, tmp_path: Path) -> None:
    run_id = _run(store)
    store.add_samples(run_id, [(i, _rec(i)) for i in range(4)])
    store.add_points(run_id, [(1.0, "output_tok_s", 3.0)])
    store.put_artifact(run_id, "profile_breakdown", {"rows": [{"category": "other", "time_ms": 1.0}]})
    store.finish_run(run_id, "completed", summarize([_rec(i) for i in range(4)]))
    other = Store(tmp_path / "other.sqlite")
    new_id = import_run(other, store.export_bundle(run_id))
    assert requests_csv(other, new_id).replace(b"\n" + str(new_id).encode(), b"\nX") == requests_csv(
        store, run_id
    ).replace(b"\n" + str(run_id).encode(), b"\nX")
    assert other.timeseries(new_id) == store.timeseries(run_id)
    assert other.artifact(new_id, "profile_breakdown") == store.artifact(run_id, "profile_breakdown")
    assert other.get_run(new_id).summary == store.get_run(run_id).summary  # type: ignore[union-attr]
    from engines.errors import MoEBenchError

    with pytest.raises(MoEBenchError, match="not a MoE Bench run bundle"):
        import_run(other, {"format": "something else"})


def test_csv_text_cells_cannot_be_formulas_but_numbers_stay_numbers(tmp_path: Path) -> None:
    import csv
    import io

    from bench.metrics.records import RequestRecord
    from bench.metrics.summary import summarize

    store = Store(tmp_path / "db.sqlite")
    evil = '=HYPERLINK("http://evil.example","click")'
    run_id = store.create_run(mode="concurrency", engine="fake", model="m", accelerator="cpu", config={}, name=evil)
    rec = RequestRecord("r0", 0.0, 0.5, [0.1, 0.2], 4, 2, send_lag_ms=-0.25)
    bad = RequestRecord("r1", 0.0, 0.1, [], 4, 0, error="+cmd|' /C calc'!A0", send_lag_ms=0.5)
    store.add_samples(run_id, [(0, rec), (1, bad)])
    store.finish_run(run_id, "completed", summary=summarize([rec, bad]), error="@SUM(1+1)")
    (row,) = list(csv.DictReader(io.StringIO(summary_csv(store, [run_id]).decode())))
    assert row["name"] == "'" + evil and row["error"] == "'@SUM(1+1)"
    rows = list(csv.DictReader(io.StringIO(requests_csv(store, run_id).decode())))
    assert rows[0]["send_lag_ms"] == "-0.25"  # a number, not text: left as it is
    assert rows[1]["error"] == "'+cmd|' /C calc'!A0"


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    import sqlite3

    from engines.errors import ConfigError

    other = tmp_path / "app.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, who TEXT)")  # its own `runs`
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    con.commit()
    con.close()
    before = other.read_bytes()
    with pytest.raises(ConfigError, match=r"is another application's SQLite file \(tables: users\)"):
        Store(other)
    assert other.read_bytes() == before and not Path(f"{other}-wal").exists()  # nothing written, no WAL
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all\n" * 100)
    with pytest.raises(ConfigError, match="is not a MoE Bench database"):
        Store(text)
    Store(tmp_path / "fresh.sqlite").close()  # a new file is fine
    Store(tmp_path / "fresh.sqlite").close()  # and so is our own, opened again


def test_bundle_keys_never_reach_sql_and_bad_bundles_say_why(store: Store) -> None:
    from engines.errors import MoEBenchError

    run_id = _run(store)
    store.add_samples(run_id, [(i, _rec(i)) for i in range(2)])
    store.finish_run(run_id, "completed", summarize([_rec(i) for i in range(2)]))
    bundle = store.export_bundle(run_id)
    bundle["run"]["name) VALUES (1); --"] = "x"  # a key that would be SQL if pasted into a statement
    bundle["samples"][0]["evil) --"] = 1
    new_id = import_run(store, bundle)
    assert store.get_run(new_id) is not None and len(store.records(new_id)) == 2
    n_runs = len(store.list_runs())
    for broken, reason in (
        ({**bundle, "run": {"name": "no fields"}}, "the run lacks created_at, status, mode"),
        ({**bundle, "samples": [{"seq": 0}]}, "sample 0 is not a sample"),
        ({**bundle, "run": []}, "'run' must be an object"),
    ):
        with pytest.raises(MoEBenchError, match=reason):
            import_run(store, broken)
    assert len(store.list_runs()) == n_runs  # nothing half-imported


# --- compact chunk times, kept counts, series rollups (issue 32: a million-request run) ---------


def test_chunk_times_are_stored_packed_and_read_back_to_the_microsecond(store: Store) -> None:
    from bench.store import pack_times, unpack_times

    run_id = _run(store)
    times = [1000.0 + k * 0.0123456789 for k in range(64)]
    long = RequestRecord("long", 5.0, 2405.0, [5.5, 2405.0], 8, 2, None)  # 40 minutes: int64 microseconds
    store.add_samples(run_id, [(0, RequestRecord("a", 999.9, times[-1], times, 8, 64, None)), (1, long)])
    raw = store._conn().execute("SELECT chunk_times_json FROM samples WHERE run_id=? ORDER BY seq", (run_id,))
    blobs = [r[0] for r in raw.fetchall()]
    assert [b[:1] for b in blobs] == [b"i", b"q"] and len(blobs[0]) == 1 + 4 * 64
    a, b = store.records(run_id)
    assert max(abs(x - y) for x, y in zip(a.chunk_times_s, times, strict=True)) <= 0.5e-6
    assert b.chunk_times_s == pytest.approx([5.5, 2405.0], abs=1e-6)
    # a file written before packing holds the JSON list: it still reads
    assert unpack_times(0.0, "[0.25, 0.5]") == [0.25, 0.5]
    assert unpack_times(2.0, pack_times(2.0, [])) == []


def test_bundles_keep_chunk_times_as_json_text(store: Store, tmp_path: Path) -> None:
    """A bundle written from packed rows is the same JSON document as before (moebench-run/1)."""
    import json

    run_id = _run(store)
    store.add_samples(run_id, [(i, _rec(i)) for i in range(3)])
    store.finish_run(run_id, "completed", summarize([_rec(i) for i in range(3)]))
    bundle = json.loads(json.dumps(store.export_bundle(run_id)))
    assert json.loads(bundle["samples"][1]["chunk_times_json"]) == pytest.approx([0.2, 0.6])
    again = import_run(store, bundle)
    for x, y in zip(store.records(again), store.records(run_id), strict=True):
        assert x.chunk_times_s == pytest.approx(y.chunk_times_s, abs=1e-6)
    assert store.sample_count(again) == 3


def test_the_sample_count_is_kept_not_counted(store: Store) -> None:
    run_id = _run(store)
    store.add_samples(run_id, [(i, _rec(i)) for i in range(5)])
    store.add_samples(run_id, [(4, _rec(4)), (5, _rec(5))])  # request 4 stored again: replaced, not added
    assert store.sample_count(run_id) == 6 == len(store.records(run_id))
    assert store._conn().execute("SELECT n FROM sample_counts WHERE run_id=?", (run_id,)).fetchone()[0] == 6
    store.finish_run(run_id, "completed", summarize(store.records(run_id)))
    store.delete_runs([run_id])
    assert store.sample_count(run_id) == 0
    assert store._conn().execute("SELECT COUNT(*) FROM sample_counts").fetchone()[0] == 0


def test_a_long_runs_series_are_read_from_bounded_rollups(store: Store) -> None:
    """Three hours at one point a second: the view asks for 1,500 points and gets the 10 s means
    (1,080 of them), each the mean of its ten seconds; a short run keeps its 1 s points."""
    run_id = _run(store)
    hours = 3 * 3600
    store.add_points(run_id, [(float(t), "output_tok_s", float(t % 20)) for t in range(hours)])
    store.add_points(run_id, [(float(t), "in_flight", None) for t in range(0, hours, 7)])  # empty values: no rollup
    assert store.series_level(run_id, 1500) == 10 and store.series_level(run_id, 200) == 100
    assert store.series_level(run_id, 20_000) == 1
    tens = store.timeseries(run_id, ["output_tok_s"], level=10)
    assert len(tens) == hours // 10 and tens[0] == (0.0, "output_tok_s", pytest.approx(4.5))  # mean of 0..9
    assert tens[1][2] == pytest.approx(14.5)  # 10..19
    assert len(store.timeseries(run_id, level=100)) == hours // 100
    short = _run(store)
    store.add_points(short, [(float(t), "output_tok_s", 1.0) for t in range(600)])
    assert store.series_level(short, 1500) == 1 and len(store.timeseries(short)) == 600
    old = _run(store)  # a file from before the rollups: the raw series, every point
    store.add_points(old, [(float(t), "x", 1.0) for t in range(3000)])
    store._conn().execute("DELETE FROM timeseries_rollup WHERE run_id=?", (old,))
    assert store.series_level(old, 1500) == 1

"""Bad inputs (issue 13 item 7) through the real CLI: the one-line reason, the exit code
(2 for a usage error, 1 for a failed run) and what is stored.

Cases ``tests/bench/test_cli.py`` already covers the same way (NaN ``--burstiness`` and
``--temperature``, a folder as a JSONL ``--prompt-file``, credentials in ``--base-url`` with
a refused run) are not repeated here; their neighbours are (inf and NaN in other flags, a
folder as a ShareGPT file, ...). Store-level tests cover foreign databases and bundles in
process; these go through ``python -m bench`` as a user does.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from tests.hostile.clirun import ROOT, bench, write_jsonl
from tests.hostile.hostile_server import FORMULA, MODEL, HostileServer

EXAMPLE = ROOT / "examples" / "h200-latency-bs1.json"


def stored_runs(db: Path) -> list[Any]:
    """The runs in ``db`` (none when the file was never created)."""
    return Store(db).list_runs() if db.exists() else []


# --- another application's database ---------------------------------------------------


def _own_runs_table(path: Path) -> str:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, who TEXT, started TEXT)")  # its own `runs`
    con.execute("INSERT INTO runs VALUES (1, 'alice', '2026-01-01')")
    con.commit()
    con.close()
    own = "give MoE Bench a file of its own"
    return f"is another application's SQLite file (tables: runs (another application's)); {own}"


def _unrelated_tables(path: Path) -> str:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.execute("INSERT INTO users VALUES (1, 'bob')")
    con.commit()
    con.close()
    return "is another application's SQLite file (tables: notes, users); give MoE Bench a file of its own"


def _not_sqlite(path: Path) -> str:
    path.write_text("id,name\n1,carol\n" * 200)
    return "is not a MoE Bench database (SQLite says: file is not a database)"


@pytest.mark.slow
@pytest.mark.parametrize("make", [_own_runs_table, _unrelated_tables, _not_sqlite], ids=lambda f: f.__name__[1:])
def test_db_at_another_applications_file_is_refused_and_left_byte_identical(
    tmp_path: Path, make: Callable[[Path], str]
) -> None:
    db = tmp_path / "app.sqlite"
    reason = make(db)
    before = db.read_bytes()
    for argv in (
        ["run", "--requests", "1"],
        ["runs"],
        ["import", str(EXAMPLE)],
        ["export", "1", "--csv", str(tmp_path / "out.csv")],
        ["sweeps"],
    ):
        r = bench(*argv, "--db", str(db), data_dir=tmp_path)
        assert r.returncode == 2, (argv, r.stderr)
        assert r.one_error() == f"error: '{db}' {reason}", argv
        assert db.read_bytes() == before, argv
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("app.sqlite")) == ["app.sqlite"], argv
    assert not (tmp_path / "out.csv").exists()


# --- run bundles (`import`) -----------------------------------------------------------


def _bundle() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def _seeded_store(tmp_path: Path) -> Path:
    """A store holding one imported run (run 1)."""
    db = tmp_path / "db.sqlite"
    r = bench("import", str(EXAMPLE), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0 and "as run 1" in r.stdout, r.stderr
    return db


def _without(*keys: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(b: dict[str, Any]) -> Any:
        for k in keys:
            b["run"].pop(k)
        return b

    return mutate


def _set(where: str, key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(b: dict[str, Any]) -> Any:
        (b if where == "top" else b["run"])[key] = value
        return b

    return mutate


BAD_BUNDLES = [
    ("missing_fields", _without("created_at", "status", "mode"), "run bundle: the run lacks created_at, status, mode"),
    ("missing_config", _without("config_json", "engine"), "run bundle: the run lacks engine, config_json"),
    ("a_json_list", lambda b: [b], "MoE Bench bundle"),
    ("artifacts_a_list", _set("top", "artifacts", [1, 2]), "artifacts"),
    ("timeseries_rows_short", _set("top", "timeseries", [[1.0]]), "timeseries"),
    ("config_json_not_json", _set("run", "config_json", "{not json"), "config_json"),
    ("summary_json_not_json", _set("run", "summary_json", "{not json"), "summary_json"),
]


@pytest.mark.parametrize(("mutate", "reason"), [c[1:] for c in BAD_BUNDLES], ids=[c[0] for c in BAD_BUNDLES])
def test_a_bad_bundle_is_refused_in_one_line_and_nothing_is_imported(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], Any], reason: str
) -> None:
    db = _seeded_store(tmp_path)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutate(_bundle())))
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.one_error()
    assert reason in line, line
    assert [run.id for run in stored_runs(db)] == [1]  # nothing half-imported
    listed = bench("runs", "--db", str(db), data_dir=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr


SWEEP_EXAMPLE = ROOT / "examples" / "h100-fast-sweep.sweep.json"


def test_a_sweep_bundle_goes_out_and_back_through_the_cli(tmp_path: Path) -> None:
    """`import` takes a sweep bundle; `export ID --sweep --bundle` writes it back with its runs;
    `--sweep` without `--bundle` is refused in one line."""
    db = tmp_path / "db.sqlite"
    r = bench("import", str(SWEEP_EXAMPLE), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0 and "as sweep 1" in r.stdout, r.stderr
    out = tmp_path / "again.sweep.json"
    r = bench("export", "1", "--sweep", "--bundle", "--out", str(out), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0 and "sweep 1 bundle" in r.stdout, r.stderr
    again = json.loads(out.read_text())
    assert again["sweep"]["name"] == "h100-fast-sweep" and len(again["runs"]) == 4
    r = bench("export", "1", "--sweep", "--out", str(tmp_path / "x.csv"), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and "add --bundle" in r.one_error()
    r = bench("export", "9", "--sweep", "--bundle", "--out", str(out), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and "no sweep with id 9" in r.one_error()


def test_a_sweep_bundle_with_a_bad_run_imports_nothing(tmp_path: Path) -> None:
    """The third run of the sweep is broken: the sweep and the two runs before it go back out."""
    db = _seeded_store(tmp_path)
    bundle = json.loads(SWEEP_EXAMPLE.read_text())
    bundle["runs"][2]["run"].pop("config_json")
    path = tmp_path / "bad.sweep.json"
    path.write_text(json.dumps(bundle))
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and "the run lacks config_json" in r.one_error()
    assert [run.id for run in stored_runs(db)] == [1] and Store(db).list_sweeps() == []


def test_a_bundle_whose_keys_and_values_are_sql_is_imported_as_data(tmp_path: Path) -> None:
    db = _seeded_store(tmp_path)
    con = sqlite3.connect(db)
    columns = {t: con.execute(f"PRAGMA table_info({t})").fetchall() for t in ("runs", "samples")}
    con.close()
    bundle = _bundle()
    bundle["run"]["name) VALUES (1); --"] = "x"
    bundle["run"]["name"] = "x'); DROP TABLE runs; --"
    bundle["samples"][0]["error) VALUES (1); DROP TABLE samples; --"] = 1
    path = tmp_path / "sql.json"
    path.write_text(json.dumps(bundle))
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"imported {path} as run 2", r.stderr
    store = Store(db)
    assert [run.id for run in store.list_runs()] == [2, 1]
    run = store.get_run(2)
    assert run is not None and run.name == "x'); DROP TABLE runs; --" and run.status == "completed"
    assert store.sample_count(2) == store.sample_count(1) == len(bundle["samples"])
    store.close()
    con = sqlite3.connect(db)
    assert {t: con.execute(f"PRAGMA table_info({t})").fetchall() for t in ("runs", "samples")} == columns
    con.close()


# --- model folders, flags ---------------------------------------------------------------

CONFIGS = [
    ("a_list", "[1, 2]", "holds a JSON list, not a model config object"),
    ("a_string", '"just a string"', "holds a JSON str, not a model config object"),
    ("not_json", "not json{", "is not valid JSON"),
    ("nested_deep", "[" * 100_000, "config.json"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("content", "reason"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_a_model_folder_with_a_bad_config_fails_the_run_in_one_line(tmp_path: Path, content: str, reason: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(content)
    db = tmp_path / "db.sqlite"
    r = bench("run", "--model", str(model), "--requests", "1", "--quiet", "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 1, r.stderr
    line = r.one_error()
    assert line.startswith("error: run 1 failed: ") and reason in line, line
    (run,) = stored_runs(db)
    assert run.status == "failed" and run.error == line.removeprefix("error: run 1 failed: ")
    assert Store(db).sample_count(run.id) == 0


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["run", "--burstiness", "inf"], "burstiness: Input should be a finite number"),
        (["run", "--temperature", "inf"], "temperature: Input should be a finite number"),
        (["run", "--top-p", "nan"], "top_p: Input should be a finite number"),
        (["run", "--request-rate", "nan"], "got nan"),
        (["sweep", "--request-rate", "nan"], "request_rate: Input should be a finite number"),
        (["sweep", "--request-rate", "1,nan"], "finite"),
        (["run", "--dtype", "int8"], "dtype: unknown dtype 'int8'; use auto, float16, bfloat16 or float32"),
    ],
    ids=["burstiness-inf", "temperature-inf", "top_p-nan", "rate-nan", "sweep-rate-nan", "sweep-rate-list-nan", "int8"],
)
def test_a_bad_flag_is_a_usage_error_and_records_nothing(
    tmp_path: Path, tiny_model: Path, argv: list[str], reason: str
) -> None:
    db = tmp_path / "db.sqlite"
    r = bench(*argv, "--model", str(tiny_model), "--requests", "1", "--quiet", "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.one_error()
    assert reason in line, line
    assert stored_runs(db) == []
    assert not db.exists() or Store(db).list_sweeps() == []


@pytest.mark.slow
def test_a_folder_as_sharegpt_file_fails_the_run_saying_so(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "prompts"
    folder.mkdir()
    db = tmp_path / "db.sqlite"
    r = bench(
        "run", "--model", str(tiny_model), "--prompts", "sharegpt", "--prompt-file", str(folder), "--requests", "1",
        "--quiet", "--db", str(db), data_dir=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.one_error() == f"error: run 1 failed: ShareGPT file '{folder}' is a folder, not a file"
    (run,) = stored_runs(db)
    assert run.status == "failed" and run.error == f"ShareGPT file '{folder}' is a folder, not a file"


@pytest.mark.slow
def test_a_50_mb_jsonl_line_is_refused_unread_with_the_context_reason(tmp_path: Path, tiny_model: Path) -> None:
    """On the native engine's tiny model (2,048 tokens of context): refused before any
    request, without the CLI taking the line's size many times over in memory."""
    path = tmp_path / "big.jsonl"
    huge = json.dumps({"prompt": "word " * 10_000_000}) + "\n"  # 50,000,014 bytes
    path.write_text(json.dumps({"prompt": "a fine first prompt"}) + "\n" + huge)
    db = tmp_path / "db.sqlite"
    r = bench(
        "run", "--model", str(tiny_model), "--prompts", "jsonl", "--prompt-file", str(path), "--requests", "2",
        "--quiet", "--db", str(db), data_dir=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    line = r.one_error()
    assert line.startswith(
        f"error: run 1 failed: big.jsonl line 2: {len(huge):,} bytes is too long for the model's context of "
    ), line
    assert "tokens (limit" in line and "per token of context)" in line, line
    (run,) = stored_runs(db)
    assert run.status == "failed" and run.error == line.removeprefix("error: run 1 failed: ")
    assert Store(db).sample_count(run.id) == 0
    assert r.peak_rss < 1.5e9, f"the CLI peaked at {r.peak_rss / 2**20:.0f} MiB"


@pytest.mark.slow
def test_failed_requests_exit_1_with_their_count_unless_allowed(tmp_path: Path) -> None:
    """A real server failing 2 of 5 requests: exit 1 and "2 of 5 requests failed", then with
    --allow-failures exit 0; both runs are stored completed with their 3 good samples."""
    prompts = ["good a", "hostile:error_formula b", "good c", "hostile:error_formula d", "good e"]
    prompt_file = write_jsonl(tmp_path / "prompts.jsonl", prompts)
    db = tmp_path / "db.sqlite"
    with HostileServer() as server:
        url = server.url()
        argv = ["run", "--engine", "openai", "--base-url", url, "--model", MODEL, "--prompts", "jsonl",
                "--prompt-file", str(prompt_file), "--requests", "5", "--concurrency", "1", "--warmup", "0",
                "--output-len", "4", "--quiet", "--db", str(db)]  # fmt: skip
        strict = bench(*argv, data_dir=tmp_path)
        allowed = bench(*argv, "--allow-failures", data_dir=tmp_path)
    first = f"RequestFailed: HTTP 500 from {url}/completions: {FORMULA}"
    assert strict.returncode == 1, strict.stderr
    assert strict.one_error() == f"error: run 1: 2 of 5 requests failed (first: {first}); --allow-failures accepts that"
    assert "run id        1  (completed, 2 of 5 requests failed)" in strict.stdout
    assert allowed.returncode == 0 and allowed.error_lines == [] and "Traceback" not in allowed.stderr
    assert "run id        2  (completed, 2 of 5 requests failed)" in allowed.stdout
    store = Store(db)
    for run in store.list_runs():
        assert run.status == "completed" and run.summary is not None and run.summary.failed == 2
        records = {rec.request_id: rec for rec in store.records(run.id)}
        assert [rid for rid, rec in sorted(records.items()) if rec.error] == ["r1", "r3"]
        assert all(records[rid].output_tokens == 4 for rid in ("r0", "r2", "r4"))

"""The CLI as a user runs it: real subprocesses, real files."""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import RunConfig
from bench.send.schedule import arrival_offsets
from bench.store import Store
from bench.store.rows import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args, "--db", str(db)],  # --db after the command, as the README shows
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_issue_command_prints_summary_and_writes_both_csvs(tmp_path: Path, tiny_model: Path) -> None:
    db, req_csv, sum_csv = tmp_path / "db.sqlite", tmp_path / "req.csv", tmp_path / "sum.csv"
    p = cli(
        "run",
        "--engine",
        "native",
        "--model",
        "tiny-deepseek-v3",
        "--accelerator",
        "cpu",
        "--mode",
        "concurrency",
        "--requests",
        "8",
        "--concurrency",
        "4",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--csv",
        str(req_csv),
        "--summary-csv",
        str(sum_csv),
        db=db,
    )
    assert p.returncode == 0, p.stderr
    assert "8 completed, 0 failed" in p.stdout and "TTFT ms" in p.stdout and "run id        1" in p.stdout
    rows = list(csv.DictReader(req_csv.open()))
    assert list(rows[0]) == list(REQUEST_CSV_COLUMNS) and len(rows) == 8
    assert all(r["output_tokens"] == "16" and r["prompt_tokens"] == "32" for r in rows)
    summary = list(csv.DictReader(sum_csv.open()))
    assert list(summary[0]) == list(SUMMARY_CSV_COLUMNS)
    assert summary[0]["completed"] == "8" and summary[0]["concurrency"] == "4"
    assert float(summary[0]["output_throughput_tok_s"]) > 0

    listed = cli("runs", db=db)
    assert listed.returncode == 0 and "completed" in listed.stdout and "tiny-deepseek-v3" in listed.stdout
    out = tmp_path / "again.csv"
    exported = cli("export", "1", "--csv", str(out), db=db)
    assert exported.returncode == 0 and out.read_bytes() == req_csv.read_bytes()
    exported = cli("export", "1", "--csv", str(out), "--summary", db=db)
    assert exported.returncode == 0 and len(list(csv.DictReader(out.open()))) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["run", "--engine", "tgi"], "unknown engine 'tgi'; known engines: native"),
        (["run", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
        (["run", "--model", "/no/such/model"], "model path '/no/such/model' does not exist"),
        (["run", "--accelerator", "npu"], "accelerator 'npu' is unavailable: torch_npu is not installed"),
        (["run", "--accelerator", "tpu"], "unknown accelerator 'tpu'"),
        (["run", "--prompts", "jsonl"], "a jsonl workload needs a path"),
        (["export", "99", "--csv", "x.csv"], "no run with id 99"),
        (["run", "--request-rate", "fast"], "--request-rate must be a number of requests per second, got 'fast'"),
        (["run", "--request-rate", "-1"], "--request-rate must be 0 or above (0 or inf: closed loop), got -1"),
        (["run", "--mode", "latency", "--request-rate", "2"], "request_rate applies to concurrency and profile runs"),
        (["run", "--workers", "3", "--concurrency", "2"], "3 workers need a concurrency of at least 3"),
        (["run", "--workers", "0"], "--workers must be at least 1, got 0"),
        (["run", "--workers", "17", "--concurrency", "32"], "workers: Input should be less than or equal to 16"),
    ],
)
def test_bad_inputs_exit_non_zero_with_one_line(tmp_path: Path, tiny_model: Path, args: list[str], reason: str) -> None:
    p = cli(*args, db=tmp_path / "db.sqlite")
    assert p.returncode != 0
    err_lines = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(err_lines) == 1 and reason in err_lines[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_workers_and_default_warmup_reach_the_stored_config(tmp_path: Path, tiny_model: Path) -> None:
    """The run is recorded (then fails: no such model) with the flags' values in its config."""
    db = tmp_path / "db.sqlite"
    p = cli("run", "--model", "/no/such/model", "--workers", "2", "--concurrency", "4", db=db)
    assert p.returncode == 1, p.stderr
    (run,) = Store(db).list_runs()
    assert run.config["workers"] == 2 and run.config["concurrency"] == 4
    assert run.config["warmup"] == RunConfig.model_fields["warmup"].default == 1  # concurrency runs warm up too


def test_run_flags_take_their_defaults_and_help_from_run_config(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli.common import rate_or_none, run_config_data
    from bench.cli.main import build_parser

    args = build_parser().parse_args(["run"])
    assert args.workers == RunConfig.model_fields["workers"].default == 1
    assert args.warmup is None  # left to RunConfig
    assert args.requests is None  # left to RunConfig: its default, or a cap for --duration
    assert RunConfig.build(**run_config_data(args)).requests == RunConfig.model_fields["requests"].default
    timed = RunConfig.build(**run_config_data(build_parser().parse_args(["run", "--duration", "2m"])))
    assert timed.duration_s == 120.0 and timed.requests == 1_000_000
    assert rate_or_none("0") is None and rate_or_none("inf") is None  # 0 and inf: closed loop
    assert rate_or_none("2.5") == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("workers", "warmup", "request_rate"):
        assert str(RunConfig.model_fields[name].description) in text, name


@pytest.mark.slow
def test_open_loop_run_prints_its_load_and_send_lag(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "req.csv"
    args = ["run", "--request-rate", "8", "--burstiness", "2", "--requests", "4", "--concurrency", "2"]
    p = cli(*args, "--output-len", "4", "--csv", str(out), db=tmp_path / "db.sqlite")
    assert p.returncode == 0, p.stderr
    assert "open loop, 8 req/s, burstiness 2" in p.stdout and "send lag" in p.stdout
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 4
    due = arrival_offsets(4, 8.0, 2.0, seed=0)
    for r in rows:  # each request left at its due time plus its (unclamped) lag
        i = int(r["request_id"].lstrip("r"))
        assert float(r["start_s"]) == pytest.approx(due[i] + float(r["send_lag_ms"]) / 1000, abs=2e-4)


@pytest.mark.slow
def test_failed_run_is_recorded(tmp_path: Path, tiny_model: Path) -> None:
    db = tmp_path / "db.sqlite"
    cli("run", "--model", "/no/such/model", db=db)
    listed = cli("runs", db=db)
    assert "failed" in listed.stdout


def test_model_tiny_prints_the_folder(tmp_path: Path, tiny_model: Path) -> None:
    p = cli("model", "tiny", db=tmp_path / "db.sqlite")
    assert p.returncode == 0 and Path(p.stdout.strip()) == tiny_model


def test_engines_and_accelerators_list_reasons(tmp_path: Path) -> None:
    p = cli("accelerators", db=tmp_path / "db.sqlite")
    assert p.returncode == 0 and "cpu   available" in p.stdout and "npu   unavailable" in p.stdout
    p = cli("engines", db=tmp_path / "db.sqlite")
    assert p.returncode == 0 and "native" in p.stdout


def test_engine_options_from_flags() -> None:
    from bench.cli.common import engine_opts
    from bench.cli.main import build_parser

    args = build_parser().parse_args(
        ["run", "--engine", "vllm", "--base-url", "http://127.0.0.1:8000/v1", "--engine-opt", "max_num_seqs=64",
         "--engine-opt", "enable_prefix_caching=true", "--engine-opt", "quantization=fp8"]
    )  # fmt: skip
    opts = engine_opts(args)
    assert opts["base_url"] == "http://127.0.0.1:8000/v1" and opts["kind"] == "vllm"
    assert opts["max_num_seqs"] == 64 and opts["enable_prefix_caching"] is True and opts["quantization"] == "fp8"


def test_unknown_engine_option_is_a_one_line_reason(tmp_path: Path) -> None:
    p = cli("run", "--engine-opt", "no_such_option=1", db=tmp_path / "db.sqlite")
    assert p.returncode == 2 and "no_such_option: Extra inputs are not permitted" in p.stderr


def test_a_run_with_failed_requests_exits_1_unless_failures_are_allowed(
    tmp_path: Path, fake_engine_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run completed, but 2 of its 8 requests failed: the status line and the exit code say so."""
    from bench.cli.main import main

    argv = ["run", "--engine", fake_engine_kind, "--engine-opt", "fail_every=4", "--prompts", "builtin",
            "--requests", "8", "--concurrency", "2", "--output-len", "3", "--quiet",
            "--db", str(tmp_path / "f.sqlite")]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "(completed, 2 of 8 requests failed)" in out
    assert err.strip().startswith("error: run 1: 2 of 8 requests failed (first: RequestFailed: scripted failure")
    assert "\n" not in err.strip()
    assert main([*argv, "--allow-failures"]) == 0
    (run, _) = Store(tmp_path / "f.sqlite").list_runs()
    assert run.status == "completed" and run.summary is not None and run.summary.failed == 2


@pytest.mark.parametrize("flag", ["--burstiness", "--temperature"])
def test_nan_is_not_a_number_here(tmp_path: Path, flag: str) -> None:
    p = cli("run", flag, "nan", db=tmp_path / "db.sqlite")
    assert p.returncode == 2 and "should be a finite number" in p.stderr, p.stderr


def test_a_folder_as_prompt_file_says_so(tmp_path: Path, tiny_model: Path) -> None:
    p = cli("run", "--prompts", "jsonl", "--prompt-file", str(tmp_path), "--requests", "1", db=tmp_path / "db.sqlite")
    assert p.returncode == 1 and f"prompt file '{tmp_path}' is a folder, not a file" in p.stderr, p.stderr


def test_credentials_in_a_base_url_are_refused_and_never_echoed(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    p = cli("run", "--engine", "openai", "--base-url", "http://user:sk-secret@127.0.0.1:9/v1", db=db)
    assert p.returncode == 2 and "base_url carries credentials (http://***@127.0.0.1:9/v1)" in p.stderr, p.stderr
    assert "sk-secret" not in p.stderr + p.stdout
    assert not db.exists() or Store(db).list_runs() == []  # nothing stored


def test_ctrl_c_mid_run_of_a_million_requests_keeps_what_was_measured(tmp_path: Path, tiny_model: Path) -> None:
    """Prompts are built as the run goes, so a million-request run is sending within moments;
    Ctrl-C then ends it cancelled, exit 130, with its samples and a summary that counts them."""
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "db.sqlite"
    argv = [sys.executable, "-m", "bench", "run", "--requests", "1000000", "--input-len", "64", "--quiet",
            "--db", str(db)]  # fmt: skip
    # SIGINT's default disposition for the child, as in a terminal: a suite started in the
    # background by a non-interactive shell inherits SIGINT ignored, and so would the CLI
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.time() + 180
        while time.time() < deadline:  # wait for the first stored requests
            runs = Store(db).list_runs() if db.exists() else []
            if runs and Store(db).sample_count(runs[0].id) >= 3:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # never leave a million-request run behind
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    (run,) = Store(db).list_runs()
    assert run.status == "cancelled", run.error
    stored = Store(db).sample_count(run.id)
    assert stored >= 3 and run.summary is not None and run.summary.requests == stored


@pytest.mark.slow
def test_repeat_runs_the_same_run_n_times_and_prints_the_spread(tmp_path: Path, tiny_model: Path) -> None:
    db, sum_csv = tmp_path / "db.sqlite", tmp_path / "sum.csv"
    p = cli("run", "--repeat", "3", "--requests", "4", "--concurrency", "2", "--output-len", "4", "--quiet",
            "--summary-csv", str(sum_csv), db=db)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "spread over 3 completed run(s)" in p.stdout
    table = p.stdout.split("spread over", 1)[1].splitlines()[1:]
    assert table[0].split() == ["figure", "runs", "min", "median", "max", "CV", "mean", "+-", "95%", "CI"]
    assert len(table) >= 10 and table[1].startswith("output tok/s") and table[1].split()[2] == "3"
    store = Store(db)
    (sweep,) = store.list_sweeps()
    runs = store.sweep_runs(sweep.id)
    assert len(runs) == 3 and all(r.status == "completed" for r in runs)
    # the mean and its 95 % interval over the three runs (t with 2 degrees of freedom), by hand
    tok_s = [r.summary.output_throughput_tok_s for r in runs]
    mean, _, half = table[1].split()[-3:]
    assert float(mean) == pytest.approx(statistics.fmean(tok_s), abs=0.006)
    assert float(half) == pytest.approx(4.303 * statistics.stdev(tok_s) / 3**0.5, abs=0.006)
    assert len({r.config["workload"]["seed"] for r in runs}) == 3  # fresh prompts each time
    assert len(list(csv.DictReader(sum_csv.open()))) == 3


def test_the_cli_exits_only_after_the_run_has_stopped_its_engine(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A completed run's worker stops the engine it loaded after the run is final; the CLI waits for
    it. On an H100 it did not: the worker ("run-1") was still inside CUDA at interpreter exit and
    the process aborted (exit 134, "terminate called without an active exception"). Here the
    engine's stop takes 2 s, past the CLI's 1 s poll: no run thread may be left when it returns."""
    import threading
    import time

    from bench.cli.main import main
    from engines.native import NativeEngine

    real_stop = NativeEngine.stop

    def slow_stop(self: NativeEngine) -> None:
        time.sleep(2.0)
        real_stop(self)

    monkeypatch.setattr(NativeEngine, "stop", slow_stop)
    monkeypatch.setenv("MOEBENCH_EXIT_THREADS", "1")
    code = main(["run", "--engine", "native", "--requests", "2", "--output-len", "4", "--quiet",
                 "--db", str(tmp_path / "r.sqlite")])  # fmt: skip
    assert code == 0
    assert [t.name for t in threading.enumerate() if t.name.startswith("run-")] == []
    assert "run-" not in capsys.readouterr().err  # the exit report names no run thread

"""``python -m bench export RUN --format vllm-json|parquet|jsonl`` (bench.report.formats): real runs of
the fake engine in a real SQLite store, exported through the CLI and read back with json and pyarrow,
every figure checked against the store's own records and summary; and vLLM's own sweep tools (in the
vLLM environment) reading the vllm-json file."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.cli.main import main
from bench.config import RunConfig
from bench.report.csv_export import requests_csv
from bench.report.formats import REQUEST_COLUMN_TYPES, vllm_result
from bench.run.manager import start_run
from bench.store import Store
from bench.store.rows import REQUEST_CSV_COLUMNS
from engines.vllm import vllm_python

# What `vllm bench serve --save-result --save-detailed` writes for a text model (vLLM 0.32,
# vllm/benchmarks/serve.py: result_json, benchmark()'s result and process_one_metric).
VLLM_KEYS = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
    "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")),
)  # fmt: skip


def _run(store: Store, kind: str, **kw: Any) -> int:
    """A finished run of the fake engine; its id."""
    config: dict[str, Any] = {
        "engine": {"kind": kind, **kw.pop("engine", {})},
        "mode": "concurrency",
        "workload": {"source": "builtin", "output_len": 4},
        "requests": 20,
        "concurrency": 4,
    }
    config.update(kw)
    snap = start_run(RunConfig.build(**config), store).wait(60)
    assert snap.status == "completed", snap.error
    assert snap.run_id is not None
    return snap.run_id


def _export(store: Store, run_id: int, fmt: str, out: Path) -> Path:
    assert main(["--db", str(store.path), "export", str(run_id), "--format", fmt, "--out", str(out)]) == 0
    return out


def test_vllm_json_has_vllms_keys_and_units_and_the_runs_own_numbers(
    store: Store, fake_engine_kind: str, tmp_path: Path
) -> None:
    run_id = _run(store, fake_engine_kind, engine={"fail_every": 5}, name="c4")
    data = json.loads(_export(store, run_id, "vllm-json", tmp_path / "r.json").read_text())
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    s = run.summary
    assert set(VLLM_KEYS) <= set(data)
    # the run's figures, under vLLM's names and units
    assert (data["completed"], data["failed"], data["num_prompts"]) == (16, 4, 20) == (s.completed, s.failed, 20)
    assert data["total_input_tokens"] == s.prompt_tokens and data["total_output_tokens"] == s.output_tokens == 64
    assert data["duration"] == s.duration_s and data["request_throughput"] == s.request_throughput_rps
    assert data["output_throughput"] == s.output_throughput_tok_s
    assert data["total_token_throughput"] == s.total_throughput_tok_s
    assert (data["backend"], data["model_id"], data["label"]) == ("fake", run.model, "c4")
    assert (data["request_rate"], data["max_concurrency"], data["burstiness"]) == ("inf", 4, None)  # closed loop
    assert data["request_goodput"] is None  # no SLO: vLLM writes null without --goodput
    assert data["rtfx"] == 0.0
    # per request, in send order: lists in seconds (vLLM's RequestFuncOutput); the store keeps chunk times to
    # the microsecond (its rows' ttft_ms are taken before), and the summary is computed from what it keeps
    records, rows = store.records(run_id), store.sample_rows(run_id)
    assert len(data["ttfts"]) == len(data["itls"]) == len(data["errors"]) == 20
    for i, (rec, row) in enumerate(zip(records, rows, strict=True)):
        assert data["input_lens"][i] == rec.prompt_tokens
        assert data["itls"][i] == pytest.approx([b - a for a, b in itertools.pairwise(rec.chunk_times_s)])
        assert data["start_times"][i] == rec.start_s
        if rec.ok:
            assert data["ttfts"][i] == pytest.approx(row["ttft_ms"] / 1000.0, abs=1e-6)
            assert data["latencies"][i] == pytest.approx(row["e2e_ms"] / 1000.0, abs=1e-9)
            assert data["output_lens"][i] == 4 and len(data["itls"][i]) == 3 and data["errors"][i] == ""
        else:  # the fake fails after its first chunk: TTFT was timed (vLLM keeps it too), no complete latency
            assert data["errors"][i] == "RequestFailed: scripted failure" and data["output_lens"][i] == 0
            assert data["ttfts"][i] == pytest.approx(row["ttft_ms"] / 1000.0, abs=1e-6) and data["itls"][i] == []
            assert data["latencies"][i] is None
    assert data["generated_texts"] == [None] * 20 and data["queue_times"] == [None] * 20  # not stored / not timed
    # aggregates in ms: the summary's own, and what numpy gives over the lists above
    ok_ttfts = [t * 1000 for i, t in enumerate(data["ttfts"]) if data["errors"][i] == ""]
    assert data["p99_ttft_ms"] == s.ttft_ms.p99 == pytest.approx(np.percentile(ok_ttfts, 99))
    assert data["median_ttft_ms"] == s.ttft_ms.p50 and data["mean_ttft_ms"] == s.ttft_ms.mean
    assert data["std_ttft_ms"] == pytest.approx(np.std(ok_ttfts))
    gaps = [g * 1000 for i, itl in enumerate(data["itls"]) if data["errors"][i] == "" for g in itl]
    assert data["p99_itl_ms"] == s.itl_ms.p99 == pytest.approx(np.percentile(gaps, 99))
    assert data["mean_tpot_ms"] == s.tpot_ms.mean and data["p90_tpot_ms"] == s.tpot_ms.p90
    assert data["p99_e2el_ms"] == s.e2e_ms.p99 and data["p50_e2el_ms"] == s.e2e_ms.p50
    # vLLM's peak figures over 1 s buckets (a chunk counts as a token): a run within one second has them all
    ok = [r for r in records if r.ok]
    peaks = (data["max_output_tokens_per_s"], data["max_concurrent_requests"])
    if max(r.end_s for r in ok) - min(r.start_s for r in ok) < 1.0:
        assert peaks == (64.0, 16)
    else:  # a slow machine: no bucket holds more than the run
        assert 0 < peaks[0] <= 64.0 and 0 < peaks[1] <= 16


def test_vllm_json_of_a_rate_run_with_slos_and_of_a_reasoning_run(
    store: Store, fake_engine_kind: str, tmp_path: Path
) -> None:
    rate = _run(store, fake_engine_kind, request_rate=200.0, burstiness=1.0, slos=["ttft_ms:p99<=5000"])
    data = vllm_result(store, rate)
    s = store.get_run(rate).summary  # type: ignore[union-attr]
    assert s is not None and s.goodput_rps is not None
    assert (data["request_rate"], data["burstiness"]) == (200.0, 1.0)
    assert data["request_goodput"] == s.goodput_rps == s.request_throughput_rps  # every request met it
    # a reasoning model: vLLM's TTFT is the first output of any kind (its thinking), not the first answer
    thinking = _run(store, fake_engine_kind, engine={"reasoning_tokens": 2})
    data = vllm_result(store, thinking)
    s = store.get_run(thinking).summary  # type: ignore[union-attr]
    rows = store.sample_rows(thinking)
    assert data["ttfts"] == pytest.approx([r["ttft_any_ms"] / 1000.0 for r in rows], abs=1e-6)
    assert all(r["ttft_any_ms"] < r["ttft_ms"] for r in rows)
    assert data["p99_ttft_ms"] == pytest.approx(np.percentile([r["ttft_any_ms"] for r in rows], 99))
    assert s is not None and s.ttft_ms.p99 is not None and data["p99_ttft_ms"] < s.ttft_ms.p99
    assert data["p99_tpot_ms"] == s.tpot_ms.p99  # TPOT already counts from the first output of any kind


def test_parquet_is_typed_with_units_and_the_run_in_its_metadata(
    store: Store, fake_engine_kind: str, tmp_path: Path
) -> None:
    run_id = _run(store, fake_engine_kind, engine={"fail_every": 5})
    table = pq.read_table(_export(store, run_id, "parquet", tmp_path / "r.parquet"))
    assert tuple(table.column_names) == REQUEST_CSV_COLUMNS
    types = {f.name: str(f.type) for f in table.schema}
    assert types["run_id"] == types["prompt_tokens"] == types["usage_output_tokens"] == "int64"
    assert types["ttft_ms"] == types["start_s"] == types["send_lag_ms"] == "double"
    assert types["request_id"] == types["error"] == "string"
    assert table.schema.field("ttft_ms").metadata == {b"unit": b"ms"}
    assert table.schema.field("end_s").metadata == {b"unit": b"s"}
    assert table.schema.field("output_tokens").metadata == {b"unit": b"tokens"}
    assert table.schema.field("request_id").metadata is None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None
    assert (meta["run_id"], meta["engine"], meta["model"]) == (str(run_id), "fake", run.model)
    assert json.loads(meta["summary"]) == json.loads(json.dumps(run.summary.as_dict()))
    units = json.loads(meta["units"])
    assert units["ttft_ms"] == "ms" and units["start_s"] == "s" and "error" not in units
    assert set(units) == {c for c, (_, u) in REQUEST_COLUMN_TYPES.items() if u}
    # the rows: the store's, a successful request's error null, an unmeasured value null
    got = table.to_pylist()
    want = store.sample_rows(run_id)
    assert len(got) == 20
    for g, w in zip(got, want, strict=True):
        assert g == {**w, "error": w["error"] or None}
    failed = [g for g in got if g["error"]]
    assert len(failed) == 4 and all(g["ttft_ms"] > 0 and g["tpot_ms"] is None for g in failed)  # one chunk came


def test_jsonl_is_one_request_a_line_with_null_for_missing(store: Store, fake_engine_kind: str, tmp_path: Path) -> None:
    run_id = _run(store, fake_engine_kind, engine={"fail_every": 5})
    lines = _export(store, run_id, "jsonl", tmp_path / "r.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 20 and all(list(r) == list(REQUEST_CSV_COLUMNS) for r in rows)
    for r, w in zip(rows, store.sample_rows(run_id), strict=True):
        assert r == {**w, "error": w["error"] or None}
    assert '"tpot_ms": null' in lines[4] and '"error": "RequestFailed: scripted failure"' in lines[4]  # r4 failed
    assert '"reasoning_ms": null' in lines[0] and '"error": null' in lines[0]
    assert isinstance(rows[0]["prompt_tokens"], int) and isinstance(rows[0]["ttft_ms"], float)


def test_export_keeps_csv_and_refuses_a_format_that_does_not_fit(
    store: Store, fake_engine_kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _run(store, fake_engine_kind, requests=4)
    db = ["--db", str(store.path), "export", str(run_id)]
    out = tmp_path / "r.csv"
    assert main([*db, "--out", str(out)]) == 0 and out.read_bytes() == requests_csv(store, run_id)
    assert main([*db, "--out", str(out), "--format", "csv"]) == 0 and out.read_bytes() == requests_csv(store, run_id)
    assert main([*db, "--out", str(out), "--summary", "--format", "csv"]) == 0
    capsys.readouterr()
    for extra, text in (
        (["--summary", "--format", "parquet"], "--format parquet does not fit --summary"),
        (["--operators", "--format", "jsonl"], "--format jsonl does not fit --operators"),
        (["--bundle", "--format", "vllm-json"], "--format vllm-json does not fit --bundle"),
        (["--bundle", "--sweep", "--format", "csv"], "--format csv does not fit --sweep"),
    ):
        assert main([*db, "--out", str(tmp_path / "x"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {text}") and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()
    missing = ["--db", str(store.path), "export", "99", "--format", "parquet", "--out", str(tmp_path / "x")]
    assert main(missing) == 2
    assert capsys.readouterr().err == f"error: no run with id 99 in {store.path}\n"
    with pytest.raises(SystemExit) as bad:
        main([*db, "--out", str(tmp_path / "x"), "--format", "xlsx"])
    assert bad.value.code == 2


# vLLM's sweep tools on our files: `vllm bench sweep serve` finds each saved result where it saves one
# (run=0.json), loads it and writes the combination's summary.json; `vllm bench sweep plot` reads every
# summary.json (it draws the figure where pandas, seaborn and matplotlib are installed, else dry-runs);
# plot_pareto's record preparation and the `--plot-timeline` segments run on the same data.
VLLM_READER = r"""
import importlib.util, json, shutil, sys
from pathlib import Path
from vllm.benchmarks.plot import construct_timeline_data
from vllm.benchmarks.sweep.param_sweep import ParameterSweepItem
from vllm.benchmarks.sweep.plot import SweepPlotArgs, run_main as sweep_plot
from vllm.benchmarks.sweep.plot_pareto import _prepare_records
from vllm.benchmarks.sweep.serve import run_comb
from vllm.utils.argparse_utils import FlexibleArgumentParser

exp, files = Path(sys.argv[1]), sys.argv[2:]
out = {"summaries": [], "pareto": [], "timeline": []}
for i, f in enumerate(files):
    base = exp / f"moebench-{i}"
    base.mkdir(parents=True)
    shutil.copy(f, base / "run=0.json")
    run_comb(None, ["vllm", "bench", "serve"], serve_comb=ParameterSweepItem(), bench_comb=ParameterSweepItem(),
             link_vars=[], base_path=base, num_runs=1, dry_run=False)
    summary = json.loads((base / "summary.json").read_text())
    out["summaries"].append(summary)
    out["pareto"].append(_prepare_records(summary, user_count_var="max_concurrency", gpu_count_var=None)[0])
    r = summary[0]
    per_request = [  # as serve.py builds it for --plot-timeline
        {"start_time": r["start_times"][k], "ttft": r["ttfts"][k], "itl": r["itls"][k],
         "latency": r["ttfts"][k] + sum(r["itls"][k]) if r["itls"][k] else r["ttfts"][k],
         "prompt_len": r["input_lens"][k], "output_tokens": r["output_lens"][k]}
        for k in range(len(r["start_times"]))
    ]
    out["timeline"].append(construct_timeline_data(per_request, [0.025, 0.05], ["<25ms", "25-50ms", ">50ms"]))
out["drawn"] = all(importlib.util.find_spec(m) for m in ("pandas", "seaborn", "matplotlib"))
parser = FlexibleArgumentParser()
SweepPlotArgs.add_cli_args(parser)
argv = [str(exp), "--var-x", "total_token_throughput", "--var-y", "p99_ttft_ms", "--fig-by", "model_id",
        "--curve-by", "backend", "--fig-name", "moebench", "--fig-dpi", "50"]
sweep_plot(SweepPlotArgs.from_cli_args(parser.parse_args(argv + ([] if out["drawn"] else ["--dry-run"]))))
out["figures"] = sorted(p.name for p in exp.glob("*.png"))
print("RESULT " + json.dumps(out))
"""


def _vllm_importable() -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([vllm_python(), "-c", probe], capture_output=True, timeout=60).returncode == 0


@pytest.mark.slow
def test_vllms_own_sweep_tools_read_the_vllm_json(store: Store, fake_engine_kind: str, tmp_path: Path) -> None:
    if not _vllm_importable():
        pytest.skip(f"vLLM is not installed for {vllm_python()} (no .venv-vllm; MOEBENCH_VLLM_PYTHON names another)")
    ids = [_run(store, fake_engine_kind, concurrency=c, engine={"fail_every": 10}) for c in (2, 4)]
    files = [str(_export(store, i, "vllm-json", tmp_path / f"run{i}.json")) for i in ids]
    done = subprocess.run(
        [vllm_python(), "-c", VLLM_READER, str(tmp_path / "exp"), *files],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Found existing results." in done.stdout  # vLLM's sweep took our file as its own saved result
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for run_id, summary, pareto, timeline in zip(
        ids, result["summaries"], result["pareto"], result["timeline"], strict=True
    ):
        mine = vllm_result(store, run_id)
        assert len(summary) == 1 and summary[0]["run_number"] == 0
        assert {k: v for k, v in summary[0].items() if k != "run_number"} == json.loads(json.dumps(mine))
        s = store.get_run(run_id).summary  # type: ignore[union-attr]
        assert s is not None and s.max_concurrency is not None
        assert pareto[0]["tokens_per_user"] == pytest.approx(s.output_throughput_tok_s / s.max_concurrency)
        # one TTFT segment per request with output (a failed one's too, as vLLM draws it), one per chunk gap
        assert len(timeline) == sum(len(r.chunk_times_s) for r in store.records(run_id))
        ttft_segments = [t["duration"] for t in timeline if t["type"] == "TTFT"]
        assert ttft_segments == [f"{t:.3f}s" for t in mine["ttfts"] if t is not None]  # seconds
    if result["drawn"]:
        assert result["figures"] == ["moebench-model_id=" + store.get_run(ids[0]).model + ".png"]  # type: ignore[union-attr]
    else:
        assert "[BEGIN FIGURE]" in done.stdout and "Grid: 1 rows x 1 cols" in done.stdout

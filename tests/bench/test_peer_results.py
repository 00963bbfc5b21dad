"""Other tools' result files imported as runs (bench.peers through bench.bundle): real files written by
``vllm bench serve``, AIPerf and guidellm against ``python -m bench stub`` (tests/data/README.md says how),
each stored in a real SQLite store and checked by hand against the file; bad files refused whole."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import bundle, peers
from bench.bundle import import_file, import_run, read_bundle
from bench.metrics.summary import summarize
from bench.store import Store
from engines.errors import MoEBenchError

DATA = Path(__file__).resolve().parents[1] / "data" / "peers"
VLLM_DETAILED = DATA / "vllm-bench-serve-detailed.json"
VLLM_SUMMARY = DATA / "vllm-bench-serve-summary.json"
AIPERF = DATA / "aiperf-concurrency.json"
AIPERF_RECORDS = DATA / "aiperf-concurrency.jsonl"
AIPERF_RATE = DATA / "aiperf-rate-summary.json"
GUIDELLM = DATA / "guidellm-concurrent.json"
GUIDELLM_RATE = DATA / "guidellm-constant-rate.json"
ALL = (VLLM_DETAILED, VLLM_SUMMARY, AIPERF, AIPERF_RATE, GUIDELLM, GUIDELLM_RATE)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def imported(store: Store, path: Path) -> Any:
    kind, run_id = import_file(store, path)
    assert kind == "run"
    run = store.get_run(run_id)
    assert run is not None and run.summary is not None and run.status == "completed"
    return run


def nothing_stored(store: Store) -> bool:
    """No run, request row or artifact in the store's file (read on a connection of its own)."""
    with closing(sqlite3.connect(store.path)) as conn:
        tables = ("runs", "samples", "artifacts", "sample_counts")
        return all(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] == 0 for t in tables)


# --- vllm bench serve ---------------------------------------------------------------------------


def test_a_vllm_bench_serve_detailed_result_imports_with_its_own_figures(store: Store) -> None:
    doc = load(VLLM_DETAILED)
    run = imported(store, VLLM_DETAILED)
    s = run.summary
    assert run.name.startswith("vllm bench serve: tiny-deepseek-v3 c=4 ")
    assert run.engine == "openai" and run.model == "tiny-deepseek-v3" and run.mode == "concurrency"
    assert run.engine_info["source_tool"] == run.config["source_tool"] == "vllm bench serve"
    assert run.config["source_file"] == VLLM_DETAILED.name
    assert run.config["requests"] == doc["num_prompts"] == 40 and run.concurrency == doc["max_concurrency"] == 4
    assert run.config["request_rate"] is None and s.request_rate is None  # "inf": all at once, a closed loop of 4
    assert (s.requests, s.completed, s.failed) == (40, doc["completed"], 0)
    assert s.duration_s == doc["duration"] and s.output_tokens == doc["total_output_tokens"]
    assert s.request_throughput_rps == doc["request_throughput"]
    assert s.output_throughput_tok_s == doc["output_throughput"]
    assert s.total_throughput_tok_s == doc["total_token_throughput"]
    for ours, theirs in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2el")):
        st = getattr(s, ours)
        assert st.p99 == pytest.approx(doc[f"p99_{theirs}_ms"], abs=1e-9), ours
        assert st.p90 == pytest.approx(doc[f"p90_{theirs}_ms"]) and st.p50 == pytest.approx(doc[f"median_{theirs}_ms"])
        assert st.mean == pytest.approx(doc[f"mean_{theirs}_ms"]) and st.std == pytest.approx(doc[f"std_{theirs}_ms"])
    # min and max are not in the file's summary: they come from its per-request lists (seconds)
    assert s.ttft_ms.min == pytest.approx(min(doc["ttfts"]) * 1000) and s.e2e_ms.max == pytest.approx(
        max(doc["latencies"]) * 1000
    )
    assert s.itl_ms.count == sum(len(x) for x in doc["itls"]) == 600
    # one stored row per request, and the rows carry the file's per-request times
    assert store.sample_count(run.id) == doc["completed"] == 40
    rows = store.sample_rows(run.id)
    assert [r["ttft_ms"] for r in rows] == pytest.approx([t * 1000 for t in doc["ttfts"]], abs=1e-3)
    assert [r["output_tokens"] for r in rows] == doc["output_lens"]
    assert [r["prompt_tokens"] for r in rows] == doc["input_lens"]
    assert all(r["error"] == "" for r in rows)
    # MoE Bench's own summary of the stored rows gives vLLM's TTFT and ITL back (within the µs rounding)
    again = summarize(store.records(run.id))
    assert again.ttft_ms.p99 == pytest.approx(doc["p99_ttft_ms"], abs=2e-3)
    assert again.itl_ms.p99 == pytest.approx(doc["p99_itl_ms"], abs=2e-3)


def test_a_vllm_bench_serve_result_without_detail_imports_its_summary_and_leaves_the_rest_empty(
    store: Store,
) -> None:
    doc = load(VLLM_SUMMARY)
    run = imported(store, VLLM_SUMMARY)
    s = run.summary
    assert run.engine == "openai-chat" and store.sample_count(run.id) == 0
    assert s.request_rate == 20.0 and s.burstiness == 1.0 and run.concurrency == 4 and s.requests == 30
    assert s.ttft_ms.p99 == pytest.approx(doc["p99_ttft_ms"]) and s.ttft_ms.p50 == pytest.approx(doc["median_ttft_ms"])
    # the file has mean, median, std and p99 only (vLLM's default --metric-percentiles 99)
    assert s.ttft_ms.p90 is None and s.ttft_ms.min is None and s.ttft_ms.max is None
    assert s.tpot_ms.count is None and s.itl_ms.count is None  # how many: not in the file
    assert "p99_e2el_ms" not in doc  # E2E from the file's 'latencies' (seconds; every request succeeded)
    assert s.e2e_ms.p99 == pytest.approx(float(np.percentile(doc["latencies"], 99)) * 1000)
    assert s.cancelled is None and s.usage_mismatches is None and s.goodput_rps is None


# --- AIPerf -------------------------------------------------------------------------------------


def test_an_aiperf_profile_export_imports_with_its_records_from_beside_it(store: Store) -> None:
    doc = load(AIPERF)
    records = [json.loads(line) for line in AIPERF_RECORDS.read_text().splitlines() if line.strip()]
    run = imported(store, AIPERF)
    s = run.summary
    assert run.name.startswith("AIPerf: tiny-deepseek-v3 c=4 ")
    assert run.engine_info["source_tool"] == "AIPerf 0.13.0" == f"AIPerf {doc['aiperf_version']}"
    assert run.engine == "openai" and run.engine_info["endpoint_type"] == "completions" and run.concurrency == 4
    assert run.config["per_request"] == f"rows from {AIPERF_RECORDS.name}"
    assert (s.requests, s.completed, s.failed) == (30, doc["request_count"]["avg"], 0)
    assert s.duration_s == pytest.approx(doc["benchmark_duration"]["avg"])  # unit "sec"
    assert s.output_throughput_tok_s == doc["output_token_throughput"]["avg"]
    assert s.prompt_tokens == doc["total_isl"]["avg"] and s.output_tokens == doc["total_osl"]["avg"]
    pairs = (
        ("ttft_ms", "time_to_first_output_token"),  # the first answer token, MoE Bench's TTFT
        ("tpot_ms", "inter_token_latency"),  # AIPerf's ITL: (latency - TTFT) / (OSL - 1) per request
        ("itl_ms", "inter_chunk_latency"),  # every gap between chunks
        ("e2e_ms", "request_latency"),
    )
    for ours, theirs in pairs:
        st, m = getattr(s, ours), doc[theirs]
        assert m["unit"] == "ms"
        assert (st.p99, st.p50, st.mean, st.min, st.max, st.count) == (
            m["p99"], m["p50"], m["avg"], m["min"], m["max"], m["count"],
        ), ours  # fmt: skip
    assert store.sample_count(run.id) == len(records) == s.completed
    rows = store.sample_rows(run.id)
    assert sorted(r["e2e_ms"] for r in rows) == pytest.approx(
        sorted(r["metrics"]["request_latency"]["value"] for r in records), abs=1e-9
    )
    assert {r["request_id"] for r in rows} == {r["metadata"]["x_request_id"] for r in records}
    again = summarize(store.records(run.id))  # MoE Bench's own figures over the stored records
    assert again.itl_ms.p99 == pytest.approx(doc["inter_chunk_latency"]["p99"], abs=2e-3)
    assert again.ttft_ms.p99 == pytest.approx(doc["time_to_first_output_token"]["p99"], abs=2e-3)


def test_an_aiperf_rate_run_without_records_imports_its_summary(store: Store) -> None:
    doc = load(AIPERF_RATE)
    run = imported(store, AIPERF_RATE)
    assert store.sample_count(run.id) == 0 and run.config["per_request"].startswith("none")
    assert run.summary.request_rate == 20.0 and run.summary.burstiness == 1.0  # Poisson arrivals
    assert run.concurrency is None and run.engine_info["endpoint_type"] == "chat"
    assert run.summary.e2e_ms.p99 == doc["request_latency"]["p99"]


# --- guidellm -----------------------------------------------------------------------------------


def test_a_guidellm_benchmarks_file_imports_with_its_requests(store: Store) -> None:
    doc = load(GUIDELLM)
    b = doc["benchmarks"][0]
    m = b["metrics"]
    run = imported(store, GUIDELLM)
    s = run.summary
    assert run.engine_info["source_tool"] == "guidellm 0.8.1" == f"guidellm {doc['metadata']['guidellm_version']}"
    assert run.engine == "openai_http" and run.concurrency == 4 and run.config["workload"]["input_len"] == 32
    assert (s.requests, s.completed, s.failed, s.cancelled) == (20, 20, 0, 0)
    assert s.duration_s == b["duration"]
    out = m["output_token_count"]["successful"]["total_sum"]
    assert s.output_tokens == out and s.output_throughput_tok_s == pytest.approx(out / b["duration"])
    ttft = m["time_to_first_output_token_ms"]["successful"]
    assert s.ttft_ms.p99 == ttft["percentiles"]["p99"] and s.ttft_ms.mean == ttft["mean"]
    e2e = m["request_latency"]["successful"]  # seconds
    assert s.e2e_ms.p99 == pytest.approx(e2e["percentiles"]["p99"] * 1000) and s.e2e_ms.count == 20
    # guidellm keeps no gaps between chunks: ITL is empty, not 0
    assert s.itl_ms.count is None and s.itl_ms.p99 is None and s.itl_ms.mean is None
    # its inter_token_latency_ms distribution weighs requests by output tokens - 1: MoE Bench's ITL per token
    itl = m["inter_token_latency_ms"]["successful"]
    assert s.itl_token_ms is not None and s.itl_token_ms.count == itl["count"] == 300
    assert s.itl_token_ms.p99 == itl["percentiles"]["p99"]
    # TPOT per request, from the file's requests
    per_request = [r["inter_token_latency_ms"] for r in b["requests"]["successful"]]
    assert s.tpot_ms.count == 20 and s.tpot_ms.mean == pytest.approx(np.mean(per_request))
    assert s.tpot_ms.p99 == pytest.approx(float(np.percentile(per_request, 99)))
    assert store.sample_count(run.id) == 20
    again = summarize(store.records(run.id))  # first and last token times: the per-token ITL comes back
    assert again.itl_token_ms is not None and again.itl_token_ms.mean == pytest.approx(itl["mean"], abs=2e-3)
    assert again.ttft_ms.mean == pytest.approx(ttft["mean"], abs=2e-3)
    # guidellm's percentiles are the value at or above the rank (numpy's "higher"), not interpolated
    per_ttft = [r["time_to_first_output_token_ms"] for r in b["requests"]["successful"]]
    assert ttft["percentiles"]["p50"] == float(np.percentile(per_ttft, 50, method="higher"))


def test_a_guidellm_constant_rate_run_says_its_rate(store: Store) -> None:
    run = imported(store, GUIDELLM_RATE)
    assert run.summary.request_rate == 20.0 and run.summary.burstiness is None  # constant, not Poisson
    assert run.concurrency is None and run.engine_info["request_format"] == "/v1/completions"


# --- the CLI and the dashboard take them as they take bundles ------------------------------------


def test_bench_import_takes_each_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli.main import main

    db = tmp_path / "s.sqlite"
    for path in ALL:
        assert main(["import", "--db", str(db), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("imported ") == len(ALL)
    runs = Store(db).list_runs()
    assert sorted(r.engine_info["source_tool"] for r in runs) == sorted(
        ["vllm bench serve"] * 2 + ["AIPerf 0.13.0"] * 2 + ["guidellm 0.8.1"] * 2
    )


def test_the_dashboards_import_takes_them_with_distinct_names(store: Store, tmp_path: Path) -> None:
    from dashboard import data, profile_data

    for path in (*ALL, AIPERF_RECORDS):
        shutil.copy(path, tmp_path / path.name)
    done, skipped = profile_data.import_examples(store, tmp_path)
    assert len(done) == len(ALL) and skipped == []
    run = next(r for r in store.list_runs() if r.name.startswith("guidellm: tiny-deepseek-v3 c=4"))
    frame = data.replay_frame(data.load_recording(store, run.id), 1e9)
    assert frame.finished and frame.done == 20


# --- bad files ----------------------------------------------------------------------------------


def _edited(path: Path, keys: list[Any], value: Any) -> str:
    """The file's JSON with one value replaced."""
    doc = load(path)
    inner = doc
    for k in keys[:-1]:
        inner = inner[k]
    inner[keys[-1]] = value
    return json.dumps(doc)


def _vllm_bad(doc: dict[str, Any], change: str) -> str:
    if change == "negative":
        doc["completed"] = -3
    elif change == "short-list":
        doc["ttfts"] = doc["ttfts"][:-1]
    elif change == "junk":
        doc["itls"][5] = [[[[[0.1]]]]]
    elif change == "text-count":
        doc["output_lens"][2] = "sixteen"
    elif change == "errors-disagree":
        doc["errors"][0] = "boom"  # one error, the file says none failed
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("other.json", json.dumps({"hello": 1}), "file of SGLang bench_serving, vllm bench serve, AIPerf or guidellm"),
        ("list.json", "[1, 2, 3]", "nor a result file of"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("bad.json", "{not json", "cannot read bundle"),
        ("v.json", _vllm_bad(load(VLLM_DETAILED), "negative"), "completed is -3, below 0"),
        ("v.json", _vllm_bad(load(VLLM_DETAILED), "short-list"), "ttfts has 39 entries for 40 requests"),
        ("v.json", _vllm_bad(load(VLLM_DETAILED), "junk"), "itls[5] is '[[[[0.1]]]]', not a number"),
        ("v.json", _vllm_bad(load(VLLM_DETAILED), "text-count"), "output_lens[2] is 'sixteen', not a number"),
        ("v.json", _vllm_bad(load(VLLM_DETAILED), "errors-disagree"), "errors lists 1 failed requests"),
        ("v.json", VLLM_SUMMARY.read_text().replace('"p99_ttft_ms": 6.21', '"p99_ttft_ms": NaN, "x": 6.21'),
         "p99_ttft_ms is nan, not a finite number"),
        ("v.json", VLLM_SUMMARY.read_text().replace('"duration": 1.6', '"duration": Infinity, "x": 1.6'),
         "duration is inf, not a finite number"),
        ("a.json", AIPERF_RATE.read_text().replace('"unit": "ms"', '"unit": "furlongs"', 1),
         "not a unit of time"),
        ("a.json", _edited(AIPERF_RATE, ["request_count", "avg"], 29.5), "request_count is 29.5, not a count"),
        ("g.json", json.dumps({**load(GUIDELLM), "benchmarks": load(GUIDELLM)["benchmarks"] * 2}),
         "holds 2 benchmarks"),
        ("g.json", _edited(GUIDELLM, ["benchmarks", 0, "metrics", "request_totals", "errored"], -1),
         "request_totals.errored is -1, below 0"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_with_one_line_and_nothing_is_stored(
    store: Store, tmp_path: Path, name: str, text: str, why: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MoEBenchError) as err:
        import_file(store, path)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert nothing_stored(store)


def test_a_file_over_the_bundle_cap_is_refused_before_it_is_read(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "BUNDLE_MAX_BYTES", 10_000)
    with pytest.raises(MoEBenchError, match="over the 0 MiB allowed"):
        import_file(store, GUIDELLM)
    monkeypatch.setattr(bundle, "BUNDLE_MAX_BYTES", 50_000)  # the JSON fits, its records beside it do not
    with pytest.raises(MoEBenchError, match=r"aiperf-concurrency\.jsonl beside it is 0 MiB, over the 0 MiB allowed"):
        import_file(store, AIPERF)
    assert nothing_stored(store)


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (lambda ls: ls[:10], "holds 10 profiling records for 30 requests: not this run's records"),
        (lambda ls: [*ls[:29], "{oops"], "line 30 is not JSON"),
        (lambda ls: [*ls[:29], "[]"], "line 30 is not an object"),
    ],
)
def test_aiperf_records_that_are_not_the_runs_refuse_the_import(
    store: Store, tmp_path: Path, lines: Any, why: str
) -> None:
    shutil.copy(AIPERF, tmp_path / AIPERF.name)
    kept = lines(AIPERF_RECORDS.read_text().splitlines())
    (tmp_path / AIPERF_RECORDS.name).write_text("\n".join(kept) + "\n")
    with pytest.raises(MoEBenchError, match=why):
        import_file(store, tmp_path / AIPERF.name)
    assert nothing_stored(store)


def test_a_failed_request_in_a_vllm_file_is_stored_as_failed(store: Store, tmp_path: Path) -> None:
    doc = load(VLLM_DETAILED)
    doc["errors"][3] = "Traceback (most recent call last):\n  ...\naiohttp.ClientError: boom"
    doc["completed"], doc["failed"] = 39, 1
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(doc))
    run = imported(store, path)
    assert (run.summary.requests, run.summary.completed, run.summary.failed) == (40, 39, 1)
    row = store.sample_rows(run.id)[3]
    assert row["error"].endswith("aiohttp.ClientError: boom") and "\n" not in row["error"]
    assert row["ttft_ms"] is None and row["output_tokens"] == 0
    assert store.sample_count(run.id) == 40


def test_a_peer_bundle_refused_half_way_by_the_store_leaves_nothing(store: Store) -> None:
    made = read_bundle(VLLM_DETAILED)
    made["samples"][-1]["e2e_ms"] = float("nan")  # the last row: the run and 39 rows were written first
    with pytest.raises(MoEBenchError, match="sample 39 has e2e_ms 'nan', not a number"):
        import_run(store, made)
    assert nothing_stored(store)
    assert import_run(store, read_bundle(VLLM_DETAILED)) > 0  # the store is still usable


def test_a_moebench_bundle_is_not_mistaken_for_a_peer_file(store: Store, tmp_path: Path) -> None:
    run = imported(store, VLLM_DETAILED)
    exported = store.export_bundle(run.id)
    assert peers.detect(exported) is None
    path = tmp_path / "ours.json"
    path.write_text(json.dumps(exported))
    again = imported(store, path)
    assert again.summary == run.summary and again.engine_info == run.engine_info


def test_moebench_vllm_json_export_reads_back_as_the_same_run(store: Store, tmp_path: Path) -> None:
    """A run exported with ``bench export --format vllm-json`` (nulls where vLLM writes 0.0 for a
    failed request) imports as a vllm bench serve run with the same figures."""
    from bench.report.formats import export_run

    doc = load(VLLM_DETAILED)
    doc["errors"][7] = "boom"
    doc["completed"], doc["failed"] = 39, 1
    path = tmp_path / "with-failure.json"
    path.write_text(json.dumps(doc))
    first = imported(store, path)
    out = tmp_path / "exported.json"
    out.write_bytes(export_run(store, first.id, "vllm-json"))
    assert load(out)["latencies"][7] is None and load(out)["ttfts"][7] is None
    second = imported(store, out)
    a, b = first.summary, second.summary
    assert (b.completed, b.failed, b.requests) == (a.completed, a.failed, a.requests) == (39, 1, 40)
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert getattr(b, name).p99 == pytest.approx(getattr(a, name).p99, abs=2e-3), name
    assert store.sample_count(second.id) == 40
    assert store.sample_rows(second.id)[7]["error"] == "boom"


# --- SGLang bench_serving -----------------------------------------------------------------------
SGLANG_DETAILED = DATA / "sglang-bench-serving-detailed.jsonl"
SGLANG_SUMMARY = DATA / "sglang-bench-serving-summary.jsonl"
SGLANG_TWO = DATA / "sglang-bench-serving-two-rates.jsonl"
SGLANG = (SGLANG_DETAILED, SGLANG_SUMMARY)
_SGLANG_STATS = (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2e_latency"))


def test_an_sglang_bench_serving_line_with_details_imports_with_its_own_figures(store: Store) -> None:
    doc = load(SGLANG_DETAILED)  # one line: one JSON document
    run = imported(store, SGLANG_DETAILED)
    s = run.summary
    assert run.name.startswith("SGLang bench_serving: unknown c=4 ")  # the line names no model
    assert run.engine == doc["backend"] == "sglang-oai" and run.model == "unknown"
    assert run.engine_info["source_tool"] == run.config["source_tool"] == "SGLang bench_serving"
    assert run.engine_info["created_at_from"].startswith("file modification time")  # the line has no date
    assert doc["request_rate"] == float("inf") and s.request_rate is None and run.concurrency == 4
    assert (s.requests, s.completed, s.failed) == (40, doc["completed"], 0)
    assert s.duration_s == doc["duration"] and s.prompt_tokens == doc["total_input_tokens"] == 1280
    assert s.output_tokens == doc["total_output_tokens"] == 640
    assert s.request_throughput_rps == doc["request_throughput"]
    assert s.output_throughput_tok_s == doc["output_throughput"] and s.total_throughput_tok_s == doc["total_throughput"]
    for ours, theirs in _SGLANG_STATS:  # SGLang's own figures, as it wrote them
        st = getattr(s, ours)
        assert (st.mean, st.std, st.p50) == (
            doc[f"mean_{theirs}_ms"],
            doc[f"std_{theirs}_ms"],
            doc[f"median_{theirs}_ms"],
        )
        assert (st.p90, st.p95, st.p99) == tuple(doc[f"p{q}_{theirs}_ms"] for q in (90, 95, 99)), ours
    # hand check: SGLang's figures are numpy's over the lists it wrote (seconds); min and max come from there
    ttfts, gaps = np.array(doc["ttfts"]) * 1000, np.array([g for x in doc["itls"] for g in x]) * 1000
    assert np.percentile(ttfts, 99) == pytest.approx(doc["p99_ttft_ms"]) and np.mean(gaps) == pytest.approx(
        doc["mean_itl_ms"]
    )
    assert (s.ttft_ms.min, s.ttft_ms.max) == (pytest.approx(ttfts.min()), pytest.approx(ttfts.max()))
    assert s.itl_ms.count == len(gaps) == 600 and s.itl_ms.max == pytest.approx(gaps.max())
    assert s.tpot_ms.count == 40 and s.tpot_ms.min is None and s.e2e_ms.min is None  # no latencies per request
    rows = store.sample_rows(run.id)
    assert len(rows) == 40 and all(r["start_s"] == 0.0 for r in rows)  # SGLang keeps no start times
    r = rows[7]
    assert r["ttft_ms"] == pytest.approx(doc["ttfts"][7] * 1000)
    assert r["e2e_ms"] == pytest.approx((doc["ttfts"][7] + sum(doc["itls"][7])) * 1000)  # to the last chunk
    assert (r["prompt_tokens"], r["output_tokens"], r["error"], r["tpot_ms"]) == (32, 16, "", None)
    assert r["itl_mean_ms"] == pytest.approx(np.mean(doc["itls"][7]) * 1000)
    # chunk times rebuilt from TTFT and the gaps: MoE Bench's own summary of the rows gives SGLang's back
    again = summarize(store.records(run.id))
    assert again.ttft_ms.p99 == pytest.approx(doc["p99_ttft_ms"], abs=2e-3)
    assert again.itl_ms.p99 == pytest.approx(doc["p99_itl_ms"], abs=2e-3) and again.itl_ms.count == 600
    assert "no start times" in run.config["per_request"]


def test_an_sglang_line_without_details_imports_its_summary_and_leaves_the_rest_empty(store: Store) -> None:
    doc = load(SGLANG_SUMMARY)
    run = imported(store, SGLANG_SUMMARY)
    s = run.summary
    assert run.engine == doc["backend"] == "vllm"
    assert s.completed == 40 and s.requests is None and s.failed is None  # SGLang writes no request count
    assert s.ttft_ms.p99 == doc["p99_ttft_ms"] and s.e2e_ms.p50 == doc["median_e2e_latency_ms"]
    assert s.itl_ms.count is None and s.ttft_ms.min is None and s.ttft_ms.max is None
    assert store.sample_count(run.id) == 0 and run.config["per_request"].startswith("none")
    assert run.config["source_settings"]["max_concurrent_requests"] == doc["max_concurrent_requests"]


def test_an_sglang_file_of_several_runs_gives_its_last_line(tmp_path: Path) -> None:
    text = SGLANG_TWO.read_text(encoding="utf-8")
    last = json.loads(text.splitlines()[1])
    b = peers.sglang_jsonl_bundle(text, SGLANG_TWO)
    assert b is not None
    cfg, s = json.loads(b["run"]["config_json"]), json.loads(b["run"]["summary_json"])
    assert cfg["source_line"].startswith("line 2 of 2") and cfg["request_rate"] == last["request_rate"] == 40
    assert s["request_rate"] == 40 and s["burstiness"] == 1.0 and s["ttft_ms"]["p99"] == last["p99_ttft_ms"]
    assert b["run"]["engine"] == "sglang-oai-chat"
    assert peers.sglang_jsonl_bundle(VLLM_SUMMARY.read_text(), VLLM_SUMMARY) is None  # not SGLang's
    bad = tmp_path / "two.jsonl"
    bad.write_text(text + "{oops\n", encoding="utf-8")
    with pytest.raises(MoEBenchError, match=r"^SGLang bench_serving result two\.jsonl: line 3 is not JSON") as err:
        peers.sglang_jsonl_bundle(bad.read_text(), bad)
    assert "\n" not in str(err.value)
    bad.write_text(text.replace('"duration": ', '"duration": -', 1), encoding="utf-8")
    with pytest.raises(MoEBenchError, match=r"two\.jsonl line 1: duration is -[\d.]+, below 0"):
        peers.sglang_jsonl_bundle(bad.read_text(), bad)


def test_bench_import_and_bench_runs_take_sglang_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli.main import main

    db = tmp_path / "s.sqlite"
    for path in SGLANG:
        assert main(["import", "--db", str(db), str(path)]) == 0
    assert capsys.readouterr().out.count("imported ") == 2
    assert main(["runs", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    rows = [line.split() for line in listed.splitlines()[1:]]
    assert sorted(r[3] for r in rows) == ["sglang-oai", "vllm"] and all(r[1] == "completed" for r in rows)
    for path in SGLANG:  # each with the output tok/s its line says
        assert f"{load(path)['output_throughput']:.1f}" in listed
    assert sorted(r.engine for r in Store(db).list_runs()) == ["sglang-oai", "vllm"]


def _sglang_bad(change: str) -> str:
    doc = load(SGLANG_DETAILED)
    if change == "missing":
        del doc["total_input_tokens"]
    elif change == "negative":
        doc["p90_itl_ms"] = -1.5
    elif change == "nan":
        doc["mean_ttft_ms"] = float("nan")
    elif change == "short-list":
        doc["itls"] = doc["itls"][:-1]
    elif change == "errors-disagree":
        doc["errors"][3] = "boom"  # one failed, completed says all 40 succeeded
    elif change == "zero-duration":
        doc["duration"] = 0
    return json.dumps(doc) + "\n"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("missing", "total_input_tokens is 'None', not a number"),
        ("negative", "p90_itl_ms is -1.5, below 0"),
        ("nan", "mean_ttft_ms is nan, not a finite number"),
        ("short-list", "itls has 39 entries for 40 requests"),
        ("errors-disagree", "errors lists 39 successful requests, completed says 40"),
        ("zero-duration", "a run that took no time has no rates"),
    ],
)
def test_a_bad_sglang_line_is_refused_with_one_line(store: Store, tmp_path: Path, change: str, why: str) -> None:
    path = tmp_path / "sgl.jsonl"
    path.write_text(_sglang_bad(change), encoding="utf-8")
    with pytest.raises(MoEBenchError) as err:
        import_file(store, path)
    msg = str(err.value)
    assert msg.startswith("SGLang bench_serving result sgl.jsonl: ") and why in msg and "\n" not in msg
    assert nothing_stored(store)


def test_bench_import_reads_an_sglang_file_of_several_runs(tmp_path: Path) -> None:
    """SGLang appends one run a line: `bench import` checks every line and imports the last."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "s.sqlite"
    path = root / "tests" / "data" / "peers" / "sglang-bench-serving-two-rates.jsonl"
    out = subprocess.run([sys.executable, "-m", "bench", "--db", str(db), "import", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=root)  # fmt: skip
    assert out.returncode == 0, out.stderr
    from bench.store import Store

    runs = Store(db).list_runs()
    last = json.loads(path.read_text(encoding="utf-8").splitlines()[-1])
    assert len(runs) == 1 and runs[0].summary is not None
    assert runs[0].summary.completed == last["completed"]

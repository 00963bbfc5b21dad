"""SLOs, goodput and the run's verdict, checked against hand-computed figures."""

from __future__ import annotations

import pytest

from bench.config import RunConfig
from bench.metrics.records import RequestRecord
from bench.metrics.slo import SLO_PRESETS, SloError, judge, parse_slo, parse_slos
from bench.metrics.summary import summarize
from engines.errors import ConfigError


def _rec(rid: str, start: float, ttft_ms: float, tpot_ms: float, n: int, error: str | None = None) -> RequestRecord:
    """A request whose first chunk comes ttft_ms after start, then one chunk every tpot_ms."""
    first = start + ttft_ms / 1000
    chunks = [first + i * tpot_ms / 1000 for i in range(n)]
    end = chunks[-1] if chunks else start + 0.001
    return RequestRecord(rid, start, end, chunks if error is None else [], 4, n if error is None else 0, error)


def test_parse_slo_forms_and_presets() -> None:
    s = parse_slo("ttft_ms:p99<=2000")
    assert (s.metric, s.stat, s.limit_ms, s.text) == ("ttft_ms", "p99", 2000.0, "ttft_ms:p99<=2000")
    assert parse_slo(" TPOT:p99.9 <= 80ms ").text == "tpot_ms:p99.9<=80"
    assert parse_slo("e2e_ms:mean<=1500.5").limit_ms == 1500.5
    assert [x.text for x in parse_slos(["mlperf-server"])] == list(SLO_PRESETS["mlperf-server"])
    # a later SLO on the same metric and statistic replaces the preset's
    assert [x.text for x in parse_slos(["interactive", "tpot_ms:p99<=20"])] == ["ttft_ms:p99<=1500", "tpot_ms:p99<=20"]


@pytest.mark.parametrize(
    "text,reason",
    [
        ("ttft_ms<2000", "is not METRIC:STAT<=LIMIT"),
        ("latency_ms:p99<=10", "unknown metric 'latency_ms'"),
        ("ttft_ms:p0<=10", "percentile must be in (0, 100]"),
        ("ttft_ms:p101<=10", "percentile must be in (0, 100]"),
        ("ttft_ms:p99<=0", "limit must be above 0 ms"),
    ],
)
def test_bad_slos_have_a_one_line_reason(text: str, reason: str) -> None:
    with pytest.raises(SloError, match=None) as info:
        parse_slo(text)
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_run_config_checks_and_normalises_slos() -> None:
    cfg = RunConfig.build(slos=["mlperf-server", "e2e:p90<=5000"])
    assert cfg.slos == ["ttft_ms:p99<=2000", "tpot_ms:p99<=80", "e2e_ms:p90<=5000"]
    with pytest.raises(ConfigError, match="slos: SLO 'ttft:p99<2000' is not"):
        RunConfig.build(slos=["ttft:p99<2000"])


def test_goodput_and_verdict_by_hand() -> None:
    recs = [
        _rec("a", 0.0, ttft_ms=100, tpot_ms=10, n=5),  # good
        _rec("b", 0.1, ttft_ms=2500, tpot_ms=10, n=5),  # TTFT over 2000
        _rec("c", 0.2, ttft_ms=100, tpot_ms=90, n=5),  # TPOT over 80
        _rec("d", 0.3, ttft_ms=200, tpot_ms=0, n=1),  # one token: no TPOT, meets it
        _rec("e", 0.4, ttft_ms=50, tpot_ms=5, n=3, error="HTTP 500"),  # failed: never good
        _rec("f", 0.5, ttft_ms=2000, tpot_ms=80, n=4),  # exactly at both limits: good (<=)
    ]
    s = summarize(recs, duration_s=2.0, slos=["mlperf-server"])
    assert s.good_requests == 3 and s.goodput_rps == pytest.approx(1.5)  # a, d, f over 2 s
    assert s.slos == ("ttft_ms:p99<=2000", "tpot_ms:p99<=80")
    # TTFT over the 5 completed: 100, 2500, 100, 200, 2000 -> p99 = 2000 + 0.96 * 500 = 2480
    verdicts = judge(recs, parse_slos(["mlperf-server"]))
    assert verdicts[0].value == pytest.approx(2480.0) and not verdicts[0].ok
    # TPOT over those with one: 10, 10, 90, 80 -> p99 = 80 + (90 - 80) * ... sorted 10,10,80,90: pos 2.97
    assert verdicts[1].value == pytest.approx(80 + 0.97 * 10) and not verdicts[1].ok
    assert s.slo_met is False
    assert "TTFT p99 ≤ 2000 ms: 2480 ms FAILED" == verdicts[0].text
    relaxed = summarize(recs, duration_s=2.0, slos=["ttft_ms:p50<=500", "e2e_ms:max<=5000"])
    # TTFT p50 of 100, 100, 200, 2000, 2500 is 200; per request b (2500) and f (2000) miss 500 ms
    assert relaxed.slo_met is True and relaxed.good_requests == 3
    flat = relaxed.flat()
    assert flat["goodput_rps"] == pytest.approx(1.5) and flat["slos"] == "ttft_ms:p50<=500 e2e_ms:max<=5000"


def test_itl_slo_uses_the_mean_gap_per_request_and_pooled_gaps_for_the_verdict() -> None:
    recs = [_rec("a", 0.0, 10, 10, 5), _rec("b", 0.0, 10, 30, 3)]
    s = summarize(recs, duration_s=1.0, slos=["itl_ms:max<=20"])
    assert s.good_requests == 1 and s.slo_met is False  # b's gaps are 30 ms


def test_no_slo_no_goodput_columns_filled() -> None:
    s = summarize([_rec("a", 0.0, 10, 10, 3)], duration_s=1.0)
    assert s.goodput_rps is None and s.slo_met is None and s.flat()["slos"] is None

"""Metric definitions against hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest

from bench.metrics.records import METRIC_DEFINITIONS, RequestRecord, describe, percentile
from bench.metrics.summary import RunSummary, summarize


def test_request_metrics_follow_vllm_conventions() -> None:
    # sent at 1.0 s, chunks at 1.1, 1.3, 1.6 (one token each), done at 1.6
    r = RequestRecord("a", start_s=1.0, end_s=1.6, chunk_times_s=[1.1, 1.3, 1.6], prompt_tokens=10, output_tokens=3)
    assert r.ttft_ms == pytest.approx(100.0)
    assert r.e2e_ms == pytest.approx(600.0)
    assert r.tpot_ms == pytest.approx((600.0 - 100.0) / 2)  # (E2E - TTFT) / (N - 1)
    assert r.itls_ms == pytest.approx([200.0, 300.0])
    assert r.itl_mean_ms == pytest.approx(250.0)


def test_multi_token_chunks_count_tokens_not_chunks_for_tpot() -> None:
    r = RequestRecord("b", 0.0, 1.0, chunk_times_s=[0.2, 1.0], prompt_tokens=4, output_tokens=5)
    assert r.tpot_ms == pytest.approx((1000.0 - 200.0) / 4)
    assert r.itls_ms == pytest.approx([800.0])


def test_single_token_has_no_tpot_and_no_itl() -> None:
    r = RequestRecord("c", 0.0, 0.05, chunk_times_s=[0.05], output_tokens=1)
    assert r.tpot_ms is None and r.itls_ms == [] and r.itl_mean_ms is None


def test_percentiles_interpolate_linearly_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile([], 50) is None
    st = describe([2.0, None, 4.0])
    assert (st.count, st.mean, st.std, st.min, st.max, st.p50) == (2, 3.0, 1.0, 2.0, 4.0, 3.0)


def test_run_throughput_uses_wall_clock_not_summed_latencies() -> None:
    # Two requests fully overlapping for 2 s: summed latency would be 4 s (the seed's mistake).
    recs = [
        RequestRecord("1", 0.0, 2.0, [0.5, 1.0, 1.5, 2.0], prompt_tokens=8, output_tokens=4),
        RequestRecord("2", 0.0, 2.0, [0.5, 1.0, 1.5, 2.0], prompt_tokens=8, output_tokens=4),
        RequestRecord("3", 0.1, 0.2, [], prompt_tokens=8, output_tokens=0, error="HTTP 500"),
    ]
    s = summarize(recs, peak_memory_gib=1.5, max_concurrency=2)
    assert (s.requests, s.completed, s.failed) == (3, 2, 1)
    assert s.duration_s == pytest.approx(2.0)
    assert s.output_throughput_tok_s == pytest.approx(8 / 2.0)
    assert s.total_throughput_tok_s == pytest.approx((16 + 8) / 2.0)  # failed request's tokens excluded
    assert s.request_throughput_rps == pytest.approx(1.0)
    assert s.ttft_ms.p50 == pytest.approx(500.0) and s.ttft_ms.count == 2
    assert s.itl_ms.count == 6 and s.itl_ms.mean == pytest.approx(500.0)
    assert s.tpot_ms.mean == pytest.approx(500.0)
    assert s.peak_memory_gib == 1.5
    again = RunSummary.from_dict(s.as_dict())
    assert again == s
    flat = s.flat()
    assert flat["ttft_ms_p99"] == pytest.approx(500.0) and "ttft_ms_count" not in flat


def test_usage_mismatch_is_counted() -> None:
    recs = [RequestRecord("1", 0, 1, [0.5, 1.0], output_tokens=2, usage_output_tokens=3)]
    assert summarize(recs).usage_mismatches == 1


def test_the_servers_usage_count_drives_tpot_and_throughput() -> None:
    """As vllm bench serve: the server's completion_tokens where reported, else the client's count."""
    served = RequestRecord("s", 0.0, 1.0, [0.1, 0.4, 1.0], output_tokens=4, usage_output_tokens=3)
    assert served.counted_output_tokens == 3 and served.tpot_ms == pytest.approx((1000.0 - 100.0) / 2)
    local = RequestRecord("l", 0.0, 1.0, [0.1, 0.4, 1.0], output_tokens=4)
    assert local.counted_output_tokens == 4 and local.tpot_ms == pytest.approx((1000.0 - 100.0) / 3)
    s = summarize([served, local], duration_s=2.0)
    assert s.output_tokens == 7 and s.output_throughput_tok_s == pytest.approx(3.5)
    assert served.as_row()["output_tokens"] == 4 and served.as_row()["usage_output_tokens"] == 3  # both kept


def test_every_metric_has_a_definition() -> None:
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_throughput_tok_s", "duration_s"):
        assert len(METRIC_DEFINITIONS[key]) > 30


def test_burst_streamed_outputs_are_named_not_shown_as_a_speed() -> None:
    """689 of 1,201 vLLM requests got all 16 tokens in one chunk (issue 14): TPOT p50 read 0.006 ms.
    The summary says how the output was chunked and flags the run."""
    from bench.metrics.summary import summarize

    burst = [RequestRecord(f"b{i}", 0.0, 0.2, [0.2], 4, 16) for i in range(6)]  # 16 tokens, one chunk
    steady = [RequestRecord(f"s{i}", 0.0, 0.5, [0.1 + 0.02 * k for k in range(16)], 4, 16) for i in range(4)]
    s = summarize(burst + steady)
    assert s.single_chunk_share == pytest.approx(0.6)
    assert s.tokens_per_chunk == pytest.approx(160 / (6 + 64))
    assert s.bursty and s.burst_warning is not None and "60% of the requests" in s.burst_warning
    assert s.tpot_ms.p50 == 0.0  # the misleading figure the note explains
    calm = summarize(steady)
    assert calm.single_chunk_share == 0.0 and calm.tokens_per_chunk == 1.0
    assert not calm.bursty and calm.burst_warning is None
    assert RunSummary.from_dict(s.as_dict()) == s  # stored and read back


def test_spread_of_repeated_runs_gives_min_median_max_and_cv() -> None:
    from bench.metrics.summary import HEADLINE_FIGURES, spread

    base = summarize([RequestRecord("a", 0.0, 1.0, [0.1, 0.2, 0.3], 4, 3)])
    runs = [dataclasses.replace(base, output_throughput_tok_s=v) for v in (90.0, 100.0, 110.0)]
    rows = {r.figure: r for r in spread(runs)}
    assert list(rows) == [k for k, _ in HEADLINE_FIGURES]
    out = rows["output_throughput_tok_s"]
    assert (out.n, out.min, out.median, out.max) == (3, 90.0, 100.0, 110.0)
    assert out.cv == pytest.approx(0.1)  # sample std 10 / mean 100
    assert rows["ttft_ms_p50"].cv == 0.0  # identical values
    assert spread(runs[:1])[0].cv is None  # one run: no spread to speak of

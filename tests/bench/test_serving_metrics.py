"""DeepSeek serving metrics (issue 35): ITL per token with multi-token chunks, reasoning splits and
the usage flag, speculative-decoding acceptance from the server's counters, energy per token.

Each figure is computed here by hand from what the run stored (chunk times, planted token counts,
planted power series, the server's counters read by the test itself) and compared with the
summary. Engines: the fake engine (tests/fakes.py: planted chunking and reasoning) in sender
processes and in process, and the real stub server over HTTP (bench/stub_server.py)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.config import RunConfig
from bench.metrics.energy import device_energy, energy_of_run
from bench.metrics.records import RequestRecord
from bench.metrics.spec_decode import spec_fields
from bench.metrics.summary import RunSummary, summarize
from bench.run.manager import start_run
from bench.store import Store
from bench.stub_server import start_stub_server
from engines import telemetry
from engines.base import SERIES_SPEC_ACCEPTED, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_DRAFTS, SERIES_SPEC_POS
from engines.prometheus import parse_prometheus, parse_prometheus_by
from engines.telemetry import DeviceReading, RaplSource, TelemetrySource, TelemetryUnavailable


def _run(store: Store, kind: str, engine: dict[str, Any] | None = None, **kw: Any) -> tuple[Any, RunSummary]:
    base: dict[str, Any] = {
        "engine": {"kind": kind, **(engine or {})},
        "mode": "concurrency",
        "workload": {"source": "builtin", "output_len": 10},
        "requests": 12,
        "concurrency": 3,
    }
    base.update(kw)
    snap = start_run(RunConfig.build(**base), store).wait(60)
    assert snap.status == "completed", snap.error
    return snap, store.get_run(snap.run_id).summary


# --- per request, by hand ---------------------------------------------------------------------


def test_itl_per_token_splits_each_gap_over_its_chunks_tokens() -> None:
    # chunks of 1, 4, 2 and 3 tokens at 0.10, 0.14, 0.15, 0.18 s
    rec = RequestRecord("r", 0.0, 0.18, [0.10, 0.14, 0.15, 0.18], 5, 10, chunk_tokens=[1, 4, 2, 3])
    assert rec.itls_ms == pytest.approx([40.0, 10.0, 30.0])
    assert rec.itl_token_ms == pytest.approx([10.0] * 4 + [5.0] * 2 + [10.0] * 3)
    assert rec.itl_token_mean_ms == pytest.approx(80.0 / 9)  # (last - first) / tokens after the first chunk
    assert rec.tpot_ms == pytest.approx(80.0 / 9)  # (E2E - TTFT) / (N - 1): N - 1 = 9 here too
    one_each = RequestRecord("s", 0.0, 0.3, [0.1, 0.2, 0.3], 5, 3)
    assert one_each.itl_token_ms == one_each.itls_ms and one_each.itl_token_mean_ms == pytest.approx(100.0)


def test_reasoning_time_tokens_and_the_mismatch_rule() -> None:
    # two reasoning chunks (3 + 2 tokens), then three answer chunks of one token
    rec = RequestRecord(
        "r", 0.0, 0.6, [0.1, 0.2, 0.4, 0.5, 0.6], 5, 8, first_any_token_s=0.1,
        chunk_tokens=[3, 2, 1, 1, 1], reasoning_chunks=2, reasoning_tokens=5, usage_reasoning_tokens=5,
    )  # fmt: skip
    assert rec.ttft_ms == pytest.approx(400.0) and rec.ttft_any_ms == pytest.approx(100.0)
    assert rec.reasoning_ms == pytest.approx(300.0) and rec.answer_tokens == 3
    assert rec.tpot_ms == pytest.approx(500.0 / 7)  # from the first output token of any kind
    assert not rec.reasoning_mismatch
    assert RequestRecord("z", 0, 1, [0.5], 1, 40, reasoning_chunks=1, reasoning_tokens=40,
                         usage_reasoning_tokens=0).reasoning_mismatch  # fmt: skip
    # within max(2, 10 %): tokenizer boundaries, not a mismatch
    assert not RequestRecord("b", 0, 1, [0.5], 1, 40, reasoning_tokens=40, usage_reasoning_tokens=42).reasoning_mismatch
    assert RequestRecord("c", 0, 1, [0.5], 1, 40, reasoning_tokens=40, usage_reasoning_tokens=45).reasoning_mismatch
    # reasoning only (the thinking used up max_tokens): no answer, no TTFT, no reasoning time
    only = RequestRecord("o", 0.0, 0.3, [0.1, 0.3], 5, 4, chunk_tokens=[2, 2], reasoning_chunks=2, reasoning_tokens=4)
    assert only.ttft_ms is None and only.reasoning_ms is None and only.answer_tokens == 0
    assert only.tpot_ms == pytest.approx(200.0 / 3)


# --- runs on the fake engine: planted chunking and reasoning ---------------------------------------


@pytest.mark.parametrize("processes", [False, True])
def test_a_run_with_four_token_chunks_reports_itl_per_token(
    store: Store, fake_engine_kind: str, processes: bool
) -> None:
    snap, s = _run(store, fake_engine_kind, {"tokens_per_chunk": 4, "itl_s": 0.02, "processes": processes})
    records = store.records(snap.run_id)
    assert all(r.chunk_tokens == [4, 4, 2] for r in records)  # 10 tokens in chunks of up to 4
    by_hand = [g / k for r in records for g, k in zip(r.itls_ms, r.chunk_tokens[1:], strict=True) for _ in range(k)]
    assert s.itl_token_ms is not None and s.itl_token_ms.count == len(by_hand) == 12 * 6
    assert s.itl_token_ms.mean == pytest.approx(float(np.mean(by_hand)))
    assert s.itl_token_ms.p99 == pytest.approx(float(np.percentile(by_hand, 99)))
    assert s.itl_ms.count == 24 and s.tokens_per_chunk == pytest.approx(10 / 3)
    # the per-request CSV column is the per-token mean
    rows = store.sample_rows(snap.run_id)
    for row, r in zip(rows, records, strict=True):
        # (stored chunk times keep 1 µs: the column was computed before they were rounded)
        by_hand = (r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1000 / 6
        assert row["itl_token_mean_ms"] == pytest.approx(by_hand, abs=1e-3)
    assert "ITL per token" in (s.burst_warning or "")


def test_a_reasoning_run_splits_reasoning_and_answer_and_flags_a_server_that_reports_zero(
    store: Store, fake_engine_kind: str
) -> None:
    engine = {"reasoning_tokens": 6, "tokens_per_chunk": 2, "usage_reasoning_tokens": 0, "itl_s": 0.01}
    snap, s = _run(store, fake_engine_kind, engine, slos=["ttft_ms:p99<=10000"])
    records = store.records(snap.run_id)
    assert all(r.reasoning_tokens == 6 and r.reasoning_chunks == 3 and r.answer_tokens == 4 for r in records)
    assert s.reasoning_tokens == 72 and s.answer_tokens == 48
    assert s.answer_throughput_tok_s == pytest.approx(48 / s.duration_s)
    by_hand = [(r.chunk_times_s[3] - r.chunk_times_s[0]) * 1000 for r in records]
    assert s.reasoning_ms is not None and s.reasoning_ms.mean == pytest.approx(float(np.mean(by_hand)))
    # TTFT is the first answer chunk, ttft_any the first reasoning chunk
    assert all(r.ttft_ms == pytest.approx((r.chunk_times_s[3] - r.start_s) * 1000, abs=1e-3) for r in records)
    assert all(r.ttft_any_ms == pytest.approx((r.chunk_times_s[0] - r.start_s) * 1000, abs=1e-3) for r in records)
    assert s.reasoning_mismatches == 12 and "reasoning tokens" in (s.reasoning_warning or "")
    rows = store.sample_rows(snap.run_id)
    assert {(r["reasoning_tokens"], r["answer_tokens"], r["usage_reasoning_tokens"]) for r in rows} == {(6, 4, 0)}
    # a server that counts right is not flagged
    _, exact = _run(store, fake_engine_kind, {**engine, "usage_reasoning_tokens": 6})
    assert exact.reasoning_mismatches == 0 and exact.reasoning_warning is None
    # a model without reasoning: none of the reasoning fields
    _, plain = _run(store, fake_engine_kind)
    assert plain.reasoning_tokens is None and plain.reasoning_ms is None and plain.reasoning_mismatches is None


# --- speculative decoding over HTTP: the stub's counters ---------------------------------------------


def _counters(url: str) -> dict[str, Any]:
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=5).read().decode()
    values = parse_prometheus(text)
    pos = parse_prometheus_by(text, "position", ["vllm:spec_decode_num_accepted_tokens_per_pos_total"])
    return {
        "drafts": values["vllm:spec_decode_num_drafts_total"],
        "tokens": values["vllm:spec_decode_num_draft_tokens_total"],
        "accepted": values["vllm:spec_decode_num_accepted_tokens_total"],
        "pos": [pos[(name, k)] for name, k in sorted(pos, key=lambda x: int(x[1]))],
    }


def test_acceptance_is_the_servers_counter_deltas_over_the_measured_window(store: Store, tiny_model: Path) -> None:
    url, proc = start_stub_server(tokens_per_chunk=4, itl_ms=5.0)
    try:
        config = {"kind": "vllm", "model": "tiny-deepseek-v3", "base_url": url}
        _run(store, "vllm", config, requests=3, workload={"source": "builtin", "output_len": 7})  # before the run
        before = _counters(url)
        assert before["drafts"] > 0  # the server's totals since it started are not the run's
        snap, s = _run(store, "vllm", config, requests=10, warmup=0, workload={"source": "builtin", "output_len": 30})
        after = _counters(url)
    finally:
        proc.stop()
    drafts, tokens = after["drafts"] - before["drafts"], after["tokens"] - before["tokens"]
    accepted = after["accepted"] - before["accepted"]
    # 30 tokens in chunks of 4: 7 full steps (3 accepted of 3) and one of 2 (1 of 3), per request
    assert (drafts, tokens, accepted) == (80, 240, 220)
    assert (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens) == (drafts, tokens, accepted)
    assert s.spec_acceptance_rate == pytest.approx(accepted / tokens)
    assert s.spec_acceptance_length == pytest.approx(1 + accepted / drafts)
    per_pos = [(a - b) / drafts for a, b in zip(after["pos"], before["pos"], strict=True)]
    assert s.spec_accepted_per_pos == pytest.approx(per_pos) and per_pos == pytest.approx([1.0, 0.875, 0.875])
    records = store.records(snap.run_id)
    assert all(r.chunk_tokens == [4] * 7 + [2] for r in records)  # counted from token_ids
    # per request, 7 gaps between the 8 chunks; per token, the first 6 gaps count 4 times (/ 4) and
    # the last twice (/ 2): the pooled means are sum(gaps) / 70 and sum(gaps) / 260
    assert s.itl_ms.count == 70 and s.itl_token_ms is not None and s.itl_token_ms.count == 260
    assert s.itl_ms.mean / s.itl_token_ms.mean == pytest.approx(26 / 7)  # type: ignore[operator]


@pytest.mark.parametrize("usage,flagged", [("zero", 8), ("exact", 0), ("none", None)])
def test_a_reasoning_stub_over_http_gives_exact_splits(
    store: Store, tiny_model: Path, usage: str, flagged: int | None
) -> None:
    url, proc = start_stub_server(reasoning_tokens=5, reasoning_usage=usage, tokens_per_chunk=2, itl_ms=2.0)
    try:
        engine = {"model": "tiny-deepseek-v3", "base_url": url, "endpoint": "chat"}
        snap, s = _run(store, "openai", engine, requests=8, workload={"source": "builtin", "output_len": 12})
    finally:
        proc.stop()
    records = store.records(snap.run_id)
    # 5 reasoning tokens in chunks of 2, 2, 1; then 7 answer tokens in 2, 2, 2, 1
    assert all(r.chunk_tokens == [2, 2, 1, 2, 2, 2, 1] and r.reasoning_chunks == 3 for r in records)
    assert (s.reasoning_tokens, s.answer_tokens, s.reasoning_mismatches) == (40, 56, flagged)
    assert all(r.reasoning_ms == pytest.approx((r.chunk_times_s[3] - r.chunk_times_s[0]) * 1000) for r in records)


def test_spec_fields_need_drafts_during_the_run() -> None:
    points = [(0.0, SERIES_SPEC_DRAFTS, 5.0), (0.0, SERIES_SPEC_DRAFT_TOKENS, 15.0), (0.0, SERIES_SPEC_ACCEPTED, 9.0)]
    assert spec_fields(points + [(1.0, n, v) for _, n, v in points]) == {}  # none during the run
    later = [(2.0, SERIES_SPEC_DRAFTS, 9.0), (2.0, SERIES_SPEC_DRAFT_TOKENS, 27.0), (2.0, SERIES_SPEC_ACCEPTED, 15.0)]
    pos = [(0.0, f"{SERIES_SPEC_POS}0", 4.0), (2.0, f"{SERIES_SPEC_POS}0", 7.0)]
    got = spec_fields(points + pos + later)
    assert got["spec_acceptance_rate"] == pytest.approx(6 / 12) and got["spec_acceptance_length"] == pytest.approx(2.5)
    assert got["spec_accepted_per_pos"] == pytest.approx((0.75,))
    restarted = [(2.0, SERIES_SPEC_DRAFTS, 1.0), (2.0, SERIES_SPEC_DRAFT_TOKENS, 3.0), (2.0, SERIES_SPEC_ACCEPTED, 1.0)]
    assert spec_fields(points + restarted) == {}  # counters that went down: the server restarted


# --- energy: a planted power series -----------------------------------------------------------------


def test_energy_by_the_trapezoid_and_by_a_counter() -> None:
    power = [(0.0, 100.0), (1.0, 300.0), (2.5, 200.0), (3.0, 200.0)]
    points = [(t, "dev0_power_w", w) for t, w in power] + [(t, "dev1_power_w", 50.0) for t, _ in power]
    points += [(0.0, "dev1_energy_j", 1000.0), (3.0, "dev1_energy_j", 1180.0)]  # dev1's own counter: 180 J
    devices = {d.device: d for d in device_energy(points)}
    assert devices["dev0"].energy_j == pytest.approx(200 + 375 + 100) and devices["dev0"].method.startswith("power")
    assert devices["dev1"].energy_j == pytest.approx(180.0) and devices["dev1"].method == "energy counter"
    fields, artifact = energy_of_run(points, output_tokens=855, goodput_rps=2.0)
    assert fields["energy_j"] == pytest.approx(855.0) and fields["joules_per_output_token"] == pytest.approx(1.0)
    assert fields["output_tokens_per_j"] == pytest.approx(1.0) and fields["power_avg_w"] == pytest.approx(285.0)
    assert fields["power_peak_w"] == pytest.approx(350.0) and fields["goodput_per_w"] == pytest.approx(2.0 / 285.0)
    assert [d["device"] for d in artifact["devices"]] == ["dev0", "dev1"]
    assert energy_of_run([], 10, None, "no power read: nvidia-smi is missing") == (
        {},
        {"reason": "no power read: nvidia-smi is missing"},
    )


class _PlantedPower(TelemetrySource):
    """A device whose power rises 10 W at each read and whose energy counter gains 150 J per read (reads
    are about a second apart: a counter that keeps up with the power, which the runs trusts)."""

    name = "planted"

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> list[DeviceReading]:
        self.reads += 1
        return [
            DeviceReading("nvidia", 0, "Planted GPU", power_w=100.0 + 10 * self.reads, energy_j=150.0 * self.reads),
            DeviceReading("nvidia", 1, "Planted GPU", power_w=100.0 + 10 * self.reads),
        ]


def test_a_run_integrates_its_planted_power_over_the_measured_window(
    store: Store, fake_engine_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _PlantedPower()
    monkeypatch.setattr(telemetry, "detect", lambda *a, **k: ([source], []))
    snap, s = _run(store, fake_engine_kind, {"itl_s": 0.05}, requests=6, concurrency=2, slos=["e2e_ms:p99<=60000"])
    series = store.timeseries(snap.run_id, ["dev0_energy_j", "dev1_power_w"])
    counter = [v for _, n, v in series if n == "dev0_energy_j"]
    dev1 = [(t, v) for t, n, v in series if n == "dev1_power_w"]
    assert counter[0] == 150.0 and len(counter) == source.reads  # first point before the first request
    dev0_j = counter[-1] - counter[0]  # its counter: exact
    dev1_j = float(np.trapezoid([v for _, v in dev1], [t for t, _ in dev1]))
    assert s.energy_j == pytest.approx(dev0_j + dev1_j)
    assert s.joules_per_output_token == pytest.approx((dev0_j + dev1_j) / s.output_tokens)
    window = dev1[-1][0] - dev1[0][0]
    assert s.power_avg_w == pytest.approx((dev0_j + dev1_j) / window)
    assert s.power_peak_w == pytest.approx(2 * (100.0 + 10 * source.reads))  # the last read, both devices
    assert s.goodput_per_w == pytest.approx(s.goodput_rps / s.power_avg_w)  # type: ignore[operator]
    art = store.artifact(snap.run_id, "energy")
    assert [d["method"] for d in art["devices"]] == ["energy counter", "power samples (trapezoid)"]


def test_a_run_without_power_says_why(store: Store, fake_engine_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "detect", lambda *a, **k: ([], ["no CPU energy counter (RAPL): planted reason"]))
    snap, s = _run(store, fake_engine_kind, requests=3)
    assert s.energy_j is None and s.joules_per_output_token is None
    assert store.artifact(snap.run_id, "energy") == {
        "reason": "no power read: no CPU energy counter (RAPL): planted reason"
    }


def test_rapl_reads_package_counters_and_unwinds_a_wrap(tmp_path: Path) -> None:
    root = tmp_path / "powercap"
    for zone, name, uj in (
        ("intel-rapl:0", "package-0", 999_000_000),
        ("intel-rapl:0:0", "core", 5),
        ("intel-rapl:1", "package-1", 10),
    ):
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text(f"{uj}\n")
        (root / zone / "max_energy_range_uj").write_text("1000000000\n")
    src = RaplSource(root)
    first = src.read()
    assert [(r.index, r.name, r.energy_j) for r in first] == [(0, "CPU package-0", 999.0), (1, "CPU package-1", 1e-5)]
    assert all(r.power_w is None for r in first)  # power needs two reads
    (root / "intel-rapl:0" / "energy_uj").write_text("2000000\n")  # wrapped: +3 J
    (root / "intel-rapl:1" / "energy_uj").write_text("5000010\n")  # +5 J
    second = src.read()
    assert [r.energy_j for r in second] == pytest.approx([1002.0, 5.00001])
    assert all(r.power_w is not None and r.power_w > 0 for r in second)
    with pytest.raises(TelemetryUnavailable, match="no CPU energy counter"):
        RaplSource(tmp_path / "absent")


def test_summaries_before_these_fields_still_load() -> None:
    old = summarize([RequestRecord("r", 0.0, 0.3, [0.1, 0.2, 0.3], 5, 3)]).as_dict()
    for key in ("itl_token_ms", "reasoning_ms", "spec_accepted_per_pos", "energy_j", "reasoning_tokens"):
        old.pop(key)
    s = RunSummary.from_dict(old)
    assert s.itl_token_ms is None and s.energy_j is None
    row = RunSummary.from_dict({**s.as_dict(), "spec_accepted_per_pos": [0.5, 0.25]}).flat()
    assert row["spec_accepted_per_pos"] == "0.5000 0.2500"

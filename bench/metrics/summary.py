"""Run summaries (:class:`RunSummary`) from request records, and the spread of repeated runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.metrics.catalogue import PER_REQUEST_METRICS, STAT_METRICS
from bench.metrics.client_bound import client_bound_reason
from bench.metrics.records import (
    BURST_SINGLE_CHUNK_SHARE,
    BURST_TOKENS_PER_CHUNK,
    PREFIX_CACHE_WARN,
    RequestRecord,
    Stat,
    describe,
)
from bench.metrics.slo import all_met, good_requests, judge, parse_slos

BASE_STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")  # every summary has these
OPTIONAL_STATS = tuple(m for m in STAT_METRICS if m not in BASE_STATS)  # Stat fields a summary may lack


@dataclass(frozen=True)
class RunSummary:
    """What a run measured. Latency stats cover completed requests only."""

    requests: int
    completed: int
    failed: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    request_throughput_rps: float
    output_throughput_tok_s: float
    total_throughput_tok_s: float
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2e_ms: Stat
    peak_memory_gib: float | None = None
    accelerators: int | None = None  # the engine's accelerators (bench.metrics.deployment)
    output_tok_s_per_accelerator: float | None = None  # output_throughput_tok_s / accelerators
    max_concurrency: int | None = None
    usage_mismatches: int = 0
    send_lag_ms: Stat | None = None
    request_rate: float | None = None  # open-loop target (req/s); None: closed loop
    burstiness: float | None = None
    slos: tuple[str, ...] | None = None  # the run's SLOs (bench.metrics.slo texts); None: no SLO
    good_requests: int | None = None  # completed requests that met every SLO
    goodput_rps: float | None = None
    slo_met: bool | None = None  # every SLO's statistic over the run within its limit
    prefix_cache_hit_rate: float | None = None  # the server's prefix-cache hits / lookups (prompt tokens)
    cancelled: int = 0  # in flight when the run was cancelled: neither completed nor failed
    single_chunk_share: float | None = None  # multi-token outputs that arrived in one chunk / such outputs
    tokens_per_chunk: float | None = None  # output tokens / output chunks, completed requests
    other_cpu_cores: float | None = None  # CPU cores other processes used, mean over the run (bench.run.host_load)
    client_cpu_cores: float | None = None  # CPU cores MoE Bench's own process tree used, mean
    steal_pct: float | None = None  # CPU the hypervisor took, % of the host, mean
    disturbance: str | None = None  # what disturbed the run (bench.run.host_load.disturbance), or None
    device_util_pct: float | None = None  # accelerator utilisation %, mean over devices and samples (telemetry)
    device_power_w: float | None = None  # board power summed over devices, mean over samples (W)
    device_mem_used_gib: float | None = None  # device memory in use summed over devices, highest sample (GiB)
    tpot_limit_ms: float | None = None  # the shortest decode step at the run's batch (run_limits)
    output_tok_s_limit: float | None = None  # the most output tokens/s at the run's batch (bench.metrics.run_limits)
    tpot_pct_of_limit: float | None = None  # tpot_limit_ms / TPOT p50 x 100
    throughput_pct_of_limit: float | None = None  # output tokens/s / output_tok_s_limit x 100
    moe_imbalance_max: float | None = None  # the worst MoE layer's busiest expert / mean (bench.metrics.moe)
    ep_rank_imbalance: float | None = None  # the worst layer's busiest EP rank / mean, EP 8, contiguous
    eplb_balancedness_whatif: float | None = None  # vLLM's balancedness EPLB would reach at EP 8 (8 replicas)
    # several tokens per chunk (speculative decoding, MTP): ITL per token (bench.metrics.records)
    itl_token_ms: Stat | None = None
    ntpot_ms: Stat | None = None  # E2E / output tokens per request (None: a summary from before it)
    interactivity_tok_s: Stat | None = None  # 1000 / TPOT per request: tok/s per user
    # reasoning models: None when no request streamed reasoning
    reasoning_tokens: int | None = None  # client-counted reasoning tokens, completed requests
    answer_tokens: int | None = None  # output tokens less reasoning tokens
    answer_throughput_tok_s: float | None = None  # answer tokens / duration_s
    reasoning_ms: Stat | None = None  # first reasoning chunk -> first answer chunk
    reasoning_mismatches: int | None = None  # server's reasoning count off the client's (None: none reported)
    # speculative decoding, from the server's counters over the measured window (None: none reported)
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_acceptance_rate: float | None = None  # accepted / draft tokens, 0..1
    spec_acceptance_length: float | None = None  # 1 + accepted / drafts
    spec_accepted_per_pos: tuple[float, ...] | None = None  # accepted at position i / drafts
    # energy over the measured window, summed over devices (bench.metrics.energy); None: no power read
    energy_j: float | None = None
    joules_per_output_token: float | None = None
    output_tokens_per_j: float | None = None
    power_avg_w: float | None = None
    power_peak_w: float | None = None
    goodput_per_w: float | None = None  # goodput_rps / power_avg_w
    # statistical stopping (bench.metrics.confidence): the rule, when it was met, the final interval
    until_ci: str | None = None
    until_ci_met_at: int | None = None  # completed requests when the interval was narrow enough (None: never)
    ci_value: float | None = None  # the rule's figure over every completed request
    ci_half_width_pct: float | None = None  # its 95 % half-width, % of it (batch means)

    @property
    def bursty(self) -> bool:
        """Output arrived in bursts: TPOT and ITL time the bursts, not per-token generation."""
        share, per = self.single_chunk_share, self.tokens_per_chunk
        return (share is not None and share >= BURST_SINGLE_CHUNK_SHARE) or (
            per is not None and per >= BURST_TOKENS_PER_CHUNK
        )

    @property
    def burst_warning(self) -> str | None:
        """One line when the output arrived in bursts (see :attr:`bursty`)."""
        if not self.bursty:
            return None
        share = f"{self.single_chunk_share:.0%}" if self.single_chunk_share is not None else "-"
        per = f"{self.tokens_per_chunk:.1f}" if self.tokens_per_chunk is not None else "-"
        if self.spec_acceptance_rate is not None:
            return (
                f"{per} tokens per chunk on average, from speculative decoding (acceptance "
                f"{self.spec_acceptance_rate:.0%}): ITL times the decoding steps, ITL per token (itl_token_ms) "
                "the tokens"
            )
        return (
            f"output arrived in bursts: {share} of the requests got their whole output in one chunk, "
            f"{per} tokens per chunk on average; ITL times the gaps between bursts, not per-token generation "
            "(the server batches its stream, or decodes speculatively): see ITL per token (itl_token_ms)"
        )

    @property
    def reasoning_warning(self) -> str | None:
        """One line when the server's reasoning-token counts disagree with the client's."""
        if not self.reasoning_mismatches:
            return None
        return (
            f"{self.reasoning_mismatches} of {self.completed} requests: the server's usage reports a different "
            "number of reasoning tokens than the client counted in the reasoning stream (reasoning_tokens and "
            "answer figures use the client's count)"
        )

    @property
    def cache_warning(self) -> str | None:
        """One line when the server's prefix cache served much of the prompts."""
        rate = self.prefix_cache_hit_rate
        if rate is None or rate < PREFIX_CACHE_WARN:
            return None
        return (
            f"the server's prefix cache served {rate:.0%} of the prompt tokens: TTFT and throughput reflect cache "
            "hits, not prefill (expected for shared-prefix and multi-turn workloads; otherwise these prompts were "
            "seen before, e.g. an earlier run with the same seed: change --seed or restart the server)"
        )

    @property
    def load_warning(self) -> str | None:
        """One line when the load did not reach the server as planned (see :mod:`bench.metrics.client_bound`)."""
        p90 = self.send_lag_ms.p90 if self.send_lag_ms is not None else None
        return client_bound_reason(p90, self.request_rate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def flat(self) -> dict[str, Any]:
        """One flat row: ``ttft_ms_p50``, ``e2e_ms_mean``, ... for tables and CSV."""
        row: dict[str, Any] = {}
        for key, value in self.as_dict().items():
            if value is None and key in (*OPTIONAL_STATS, "burstiness"):
                continue
            if key == "slos":
                row[key] = " ".join(value) if value else None
                continue
            if key == "spec_accepted_per_pos":
                row[key] = " ".join(f"{v:.4f}" for v in value) if value else None
                continue
            if isinstance(value, dict):
                for stat, v in value.items():
                    if stat != "count":
                        row[f"{key}_{stat}"] = v
            else:
                row[key] = value
        return row

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        stats = {k: Stat(**data[k]) for k in BASE_STATS}
        for k in OPTIONAL_STATS:
            if data.get(k):
                stats[k] = Stat(**data[k])
        rest = {k: v for k, v in data.items() if k not in stats}
        for k in ("slos", "spec_accepted_per_pos"):
            if rest.get(k) is not None:
                rest[k] = tuple(rest[k])
        return cls(**rest, **stats)


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float | None = None,
    peak_memory_gib: float | None = None,
    max_concurrency: int | None = None,
    request_rate: float | None = None,
    burstiness: float | None = None,
    slos: Sequence[str] | None = None,
    prefix_cache_hit_rate: float | None = None,
) -> RunSummary:
    """Summarize a run. ``duration_s`` defaults to first start -> last end of the records.

    With ``slos`` (:mod:`bench.metrics.slo` texts), the summary carries goodput and the verdict."""
    ok = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = (max(r.end_s for r in records) - min(r.start_s for r in records)) if records else 0.0
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.counted_output_tokens for r in ok)

    def rate(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    return RunSummary(
        requests=len(records),
        completed=len(ok),
        failed=sum(1 for r in records if r.failed),
        cancelled=sum(1 for r in records if r.cancelled),
        duration_s=duration_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        request_throughput_rps=rate(len(ok)),
        output_throughput_tok_s=rate(output_tokens),
        total_throughput_tok_s=rate(prompt_tokens + output_tokens),
        **{name: describe(getattr(r, name) for r in ok) for name in PER_REQUEST_METRICS},
        itl_ms=describe(g for r in ok for g in r.itls_ms),
        peak_memory_gib=peak_memory_gib,
        max_concurrency=max_concurrency,
        usage_mismatches=sum(1 for r in ok if r.usage_mismatch),
        send_lag_ms=describe(r.send_lag_ms for r in records)
        if any(r.send_lag_ms is not None for r in records)
        else None,
        request_rate=request_rate,
        burstiness=burstiness if request_rate is not None else None,
        prefix_cache_hit_rate=prefix_cache_hit_rate,
        **chunk_fields(ok),
        **reasoning_fields(ok, rate),
        **slo_fields(records, duration_s, slos),
    )


def reasoning_fields(ok: Sequence[RequestRecord], rate: Any) -> dict[str, Any]:
    """ITL per token, and the reasoning figures of a run whose requests streamed reasoning."""
    out: dict[str, Any] = {"itl_token_ms": describe(g for r in ok for g in r.itl_token_ms)}
    thinking = [r for r in ok if r.reasoning_tokens or r.reasoning_chunks]
    if thinking:
        answer = sum(r.answer_tokens for r in ok)
        out.update(
            reasoning_tokens=sum(r.reasoning_tokens for r in ok),
            answer_tokens=answer,
            answer_throughput_tok_s=rate(answer),
            reasoning_ms=describe(r.reasoning_ms for r in thinking),
        )
    reported = [r for r in ok if r.usage_reasoning_tokens is not None]
    if reported:
        out["reasoning_mismatches"] = sum(1 for r in reported if r.reasoning_mismatch)
    return out


def chunk_fields(ok: Sequence[RequestRecord]) -> dict[str, float | None]:
    """How the output was chunked: the share of multi-token outputs in one chunk, tokens per chunk."""
    multi = [r for r in ok if r.counted_output_tokens >= 2]
    chunks = sum(len(r.chunk_times_s) for r in ok)
    return {
        "single_chunk_share": sum(1 for r in multi if len(r.chunk_times_s) == 1) / len(multi) if multi else None,
        "tokens_per_chunk": sum(r.counted_output_tokens for r in ok) / chunks if chunks else None,
    }


def slo_fields(records: Sequence[RequestRecord], duration_s: float, slos: Sequence[str] | None) -> dict[str, Any]:
    """The SLO part of a summary: the SLOs, good requests, goodput and the run's verdict."""
    if not slos:
        return {}
    parsed = parse_slos(slos)
    good = good_requests(records, parsed)
    return {
        "slos": tuple(s.text for s in parsed),
        "good_requests": good,
        "goodput_rps": good / duration_s if duration_s > 0 else 0.0,
        "slo_met": all_met(judge(records, parsed)),
    }


# The headline figures whose spread over repeated runs is reported (RunSummary.flat() keys).
HEADLINE_FIGURES: tuple[tuple[str, str], ...] = (
    ("output_throughput_tok_s", "output tok/s"),
    ("request_throughput_rps", "requests/s"),
    ("ttft_ms_p50", "TTFT p50 ms"),
    ("ttft_ms_p99", "TTFT p99 ms"),
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("tpot_ms_p99", "TPOT p99 ms"),
    ("itl_ms_p99", "ITL p99 ms"),
    ("e2e_ms_p50", "E2E p50 ms"),
    ("e2e_ms_p99", "E2E p99 ms"),
)


@dataclass(frozen=True)
class Spread:
    """One headline figure over repeated runs: min / median / max and the coefficient of
    variation (sample standard deviation / mean; None under two values or a zero mean)."""

    figure: str
    label: str
    n: int
    min: float | None
    median: float | None
    max: float | None
    cv: float | None
    mean: float | None = None
    ci95: float | None = None  # 95 % half-width of the mean over the runs (t, N - 1; bench.metrics.confidence)


def spread(summaries: Sequence[RunSummary]) -> list[Spread]:
    """The spread of each :data:`HEADLINE_FIGURES` over ``summaries`` (runs of one config): min,
    median, max, CV, and the mean with its 95 % confidence interval (the runs independent)."""
    import statistics

    from bench.metrics.confidence import repeat_interval

    rows = [s.flat() for s in summaries]
    out = []
    for key, label in HEADLINE_FIGURES:
        xs = [float(r[key]) for r in rows if r.get(key) is not None]
        cv = None
        if len(xs) >= 2 and statistics.fmean(xs) != 0:
            cv = statistics.stdev(xs) / abs(statistics.fmean(xs))
        interval = repeat_interval(xs)
        out.append(
            Spread(
                key,
                label,
                len(xs),
                min(xs) if xs else None,
                statistics.median(xs) if xs else None,
                max(xs) if xs else None,
                cv,
                statistics.fmean(xs) if xs else None,
                interval[1] if interval else None,
            )
        )
    return out

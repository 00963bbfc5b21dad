"""Per-request records and run summaries. The metric definitions live here, once.

Conventions follow ``vllm bench serve``:

- TTFT: time from sending the request to the first chunk that carries output.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request; requests with one output
  token have no TPOT.
- ITL: every gap between consecutive output chunks, across all requests.
- E2E: time from sending the request to its last chunk.
- Throughputs divide by the run's wall-clock duration (first send to last
  completion), never by a sum of latencies.

Only successful requests enter latency statistics and token counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load import client_bound_reason
from engines.base import REQUEST_CANCELLED

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
CANCELLED = REQUEST_CANCELLED  # the error of a request in flight when its run was cancelled
PREFIX_CACHE_WARN = 0.10  # a prefix-cache hit rate above this gets a warning
# Chunks arriving in bursts: above these, TPOT and ITL time the bursts, not the tokens.
BURST_SINGLE_CHUNK_SHARE = 0.2  # share of multi-token outputs that arrived in one chunk
BURST_TOKENS_PER_CHUNK = 2.0  # mean output tokens per chunk

METRIC_DEFINITIONS: dict[str, str] = {
    "ttft_ms": "Time to first token: from sending the request to receiving the first chunk that carries output, in ms.",
    "tpot_ms": "Time per output token after the first: (E2E - TTFT) / (output_tokens - 1), per request, in ms; "
    "undefined for requests with a single output token.",
    "itl_ms": "Inter-token latency: each gap between two consecutive output chunks of a request, in ms; "
    "statistics pool the gaps of all requests.",
    "e2e_ms": "End-to-end latency: from sending the request to receiving its last chunk, in ms.",
    "cancelled": "Requests in flight when the run was cancelled (Stop, Ctrl-C): cut short by the client, so "
    "counted neither as completed nor as failed; requests = completed + failed + cancelled.",
    "duration_s": "Wall-clock run time: from the first request sent to the last request finished, in s "
    "(warm-up excluded).",
    "request_throughput_rps": "Completed requests / duration_s.",
    "output_throughput_tok_s": "Output tokens of completed requests / duration_s.",
    "total_throughput_tok_s": "(Prompt + output tokens of completed requests) / duration_s.",
    "ttft_any_ms": "Time to the first chunk of any kind, reasoning_content included (reasoning models), in ms; "
    "equals ttft_ms for models without a reasoning stream.",
    "usage_output_tokens": "Output tokens as the server's usage report counts them (HTTP engines); output_tokens is "
    "the client's own count, and a run counts the requests where the two differ in usage_mismatches. TPOT, token "
    "totals and throughputs use the server's count where there is one (as vllm bench serve does), else the client's.",
    "send_lag_ms": "Actual send time minus due send time, per request, in ms. Open loop (request_rate): due at its "
    "scheduled arrival; closed loop: due when its slot freed (the slot's previous request ended). Not clamped: a "
    "request sent early shows a negative lag. A p90 above "
    "max(10 ms, a quarter of the mean arrival interval) marks the run client-bound.",
    "request_rate": "Target arrival rate of an open-loop run, requests/s (empty: closed loop); arrival gaps are "
    "gamma-distributed with shape burstiness (1 = Poisson).",
    "goodput_rps": "Completed requests that met every per-request SLO (TTFT, TPOT, E2E, mean ITL of the "
    "request) / duration_s, as vllm bench serve --goodput counts them; empty when the run has no SLO.",
    "slo_met": "Whether every SLO's statistic over the run (e.g. TTFT p99 over all completed requests) is within "
    "its limit; the verdict sweeps and the capacity search use. Empty when the run has no SLO.",
    "prefix_cache_hit_rate": "Prompt tokens the server's prefix cache served / prompt tokens it looked up during "
    "the run (vLLM's prefix_cache_hits / prefix_cache_queries counters; empty when the server reports none). Above "
    "10 % the run carries a warning: a warm cache can inflate TTFT and throughput.",
    "single_chunk_share": "Share of completed requests with 2+ output tokens whose whole output arrived in one "
    "chunk (0..1). Such a request has a TPOT of about 0 and no ITL gap: it shows how the server batches its "
    "stream, not how fast it generates.",
    "tokens_per_chunk": "Output tokens of completed requests / the chunks that carried them (1.0 when every chunk "
    "holds one token). Above 2, or with single_chunk_share above 20 %, the run carries a burst note: TPOT and ITL "
    "then time the gaps between bursts.",
    "other_cpu_cores": "CPU cores used by processes other than MoE Bench's own tree (client, sender processes, "
    "managed servers), mean over the run's one-second samples. From 0.5 cores, or with steal from 5 %, or when the "
    "client fell behind (send lag), the run carries a disturbance note: its figures describe a shared machine.",
    "client_cpu_cores": "CPU cores used by MoE Bench's own process tree (the client, its sender processes and the "
    "servers it manages), mean over the run.",
    "steal_pct": "CPU time the hypervisor gave to other guests (Linux steal), % of the host's CPU, mean over the run.",
    "disturbance": "Empty, or one line saying what disturbed the run: other busy processes (named), hypervisor "
    "steal, or a client that fell behind its schedule.",
    "device_util_pct": "Accelerator utilisation from the device's own telemetry (NVML GPU utilisation, Ascend AI "
    "Core %, Cambricon MLU %, or the exporters at --telemetry-url), mean over the devices read and the run's "
    "one-second samples. Empty when no device telemetry was read (CPU, or the tool is missing: the run says why).",
    "device_power_w": "Board power from device telemetry (W), summed over the devices read, mean over the run.",
    "device_mem_used_gib": "Device memory in use from device telemetry (GiB), summed over the devices read, highest "
    "sample of the run: every process on the devices counts (a served engine's weights and KV cache included).",
    "tpot_limit_ms": "The hardware's limit on TPOT: the shortest decode step for the run's batch (max_concurrency "
    "sequences, 1 for latency runs) at its mean context, max(bytes moved per step / memory bandwidth, FLOPs / peak "
    "FLOP/s) from the model's config and the accelerator's spec (README: Physical limits). Empty when the model or "
    "the device has no figures.",
    "output_tok_s_limit": "The hardware's limit on output throughput at the run's batch: batch / tpot_limit_ms.",
    "tpot_pct_of_limit": "tpot_limit_ms / TPOT p50 x 100: how close the engine's decode step came to the hardware's "
    "limit (100 % = at the limit).",
    "throughput_pct_of_limit": "output_throughput_tok_s / output_tok_s_limit x 100.",
    "peak_memory_gib": "Highest memory seen during the run: the device allocator's peak on CUDA/NPU/MLU, "
    "the process's peak RSS on CPU (native engine); for a server MoE Bench launched, the device memory its process "
    "tree holds where device telemetry sees processes (NVML, npu-smi), highest sample, else the peak RSS of that "
    "tree (device memory is not in it); empty for a remote server (base_url).",
}


@dataclass
class RequestRecord:
    """One request, with times in seconds relative to the run's start."""

    request_id: str
    start_s: float
    end_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    usage_output_tokens: int | None = None  # the server's own count, where it reports one
    first_any_token_s: float | None = None  # first chunk of any kind, reasoning included
    send_lag_ms: float | None = None  # actual send time - scheduled send time

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cancelled(self) -> bool:
        """Ended by the run's cancel (Stop, Ctrl-C) while in flight: not a failure of the server."""
        return self.error == CANCELLED

    @property
    def failed(self) -> bool:
        return self.error is not None and self.error != CANCELLED

    @property
    def first_token_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def ttft_ms(self) -> float | None:
        ft = self.first_token_s
        return None if ft is None else (ft - self.start_s) * 1000.0

    @property
    def ttft_any_ms(self) -> float | None:
        ft = self.first_any_token_s
        return None if ft is None else (ft - self.start_s) * 1000.0

    @property
    def usage_mismatch(self) -> bool:
        """The server's output-token count differs from the client's."""
        return self.usage_output_tokens is not None and self.usage_output_tokens != self.output_tokens

    @property
    def counted_output_tokens(self) -> int:
        """The output tokens the metrics use: the server's usage count where it reports one
        (as ``vllm bench serve`` does), else the client's own count."""
        return self.output_tokens if self.usage_output_tokens is None else self.usage_output_tokens

    @property
    def e2e_ms(self) -> float:
        return (self.end_s - self.start_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        ttft = self.ttft_ms
        n = self.counted_output_tokens
        if ttft is None or n < 2:
            return None
        last = self.chunk_times_s[-1]
        return ((last - self.start_s) * 1000.0 - ttft) / (n - 1)

    @property
    def itls_ms(self) -> list[float]:
        t = self.chunk_times_s
        return [(b - a) * 1000.0 for a, b in itertools.pairwise(t)]

    @property
    def itl_mean_ms(self) -> float | None:
        gaps = self.itls_ms
        return sum(gaps) / len(gaps) if gaps else None

    def as_row(self) -> dict[str, Any]:
        """The per-request CSV/store row (units in the column names)."""
        return {
            "request_id": self.request_id,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_mean_ms": self.itl_mean_ms,
            "e2e_ms": self.e2e_ms,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "usage_output_tokens": self.usage_output_tokens,
            "ttft_any_ms": self.ttft_any_ms,
            "send_lag_ms": self.send_lag_ms,
            "error": self.error or "",
        }


@dataclass(frozen=True)
class Stat:
    """Distribution of one latency metric, in ms."""

    count: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no data."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def describe(values: Iterable[float | None]) -> Stat:
    """Mean, std (population), min, max and percentiles, skipping None."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return Stat(0, None, None, None, None, None, None, None, None)
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    p = {q: percentile(xs, q) for q in PERCENTILES}
    return Stat(len(xs), mean, std, min(xs), max(xs), p[50], p[90], p[95], p[99])


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
    max_concurrency: int | None = None
    usage_mismatches: int = 0
    send_lag_ms: Stat | None = None
    request_rate: float | None = None  # open-loop target (req/s); None: closed loop
    burstiness: float | None = None
    slos: tuple[str, ...] | None = None  # the run's SLOs (bench.slo texts); None: no SLO
    good_requests: int | None = None  # completed requests that met every SLO
    goodput_rps: float | None = None
    slo_met: bool | None = None  # every SLO's statistic over the run within its limit
    prefix_cache_hit_rate: float | None = None  # the server's prefix-cache hits / lookups (prompt tokens)
    cancelled: int = 0  # in flight when the run was cancelled: neither completed nor failed
    single_chunk_share: float | None = None  # multi-token outputs that arrived in one chunk / such outputs
    tokens_per_chunk: float | None = None  # output tokens / output chunks, completed requests
    other_cpu_cores: float | None = None  # CPU cores other processes used, mean over the run (bench.host)
    client_cpu_cores: float | None = None  # CPU cores MoE Bench's own process tree used, mean
    steal_pct: float | None = None  # CPU the hypervisor took, % of the host, mean
    disturbance: str | None = None  # what disturbed the run (bench.host.disturbance), or None
    device_util_pct: float | None = None  # accelerator utilisation %, mean over devices and samples (telemetry)
    device_power_w: float | None = None  # board power summed over devices, mean over samples (W)
    device_mem_used_gib: float | None = None  # device memory in use summed over devices, highest sample (GiB)
    tpot_limit_ms: float | None = None  # the hardware's shortest decode step at the run's batch (bench.run_limits)
    output_tok_s_limit: float | None = None  # the most output tokens/s at the run's batch (bench.run_limits)
    tpot_pct_of_limit: float | None = None  # tpot_limit_ms / TPOT p50 x 100
    throughput_pct_of_limit: float | None = None  # output tokens/s / output_tok_s_limit x 100

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
        return (
            f"output arrived in bursts: {share} of the requests got their whole output in one chunk, "
            f"{per} tokens per chunk on average; TPOT and ITL time the gaps between bursts, not per-token "
            "generation (the server batches its stream)"
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
        """One line when the load did not reach the server as planned (see :mod:`bench.load`)."""
        p90 = self.send_lag_ms.p90 if self.send_lag_ms is not None else None
        return client_bound_reason(p90, self.request_rate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def flat(self) -> dict[str, Any]:
        """One flat row: ``ttft_ms_p50``, ``e2e_ms_mean``, ... for tables and CSV."""
        row: dict[str, Any] = {}
        for key, value in self.as_dict().items():
            if value is None and key in ("send_lag_ms", "burstiness"):
                continue
            if key == "slos":
                row[key] = " ".join(value) if value else None
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
        stats = {k: Stat(**data[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
        if data.get("send_lag_ms"):
            stats["send_lag_ms"] = Stat(**data["send_lag_ms"])
        rest = {k: v for k, v in data.items() if k not in stats}
        if rest.get("slos") is not None:
            rest["slos"] = tuple(rest["slos"])
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

    With ``slos`` (:mod:`bench.slo` texts), the summary carries goodput and the verdict."""
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
        ttft_ms=describe(r.ttft_ms for r in ok),
        tpot_ms=describe(r.tpot_ms for r in ok),
        itl_ms=describe(g for r in ok for g in r.itls_ms),
        e2e_ms=describe(r.e2e_ms for r in ok),
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
        **slo_fields(records, duration_s, slos),
    )


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
    from bench.slo import all_met, good_requests, judge, parse_slos

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


def spread(summaries: Sequence[RunSummary]) -> list[Spread]:
    """The spread of each :data:`HEADLINE_FIGURES` over ``summaries`` (runs of one config)."""
    import statistics

    rows = [s.flat() for s in summaries]
    out = []
    for key, label in HEADLINE_FIGURES:
        xs = [float(r[key]) for r in rows if r.get(key) is not None]
        cv = None
        if len(xs) >= 2 and statistics.fmean(xs) != 0:
            cv = statistics.stdev(xs) / abs(statistics.fmean(xs))
        out.append(
            Spread(
                key,
                label,
                len(xs),
                min(xs) if xs else None,
                statistics.median(xs) if xs else None,
                max(xs) if xs else None,
                cv,
            )
        )
    return out

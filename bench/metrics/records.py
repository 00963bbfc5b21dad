"""Per-request records, percentiles and the metric definitions, written once.

Conventions follow ``vllm bench serve``:

- TTFT: time from sending the request to the first chunk that carries answer output
  (``ttft_any_ms``: the first output of any kind, a reasoning model's thinking included).
- TPOT: (E2E - TTFT) / (output tokens - 1), per request, from the first output token of
  any kind; requests with one output token have no TPOT.
- ITL: every gap between consecutive output chunks, across all requests; ITL per token
  splits a k-token chunk's gap into k (speculative decoding sends several per chunk).
- E2E: time from sending the request to its last chunk.
- Throughputs divide by the wall-clock duration of the run (first send to last
  completion), never by a sum of latencies.

Only successful requests enter latency statistics and token counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.base import REQUEST_CANCELLED

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
CANCELLED = REQUEST_CANCELLED  # the error of a request in flight when its run was cancelled
PREFIX_CACHE_WARN = 0.10  # a prefix-cache hit rate above this gets a warning
# Chunks arriving in bursts: above these, TPOT and ITL time the bursts, not the tokens.
BURST_SINGLE_CHUNK_SHARE = 0.2  # share of multi-token outputs that arrived in one chunk
BURST_TOKENS_PER_CHUNK = 2.0  # mean output tokens per chunk

METRIC_DEFINITIONS: dict[str, str] = {
    "ttft_ms": "Time to first token: from sending the request to receiving the first chunk that carries answer "
    "output, in ms (a reasoning model's thinking is not the answer: see ttft_any_ms). For models without a "
    "reasoning stream it is vllm bench serve's TTFT.",
    "tpot_ms": "Time per output token after the first: (E2E - TTFT) / (output_tokens - 1), per request, in ms, with "
    "TTFT the first output token of any kind (reasoning included, as vllm bench counts it) and E2E to the last "
    "output chunk; undefined for requests with a single output token.",
    "itl_ms": "Inter-token latency per chunk: each gap between two consecutive output chunks of a request "
    "(reasoning chunks included), in ms; statistics pool the gaps of all requests. vllm bench serve's ITL.",
    "itl_token_ms": "Inter-token latency per token: a chunk of k tokens after a gap g counts k gaps of g / k, so a "
    "server that sends several tokens per chunk (speculative decoding, MTP, stream batching) is timed per token; "
    "equals itl_ms when every chunk holds one token. Its per-request mean is (last chunk - first chunk) / the "
    "tokens of the chunks after the first.",
    "e2e_ms": "End-to-end latency: from sending the request to receiving its last chunk, in ms.",
    "cancelled": "Requests in flight when the run was cancelled (Stop, Ctrl-C): cut short by the client, so "
    "counted neither as completed nor as failed; requests = completed + failed + cancelled.",
    "duration_s": "Wall-clock run time: from the first request sent to the last request finished, in s "
    "(warm-up excluded).",
    "request_throughput_rps": "Completed requests / duration_s.",
    "output_throughput_tok_s": "Output tokens of completed requests / duration_s.",
    "total_throughput_tok_s": "(Prompt + output tokens of completed requests) / duration_s.",
    "ttft_any_ms": "Time to first output token of any kind, reasoning_content included (AIPerf's time to first "
    "output token; vllm bench serve's TTFT on a reasoning model), in ms; equals ttft_ms for models without a "
    "reasoning stream.",
    "reasoning_tokens": "Output tokens streamed as reasoning (reasoning_content / reasoning), counted by the client "
    "(the server's tokenizer where it sends token ids or usage per chunk, else the client tokenizer); they are in "
    "output_tokens too.",
    "answer_tokens": "Output tokens that are answer: the counted output tokens less reasoning_tokens.",
    "usage_reasoning_tokens": "Reasoning tokens as the server's usage reports them "
    "(usage.completion_tokens_details.reasoning_tokens); empty when it reports none.",
    "reasoning_ms": "Reasoning time: from the first reasoning chunk to the first answer chunk, per request, in ms; "
    "empty for a request with no reasoning or no answer.",
    "answer_throughput_tok_s": "Answer tokens of completed requests / duration_s (reasoning tokens left out).",
    "reasoning_mismatches": "Completed requests whose server-reported reasoning tokens differ from the client's "
    "count by more than max(2, 10 %); a run with any carries a warning (a server that reports 0 reasoning "
    "tokens for a thinking model, vllm-ascend#13070).",
    "spec_acceptance_rate": "Speculative decoding (MTP, EAGLE, n-gram...): accepted draft tokens / proposed draft "
    "tokens over the run, from the server's counters (vllm:spec_decode_num_accepted_tokens / "
    "vllm:spec_decode_num_draft_tokens) read just before the first request and after the last: the run's own "
    "deltas, not the totals since the server started.",
    "spec_acceptance_length": "Mean tokens per decoding step with speculative decoding: 1 + accepted draft tokens / "
    "drafts (the verified token plus the accepted ones), from the same counter deltas.",
    "spec_accepted_per_pos": "Acceptance per draft position: accepted tokens at position i / drafts, i = 0..k-1 "
    "(vllm:spec_decode_num_accepted_tokens_per_pos deltas).",
    "energy_j": "Energy the devices drew during the measured window (first request sent to last finished), in J, "
    "summed over the devices read: from the device's own energy counter where it has one (NVML total energy, Linux "
    "RAPL), else the power samples integrated by the trapezoid rule; per device in the run's energy artifact.",
    "joules_per_output_token": "energy_j / output tokens of completed requests.",
    "output_tokens_per_j": "Output tokens of completed requests / energy_j (= output tokens/s per W).",
    "power_avg_w": "energy_j / the measured window's length: the devices' mean power, in W, summed over devices.",
    "power_peak_w": "The highest power sample of the measured window, summed over the devices read at that "
    "second, in W.",
    "goodput_per_w": "goodput_rps / power_avg_w: good requests per joule (requests/s per W); empty without an SLO.",
    "until_ci": "The run's statistical stopping rule, METRIC:STAT:PCT: it sent requests until the 95 % confidence "
    "half-width of that figure (batch means over 10 batches in completion order, docs/metrics.md) was at most PCT % "
    "of it, checked as requests completed; empty for a run without one.",
    "until_ci_met_at": "Completed requests when the rule was met (requests already sent then complete too); empty "
    "when the requests or the duration ran out first.",
    "ci_value": "The rule's figure over every completed request of the run.",
    "ci_half_width_pct": "Its final 95 % half-width (batch means), % of ci_value: can sit above PCT when the requests "
    "completed after the rule was met widen it.",
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
    "sequences, 1 for latency runs; open-loop and trace runs: the mean in flight by Little's law, request "
    "throughput x mean E2E, at most max_concurrency) at its mean context, max(bytes moved per step / memory "
    "bandwidth, FLOPs / peak FLOP/s) from the model's config and the accelerator's spec (docs/accelerators.md: "
    "Physical limits). Empty when the model or the device has no figures.",
    "output_tok_s_limit": "The hardware's limit on output throughput at the run's batch: batch / tpot_limit_ms.",
    "tpot_pct_of_limit": "tpot_limit_ms / TPOT p50 x 100: how close the engine's decode step came to the hardware's "
    "limit (100 % = at the limit).",
    "throughput_pct_of_limit": "output_throughput_tok_s / output_tok_s_limit x 100.",
    "moe_imbalance_max": "From the run's expert routing (engines that report it): for each MoE layer, the tokens "
    "routed to its busiest expert / the mean over its experts; the worst layer's. 1 = every expert equally busy.",
    "ep_rank_imbalance": "The same routing on an expert-parallel deployment of 8 ranks (EP 8) with the experts "
    "placed in contiguous blocks (vLLM's and SGLang's default without EPLB): for each layer the busiest rank's tokens "
    "/ the mean rank's; the worst layer's. `python -m bench routing RUN --ep N` gives it for any EP size.",
    "eplb_balancedness_whatif": "vLLM's balancedness (over the MoE layers: sum of the mean rank loads / sum of the "
    "max rank loads; 1 = even) that DeepSeek's EPLB placement (vLLM's DefaultEplbPolicy) would reach for this "
    "routing at EP 8 with 8 redundant experts (one per rank), a replicated expert's tokens split evenly.",
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
    chunk_tokens: list[int] | None = None  # tokens per output chunk (chunk_times_s); None: one each
    reasoning_chunks: int = 0  # the leading chunks that are reasoning, before the first answer chunk
    reasoning_tokens: int = 0  # the client's count of reasoning tokens (output_tokens includes them)
    usage_reasoning_tokens: int | None = None  # the server's count (usage.completion_tokens_details)

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
        """The first answer chunk's time (after the leading reasoning chunks of a reasoning model)."""
        k = self.reasoning_chunks
        return self.chunk_times_s[k] if len(self.chunk_times_s) > k else None

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
        """(last output chunk - first output chunk) / (output tokens - 1): E2E - TTFT over N - 1, with
        the first token of any kind (a reasoning model's thinking is output too, as vllm bench counts it)."""
        times = self.chunk_times_s
        n = self.counted_output_tokens
        if not times or n < 2:
            return None
        return ((times[-1] - self.start_s) * 1000.0 - (times[0] - self.start_s) * 1000.0) / (n - 1)

    @property
    def itls_ms(self) -> list[float]:
        """The gaps between consecutive output chunks (reasoning chunks included), ms."""
        t = self.chunk_times_s
        return [(b - a) * 1000.0 for a, b in itertools.pairwise(t)]

    @property
    def itl_mean_ms(self) -> float | None:
        gaps = self.itls_ms
        return sum(gaps) / len(gaps) if gaps else None

    def _chunk_tokens(self) -> list[int] | None:
        """Tokens per chunk when known for every chunk (None: one each, or a bundle's mismatched list)."""
        tokens = self.chunk_tokens
        return tokens if tokens is not None and len(tokens) == len(self.chunk_times_s) else None

    @property
    def itl_token_ms(self) -> list[float]:
        """ITL per token: a chunk of k tokens after a gap g counts k gaps of g / k (speculative
        decoding, MTP and servers that batch their stream send several tokens per chunk)."""
        gaps, tokens = self.itls_ms, self._chunk_tokens()
        if tokens is None:
            return gaps
        out: list[float] = []
        for g, k in zip(gaps, tokens[1:], strict=True):
            if k > 0:
                out.extend([g / k] * k)
        return out

    @property
    def itl_token_mean_ms(self) -> float | None:
        """Mean ITL per token: (last chunk - first chunk) / the tokens of the chunks after the first."""
        gaps, tokens = self.itls_ms, self._chunk_tokens()
        if not gaps:
            return None
        if tokens is None:
            return sum(gaps) / len(gaps)
        n = sum(tokens[1:])
        return sum(gaps) / n if n > 0 else None

    @property
    def answer_tokens(self) -> int:
        """Output tokens that are answer, not reasoning: the counted output less the client's reasoning count."""
        return max(0, self.counted_output_tokens - self.reasoning_tokens)

    @property
    def reasoning_ms(self) -> float | None:
        """Reasoning time: from the first reasoning chunk to the first answer chunk, ms; None for a
        request with no reasoning stream or no answer."""
        first_answer = self.first_token_s
        if not self.reasoning_chunks or first_answer is None or not self.chunk_times_s:
            return None
        return (first_answer - self.chunk_times_s[0]) * 1000.0

    @property
    def reasoning_mismatch(self) -> bool:
        """The server's reasoning-token count disagrees with the client's: by more than
        max(2 tokens, 10 % of the client's count) (tokenizer boundaries move a count by a token or two)."""
        server = self.usage_reasoning_tokens
        if server is None:
            return False
        return abs(server - self.reasoning_tokens) > max(2.0, 0.1 * self.reasoning_tokens)

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
            "itl_token_mean_ms": self.itl_token_mean_ms,
            "reasoning_tokens": self.reasoning_tokens,
            "answer_tokens": self.answer_tokens,
            "usage_reasoning_tokens": self.usage_reasoning_tokens,
            "reasoning_ms": self.reasoning_ms,
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
    """Linear-interpolated percentile (numpy's default method, ``np.percentile``); None for no data."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def describe(values: Iterable[float | None]) -> Stat:
    """Mean, std (population), min, max and percentiles (numpy), skipping None."""
    xs = np.fromiter((v for v in values if v is not None), dtype=float)
    if xs.size == 0:
        return Stat(0, None, None, None, None, None, None, None, None)
    p50, p90, p95, p99 = (float(v) for v in np.percentile(xs, PERCENTILES))
    return Stat(int(xs.size), float(xs.mean()), float(xs.std()), float(xs.min()), float(xs.max()), p50, p90, p95, p99)

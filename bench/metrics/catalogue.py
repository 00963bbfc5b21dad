"""The metric catalogue: every figure MoE Bench reports, declared once.

Each :class:`Metric` names a figure (its key in :class:`bench.metrics.summary.RunSummary`, the
request CSV or both), its short label and unit, the definition docs/metrics.md shows word for word,
its level (one value per request, summarized over the run by :func:`bench.metrics.records.describe`,
or one value per run), the statistics the summary CSV keeps, and whether an SLO may bound it.
:data:`CATALOGUE` is in the summary CSV's column order.

Read here, not written again: the definitions (``METRIC_DEFINITIONS``), the SLO metrics, the
summary CSV's metric columns, the CLI summary's latency rows and the rule that shows ITL per token.
A new metric is its declaration here, its computation (a :class:`RequestRecord` property for a
per-request one, a summary field) and its test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# A run whose chunks hold more than this many tokens on average shows ITL per token beside ITL.
ITL_TOKEN_SHOWN_ABOVE = 1.05


@dataclass(frozen=True)
class Metric:
    """One figure: see the module docstring."""

    name: str
    label: str
    unit: str  # "" for counts and flags
    definition: str
    level: Literal["request", "run"] = "run"
    stats: tuple[str, ...] = ()  # the summary CSV's statistics of a per-request metric
    slo: bool = False  # an SLO (and until_ci) may bound it
    summary_csv: bool = True  # the summary CSV has its column(s)
    # its run statistics are those of RequestRecord.<name> over the completed requests (others pool
    # their own values: every ITL gap, the reasoning requests' times, every request's send lag)
    per_request: bool = False
    better: Literal["lower", "higher"] = "lower"  # which way is good (an SLO bounds it <= or >=)

    @property
    def columns(self) -> tuple[str, ...]:
        """Its summary CSV columns: ``ttft_ms_mean`` ... for a per-request metric, else its name."""
        if not self.summary_csv:
            return ()
        return tuple(f"{self.name}_{s}" for s in self.stats) if self.stats else (self.name,)


CATALOGUE: tuple[Metric, ...] = (
    Metric(
        "requests",
        "requests",
        "",
        "Requests of the run: completed + failed + cancelled (warm-up excluded).",
    ),
    Metric(
        "completed",
        "completed",
        "",
        "Requests that completed: their statistics, token counts and throughputs are the run's figures.",
    ),
    Metric(
        "failed",
        "failed",
        "",
        "Requests that failed (an error from the engine or the server, or an answer refused as "
        "impossible); they enter no latency statistic.",
    ),
    Metric(
        "cancelled",
        "cancelled",
        "",
        "Requests in flight when the run was cancelled (Stop, Ctrl-C): cut short by the client, so "
        "counted neither as completed nor as failed; requests = completed + failed + cancelled.",
    ),
    Metric(
        "concurrency",
        "concurrency",
        "",
        "The most requests in flight at once (the run's setting; 1 for latency runs).",
    ),
    Metric(
        "request_rate",
        "request rate",
        "req/s",
        "Target arrival rate of an open-loop run, requests/s (empty: closed loop); arrival gaps are "
        "gamma-distributed with shape burstiness (1 = Poisson).",
    ),
    Metric(
        "duration_s",
        "duration",
        "s",
        "Wall-clock run time: from the first request sent to the last request finished, in s (warm-up excluded).",
    ),
    Metric(
        "prompt_tokens",
        "prompt tokens",
        "tok",
        "Prompt tokens of completed requests.",
    ),
    Metric(
        "output_tokens",
        "output tokens",
        "tok",
        "Output tokens of completed requests, the server's usage count where it reports one, else the "
        "client's (see usage_output_tokens).",
    ),
    Metric(
        "request_throughput_rps",
        "request throughput",
        "req/s",
        "Completed requests / duration_s.",
    ),
    Metric(
        "output_throughput_tok_s",
        "output throughput",
        "tok/s",
        "Output tokens of completed requests / duration_s.",
    ),
    Metric(
        "total_throughput_tok_s",
        "total throughput",
        "tok/s",
        "(Prompt + output tokens of completed requests) / duration_s.",
    ),
    Metric(
        "accelerators",
        "accelerators",
        "",
        "The accelerators the engine ran on, as the run recorded its deployment: a launched server's tensor x "
        "pipeline x data-parallel sizes, the native engine's expert-parallel processes (else 1), 1 for a CPU run; "
        "empty for a server reached by URL (its deployment is not known here).",
    ),
    Metric(
        "output_tok_s_per_accelerator",
        "output tok/s per accelerator",
        "tok/s",
        "output_throughput_tok_s / accelerators (InferenceMAX's and vLLM's output tok/s per GPU); empty when the "
        "accelerators are not known.",
        better="higher",
    ),
    Metric(
        "goodput_rps",
        "goodput",
        "req/s",
        "Completed requests that met every per-request SLO (TTFT, TPOT, E2E, mean ITL of the request) / "
        "duration_s, as vllm bench serve --goodput counts them; empty when the run has no SLO.",
    ),
    Metric(
        "good_requests",
        "good requests",
        "",
        "Completed requests that met every per-request SLO (see goodput_rps); empty without an SLO.",
    ),
    Metric(
        "slo_met",
        "SLOs met",
        "",
        "Whether every SLO's statistic over the run (e.g. TTFT p99 over all completed requests) is within "
        "its limit; the verdict sweeps and the capacity search use. Empty when the run has no SLO.",
    ),
    Metric(
        "slos",
        "SLOs",
        "",
        "The run's SLOs (METRIC:STAT<=LIMIT), space-separated in the CSV; empty without an SLO.",
    ),
    Metric(
        "ttft_ms",
        "TTFT",
        "ms",
        "Time to first token: from sending the request to receiving the first chunk that carries answer "
        "output, in ms (a reasoning model's thinking is not the answer: see ttft_any_ms). For models "
        "without a reasoning stream it is vllm bench serve's TTFT.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
        per_request=True,
    ),
    Metric(
        "tpot_ms",
        "TPOT",
        "ms",
        "Time per output token after the first: (E2E - TTFT) / (output_tokens - 1), per request, in ms, "
        "with TTFT the first output token of any kind (reasoning included, as vllm bench counts it) and "
        "E2E to the last output chunk; undefined for requests with a single output token.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
        per_request=True,
    ),
    Metric(
        "itl_ms",
        "ITL",
        "ms",
        "Inter-token latency per chunk: each gap between two consecutive output chunks of a request "
        "(reasoning chunks included), in ms; statistics pool the gaps of all requests. vllm bench serve's "
        "ITL.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
    ),
    Metric(
        "e2e_ms",
        "E2E",
        "ms",
        "End-to-end latency: from sending the request to receiving its last chunk, in ms.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
        per_request=True,
    ),
    Metric(
        "peak_memory_gib",
        "peak memory",
        "GiB",
        "Highest memory seen during the run: the device allocator's peak on CUDA/NPU/MLU, the process's "
        "peak RSS on CPU (native engine); for a server MoE Bench launched, the device memory its process "
        "tree holds where device telemetry sees processes (NVML, npu-smi), highest sample, else the peak "
        "RSS of that tree (device memory is not in it); empty for a remote server (base_url).",
    ),
    Metric(
        "prefix_cache_hit_rate",
        "prefix cache hits",
        "fraction",
        "Prompt tokens the server's prefix cache served / prompt tokens it looked up during the run "
        "(vLLM's prefix_cache_hits / prefix_cache_queries counters; empty when the server reports none). "
        "Above 10 % the run carries a warning: a warm cache can inflate TTFT and throughput.",
    ),
    Metric(
        "single_chunk_share",
        "outputs in one chunk",
        "fraction",
        "Share of completed requests with 2+ output tokens whose whole output arrived in one chunk "
        "(0..1). Such a request has a TPOT of about 0 and no ITL gap: it shows how the server batches its "
        "stream, not how fast it generates.",
    ),
    Metric(
        "tokens_per_chunk",
        "tokens per chunk",
        "tok",
        "Output tokens of completed requests / the chunks that carried them (1.0 when every chunk holds "
        "one token). Above 2, or with single_chunk_share above 20 %, the run carries a burst note: TPOT "
        "and ITL then time the gaps between bursts.",
    ),
    Metric(
        "usage_mismatches",
        "usage mismatches",
        "",
        "Completed requests whose server usage count of output tokens differs from the client's count.",
    ),
    Metric(
        "send_lag_ms",
        "send lag",
        "ms",
        "Actual send time minus due send time, per request, in ms. Open loop (request_rate): due at its "
        "scheduled arrival; closed loop: due when its slot freed (the slot's previous request ended). Not "
        "clamped: a request sent early shows a negative lag. A p90 above max(10 ms, a quarter of the mean "
        "arrival interval) marks the run client-bound.",
        level="request",
        stats=("p50", "p99"),
    ),
    Metric(
        "other_cpu_cores",
        "other processes' CPU",
        "cores",
        "CPU cores used by processes other than MoE Bench's own tree (client, sender processes, managed "
        "servers), mean over the run's one-second samples. From 0.5 cores, or with steal from 5 %, or "
        "when the client fell behind (send lag), the run carries a disturbance note: its figures describe "
        "a shared machine.",
    ),
    Metric(
        "client_cpu_cores",
        "MoE Bench's CPU",
        "cores",
        "CPU cores used by MoE Bench's own process tree (the client, its sender processes and the servers "
        "it manages), mean over the run.",
    ),
    Metric(
        "steal_pct",
        "steal",
        "%",
        "CPU time the hypervisor gave to other guests (Linux steal), % of the host's CPU, mean over the run.",
    ),
    Metric(
        "disturbance",
        "disturbance",
        "",
        "Empty, or one line saying what disturbed the run: other busy processes (named), hypervisor "
        "steal, or a client that fell behind its schedule.",
    ),
    Metric(
        "device_util_pct",
        "device utilisation",
        "%",
        "Accelerator utilisation from the device's own telemetry (NVML GPU utilisation, Ascend AI Core %, "
        "Cambricon MLU %, or the exporters at --telemetry-url), mean over the devices read and the run's "
        "one-second samples. Empty when no device telemetry was read (CPU, or the tool is missing: the "
        "run says why).",
    ),
    Metric(
        "device_power_w",
        "device power",
        "W",
        "Board power from device telemetry (W), summed over the devices read, mean over the run.",
    ),
    Metric(
        "device_mem_used_gib",
        "device memory in use",
        "GiB",
        "Device memory in use from device telemetry (GiB), summed over the devices read, highest sample "
        "of the run: every process on the devices counts (a served engine's weights and KV cache "
        "included).",
    ),
    Metric(
        "tpot_limit_ms",
        "TPOT limit",
        "ms",
        "The hardware's limit on TPOT: the shortest decode step for the run's batch (max_concurrency "
        "sequences, 1 for latency runs; open-loop and trace runs: the mean in flight by Little's law, "
        "request throughput x mean E2E, at most max_concurrency) at its mean context, max(bytes moved per "
        "step / memory bandwidth, FLOPs / peak FLOP/s) from the model's config and the accelerator's spec "
        "(docs/accelerators.md: Physical limits). Empty when the model or the device has no figures.",
    ),
    Metric(
        "tpot_pct_of_limit",
        "TPOT % of limit",
        "%",
        "tpot_limit_ms / TPOT p50 x 100: how close the engine's decode step came to the hardware's limit "
        "(100 % = at the limit).",
    ),
    Metric(
        "output_tok_s_limit",
        "output tok/s limit",
        "tok/s",
        "The hardware's limit on output throughput at the run's batch: batch / tpot_limit_ms.",
    ),
    Metric(
        "throughput_pct_of_limit",
        "throughput % of limit",
        "%",
        "output_throughput_tok_s / output_tok_s_limit x 100.",
    ),
    Metric(
        "moe_imbalance_max",
        "MoE imbalance",
        "x",
        "From the run's expert routing (engines that report it): for each MoE layer, the tokens routed to "
        "its busiest expert / the mean over its experts; the worst layer's. 1 = every expert equally "
        "busy.",
    ),
    Metric(
        "ep_rank_imbalance",
        "EP-8 rank imbalance",
        "x",
        "The same routing on an expert-parallel deployment of 8 ranks (EP 8) with the experts placed in "
        "contiguous blocks (vLLM's and SGLang's default without EPLB): for each layer the busiest rank's "
        "tokens / the mean rank's; the worst layer's. `python -m bench routing RUN --ep N` gives it for "
        "any EP size.",
    ),
    Metric(
        "eplb_balancedness_whatif",
        "EPLB balancedness what-if",
        "",
        "vLLM's balancedness (over the MoE layers: sum of the mean rank loads / sum of the max rank "
        "loads; 1 = even) that DeepSeek's EPLB placement (vLLM's DefaultEplbPolicy) would reach for this "
        "routing at EP 8 with 8 redundant experts (one per rank), a replicated expert's tokens split "
        "evenly.",
    ),
    Metric(
        "itl_token_ms",
        "ITL/token",
        "ms",
        "Inter-token latency per token: a chunk of k tokens after a gap g counts k gaps of g / k, so a "
        "server that sends several tokens per chunk (speculative decoding, MTP, stream batching) is timed "
        "per token; equals itl_ms when every chunk holds one token. Its per-request mean is (last chunk - "
        "first chunk) / the tokens of the chunks after the first.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
    ),
    Metric(
        "ntpot_ms",
        "NTPOT",
        "ms",
        "Normalized time per output token: E2E / output tokens, per request, in ms (inference-perf's NTPOT): "
        "the whole request, queueing and prefill included, spread over its output, so requests of different "
        "output lengths compare.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
        per_request=True,
    ),
    Metric(
        "interactivity_tok_s",
        "tok/s per user",
        "tok/s",
        "Interactivity: the output tokens per second one user sees after the first, 1000 / TPOT, per request "
        "(requests with two or more output tokens); higher is better, so the users served worst are its low "
        "percentiles: interactivity_tok_s:p10>=20 asks that nine requests in ten stream at 20 tok/s or more "
        "(InferenceMAX's and vLLM's tok/s per user).",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
        slo=True,
        per_request=True,
        better="higher",
    ),
    Metric(
        "spec_acceptance_rate",
        "acceptance",
        "fraction",
        "Speculative decoding (MTP, EAGLE, n-gram...): accepted draft tokens / proposed draft tokens over "
        "the run, from the server's counters (vllm:spec_decode_num_accepted_tokens / "
        "vllm:spec_decode_num_draft_tokens) read just before the first request and after the last: the "
        "run's own deltas, not the totals since the server started.",
    ),
    Metric(
        "spec_acceptance_length",
        "acceptance length",
        "tok/step",
        "Mean tokens per decoding step with speculative decoding: 1 + accepted draft tokens / drafts (the "
        "verified token plus the accepted ones), from the same counter deltas.",
    ),
    Metric(
        "spec_accepted_per_pos",
        "acceptance by position",
        "fraction",
        "Acceptance per draft position: accepted tokens at position i / drafts, i = 0..k-1 "
        "(vllm:spec_decode_num_accepted_tokens_per_pos deltas).",
    ),
    Metric(
        "spec_drafts",
        "drafts",
        "",
        "Speculative decoding: drafts proposed during the measured window (counter delta).",
    ),
    Metric(
        "spec_draft_tokens",
        "draft tokens",
        "tok",
        "Speculative decoding: draft tokens proposed during the measured window (counter delta).",
    ),
    Metric(
        "spec_accepted_tokens",
        "accepted tokens",
        "tok",
        "Speculative decoding: draft tokens accepted during the measured window (counter delta).",
    ),
    Metric(
        "reasoning_tokens",
        "reasoning tokens",
        "tok",
        "Output tokens streamed as reasoning (reasoning_content / reasoning), counted by the client (the "
        "server's tokenizer where it sends token ids or usage per chunk, else the client tokenizer); they "
        "are in output_tokens too.",
    ),
    Metric(
        "answer_tokens",
        "answer tokens",
        "tok",
        "Output tokens that are answer: the counted output tokens less reasoning_tokens.",
    ),
    Metric(
        "answer_throughput_tok_s",
        "answer throughput",
        "tok/s",
        "Answer tokens of completed requests / duration_s (reasoning tokens left out).",
    ),
    Metric(
        "reasoning_ms",
        "reasoning",
        "ms",
        "Reasoning time: from the first reasoning chunk to the first answer chunk, per request, in ms; "
        "empty for a request with no reasoning or no answer.",
        level="request",
        stats=("mean", "p50", "p90", "p99"),
    ),
    Metric(
        "reasoning_mismatches",
        "reasoning mismatches",
        "",
        "Completed requests whose server-reported reasoning tokens differ from the client's count by more "
        "than max(2, 10 %); a run with any carries a warning (a server that reports 0 reasoning tokens "
        "for a thinking model, vllm-ascend#13070).",
    ),
    Metric(
        "energy_j",
        "energy",
        "J",
        "Energy the devices drew during the measured window (first request sent to last finished), in J, "
        "summed over the devices read: from the device's own energy counter where it has one (NVML total "
        "energy, Linux RAPL), else the power samples integrated by the trapezoid rule; per device in the "
        "run's energy artifact.",
    ),
    Metric(
        "joules_per_output_token",
        "energy per output token",
        "J/tok",
        "energy_j / output tokens of completed requests.",
    ),
    Metric(
        "output_tokens_per_j",
        "output tokens per joule",
        "tok/J",
        "Output tokens of completed requests / energy_j (= output tokens/s per W).",
    ),
    Metric(
        "power_avg_w",
        "mean power",
        "W",
        "energy_j / the measured window's length: the devices' mean power, in W, summed over devices.",
    ),
    Metric(
        "power_peak_w",
        "peak power",
        "W",
        "The highest power sample of the measured window, summed over the devices read at that second, in W.",
    ),
    Metric(
        "goodput_per_w",
        "goodput per watt",
        "req/s/W",
        "goodput_rps / power_avg_w: good requests per joule (requests/s per W); empty without an SLO.",
    ),
    Metric(
        "until_ci",
        "until CI",
        "",
        "The run's statistical stopping rule, METRIC:STAT:PCT: it sent requests until the 95 % confidence "
        "half-width of that figure (batch means over 10 batches in completion order, docs/metrics.md) was "
        "at most PCT % of it, checked as requests completed; empty for a run without one.",
    ),
    Metric(
        "until_ci_met_at",
        "CI met at",
        "requests",
        "Completed requests when the rule was met (requests already sent then complete too); empty when "
        "the requests or the duration ran out first.",
    ),
    Metric(
        "ci_value",
        "CI figure",
        "",
        "The rule's figure over every completed request of the run.",
    ),
    Metric(
        "ci_half_width_pct",
        "CI half-width",
        "%",
        "Its final 95 % half-width (batch means), % of ci_value: can sit above PCT when the requests "
        "completed after the rule was met widen it.",
    ),
    Metric(
        "ttft_any_ms",
        "TTFT (any output)",
        "ms",
        "Time to first output token of any kind, reasoning_content included (AIPerf's time to first "
        "output token; vllm bench serve's TTFT on a reasoning model), in ms; equals ttft_ms for models "
        "without a reasoning stream.",
        level="request",
        slo=True,
        summary_csv=False,
    ),
    Metric(
        "usage_output_tokens",
        "server output tokens",
        "tok",
        "Output tokens as the server's usage report counts them (HTTP engines); output_tokens is the "
        "client's own count, and a run counts the requests where the two differ in usage_mismatches. "
        "TPOT, token totals and throughputs use the server's count where there is one (as vllm bench "
        "serve does), else the client's.",
        level="request",
        summary_csv=False,
    ),
    Metric(
        "usage_reasoning_tokens",
        "server reasoning tokens",
        "tok",
        "Reasoning tokens as the server's usage reports them "
        "(usage.completion_tokens_details.reasoning_tokens); empty when it reports none.",
        level="request",
        summary_csv=False,
    ),
)

METRICS: dict[str, Metric] = {m.name: m for m in CATALOGUE}
if len(METRICS) != len(CATALOGUE):
    raise RuntimeError("a metric is declared twice in bench.metrics.catalogue")

DEFINITIONS: dict[str, str] = {m.name: m.definition for m in CATALOGUE}
SLO_METRICS: tuple[str, ...] = tuple(m.name for m in CATALOGUE if m.slo)
SUMMARY_METRIC_COLUMNS: tuple[str, ...] = tuple(c for m in CATALOGUE for c in m.columns)
STAT_METRICS: tuple[str, ...] = tuple(m.name for m in CATALOGUE if m.stats)  # a Stat in the run summary
PER_REQUEST_METRICS: tuple[str, ...] = tuple(m.name for m in CATALOGUE if m.per_request)


def latency_rows(summary: Any) -> list[Metric]:
    """The per-request metrics a run's latency table shows, in order: TTFT, TPOT, ITL, ITL per token
    (only when chunks held several tokens: speculative decoding, stream batching), E2E, then the
    reasoning time and the send lag where the run has them."""
    rows = [METRICS[n] for n in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]
    per_chunk = getattr(summary, "tokens_per_chunk", None)
    if per_chunk is not None and per_chunk > ITL_TOKEN_SHOWN_ABOVE and getattr(summary, "itl_token_ms", None):
        rows.insert(3, METRICS["itl_token_ms"])
    rows += [METRICS[n] for n in ("reasoning_ms", "send_lag_ms") if getattr(summary, n, None) is not None]
    return rows


def definitions_table() -> str:
    """docs/metrics.md's "Metric definitions" table, in the catalogue's order (tests/test_readme.py
    checks the page against it): ``python -m bench.metrics.catalogue`` prints it."""
    rows = "\n".join(f"| `{m.name}` | {m.definition} |" for m in CATALOGUE)
    return f"| metric | definition |\n| --- | --- |\n{rows}"


if __name__ == "__main__":
    print(definitions_table())

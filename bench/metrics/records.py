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

from bench.metrics.catalogue import DEFINITIONS
from engines.base import REQUEST_CANCELLED

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
CANCELLED = REQUEST_CANCELLED  # the error of a request in flight when its run was cancelled
PREFIX_CACHE_WARN = 0.10  # a prefix-cache hit rate above this gets a warning
# Chunks arriving in bursts: above these, TPOT and ITL time the bursts, not the tokens.
BURST_SINGLE_CHUNK_SHARE = 0.2  # share of multi-token outputs that arrived in one chunk
BURST_TOKENS_PER_CHUNK = 2.0  # mean output tokens per chunk

METRIC_DEFINITIONS = DEFINITIONS  # declared in bench.metrics.catalogue


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
    def ntpot_ms(self) -> float | None:
        """E2E / the output tokens (inference-perf's normalized time per output token); None without output."""
        n = self.counted_output_tokens
        return self.e2e_ms / n if n > 0 else None

    @property
    def interactivity_tok_s(self) -> float | None:
        """1000 / TPOT: the tokens per second this request streamed after its first (None without a TPOT)."""
        tpot = self.tpot_ms
        return 1000.0 / tpot if tpot is not None and tpot > 0 else None

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

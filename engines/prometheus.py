"""Prometheus text-format parsing for server telemetry (vLLM, Triton, LMDeploy) and device
exporters (dcgm-exporter, npu-exporter, mlu-exporter), and the step that turns cumulative
counters into per-second rates.

There is one parser, :func:`parse_prometheus_samples`, built on ``prometheus_client``'s
:func:`~prometheus_client.parser.text_string_to_metric_families`; the sums and lookups the
engines need are views over its samples. Names are the ones the page writes, so callers look
up ``vllm:prompt_tokens_total``, ``nv_inference_request_success`` (a Triton counter without
``_total``) and ``vllm:e2e_request_latency_seconds_bucket`` exactly as a scrape shows them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class PromSample:
    """One sample line of the Prometheus text format."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_samples(text: str) -> list[PromSample]:
    """Every well-formed sample with its labels, in page order (comments, blank and malformed
    lines skipped; timestamps dropped).

    A sample is named as the page writes it: ``prometheus_client`` renames the samples of a
    counter declared without ``_total`` (Triton's ``nv_inference_request_success``, DCGM's
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) to ``<name>_total``; that is undone here.
    """
    # Fallback, one line at a time through the same library parser: the library stops at the
    # first line it cannot read and the page is lost, while a telemetry scrape must keep every
    # device whose lines are sound. No exporter page we have (tests/data/telemetry, vLLM's and
    # Triton's pages in tests/engines/test_prometheus.py) needs it; a garbled line, e.g. a label
    # value with an unescaped quote or a truncated body, does. Without the page's TYPE lines
    # every sample is untyped, so its name is already the one written.
    try:
        return _page_samples(text)
    except (ValueError, IndexError):  # IndexError: the library's own on some garbled label sets
        return [sample for line in text.split("\n") for sample in _line_samples(line)]


def _page_samples(text: str) -> list[PromSample]:
    declared = _declared_counters(text)
    out = []
    for family in text_string_to_metric_families(text):
        # The family is "foo" both for "# TYPE foo counter" (samples "foo", renamed) and for
        # "# TYPE foo_total counter" (samples "foo_total", as written).
        renamed = family.type == "counter" and family.name in declared and family.name + "_total" not in declared
        for s in family.samples:
            name = family.name if renamed and s.name == family.name + "_total" else s.name
            out.append(PromSample(name, s.labels, float(s.value)))
    return out


def _line_samples(line: str) -> list[PromSample]:
    try:
        return [
            PromSample(s.name, s.labels, float(s.value))
            for family in text_string_to_metric_families(line)
            for s in family.samples
        ]
    except (ValueError, IndexError):
        return []


def _declared_counters(text: str) -> set[str]:
    """The names in the page's ``# TYPE <name> counter`` lines."""
    out = set()
    for line in text.split("\n"):
        if "TYPE" in line and "counter" in line:
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "#" and parts[1] == "TYPE" and parts[3] == "counter":
                out.add(parts[2].strip('"'))
    return out


@lru_cache(maxsize=4)
def _cached_samples(text: str) -> tuple[PromSample, ...]:
    """The page's samples, kept for the views below: a server engine reads one scrape through
    two of them (vLLM: the totals, then the per-engine sums), and the library's parser is not
    cheap (about 15 us a line with prometheus-client 0.26, 60 ms for a 4,200-line page)."""
    return tuple(parse_prometheus_samples(text))


MAX_LABEL_VALUES = 64  # distinct values of a split label kept (e.g. vLLM engines): a page cannot make a million series


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over their labels: ``{name: value}`` (comments skipped). A metric
    with a NaN or infinite sample has no sum and is left out (never stored as NaN or Inf)."""
    out: dict[str, float] = {}
    bad: set[str] = set()
    for s in _cached_samples(text):
        if not math.isfinite(s.value):
            bad.add(s.name)
        out[s.name] = out.get(s.name, 0.0) + s.value
    for name in bad:
        del out[name]
    return out


def parse_prometheus_by(text: str, label: str, names: Iterable[str]) -> dict[tuple[str, str], float]:
    """For the metrics in ``names``: ``{(name, value of label): value}``, summed over the other
    labels (e.g. vLLM's per data-parallel engine series by the ``engine`` label); at most
    :data:`MAX_LABEL_VALUES` values of the label, and a sum with a NaN or infinite sample left out."""
    wanted = set(names)
    out: dict[tuple[str, str], float] = {}
    seen: set[str] = set()
    bad: set[tuple[str, str]] = set()
    for s in _cached_samples(text):
        if s.name in wanted and label in s.labels:
            value = s.labels[label]
            if value not in seen:
                if len(seen) >= MAX_LABEL_VALUES:
                    continue  # past the cap: not a series of its own
                seen.add(value)
            key = (s.name, value)
            if not math.isfinite(s.value):
                bad.add(key)
            out[key] = out.get(key, 0.0) + s.value
    for key in bad:
        del out[key]
    return out


def sample_labels(text: str, metric: str) -> dict[str, str]:
    """The labels of the first sample of ``metric`` (e.g. ``vllm:cache_config_info``); ``{}``
    when the page has none."""
    return next((dict(s.labels) for s in _cached_samples(text) if s.name == metric), {})


class CounterRates:
    """Per-second rates of cumulative counters between two scrapes (thread-safe).

    The first scrape only sets the baseline; a counter that went down (the server
    restarted) rates 0 for that interval rather than a negative rate.
    """

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, float]] | None = None
        self._lock = threading.Lock()

    def update(self, counters: dict[str, float], now: float | None = None) -> dict[str, float]:
        """Take this scrape's counter values; each counter's rate since the previous scrape."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last, self._last = self._last, (now, dict(counters))
        if last is None or now <= last[0]:
            return {}
        then, before = last
        span = now - then
        return {name: max(0.0, value - before[name]) / span for name, value in counters.items() if name in before}

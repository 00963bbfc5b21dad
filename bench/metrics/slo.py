"""Service-level objectives (SLOs), goodput and the pass/fail verdict of a run.

An SLO is written ``METRIC:STAT<=LIMIT``, e.g. ``ttft_ms:p99<=2000``:

- ``METRIC``: a latency metric that :mod:`bench.metrics.catalogue` marks ``slo``
  (``ttft_ms``, ``tpot_ms``, ...), in ms. ``ttft_ms`` is the
  first *answer* token: on a reasoning model, goodput on it judges when the answer began,
  the thinking before it included; ``ttft_any_ms`` judges the first token of any kind.
- ``STAT``: ``pNN`` (any percentile, ``p99.9`` too), ``mean`` or ``max``.
- ``LIMIT``: the bound in ms (``<=``: the value may equal it).

Two things are judged against a set of SLOs:

- **Goodput** (as ``vllm bench serve --goodput`` defines it): completed requests that
  met every SLO on their own values, divided by the run's duration. A request's own
  value is its TTFT, its TPOT (a one-token output has none and meets a TPOT SLO, as in
  vllm bench, where its TPOT is 0), its E2E, and for ITL the mean of its gaps (per
  token: its mean ITL per token). The
  STAT part plays no role per request. Failed requests never count as good.
- **The run's verdict**: each SLO's STAT over the run's requests (percentiles of the
  pooled values, ITL pooling every gap) is within its limit. Sweeps and the capacity
  search use this verdict; a run with no completed request fails every SLO.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.metrics.catalogue import METRICS, SLO_METRICS
from bench.metrics.records import RequestRecord, percentile

# Named sets of SLOs. The MLPerf Inference server scenario for DeepSeek-R1 bounds
# TTFT at 2 s and TPOT at 80 ms (p99); its interactive scenario at 1.5 s and 15 ms.
SLO_PRESETS: dict[str, tuple[str, ...]] = {
    "mlperf-server": ("ttft_ms:p99<=2000", "tpot_ms:p99<=80"),
    "interactive": ("ttft_ms:p99<=1500", "tpot_ms:p99<=15"),
}

_SLO_RE = re.compile(
    r"^\s*([a-z][a-z0-9_/]*)\s*:\s*(p\d+(?:\.\d+)?|mean|max|min)\s*(<=|>=)\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|tok/s)?\s*$"
)


class SloError(ValueError):
    """An SLO that cannot be parsed; the message is one line."""


@dataclass(frozen=True)
class Slo:
    """One objective: ``stat`` of ``metric`` at most ``limit_ms`` (in the metric's unit: ms for a
    latency), or at least it for a metric where higher is better (``at_least``: tok/s per user)."""

    metric: str
    stat: str  # "p99", "p99.9", "mean", "max" or "min"
    limit_ms: float
    at_least: bool = False

    @property
    def text(self) -> str:
        return f"{self.metric}:{self.stat}{'>=' if self.at_least else '<='}{self.limit_ms:g}"

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    @property
    def figure(self) -> str:
        """The bounded figure: ``TTFT p99``, ``tok/s per user p10``."""
        m = METRICS[self.metric]
        name = m.label if m.unit != "ms" else self.metric.removesuffix("_ms").upper()
        return f"{name} {self.stat}"

    @property
    def label(self) -> str:
        """Short form for charts and tables: ``TTFT p99 ≤ 2000 ms``, ``tok/s per user p10 ≥ 20 tok/s``."""
        return f"{self.figure} {'≥' if self.at_least else '≤'} {self.limit_ms:g} {self.unit}"

    def met(self, value: float) -> bool:
        """Whether ``value`` is within this objective."""
        return value >= self.limit_ms if self.at_least else value <= self.limit_ms

    def measure(self, values: Sequence[float]) -> float | None:
        """This SLO's statistic over ``values`` (None without values)."""
        if not values:
            return None
        if self.stat == "mean":
            return sum(values) / len(values)
        if self.stat == "max":
            return max(values)
        if self.stat == "min":
            return min(values)
        return percentile(values, float(self.stat[1:]))


def parse_slo(text: str) -> Slo:
    """``"ttft_ms:p99<=2000"`` -> :class:`Slo`; :class:`SloError` with the reason otherwise."""
    m = _SLO_RE.match(text.lower())
    if m is None:
        raise SloError(
            f"SLO '{text}' is not METRIC:STAT<=LIMIT or METRIC:STAT>=LIMIT (e.g. ttft_ms:p99<=2000, "
            "interactivity_tok_s:p10>=20)"
        )
    metric, stat, op, limit = m.group(1), m.group(2), m.group(3), float(m.group(4))
    if metric not in SLO_METRICS and f"{metric}_ms" in SLO_METRICS:
        metric += "_ms"  # "ttft:p99<=2000" reads as ttft_ms
    if metric not in SLO_METRICS:
        raise SloError(f"SLO '{text}': unknown metric '{metric}'; one of {', '.join(SLO_METRICS)}")
    at_least = METRICS[metric].better == "higher"
    if (op == ">=") != at_least:
        want = ">=" if at_least else "<="
        raise SloError(f"SLO '{text}': {metric} is bounded with {want} ({'higher' if at_least else 'lower'} is better)")
    if stat.startswith("p") and not 0 < float(stat[1:]) <= 100:
        raise SloError(f"SLO '{text}': the percentile must be in (0, 100]")
    if limit <= 0:
        raise SloError(f"SLO '{text}': the limit must be above 0 ms")
    return Slo(metric, stat, limit, at_least)


def parse_slos(items: Iterable[str]) -> list[Slo]:
    """SLO texts and preset names (see :data:`SLO_PRESETS`) -> SLOs; a later SLO on the same
    metric and statistic replaces an earlier one."""
    out: dict[tuple[str, str], Slo] = {}
    for item in items:
        for text in SLO_PRESETS.get(item.strip().lower(), (item,)):
            slo = parse_slo(text)
            out[(slo.metric, slo.stat)] = slo
    return list(out.values())


def request_value(rec: RequestRecord, metric: str) -> float | None:
    """The request's own value of ``metric`` for goodput (see the module docstring)."""
    if metric == "tpot_ms":
        return rec.tpot_ms if rec.tpot_ms is not None else 0.0
    if metric == "interactivity_tok_s":  # a one-token answer meets it, as it meets a TPOT bound
        return rec.interactivity_tok_s if rec.interactivity_tok_s is not None else math.inf
    if metric == "itl_ms":
        return rec.itl_mean_ms if rec.itl_mean_ms is not None else 0.0
    if metric == "itl_token_ms":
        return rec.itl_token_mean_ms if rec.itl_token_mean_ms is not None else 0.0
    value = getattr(rec, metric)  # the request's own figure (TTFT, E2E, NTPOT ...)
    return None if value is None else float(value)


def is_good(rec: RequestRecord, slos: Sequence[Slo]) -> bool:
    """The request completed and met every SLO on its own values."""
    if not rec.ok:
        return False
    for slo in slos:
        v = request_value(rec, slo.metric)
        if v is None or not slo.met(v):
            return False
    return True


def good_requests(records: Iterable[RequestRecord], slos: Sequence[Slo]) -> int:
    return sum(1 for r in records if is_good(r, slos))


@dataclass(frozen=True)
class Verdict:
    """One SLO judged on a run: the measured statistic and whether it is within the limit."""

    slo: Slo
    value: float | None

    @property
    def ok(self) -> bool:
        return self.value is not None and self.slo.met(self.value)

    @property
    def margin(self) -> float | None:
        """How far from the limit, as value / limit for a bound from above (below 1 passes; 1.5 is 50 %
        over) and limit / value for one from below, so that below 1 passes either way."""
        if self.value is None:
            return None
        if self.slo.at_least:
            return self.slo.limit_ms / self.value if self.value > 0 else float("inf")
        return self.value / self.slo.limit_ms

    @property
    def text(self) -> str:
        shown = "no data" if self.value is None else f"{self.value:.4g} {METRICS[self.slo.metric].unit}"
        return f"{self.slo.label}: {shown} {'ok' if self.ok else 'FAILED'}"


def pooled_values(records: Iterable[RequestRecord], metric: str) -> list[float]:
    """Every value of ``metric`` over the completed requests (ITL: every gap)."""
    ok = [r for r in records if r.ok]
    if metric == "itl_ms":
        return [g for r in ok for g in r.itls_ms]
    if metric == "itl_token_ms":
        return [g for r in ok for g in r.itl_token_ms]
    values = (getattr(r, metric) for r in ok)
    return [float(v) for v in values if v is not None]


def judge(records: Sequence[RequestRecord], slos: Sequence[Slo]) -> list[Verdict]:
    """Each SLO's statistic over the run's records, exactly (no sketch)."""
    cache: dict[str, list[float]] = {}
    out = []
    for slo in slos:
        if slo.metric not in cache:
            cache[slo.metric] = pooled_values(records, slo.metric)
        out.append(Verdict(slo, slo.measure(cache[slo.metric])))
    return out


def judge_summary(summary_row: dict[str, float | None], slos: Sequence[Slo]) -> list[Verdict]:
    """The verdicts from a flat summary row (``ttft_ms_p99``, ...) for the statistics it holds;
    an SLO on another percentile has no value here (judge the records instead)."""
    return [Verdict(slo, _as_float(summary_row.get(f"{slo.metric}_{slo.stat}"))) for slo in slos]


def _as_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def all_met(verdicts: Sequence[Verdict]) -> bool:
    return all(v.ok for v in verdicts)

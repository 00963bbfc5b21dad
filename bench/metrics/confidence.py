"""Confidence intervals: when a run has measured enough (``--until-ci``), and the spread of repeats.

**Batch means.** A run's requests are not independent draws: a slow stretch of the server
slows the requests around it. So the 95 % confidence interval of a figure (a percentile or
the mean of a per-request metric) is taken by batch means: the values, in the order the
requests completed, are cut into :data:`BATCHES` contiguous batches; the figure is computed
on each batch; the interval is the batches' mean +- t(0.975, B - 1) x their standard
deviation / sqrt(B). Its half-width is reported relative to the figure over all the values.
Correlation inside a batch does not narrow the interval, as it would with an i.i.d. formula.

**Stopping.** ``--until-ci METRIC:STAT:PCT`` (``ttft_ms:p50:5%``) keeps sending until that
half-width is at most PCT % of the figure, checked after every completed request (every
n/1000-th past 2,000 requests), from :data:`MIN_REQUESTS` completed requests on; or until
``--requests`` / ``--duration`` runs out, whichever comes first. Requests already due or in
flight when it is met still complete and are counted.

**Repeats** (``--repeat N``): each headline figure's mean over the N runs +- t(0.975, N - 1)
x their standard deviation / sqrt(N) (the runs are independent: no batching needed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.metrics.records import RequestRecord
from bench.metrics.slo import SLO_METRICS, request_value

BATCHES = 10
MIN_PER_BATCH = 5
MIN_REQUESTS = BATCHES * MIN_PER_BATCH
# two-sided 95 % Student t quantiles by degrees of freedom (1..30); above 30, the normal 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip
_RULE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*:\s*(p\d+(?:\.\d+)?|mean)\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (a 95 % two-sided interval)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two values")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class StopRule:
    """``until-ci``: stop once the 95 % half-width of ``stat`` of ``metric`` is at most ``pct`` %."""

    metric: str
    stat: str  # "mean" or "pNN"
    pct: float

    @property
    def text(self) -> str:
        return f"{self.metric}:{self.stat}:{self.pct:g}%"


def parse_stop_rule(text: str) -> StopRule:
    """``"ttft_ms:p50:5%"`` -> :class:`StopRule`; ValueError with a one-line reason otherwise."""
    m = _RULE.match(text.lower())
    if m is None:
        raise ValueError(f"until_ci '{text}' is not METRIC:STAT:PCT (e.g. ttft_ms:p50:5%)")
    metric, stat, pct = m.group(1), m.group(2), float(m.group(3))
    if not metric.endswith("_ms"):
        metric += "_ms"
    if metric not in SLO_METRICS:
        raise ValueError(f"until_ci '{text}': unknown metric '{metric}'; one of {', '.join(SLO_METRICS)}")
    if stat.startswith("p") and not 0 < float(stat[1:]) < 100:
        raise ValueError(f"until_ci '{text}': the percentile must be in (0, 100)")
    if not 0 < pct < 100:
        raise ValueError(f"until_ci '{text}': the half-width must be above 0 % and below 100 %")
    return StopRule(metric, stat, pct)


def _stat(values: np.ndarray, stat: str) -> float:
    return float(values.mean()) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


@dataclass(frozen=True)
class Interval:
    """A figure over all values, and its 95 % confidence interval's half-width (absolute and % of it)."""

    value: float
    half_width: float
    n: int

    @property
    def half_width_pct(self) -> float:
        return math.inf if self.value == 0 else 100.0 * self.half_width / abs(self.value)


def batch_means(values: Sequence[float], stat: str = "mean", batches: int = BATCHES) -> Interval | None:
    """The 95 % interval of ``stat`` over ``values`` (in completion order) by batch means; None
    under ``batches`` x :data:`MIN_PER_BATCH` values."""
    n = len(values)
    if n < batches * MIN_PER_BATCH:
        return None
    xs = np.asarray(values, dtype=float)
    per = np.array([_stat(b, stat) for b in np.array_split(xs, batches)])
    half = t975(batches - 1) * float(per.std(ddof=1)) / math.sqrt(batches)
    return Interval(_stat(xs, stat), half, n)


def rule_values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    """The completed requests' own values of ``metric``, in completion order (as the run saw them)."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.end_s)
    return [float(v) for r in ok if (v := request_value(r, metric)) is not None]


class StopWatch:
    """Follows one :class:`StopRule` as requests complete (the recorder's thread calls :meth:`add`)."""

    def __init__(self, rule: StopRule) -> None:
        self.rule = rule
        self.values: list[float] = []
        self.met_at: int | None = None  # completed requests when the rule was met
        self.last: Interval | None = None

    def add(self, rec: RequestRecord) -> bool:
        """Take one finished request; True the first time the rule is met."""
        if not rec.ok or self.met_at is not None:
            return False
        v = request_value(rec, self.rule.metric)
        if v is None:
            return False
        self.values.append(float(v))
        n = len(self.values)
        if n < MIN_REQUESTS or (n > 2000 and n % max(1, n // 1000)):
            return False
        self.last = batch_means(self.values, self.rule.stat)
        if self.last is not None and self.last.half_width_pct <= self.rule.pct:
            self.met_at = n
            return True
        return False


def repeat_interval(xs: Sequence[float]) -> tuple[float, float] | None:
    """(mean, 95 % half-width) of independent repeats; None under two."""
    if len(xs) < 2:
        return None
    arr = np.asarray(xs, dtype=float)
    return float(arr.mean()), t975(len(xs) - 1) * float(arr.std(ddof=1)) / math.sqrt(len(xs))


def stop_fields(rule_text: str, records: Sequence[RequestRecord], met_at: int | None) -> dict[str, object]:
    """The summary's until_ci fields: the rule, whether it was met during the run (and after how
    many completed requests), and the final interval over every completed request."""
    rule = parse_stop_rule(rule_text)
    final = batch_means(rule_values(records, rule.metric), rule.stat)
    return {
        "until_ci": rule.text,
        "until_ci_met_at": met_at,
        "ci_value": final.value if final is not None else None,
        "ci_half_width_pct": final.half_width_pct
        if final is not None and math.isfinite(final.half_width_pct)
        else None,
    }

"""Arrival schedules and the client-bound verdict."""

from __future__ import annotations

import itertools
import statistics

import pytest

from bench.metrics.client_bound import CLIENT_BOUND_MIN_MS, client_bound_reason
from bench.send.schedule import arrival_offsets


def test_poisson_schedule_has_the_requested_mean_rate_and_is_seeded() -> None:
    offs = arrival_offsets(4000, request_rate=20.0, burstiness=1.0, seed=7)
    assert offs[0] == 0.0 and offs == sorted(offs)
    gaps = [b - a for a, b in itertools.pairwise(offs)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 20.0, rel=0.06)
    # Exponential gaps: the coefficient of variation is 1.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.08)
    assert arrival_offsets(4000, 20.0, 1.0, seed=7) == offs
    assert arrival_offsets(4000, 20.0, 1.0, seed=8) != offs


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_changes_the_spread_not_the_mean(burstiness: float) -> None:
    offs = arrival_offsets(6000, request_rate=10.0, burstiness=burstiness, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(offs)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.1)
    # Gamma(k) gaps: CV = 1/sqrt(k).
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(burstiness**-0.5, rel=0.1)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (float("inf"), 1.0), (1.0, 0.0)])
def test_bad_schedule_parameters_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="must be a positive number"):
        arrival_offsets(3, rate, burst)


def test_client_bound_verdict() -> None:
    assert client_bound_reason(None, None) is None
    assert client_bound_reason(CLIENT_BOUND_MIN_MS - 1, None) is None
    closed = client_bound_reason(25.0, None)
    assert closed is not None and closed.startswith("client-bound") and "25.0 ms" in closed
    # Open loop at 2 req/s: the limit is a quarter of the 500 ms interval.
    assert client_bound_reason(100.0, 2.0) is None
    late = client_bound_reason(200.0, 2.0)
    assert late is not None and "125.0 ms" in late and "2 req/s" in late

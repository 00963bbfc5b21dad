"""Prometheus parsing and the counter-to-rate step every server engine uses."""

from __future__ import annotations

from engines.prometheus import CounterRates, parse_prometheus


def test_counter_rates_between_scrapes() -> None:
    rates = CounterRates()
    assert rates.update({"a": 10.0}, now=100.0) == {}  # the first scrape is the baseline
    assert rates.update({"a": 30.0, "b": 5.0}, now=102.0) == {"a": 10.0}  # b is new: no rate yet
    assert rates.update({"a": 0.0, "b": 9.0}, now=104.0) == {"a": 0.0, "b": 2.0}  # a restarted: 0, not negative
    assert rates.update({"a": 4.0}, now=104.0) == {}  # no time passed


def test_parse_sums_labels() -> None:
    text = '# HELP x\nx{a="1"} 2\nx{a="2"} 3\ny 4.5\n'
    assert parse_prometheus(text) == {"x": 5.0, "y": 4.5}

"""Prometheus text-format parsing for server telemetry (vLLM, Triton, LMDeploy), and the
step that turns cumulative counters into per-second rates."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over their labels: ``{name: value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.rpartition("}") if "}" in line else ("", "", line)
        if name_part:
            name = name_part.split("{", 1)[0]
            fields = rest.split()
        else:
            parts = line.split()
            name, fields = parts[0], parts[1:]
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def parse_prometheus_by(text: str, label: str, names: Iterable[str]) -> dict[tuple[str, str], float]:
    """For the metrics in ``names``: ``{(name, value of label): value}``, summed over the other
    labels (e.g. vLLM's per data-parallel engine series by the ``engine`` label)."""
    wanted = set(names)
    key = f'{label}="'
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        if name not in wanted:
            continue
        labels, _, tail = rest.rpartition("}")
        at = labels.find(key)
        if at < 0:
            continue
        value_of = labels[at + len(key) :].split('"', 1)[0]
        fields = tail.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        out[(name, value_of)] = out.get((name, value_of), 0.0) + value
    return out


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

"""Energy of a run: joules per output token, tokens per joule, mean and peak power, goodput per watt.

The run's sampler reads device telemetry (:mod:`engines.telemetry`) at the start of the measured
window (before the first request), about once a second, and once more after the last request,
so every device's series covers the window. A device's energy over it is, best source first:

1. its own cumulative energy counter (``dev{i}_energy_j``: NVML's total energy, DCGM's, Linux
   RAPL's), last value less first: exact whatever the sampling rate; unless it gained less than
   half what the power samples add up to (an exporter that refreshes it every 30 s, as
   dcgm-exporter does by default, shows a short run no energy at all) or went back;
2. else its power samples (``dev{i}_power_w``) integrated by the trapezoid rule from the first
   sample to the last (a power reading is the board's average over a short interval, so a
   1 s sampling misses spikes shorter than that: the method is named beside the figure).

The run's figures sum the devices: ``energy_j`` (J), ``joules_per_output_token``,
``output_tokens_per_j``, ``power_avg_w`` (= energy / window), ``power_peak_w`` (the highest
sum over devices of the power read in one sample) and ``goodput_per_w`` (goodput_rps /
power_avg_w). Per device they go to the run's ``energy`` artifact (:func:`energy_of_run`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

_DEVICE_SERIES = re.compile(r"^(?P<device>(?:h[a-z0-9_]+_)?dev\d+)_(?P<field>power_w|energy_j)$")
MIN_WINDOW_S = 0.05  # a window shorter than this has no energy figure (one sample is not a span)
STALE_COUNTER = 0.5  # a counter that gained under half the sampled power's energy did not keep up


def is_energy_series(name: str) -> bool:
    return _DEVICE_SERIES.match(name) is not None


@dataclass(frozen=True)
class DeviceEnergy:
    """One device over the measured window."""

    device: str  # series prefix: dev0, h10_0_0_7_dev1
    energy_j: float
    window_s: float
    avg_w: float
    peak_w: float | None  # highest power sample (None: only a counter)
    samples: int  # power samples in the window
    method: str  # "energy counter" or "power samples (trapezoid)"


def _trapezoid(points: list[tuple[float, float]]) -> float:
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in itertools.pairwise(points))


def device_energy(points: Iterable[tuple[float, str, float | None]]) -> list[DeviceEnergy]:
    """Each device's energy over the window its series cover (see the module docstring)."""
    power: dict[str, list[tuple[float, float]]] = {}
    counter: dict[str, list[tuple[float, float]]] = {}
    for t, name, value in points:
        m = _DEVICE_SERIES.match(name)
        if m is None or value is None or value != value:
            continue
        (power if m["field"] == "power_w" else counter).setdefault(m["device"], []).append((t, float(value)))
    out: list[DeviceEnergy] = []
    for device in sorted(set(power) | set(counter)):
        p = sorted(power.get(device, []))
        c = sorted(counter.get(device, []))
        peak = max((w for _, w in p), default=None)
        sampled = _trapezoid(p) if len(p) >= 2 and p[-1][0] - p[0][0] >= MIN_WINDOW_S else None
        counted = c[-1][1] - c[0][1] if len(c) >= 2 and c[-1][0] - c[0][0] >= MIN_WINDOW_S else None
        method = "energy counter"
        if counted is not None and (counted < 0 or (sampled is not None and counted < STALE_COUNTER * sampled)):
            # a counter that went back (a reset) or barely moved while the board drew power: an exporter
            # that refreshes it less often than the run lasts (dcgm-exporter: every 30 s by default)
            counted, method = None, "power samples (trapezoid; the energy counter did not advance)"
        if counted is not None:
            window = c[-1][0] - c[0][0]
            out.append(DeviceEnergy(device, counted, window, counted / window, peak, len(p), method))
        elif sampled is not None:
            window = p[-1][0] - p[0][0]
            if method == "energy counter":
                method = "power samples (trapezoid)"
            out.append(DeviceEnergy(device, sampled, window, sampled / window, peak, len(p), method))
    return out


def peak_total_power(points: Iterable[tuple[float, str, float | None]], devices: Iterable[str]) -> float | None:
    """The highest sum of the devices' power read at one sample time."""
    wanted = set(devices)
    by_t: dict[float, float] = {}
    for t, name, value in points:
        m = _DEVICE_SERIES.match(name)
        if m is not None and m["field"] == "power_w" and m["device"] in wanted and value is not None:
            by_t[t] = by_t.get(t, 0.0) + float(value)
    return max(by_t.values(), default=None)


def energy_of_run(
    points: list[tuple[float, str, float | None]],
    output_tokens: int,
    goodput_rps: float | None,
    why_none: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the summary's energy fields, the run's ``energy`` artifact). Without a device figure the
    fields are empty and the artifact holds the one-line reason (``why_none`` where the caller
    knows it: the telemetry that is missing)."""
    devices = device_energy(points)
    if not devices:
        reason = why_none or "no device reported power or energy during the run"
        return {}, {"reason": reason}
    total = sum(d.energy_j for d in devices)
    window = max(d.window_s for d in devices)
    avg = total / window if window > 0 else None
    peak = peak_total_power(points, [d.device for d in devices])
    fields: dict[str, Any] = {
        "energy_j": total,
        "joules_per_output_token": total / output_tokens if output_tokens > 0 else None,
        "output_tokens_per_j": output_tokens / total if total > 0 else None,
        "power_avg_w": avg,
        "power_peak_w": peak,
        "goodput_per_w": goodput_rps / avg if goodput_rps is not None and avg else None,
    }
    artifact = {
        "window_s": window,
        "energy_j": total,
        "devices": [asdict(d) for d in devices],
    }
    return fields, artifact

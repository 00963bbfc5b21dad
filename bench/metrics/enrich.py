"""A run's summary made whole: the figures that come from beside its requests, in one order, for
every path that makes a summary (a run finishing, a run whose process died, an import).

:func:`summarize` (bench.metrics.summary) reads the requests. :func:`enrich` adds, in this order:

1. the hardware's limits at the run's batch (bench.metrics.run_limits), or the reason there are none;
2. the MoE figures of its expert routing (bench.metrics.moe);
3. speculative decoding from the server's counters (bench.metrics.spec_decode);
4. energy over the measured window (bench.metrics.energy), or the reason there is none;
5. the accelerators it ran on and output tok/s per accelerator (bench.metrics.deployment).

It reads nothing itself: the caller hands it the run's config, engine description, routing record,
device-telemetry record and a reader of its time series, and stores what it returns (the summary,
and the ``limits`` and ``energy`` records). One run, one answer, whoever asks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.metrics import moe
from bench.metrics.deployment import accelerator_count, per_accelerator
from bench.metrics.energy import energy_of_run, is_energy_series
from bench.metrics.run_limits import RunLimits, for_run_or_reason
from bench.metrics.spec_decode import spec_fields, spec_series_names
from bench.metrics.summary import RunSummary

Points = list[tuple[float, str, float | None]]


@dataclass(frozen=True)
class RunInputs:
    """What a run recorded beside its requests, as :func:`enrich` needs it."""

    config: Mapping[str, Any]
    engine_info: Mapping[str, Any]
    accelerator: str
    routing: Mapping[str, Any] | None  # the expert_routing record, if any
    device_telemetry: Mapping[str, Any] | None  # what telemetry was read and what was missing
    series_names: Sequence[str]  # every time series the run stored
    series: Callable[[list[str]], Points]  # their points, in time order
    limits: Mapping[str, Any] | None = None  # the limits the run was held against when it ended, if stored


@dataclass(frozen=True)
class Enriched:
    summary: RunSummary
    limits: dict[str, Any]  # RunLimits.as_dict(), or {"reason": why there is none}
    energy: dict[str, Any]  # per device, or {"reason": why there is none}


def enrich(summary: RunSummary, run: RunInputs, measure_cpu: bool = True) -> Enriched:
    """``summary`` with the figures of the module docstring, and the records to store beside it.
    ``measure_cpu``: whether a CPU run's limit may measure this machine now (see run_limits)."""
    kept = _kept_limits(run.limits)
    try:
        found = (
            kept.reached(summary)
            if kept is not None
            else for_run_or_reason(dict(run.config), dict(run.engine_info), summary, run.accelerator, measure_cpu)
        )
    except Exception as exc:  # noqa: BLE001 - a limit is a comparison, never a reason to lose a summary
        found = f"limits could not be computed: {type(exc).__name__}: {exc}"
    if isinstance(found, str):
        limits: dict[str, Any] = {"reason": found}
    else:
        limits = found.as_dict()
        summary = dataclasses.replace(
            summary,
            tpot_limit_ms=found.tpot_limit_ms,
            output_tok_s_limit=found.output_tok_s_limit,
            tpot_pct_of_limit=found.tpot_pct,
            throughput_pct_of_limit=found.throughput_pct,
        )
    summary = dataclasses.replace(summary, **moe.run_figures(dict(run.routing) if run.routing else None))
    summary = dataclasses.replace(summary, **spec_fields(run.series(spec_series_names())))
    names = [n for n in run.series_names if is_energy_series(n)]
    fields, energy = energy_of_run(
        run.series(names) if names else [], summary.output_tokens, summary.goodput_rps, _why_no_power(run)
    )
    summary = dataclasses.replace(summary, **fields)
    accelerators = accelerator_count(run.config, run.engine_info)
    summary = dataclasses.replace(
        summary,
        accelerators=accelerators,
        output_tok_s_per_accelerator=per_accelerator(summary.output_throughput_tok_s, accelerators),
    )
    return Enriched(summary, limits, energy)


def _kept_limits(stored: Mapping[str, Any] | None) -> RunLimits | None:
    """The limits a run stored when it ended (the same spec: a CPU's bandwidth is measured once, at
    that moment), for a summary recomputed later; None when it stored none or only a reason."""
    if not isinstance(stored, Mapping) or stored.get("tpot_limit_ms") is None:
        return None
    names = {f.name for f in dataclasses.fields(RunLimits)}
    try:
        return RunLimits(**{k: v for k, v in stored.items() if k in names})
    except TypeError:
        return None


def _why_no_power(run: RunInputs) -> str | None:
    """The one line why a run has no power series, where its telemetry record says."""
    if any(is_energy_series(n) for n in run.series_names):
        return None
    found = run.device_telemetry
    missing = found.get("missing") if isinstance(found, Mapping) else None
    if missing:
        return "no power read: " + "; ".join(str(m) for m in missing)
    if found is None:
        return "no power read: device telemetry was off for this run"
    return None

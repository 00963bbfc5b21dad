"""What a sweep or a capacity search is: :class:`SweepSpec`, :class:`CapacitySpec`, and the points
a stored sweep measured (:func:`sweep_points`).

- A **sweep** runs one point per combination of the swept values (``concurrency``,
  ``request_rate``, input/output ``lengths`` and any engine option, e.g. vLLM's
  ``max_num_seqs``, its batch size), ``repeats`` runs per point. Each run is a normal
  stored run pointing at the sweep (``runs.sweep_id``, ``runs.sweep_point``).
  Points are ordered with the load axis innermost (``request_rate`` if swept, else
  ``concurrency``); a *line* is the points that share every other value. A line can stop
  early, and the sweep says why (the rules are off unless asked for):

  - ``stop_on_saturation=G``: output tok/s rose by less than ``G`` (0.05 = 5 %) over the
    line's best so far;
  - ``stop_on_errors=F``: more than a fraction ``F`` of the point's requests failed;
  - ``stop_on_slo_margin=M``: an SLO's statistic is above its limit by more than ``M``
    (0.5 = 50 % over).

- A **capacity search** finds the highest request rate (open loop, Poisson) or
  concurrency whose run meets every SLO (:mod:`bench.metrics.slo` verdict) with at most
  ``max_error_rate`` of its requests failed: it doubles from ``start`` until a probe
  fails (bracketing), then bisects until the bracket is one ``step`` wide, within a
  budget of runs. The result is the bracket it proved (passes at X, fails at Y).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bench.config import RunConfig
from bench.metrics.summary import RunSummary
from bench.store import Store
from bench.store.rows import RunRow
from engines.errors import ConfigError

AXES: tuple[str, ...] = ("input_len", "output_len", "concurrency", "request_rate")  # + engine.<option>
MAX_POINTS = 1000


def _config_error(exc: ValidationError) -> ConfigError:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        parts.append(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}")
    return ConfigError("; ".join(parts))


class SweepSpec(BaseModel):
    """A sweep: a base run config and the values to sweep (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    base: dict[str, Any] = Field(default_factory=dict, description="The RunConfig every point starts from")
    concurrency: list[int] = Field(default_factory=list, description="Concurrency values to sweep")
    request_rate: list[float] = Field(default_factory=list, description="Request rates to sweep (req/s, open loop)")
    lengths: list[tuple[int, int]] = Field(
        default_factory=list, description="(input_len, output_len) pairs to sweep (random prompts)"
    )
    engine_axis: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Engine options to sweep, e.g. {'max_num_seqs': [8, 32, 128]} (vLLM's batch size); "
        "the engine is restarted for each value",
    )
    repeats: int = Field(1, ge=1, le=20, description="Runs per point (the spread is shown)")
    stop_on_saturation: float | None = Field(
        None, ge=0.0, le=10.0, description="Stop a line when output tok/s rises by less than this fraction"
    )
    stop_on_errors: float | None = Field(
        None, ge=0.0, le=1.0, description="Stop a line when more than this fraction of a point's requests failed"
    )
    stop_on_slo_margin: float | None = Field(
        None, ge=0.0, le=100.0, description="Stop a line when an SLO is broken by more than this fraction"
    )
    name: str = Field("", max_length=200)

    @field_validator("concurrency", "request_rate")
    @classmethod
    def _positive_sorted(cls, v: list[Any]) -> list[Any]:
        if any(x <= 0 for x in v):
            raise ValueError("values must be above 0")
        return sorted(set(v))

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        n = len(self.points())
        if n < 1:
            raise ValueError("nothing to sweep: give concurrency, request_rate or lengths values, or engine options")
        if n > MAX_POINTS:
            raise ValueError(f"{n} points is more than {MAX_POINTS}")
        if self.stop_on_slo_margin is not None and not self.base.get("slos"):
            raise ValueError("stop_on_slo_margin needs SLOs in the base config")
        for point in self.points():
            self.run_config(point)  # every point makes a valid run: none fails after others ran
        return self

    @classmethod
    def build(cls, **data: Any) -> SweepSpec:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _config_error(exc) from exc

    @classmethod
    def repeat(cls, base: dict[str, Any], repeats: int, name: str = "") -> SweepSpec:
        """One run repeated ``repeats`` times (``run --repeat N``, the run pages' Repeats field):
        a one-point sweep at the run's own concurrency or rate, each repeat with fresh prompts."""
        cfg = RunConfig.build(**base)  # the run's own checks first, with its defaults filled in
        rate = cfg.request_rate
        return cls.build(
            base=base,
            concurrency=[] if rate is not None else [cfg.concurrency],
            request_rate=[rate] if rate is not None else [],
            repeats=repeats,
            name=name or cfg.name or f"{cfg.mode} x{repeats}",
        )

    @property
    def repeats_one_run(self) -> bool:
        """A repeat of one run (one point, several repeats): its spread is the result."""
        return self.repeats > 1 and len(self.points()) == 1

    @property
    def load_axis(self) -> str | None:
        return "request_rate" if self.request_rate else "concurrency" if self.concurrency else None

    def points(self) -> list[dict[str, Any]]:
        """Every point, the load axis innermost."""
        axes: list[tuple[str, list[Any]]] = []
        if self.lengths:
            axes.append(("lengths", [list(p) for p in self.lengths]))
        for name in sorted(self.engine_axis):
            axes.append((f"engine.{name}", list(self.engine_axis[name])))
        if self.concurrency:
            axes.append(("concurrency", list(self.concurrency)))
        if self.request_rate:
            axes.append(("request_rate", list(self.request_rate)))
        out: list[dict[str, Any]] = []
        if not axes:
            return out
        for combo in itertools.product(*(values for _, values in axes)):
            point: dict[str, Any] = {}
            for (name, _), value in zip(axes, combo, strict=True):
                if name == "lengths":
                    point["input_len"], point["output_len"] = int(value[0]), int(value[1])
                else:
                    point[name] = value
            out.append(point)
        return out

    def line_key(self, point: dict[str, Any]) -> tuple[Any, ...]:
        """The values a point shares with the rest of its line (all but the load axis)."""
        return tuple(sorted((k, v) for k, v in point.items() if k != self.load_axis))

    def run_config(self, point: dict[str, Any], repeat: int = 0, index: int = 0) -> RunConfig:
        """The run of one point: the base with the point's values. Run ``index`` of the sweep
        gets its own prompt seed (see :func:`fresh_seed`)."""
        data = {**self.base}
        data["workload"] = dict(data.get("workload") or {})
        data["workload"]["seed"] = fresh_seed(data["workload"].get("seed", 0), index * self.repeats + repeat)
        data["engine"] = dict(data.get("engine") or {"kind": "native"})
        for key, value in point.items():
            if key in ("input_len", "output_len"):
                data["workload"][key] = value
            elif key.startswith("engine."):
                data["engine"][key.removeprefix("engine.")] = value
            else:
                data[key] = value
        if "request_rate" in point and "concurrency" not in point and "concurrency" not in self.base:
            data["concurrency"] = DEFAULT_RATE_CONCURRENCY
        label = ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in point.items())
        data["name"] = f"{self.name or 'sweep'} [{label}]" + (f" #{repeat + 1}" if self.repeats > 1 else "")
        return RunConfig.build(**data)


DEFAULT_RATE_CONCURRENCY = 256  # the in-flight cap of a rate point whose base names none


def fresh_seed(seed: int, k: int) -> int:
    """The prompt seed of a sweep's ``k``-th run: new random prompts for every run (and every
    repeat), so a server's prefix cache never serves one run the prompts of an earlier one
    (vLLM caches prompt blocks across requests: the same prompts again would be served from
    the cache and inflate TTFT and throughput)."""
    return (int(seed) + 7919 * k) % 2**31


class CapacitySpec(BaseModel):
    """A capacity search (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    base: dict[str, Any] = Field(default_factory=dict, description="The RunConfig every probe starts from")
    axis: Literal["rate", "concurrency", "speedup"] = "rate"
    start: float = Field(1.0, gt=0.0, description="The first probe's rate (req/s), concurrency or trace speed-up")
    maximum: float = Field(1024.0, gt=0.0, description="Never probe above this")
    step: float = Field(1.0, gt=0.0, description="Resolution: the search ends when the bracket is this wide")
    budget: int = Field(12, ge=2, le=100, description="Most runs the search may make")
    max_error_rate: float = Field(0.0, ge=0.0, le=1.0, description="A probe with more failed requests fails")
    name: str = Field("", max_length=200)

    @model_validator(mode="after")
    def _check(self) -> CapacitySpec:
        if not self.base.get("slos"):
            raise ValueError("a capacity search needs at least one SLO (e.g. ttft_ms:p99<=2000)")
        if self.maximum < self.start:
            raise ValueError("maximum is below start")
        if self.axis == "concurrency":
            self.start, self.maximum, self.step = float(int(self.start)), float(int(self.maximum)), max(1.0, self.step)
        trace = (self.base.get("workload") or {}).get("source") == "trace"
        if trace and self.axis == "rate":
            raise ValueError("a trace sets its own arrival times: search its replay speed (axis speedup)")
        if self.axis == "speedup" and not trace:
            raise ValueError("axis speedup replays a trace faster: give a trace workload (--prompts trace)")
        self.probe_config(self.start)
        return self

    @classmethod
    def build(cls, **data: Any) -> CapacitySpec:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _config_error(exc) from exc

    def probe_config(self, value: float, index: int = 0) -> RunConfig:
        data = {**self.base}
        data["workload"] = dict(data.get("workload") or {})
        data["workload"]["seed"] = fresh_seed(data["workload"].get("seed", 0), index)
        if self.axis == "rate":
            data["request_rate"] = value
            data.setdefault("concurrency", DEFAULT_RATE_CONCURRENCY)
            data["burstiness"] = 1.0  # Poisson arrivals
        elif self.axis == "speedup":  # the trace replayed `value` times faster: its gaps / value
            data["workload"]["time_scale"] = 1.0 / value
            data["request_rate"] = None
        else:
            data["concurrency"] = int(value)
            data["request_rate"] = None
        shown = axis_label(self.axis, value)
        data["name"] = f"{self.name or 'capacity'} [{shown}]"
        return RunConfig.build(**data)


def axis_label(axis: str, value: float) -> str:
    """A capacity probe's value as it is shown: ``4 req/s``, ``concurrency 8``, ``x2.5 speed``."""
    if axis in ("rate", "request_rate"):
        return f"{value:g} req/s"
    if axis == "speedup":
        return f"x{value:g} speed"
    return f"concurrency {int(value)}"


# --- results ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PointResult:
    """One point of a sweep over its repeats (completed runs only in the figures)."""

    point: dict[str, Any]
    runs: list[RunRow]

    @property
    def summaries(self) -> list[RunSummary]:
        return [r.summary for r in self.runs if r.status == "completed" and r.summary is not None]

    def mean(self, key: str) -> float | None:
        vals = [v for s in self.summaries if isinstance(v := s.flat().get(key), (int, float))]
        return statistics.fmean(vals) if vals else None

    @property
    def disturbed(self) -> str:
        """What disturbed this point's completed runs (other load on the host, a client that fell
        behind its schedule), one line each with its run; empty when nothing did."""
        notes = []
        for r in self.runs:
            s = r.summary
            if r.status == "completed" and s is not None and (why := s.disturbance or s.load_warning):
                notes.append(f"run {r.id}: {why}")
        return "; ".join(notes)

    def spread(self, key: str) -> tuple[float, float] | None:
        """(min, max) over the repeats."""
        vals = [v for s in self.summaries if isinstance(v := s.flat().get(key), (int, float))]
        return (min(vals), max(vals)) if vals else None


def point_key(point: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in point.items() if k != "repeat"))


def sweep_points(store: Store, sweep_id: int) -> list[PointResult]:
    """A stored sweep's points (in the order first run) with their runs."""
    groups: dict[str, PointResult] = {}
    for run in store.sweep_runs(sweep_id):
        point = {k: v for k, v in (run.sweep_point or {}).items() if k != "repeat"}
        groups.setdefault(point_key(point), PointResult(point, [])).runs.append(run)
    return list(groups.values())


# --- the task ------------------------------------------------------------------------

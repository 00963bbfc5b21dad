"""Sweeps and capacity searches: many normal runs, grouped, resumable, with a verdict.

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

  A sweep interrupted (Ctrl-C, a killed process) keeps its finished runs; resuming it
  skips every (point, repeat) that has a completed run and runs the rest.
- A **capacity search** finds the highest request rate (open loop, Poisson) or
  concurrency whose run meets every SLO (:mod:`bench.slo` verdict) with at most
  ``max_error_rate`` of its requests failed: it doubles from ``start`` until a probe
  fails (bracketing), then bisects until the bracket is one ``step`` wide, within a
  budget of runs. The result is the bracket it proved (passes at X, fails at Y).

Both run in a :class:`SweepTask` (a :class:`bench.job.BackgroundTask`), which the CLI and
the dashboard drive the same way.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bench.config import RunConfig
from bench.job import BackgroundTask, Job, error_reason
from bench.metrics import RunSummary
from bench.slo import judge_summary, parse_slos
from bench.store import RunRow, Store
from engines.base import Engine
from engines.errors import ConfigError, MoEBenchError

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
    axis: Literal["rate", "concurrency"] = "rate"
    start: float = Field(1.0, gt=0.0, description="The first probe's rate (req/s) or concurrency")
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
        else:
            data["concurrency"] = int(value)
            data["request_rate"] = None
        shown = f"{value:g} req/s" if self.axis == "rate" else f"concurrency {int(value)}"
        data["name"] = f"{self.name or 'capacity'} [{shown}]"
        return RunConfig.build(**data)


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
@dataclass(frozen=True)
class SweepSnapshot:
    """A sweep or capacity search at one moment."""

    sweep_id: int | None
    kind: str
    status: str
    phase: str
    points_total: int
    runs_done: int
    runs_total: int
    current_run: int | None
    current_point: dict[str, Any] | None
    result: dict[str, Any]
    error: str | None

    @property
    def active(self) -> bool:
        return self.status in BackgroundTask.ACTIVE


@dataclass
class _Probe:
    value: float
    run_id: int
    passed: bool
    why: str


class SweepTask(BackgroundTask):
    """Runs a sweep or a capacity search, one stored run at a time, in the background."""

    TRANSITIONS: ClassVar = BackgroundTask.TRANSITIONS

    def __init__(
        self,
        spec: SweepSpec | CapacitySpec,
        store: Store,
        engine: Engine | None = None,
        resume_id: int | None = None,
        on_run: Callable[[Job], None] | None = None,
    ) -> None:
        super().__init__("sweep" if isinstance(spec, SweepSpec) else "capacity")
        if engine is not None and isinstance(spec, SweepSpec) and spec.engine_axis:
            raise ConfigError(
                "a sweep over engine options starts its own engine for each value; unload the loaded engine "
                "(or sweep without engine options)"
            )
        self.spec = spec
        self.store = store
        self.engine = engine  # a started engine to use (not stopped here); else one per engine config
        self.resume_id = resume_id
        self.on_run = on_run
        self.kind = "sweep" if isinstance(spec, SweepSpec) else "capacity"
        self._sweep_id: int | None = None
        self._job: Job | None = None
        self._point: dict[str, Any] | None = None
        self._result: dict[str, Any] = {}
        self._runs_done = 0
        self._runs_total = len(spec.points()) * spec.repeats if isinstance(spec, SweepSpec) else spec.budget
        self._owned: tuple[str, Engine] | None = None

    @property
    def sweep_id(self) -> int | None:
        return self._sweep_id

    def snapshot(self) -> SweepSnapshot:
        with self._lock:
            job = self._job
            return SweepSnapshot(
                sweep_id=self._sweep_id,
                kind=self.kind,
                status=self._status,
                phase=self._phase,
                points_total=len(self.spec.points()) if isinstance(self.spec, SweepSpec) else 0,
                runs_done=self._runs_done,
                runs_total=self._runs_total,
                current_run=job.run_id if job is not None and job.active else None,
                current_point=dict(self._point) if self._point else None,
                result=dict(self._result),
                error=self._error,
            )

    def current_job(self) -> Job | None:
        with self._lock:
            return self._job

    def cancel(self) -> None:
        super().cancel()
        job = self.current_job()
        if job is not None:
            job.cancel()

    def wait(self, timeout: float | None = None) -> SweepSnapshot:
        self.join(timeout)
        return self.snapshot()

    # --- worker -----------------------------------------------------------------------
    def begin(self) -> SweepTask:
        """Create (or re-open) the stored sweep and start the worker; returns self."""
        spec_json = self.spec.model_dump(mode="json")
        if self.resume_id is None:
            self._sweep_id = self.store.create_sweep(kind=self.kind, config=spec_json, name=self.spec.name)
        else:
            row = self.store.get_sweep(self.resume_id)
            if row is None:
                raise ConfigError(f"no sweep {self.resume_id} in {self.store.path}")
            if row.status == "running":
                raise ConfigError(f"sweep {row.id} is still running (in another process?)")
            self._sweep_id = row.id
            self.store.update_sweep(row.id, status="running")
        self.start(self._body)
        return self

    def _body(self) -> None:
        assert self._sweep_id is not None
        self.transition("running", phase="starting")
        try:
            if isinstance(self.spec, SweepSpec):
                self._sweep(self.spec)
            else:
                self._capacity(self.spec)
        except Exception as exc:  # noqa: BLE001 - every failure becomes the sweep's one-line reason
            reason = error_reason(exc)
            self.store.update_sweep(self._sweep_id, status="failed", result=self._result, error=reason)
            self.transition("failed", error=reason)
            return
        finally:
            self._release_engine()
        if self.cancel_event.is_set():
            self.store.update_sweep(self._sweep_id, status="cancelled", result=self._result, error="cancelled")
            self.transition("cancelled")
        else:
            self.store.update_sweep(self._sweep_id, status="completed", result=self._result)
            self.transition("completed", phase="done")

    def _engine_for(self, cfg: RunConfig) -> Engine | None:
        """The engine a run uses: the given one, or one started here per engine config."""
        if self.engine is not None:
            return self.engine
        key = repr(sorted(cfg.engine.items()))
        if self._owned is not None and self._owned[0] == key:
            return self._owned[1]
        self._release_engine()
        self.set_phase(f"starting the {cfg.engine_options.kind} engine")
        from bench.engine_host import make_engine

        engine = make_engine(cfg.engine_options)  # hosted where this process hosts models
        self._owned = (key, engine)  # stopped by _release_engine even when start fails half-way
        engine.start(lambda msg, frac: self.set_phase(f"engine: {msg}"))
        return engine

    def _release_engine(self) -> None:
        if self._owned is not None:
            _, engine = self._owned
            self._owned = None
            engine.stop()

    def _run(self, cfg: RunConfig, point: dict[str, Any]) -> RunRow:
        from bench.runner import start_run

        assert self._sweep_id is not None
        engine = self._engine_for(cfg)
        job = start_run(cfg, self.store, engine=engine, sweep_id=self._sweep_id, sweep_point=point)
        with self._lock:
            self._job, self._point = job, {k: v for k, v in point.items() if k != "repeat"}
        if self.on_run is not None:
            self.on_run(job)
        if self.cancel_event.is_set():
            job.cancel()
        job.wait()
        with self._lock:
            self._runs_done += 1
        run = self.store.get_run(job.run_id or 0)
        assert run is not None
        if run.status == "failed" and engine is not None and (down := engine.health()) is not None:
            # The engine itself is gone: every later point would fail the same way.
            raise MoEBenchError(f"the engine failed at {_label(point)} (run {run.id}): {down}")
        return run

    def _sweep(self, spec: SweepSpec) -> None:
        assert self._sweep_id is not None
        done: dict[tuple[str, int], RunRow] = {}
        for run in self.store.sweep_runs(self._sweep_id):  # a resumed sweep keeps what it finished
            if run.status == "completed" and run.sweep_point is not None:
                point = {k: v for k, v in run.sweep_point.items() if k != "repeat"}
                done[(point_key(point), int(run.sweep_point.get("repeat", 0)))] = run
        points = spec.points()
        stopped: dict[tuple[Any, ...], str] = {}
        history: dict[tuple[Any, ...], list[float]] = {}
        stop_reasons: list[dict[str, Any]] = []
        self._result = {"points": len(points), "kept": len(done), "stopped": stop_reasons}
        with self._lock:
            self._runs_done = len(done)
        for i, point in enumerate(points):
            line = spec.line_key(point)
            if line in stopped:
                continue
            rows: list[RunRow] = []
            for repeat in range(spec.repeats):
                if self.cancel_event.is_set():
                    return
                key = (point_key(point), repeat)
                if key in done:
                    rows.append(done[key])
                    continue
                self.report(f"point {i + 1}/{len(points)}: {_label(point)}", i / len(points))
                cfg = spec.run_config(point, repeat, i)
                rows.append(self._run(cfg, {**point, "repeat": repeat}))
                self.store.update_sweep(self._sweep_id, result=self._result)
            if self.cancel_event.is_set():
                return
            reason = self._stop_reason(spec, PointResult(point, rows), history.setdefault(line, []))
            if reason is not None and spec.load_axis is not None:
                stopped[line] = reason
                stop_reasons.append({"after": point, "reason": reason})
                self.set_phase(f"stopped a line after {_label(point)}: {reason}")
        self._result["stopped"] = stop_reasons

    @staticmethod
    def _stop_reason(spec: SweepSpec, res: PointResult, history: list[float]) -> str | None:
        """Why this point ends its line (None: go on); ``history`` holds the line's throughputs."""
        runs = res.runs
        if spec.stop_on_errors is not None:
            total = sum(r.summary.requests for r in runs if r.summary)
            failed = sum(r.summary.failed for r in runs if r.summary)
            bad = [r for r in runs if r.status == "failed"]
            if bad or (total and failed / total > spec.stop_on_errors):
                share = failed / total if total else 1.0
                first = bad[0].error if bad else None
                return f"errors: {share:.0%} of the requests failed" + (f" ({first})" if first else "")
        if spec.stop_on_slo_margin is not None:
            slos = parse_slos(spec.base.get("slos") or [])
            for s in res.summaries:
                for v in judge_summary(s.flat(), slos):
                    if v.margin is not None and v.margin > 1 + spec.stop_on_slo_margin:
                        return f"SLO broken by {v.margin - 1:.0%}: {v.text}"
        tput = res.mean("output_throughput_tok_s")
        if spec.stop_on_saturation is not None and tput is not None:
            best = max(history) if history else None
            history.append(tput)
            if best is not None and tput < best * (1 + spec.stop_on_saturation):
                return (
                    f"saturated: {tput:.1f} output tok/s is less than {spec.stop_on_saturation:.0%} above "
                    f"the line's best so far ({best:.1f})"
                )
        elif tput is not None:
            history.append(tput)
        return None

    def _capacity(self, spec: CapacitySpec) -> None:
        probes: list[_Probe] = []
        lo: float | None = None  # highest value that passed
        hi: float | None = None  # lowest value that failed
        res: dict[str, Any] = {"axis": spec.axis, "probes": [], "slos": spec.base.get("slos")}
        self._result = res

        def probe(value: float) -> bool:
            nonlocal lo, hi
            self.report(f"probe {len(probes) + 1}/{spec.budget}: {_axis_label(spec.axis, value)}", 0)
            run = self._run(spec.probe_config(value, len(probes)), {spec.axis: value})
            passed, why = probe_verdict(run, spec)
            probes.append(_Probe(value, run.id, passed, why))
            if passed:
                lo = value if lo is None else max(lo, value)
            else:
                hi = value if hi is None else min(hi, value)
            res["probes"] = [p.__dict__ for p in probes]
            res.update(passes_at=lo, fails_at=hi, runs=len(probes))
            assert self._sweep_id is not None
            self.store.update_sweep(self._sweep_id, result=res)
            return passed

        x = spec.start
        while len(probes) < spec.budget and not self.cancel_event.is_set():  # bracket: double until a fail
            if not probe(x) or x >= spec.maximum:
                break
            x = min(spec.maximum, x * 2)
        while (
            lo is not None and hi is not None and hi - lo > spec.step
            and len(probes) < spec.budget and not self.cancel_event.is_set()
        ):  # fmt: skip
            mid = _midpoint(lo, hi, spec)
            if mid is None:
                break
            probe(mid)
        res["verdict"] = capacity_text(spec, lo, hi, len(probes))
        res["converged"] = lo is not None and hi is not None and hi - lo <= spec.step
        self.set_phase(res["verdict"])


def _midpoint(lo: float, hi: float, spec: CapacitySpec) -> float | None:
    """A probe strictly between lo and hi on the step grid from lo, or None when there is none."""
    k = math.floor((hi - lo) / spec.step / 2) or 1
    mid = lo + k * spec.step
    if spec.axis == "concurrency":
        mid = float(int(mid))
    return mid if lo < mid < hi else None


def probe_verdict(run: RunRow, spec: CapacitySpec) -> tuple[bool, str]:
    """Whether a capacity probe passed (its exact SLO verdict, few enough failures), and why, in one line."""
    s = run.summary
    if run.status != "completed" or s is None:
        return False, f"run {run.status}: {run.error or 'no summary'}"
    if s.requests and s.failed / s.requests > spec.max_error_rate:
        return False, f"{s.failed}/{s.requests} requests failed"
    verdicts = judge_summary(s.flat(), parse_slos(s.slos or ()))
    shown = [v for v in verdicts if not v.ok] if not s.slo_met else verdicts
    return bool(s.slo_met), "; ".join(v.text for v in shown) or ("SLOs met" if s.slo_met else "SLOs not met")


def capacity_text(spec: CapacitySpec, lo: float | None, hi: float | None, runs: int) -> str:
    """The search's result in one line."""
    what = "request rate" if spec.axis == "rate" else "concurrency"
    if lo is None and hi is not None:
        return f"fails at the lowest probe ({_axis_label(spec.axis, hi)}); {runs} run(s)"
    if lo is None:
        return f"no probe finished; {runs} run(s)"
    if hi is None:
        return f"passes up to {_axis_label(spec.axis, lo)} (the highest probed); {runs} run(s)"
    return (
        f"highest {what} within the SLOs: passes at {_axis_label(spec.axis, lo)}, "
        f"fails at {_axis_label(spec.axis, hi)}; {runs} run(s)"
    )


def _axis_label(axis: str, value: float) -> str:
    return f"{value:g} req/s" if axis in ("rate", "request_rate") else f"concurrency {int(value)}"


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in point.items() if k != "repeat")

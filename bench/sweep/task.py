"""Sweeps and capacity searches running: :class:`SweepTask` (a :class:`bench.run.task.BackgroundTask`),
which the CLI and the dashboard drive the same way. A sweep interrupted (Ctrl-C, a killed process)
keeps its finished runs; resuming it skips every (point, repeat) that has a completed run and runs the rest."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from bench.config import RunConfig
from bench.metrics.slo import judge_summary, parse_slos
from bench.run.job import Job
from bench.run.task import BackgroundTask, error_reason
from bench.store import Store
from bench.store.rows import RunRow
from bench.sweep.spec import CapacitySpec, PointResult, SweepSpec, axis_label, point_key
from engines.base import Engine
from engines.errors import ConfigError, MoEBenchError


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
        from bench.run.engine_host import make_engine

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
        from bench.run.manager import start_run

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
    what = {"rate": "request rate", "speedup": "trace replay speed"}.get(spec.axis, "concurrency")
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
    return axis_label(axis, value)


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in point.items() if k != "repeat")

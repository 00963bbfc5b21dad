"""Executing a run in the background: latency, concurrency and profile modes.

:func:`execute` is the worker of a :class:`~bench.run.job.Job` (started by
:func:`bench.run.manager.start_run`): it loads the engine (unless a started one is passed in),
builds the prompts and drives the measuring path, one job per module:

    schedule (when each request is due) -> sender (one asyncio loop; sender processes
    for HTTP engines) -> recorder (batched writes, running accumulators) -> job (status)

The caller polls ``job.snapshot()`` and may ``job.cancel()``: no new request starts,
in-flight requests end at their next token, and the run is recorded as ``cancelled``
with what it measured.

Modes:
- ``latency`` (seed 8.1.1 ``benchmark_latency``): sequential requests.
- ``concurrency`` (seed 8.4.1): at most ``concurrency`` in flight; a closed loop, or with
  ``request_rate`` an open loop of gamma arrivals (see :mod:`bench.send.schedule`).
  Throughput is tokens over wall-clock time, never over summed latencies.
- ``profile`` (seed 8.1.1 ``profile_inference``): a short concurrency run under the
  engine's profiler; the operator table, the breakdown and the trace file are stored.

Every mode first sends ``warmup`` unrecorded requests through the sending loop's own
session, up to the run's concurrency at once (bench.send.core.warm_up); the clock starts
after them and the first wave leaves together. Engines that see their MoE gates (native) also store expert
routing counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.config import RunConfig
from bench.metrics.confidence import stop_fields
from bench.metrics.cpu_limits import measure_cpu
from bench.metrics.enrich import enrich
from bench.metrics.summary import summarize
from bench.run.artifacts import (
    ARTIFACT_BREAKDOWN,
    ARTIFACT_CLIENT_CPU,
    ARTIFACT_COMMUNICATION,
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_ENERGY,
    ARTIFACT_GC,
    ARTIFACT_LIMITS,
    ARTIFACT_LOAD_GENERATORS,
    ARTIFACT_OPERATORS,
    ARTIFACT_PREPARE,
    ARTIFACT_ROUTING,
    ARTIFACT_ROUTING_ERROR,
)
from bench.run.gc_watch import GcWatch
from bench.run.host_load import disturbance
from bench.run.job import Job
from bench.run.recorder import (
    SERIES_MEM_PEAK,
    Recorder,
    Sampler,
)
from bench.run.task import error_reason
from bench.send import make_sender
from bench.send.cpu_wait import starved
from bench.send.schedule import strategy_for
from bench.store import Store
from bench.workloads import RequestSource, build_requests, request_source
from engines.accelerators import GIB
from engines.base import SERIES_PREFIX_HITS, SERIES_PREFIX_QUERIES, Engine, create_engine
from engines.profiling import NO_BREAKDOWN_NOTE
from engines.routing import served_record
from engines.settings import get_settings


class _Cancelled(Exception):
    pass


def execute(job: Job, engine: Engine | None, owns_engine: bool) -> None:
    cfg, store, run_id = job.config, job.store, job.run_id
    assert run_id is not None
    try:
        if engine is None:
            job.transition("loading", phase="loading model")
            engine = create_engine(cfg.engine_options)
            engine.start(lambda msg, frac: job.set_phase(f"loading: {msg}"))
        info = {**engine.describe(), "host": socket.gethostname()}  # the host that measured (bench.metrics.run_limits)
        store.set_engine_info(run_id, info, model=info.get("model"))
        if job.cancel_event.is_set():
            raise _Cancelled
        job.set_phase("building prompts")
        sampling = cfg.sampling()
        tok = engine.tokenizer()
        # Prompts are built a block at a time as the run reads them (the first block now):
        # the first request leaves at once whatever the count, and memory stays flat.
        context = engine.context_length()
        requests: Sequence[Any] = request_source(cfg.workload, cfg.requests, sampling, tok, context_len=context)
        # The warm-up's prompts differ from the run's (another seed): a prefix cache it warms
        # must not serve the first measured request.
        warm_spec = cfg.workload.model_copy(update={"seed": (cfg.workload.seed + 2**30 + 12345) % 2**31})
        warmup = build_requests(warm_spec, cfg.warmup, sampling, tok, prefix="warmup") if cfg.warmup else []
        if cfg.mode == "profile":
            _profile(job, engine, requests, warmup)
        else:
            _measure(job, engine, requests, warmup)
        _store_routing(store, run_id, engine, job)
        if (comm := engine.communication()) is not None:
            store.put_artifact(run_id, ARTIFACT_COMMUNICATION, comm)
        _finish(job, engine)
    except _Cancelled:
        store.finish_run(run_id, "cancelled", error="cancelled before any request was sent")
        job.transition("cancelled")
    except Exception as exc:  # noqa: BLE001 - every failure becomes the run's one-line reason
        reason = error_reason(exc)
        records = job.records()
        summary = summarize(records, max_concurrency=cfg.concurrency, slos=cfg.slos, **_load(cfg)) if records else None
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job.set_summary(summary)
        job.transition("failed", error=reason)
    finally:
        if owns_engine and engine is not None:
            try:
                engine.stop()
            except Exception as exc:  # noqa: BLE001 - report, but keep what was measured
                job.set_phase(f"engine stop failed: {exc}")


def _store_routing(store: Store, run_id: int, engine: Engine, job: Job) -> None:
    """The run's routing record: the engine's own (native: its gate hooks), else the one summed
    from what the server reported with each request (engines.routing.served_record)."""
    routing = engine.expert_routing()
    served = job.served_routing
    if routing is None and served is not None and served[0] is not None:
        phases, windows, requests, error = served
        layout = engine.routing_layout() or {}
        routing = served_record(phases, layout, windows, requests)
        if error:
            routing["error"] = error
    elif routing is None and served is not None and served[3]:
        routing = {"error": served[3]}  # every payload was bad: say so, keep the run
    if routing is not None and "counts" in routing:
        store.put_artifact(run_id, ARTIFACT_ROUTING, routing)
    elif routing is not None:
        store.put_artifact(run_id, ARTIFACT_ROUTING_ERROR, routing)


def _profile(job: Job, engine: Engine, requests: Sequence[Any], warmup: list[Any]) -> None:
    """The measured phase under the engine's profiler (entered after the warm-up)."""
    store, run_id = job.store, job.run_id
    assert run_id is not None
    # Beside the store the run belongs to, named after it: runs of two stores never share a trace.
    trace = store.path.parent / "traces" / f"{store.path.stem}-run{run_id}.trace.json"
    session = engine.profiler(trace, with_stack=job.config.profile_with_stack)
    if hasattr(session, "on_step"):
        session.on_step = lambda step: job.set_phase(f"analysing the profile: {step}")
    with contextlib.ExitStack() as stack:

        def enter() -> None:
            job.set_phase("profiling")
            stack.enter_context(session)

        _measure(job, engine, requests, warmup, before_start=enter)
        if job.status != "running":
            return
        job.set_phase("analysing the profile")
    res = session.result
    if res is not None:
        if res.operators:
            store.put_artifact(run_id, ARTIFACT_OPERATORS, res.operators)
        if res.breakdown and res.total_ms > 0:
            store.put_artifact(
                run_id, ARTIFACT_BREAKDOWN, {"rows": res.breakdown, "basis": res.time_basis, "total_ms": res.total_ms}
            )
        elif res.breakdown:  # scopes classified nothing: say why rather than show nine 0 % bars
            store.put_artifact(run_id, ARTIFACT_BREAKDOWN, {"rows": [], "basis": None, "total_ms": 0.0,
                                                            "note": NO_BREAKDOWN_NOTE})  # fmt: skip
        if res.trace_path:
            why = store.adopt_trace(run_id, res.trace_path)  # a vLLM server's trace is copied beside the store
            if why:
                job.set_phase(why)


PREPARE_SAMPLE = 256  # requests whose lengths the engine prepares for (the first block is built already)


def _prepare_engine(job: Job, engine: Engine, requests: Sequence[Any]) -> None:
    """Let the engine get ready before the clock (:meth:`engines.base.Engine.prepare`: the native
    engine compiles and captures its decode step for the batch sizes the run can form); what it
    did is the run's ``engine_prepare`` artifact and its engine info is read again after it."""
    cfg, store, run_id = job.config, job.store, job.run_id
    assert run_id is not None
    if engine.describe().get("accelerator") == "cpu":
        # The run's hardware limits on a CPU need this machine's measured bandwidth (about 1 s,
        # then kept for a week): measured now, before the clock, not after the last request,
        # where it held up the first run's end (and a Stop's "cancelled") by a second.
        job.set_phase("measuring this CPU's bandwidth (once)")
        measure_cpu()
    sample = [requests[i] for i in range(min(len(requests), PREPARE_SAMPLE))]
    t0 = time.perf_counter()
    line = engine.prepare(sample, cfg.concurrency, job.set_phase)
    if line is None:
        return
    store.put_artifact(run_id, ARTIFACT_PREPARE, {"text": line, "seconds": round(time.perf_counter() - t0, 3)})
    info = {**engine.describe(), "host": socket.gethostname()}
    store.set_engine_info(run_id, info, model=info.get("model"))
    job.set_phase(line)


def _measure(
    job: Job,
    engine: Engine,
    requests: Sequence[Any],
    warmup: list[Any],
    before_start: Callable[[], None] | None = None,
) -> None:
    """Warm up, then send every request on the run's schedule and record what comes back."""
    cfg, store, run_id = job.config, job.store, job.run_id
    assert run_id is not None
    strategy = strategy_for(
        cfg.mode,
        len(requests),
        cfg.concurrency,
        cfg.request_rate,
        cfg.burstiness,
        cfg.workload.seed,
        cfg.duration_s,
        cfg.ramp_up_s,
        getattr(requests, "arrivals", None),
    )
    if strategy.max_requests is not None and strategy.max_requests < len(requests):
        requests = requests[: strategy.max_requests]  # arrivals past a duration's end
    if isinstance(requests, RequestSource):
        requests.read_ahead = True  # the next block is built while this one is sent
    sender = make_sender(engine, cfg.workers, cfg.ray_address)

    def unhealthy(reason: str) -> None:
        job.set_error(reason)
        job.cancel_event.set()

    def tick(elapsed: float) -> None:
        live = recorder.live().summary  # the frame the job's snapshots show
        if live is not None:  # stored: a run killed mid-way keeps what it had measured
            store.set_summary(run_id, live)

    recorder = Recorder(
        store,
        run_id,
        tokenizer=engine.tokenizer(),
        slos=cfg.slos,
        until_ci=cfg.until_ci,
        on_enough=getattr(sender, "stop_sending", None),
    )
    sampler = Sampler(
        engine,
        store,
        run_id,
        cfg.sample_interval_s,
        sender.live,
        recorder,
        cfg.server_metrics,
        tick,
        unhealthy,
        devices=_device_sources(cfg, store, run_id),
    )
    recorder.on_failure = sampler.poke
    recorder.summary_fields = {"max_concurrency": cfg.concurrency, **_load(cfg)}
    job.attach_recorder(recorder.records, recorder.live, lambda: sender.live()[1])
    started = False
    gc_watch = GcWatch()

    def prepare() -> None:
        # The warm-up's memory peak and expert routing are not the run's.
        engine.reset_peak_memory()
        engine.reset_expert_routing()
        engine.reset_communication()
        engine.begin_window()
        sampler.first_points()  # t = 0: after the warm-up, so server counters start from here
        _name_devices(store, run_id, sampler.device_names)  # the sidebar names them during the run
        if before_start is not None:
            before_start()
        # Threads start before the clock does, so the first wave is not held up by them.
        recorder.start()
        sampler.start()
        # the heap so far collected and frozen: no full collection walks the model mid-run
        gc_watch.start(freeze=get_settings().gc_freeze != "off")

    def on_start(t0: float) -> None:
        nonlocal started
        started = True
        recorder.t0 = t0
        gc_watch.t0 = t0
        sampler.begin(t0)
        job.transition("running", t0=t0)

    _prepare_engine(job, engine, requests)
    job.set_phase(f"warm-up ({cfg.warmup} request{'s' if cfg.warmup != 1 else ''})" if cfg.warmup else "starting")
    try:
        sender.run(strategy, requests, warmup, job.cancel_event, recorder.put, prepare, on_start)
    finally:
        t_end = time.perf_counter()
        gc_watch.stop()
        sampler.stop(t_end if started else None)
        recorder.close()
        if started:
            store.put_artifact(run_id, ARTIFACT_GC, gc_watch.as_dict())
            job.client_cpu = sender.cpu
            if sender.cpu is not None:
                store.put_artifact(run_id, ARTIFACT_CLIENT_CPU, sender.cpu)
        if getattr(sender, "placement", None):
            store.put_artifact(
                run_id, ARTIFACT_LOAD_GENERATORS, {"ray_address": cfg.ray_address, "actors": sender.placement}
            )
        job.write_error = recorder.write_error
        job.stop_met_at = recorder.stop_watch.met_at if recorder.stop_watch is not None else None
        job.served_routing = (recorder.routing_phases, recorder.routing_windows, recorder.routing_requests,
                              recorder.routing_error)  # fmt: skip
        job.host = (sampler.host_means(), sampler.busiest)
        job.devices = sampler.device_means()
        job.server_device_peak_gib = sampler.server_device_peak_gib
        _name_devices(store, run_id, sampler.device_names)
        if sampler.devices and (unread := sampler.device_errors()):
            found = store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY) or {}
            missing = [*found.get("missing", []), *unread]
            store.put_artifact(run_id, ARTIFACT_DEVICE_TELEMETRY, {**found, "missing": missing})
    if not started:
        raise _Cancelled


def _name_devices(store: Store, run_id: int, names: dict[str, str]) -> None:
    """Add the devices read so far (``dev0: NVIDIA H200 (nvml)``) to the ``device_telemetry`` artifact."""
    found = store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY)
    if not names or not isinstance(found, dict):
        return
    devices = [f"{prefix}: {name}" for prefix, name in names.items()]
    if found.get("devices") != devices:
        store.put_artifact(run_id, ARTIFACT_DEVICE_TELEMETRY, {**found, "devices": devices})


def _device_sources(cfg: RunConfig, store: Store, run_id: int) -> list[Any]:
    """The run's device telemetry sources (engines.telemetry.detect); what was found and what
    is missing (one line each) is stored as the run's ``device_telemetry`` artifact."""
    if not cfg.device_telemetry and not cfg.telemetry_urls:
        return []
    from engines.telemetry import detect

    sources, missing = detect(cfg.engine_options.accelerator, cfg.telemetry_urls, local=cfg.device_telemetry)
    found = [{"source": type(s).__name__, "name": s.name} for s in sources]
    store.put_artifact(run_id, ARTIFACT_DEVICE_TELEMETRY, {"sources": found, "missing": missing})
    return sources


def _load(cfg: RunConfig) -> dict[str, Any]:
    return {"request_rate": cfg.request_rate, "burstiness": cfg.burstiness}


def _prefix_cache_hit_rate(store: Store, run_id: int) -> float | None:
    """Prompt tokens the server's prefix cache served / prompt tokens it looked up, over the
    run (its cumulative counters at the start and the end); None when it reports none."""
    series: dict[str, list[float]] = {SERIES_PREFIX_QUERIES: [], SERIES_PREFIX_HITS: []}
    for _, name, value in store.timeseries(run_id, list(series)):
        if value is not None:
            series[name].append(value)
    queries, hits = series[SERIES_PREFIX_QUERIES], series[SERIES_PREFIX_HITS]
    if len(queries) < 2 or len(hits) < 2 or queries[-1] - queries[0] <= 0:
        return None
    return max(0.0, min(1.0, (hits[-1] - hits[0]) / (queries[-1] - queries[0])))


def _measured_peak(store: Store, run_id: int, engine: Engine) -> float | None:
    """The run's peak memory (GiB): the highest peak sampled from the start to the end of the
    measured phase, so the headline is a point on the memory timeline (a profile's analysis,
    after the requests, no longer inflates it). The engine's own figure when none was sampled."""
    peaks = [v for _, _, v in store.timeseries(run_id, [SERIES_MEM_PEAK]) if v is not None]
    if peaks:
        return max(peaks)
    mem = engine.memory()
    return mem.peak_bytes / GIB if mem else None


def _finish(job: Job, engine: Engine) -> None:
    """Summarize what was measured and close the run with its final status."""
    cfg, store, run_id = job.config, job.store, job.run_id
    assert run_id is not None
    records = job.records()
    # First request sent -> last request finished (warm-up excluded).
    summary = summarize(
        records,
        peak_memory_gib=_measured_peak(store, run_id, engine),
        max_concurrency=cfg.concurrency,
        slos=cfg.slos,
        prefix_cache_hit_rate=_prefix_cache_hit_rate(store, run_id),
        **_load(cfg),
    )
    held = (summary.load_warning, starved(job.client_cpu, summary.duration_s), engine.window_warning())
    # what held the run up besides the server's own work: the client, or a compile mid-run
    held_up = "; ".join(w for w in held if w) or None
    if job.host is not None:
        means, busiest = job.host
        reason = disturbance(means["other_cpu_cores"], means["steal_pct"], held_up, busiest)
        summary = dataclasses.replace(summary, **means, disturbance=reason)
    elif held_up and held_up != summary.load_warning:
        summary = dataclasses.replace(summary, disturbance=held_up)
    if job.devices:
        summary = dataclasses.replace(summary, **job.devices)
    if job.server_device_peak_gib is not None:
        # A server launched here on an accelerator: its own device memory is the run's memory
        # (its process tree's RSS, the fallback, holds none of its weights or KV cache).
        summary = dataclasses.replace(summary, peak_memory_gib=job.server_device_peak_gib)
    run = store.get_run(run_id)
    if run is not None:  # made whole as every summary is: limits, MoE, speculation, energy, per accelerator
        done = enrich(summary, store.run_inputs(run))
        store.put_artifact(run_id, ARTIFACT_LIMITS, done.limits)
        store.put_artifact(run_id, ARTIFACT_ENERGY, done.energy)
        summary = done.summary
    if cfg.until_ci:
        summary = dataclasses.replace(summary, **stop_fields(cfg.until_ci, records, job.stop_met_at))
    job.set_summary(summary)
    engine_error = job.error
    if job.write_error is not None:
        # The summary counts every request; the store's per-request table lacks some.
        reason = f"{job.write_error} (the summary counts them; the per-request table lacks them)"
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job.transition("failed", error=reason)
        return
    if engine_error is None and summary.failed:
        # Requests failing fast (connection refused) can end a run before the sampler's next
        # health poll: ask once more, so a dead server fails the run instead of "completing" it.
        try:
            engine_error = engine.health()
        except Exception as exc:  # noqa: BLE001 - a broken health probe is itself the reason
            engine_error = f"health check failed: {type(exc).__name__}: {exc}"
    if engine_error is not None:
        reason = f"engine failed during the run: {engine_error}"
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job.transition("failed", error=reason)
    elif job.cancel_event.is_set():
        store.finish_run(run_id, "cancelled", summary=summary, error="cancelled by the user")
        job.transition("cancelled")
    elif summary.completed == 0:
        first = next((r.error for r in records if r.error), "no request completed")
        reason = f"every request failed; first error: {first}"
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job.transition("failed", error=reason)
    else:
        store.finish_run(run_id, "completed", summary=summary)
        job.transition("completed")

"""Benchmark runs in the background: latency and concurrency modes.

``start_run(config)`` returns a :class:`Job` at once; a worker thread loads the
engine (unless a started one is passed in), sends the requests, and writes every
finished request and a per-second time series to the store as they happen. The
caller polls ``job.snapshot()`` (an immutable :class:`JobSnapshot`) and may
``job.cancel()``: no new request starts, in-flight requests stop at their next
token, and the run is recorded as ``cancelled`` with what it measured.

Modes:
- ``latency`` (seed 8.1.1 ``benchmark_latency``): ``warmup`` unrecorded requests,
  then ``requests`` sequential requests.
- ``concurrency`` (seed 8.4.1): ``requests`` requests with at most ``concurrency``
  in flight; throughput is tokens over wall-clock time, not over summed latencies.
  By default a closed loop (each slot sends its next request when the last ends);
  with ``request_rate`` an open loop of Poisson/gamma arrivals capped at
  ``concurrency`` in flight (see :mod:`bench.load`). Every request records its send
  lag (actual minus due send time).
- ``profile`` (seed 8.1.1 ``profile_inference``): a short concurrency run under the
  engine's profiler; the operator table, the bottleneck breakdown and the trace file
  are stored with the run.

Engines that see their MoE gates (native) also store expert routing counts.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bench.load import arrival_offsets
from bench.metrics import RequestRecord, RunSummary, summarize
from bench.store import Store
from bench.workloads import WorkloadSpec, build_requests
from engines.accelerators import GIB
from engines.base import (
    Engine,
    EngineOptions,
    GenerationRequest,
    SamplingParams,
    create_engine,
    parse_options,
    timed_astream,
    timed_stream,
)
from engines.errors import ConfigError, MoEBenchError
from engines.settings import get_settings

Mode = Literal["latency", "concurrency", "profile"]
MODES: tuple[str, ...] = ("latency", "concurrency", "profile")

# Artifact names in the store
ARTIFACT_OPERATORS = "profile_operators"
ARTIFACT_BREAKDOWN = "profile_breakdown"
ARTIFACT_TRACE = "profile_trace"
ARTIFACT_ROUTING = "expert_routing"

# Live series written about once a second (names in the store's time series table).
SERIES_OUTPUT_TOK_S = "output_tok_s"
SERIES_IN_FLIGHT = "in_flight"
SERIES_DONE = "requests_done"
SERIES_MEM_ALLOCATED = "mem_allocated_gib"
SERIES_MEM_RESERVED = "mem_reserved_gib"
SERIES_MEM_PEAK = "mem_peak_gib"

FIRST_SAMPLE_S = 0.25  # the live series' first sample, seconds after the start
SENDER_SWITCH_INTERVAL_S = 0.0005  # the GIL switch interval while a run measures (see _measure)


class RunConfig(BaseModel):
    """Everything that defines a run; stored with it as JSON."""

    model_config = ConfigDict(extra="forbid")

    engine: dict[str, Any] = Field(default_factory=lambda: {"kind": "native"})
    mode: Mode = "concurrency"
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    requests: int = Field(8, ge=1, le=1_000_000)
    concurrency: int = Field(1, ge=1, le=4096)
    warmup: int = Field(0, ge=0, le=1000)
    # Open loop: arrivals per second (None: closed loop) and the gamma shape of the gaps.
    request_rate: float | None = Field(None, gt=0.0, le=1_000_000.0)
    burstiness: float = Field(1.0, gt=0.0, le=1000.0)
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    ignore_eos: bool = True
    name: str = ""
    sample_interval_s: float = Field(1.0, gt=0.0, le=60.0)
    # Scrape the engine's own metrics (vLLM/Triton /metrics) once a second. Each scrape costs
    # the server CPU (about 15 ms on the vLLM CPU server), which off avoids.
    server_metrics: bool = True
    profile_with_stack: bool = True  # profile mode: Python stacks per op (slower to analyse)

    @field_validator("engine")
    @classmethod
    def _engine_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        return parse_options(v).model_dump()

    @model_validator(mode="after")
    def _latency_is_sequential(self) -> RunConfig:
        if self.mode == "latency":
            if self.request_rate is not None:
                raise ValueError(
                    "request_rate applies to concurrency and profile runs; a latency run sends one request at a time"
                )
            self.concurrency = 1
        return self

    @classmethod
    def build(cls, **data: Any) -> RunConfig:
        """Validate, turning pydantic errors into one-line :class:`ConfigError`."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                loc = ".".join(str(x) for x in err["loc"]) or "config"
                parts.append(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}")
            raise ConfigError("; ".join(parts)) from exc

    @property
    def engine_options(self) -> EngineOptions:
        return parse_options(self.engine)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.workload.output_len,
            temperature=self.temperature,
            top_p=self.top_p,
            ignore_eos=self.ignore_eos,
            seed=self.workload.seed if self.temperature > 0 else None,
        )


@dataclass(frozen=True)
class JobSnapshot:
    """What a job looks like at one moment; safe to hand to any thread."""

    job_id: str
    run_id: int | None
    status: str  # pending | loading | running | completed | failed | cancelled
    phase: str
    done: int
    total: int
    failed: int
    in_flight: int
    elapsed_s: float
    error: str | None
    summary: RunSummary | None
    mode: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.status in ("pending", "loading", "running")

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


class Job:
    """A run in progress. Only the worker thread writes; snapshots are immutable copies."""

    def __init__(self, config: RunConfig, store: Store) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.config = config
        self.store = store
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._status = "pending"
        self._phase = "queued"
        self._run_id: int | None = None
        self._done = 0
        self._failed = 0
        self._in_flight = 0
        self._tokens = 0
        self._t0: float | None = None
        self._created = time.perf_counter()
        self._error: str | None = None
        self._summary: RunSummary | None = None
        self._records: list[RequestRecord] = []
        self.thread: threading.Thread | None = None

    # --- caller side ------------------------------------------------------------------
    def snapshot(self) -> JobSnapshot:
        with self._lock:
            elapsed = time.perf_counter() - (self._t0 or self._created)
            return JobSnapshot(
                job_id=self.id,
                run_id=self._run_id,
                status=self._status,
                phase=self._phase,
                done=self._done,
                total=self.config.requests,
                failed=self._failed,
                in_flight=self._in_flight,
                elapsed_s=elapsed if self._status in ("loading", "running") else self._final_elapsed(elapsed),
                error=self._error,
                summary=self._summary,
                mode=self.config.mode,
                config=self.config.model_dump(),
            )

    def _final_elapsed(self, elapsed: float) -> float:
        return self._summary.duration_s if self._summary else elapsed

    def cancel(self) -> None:
        self.cancel_event.set()

    def wait(self, timeout: float | None = None) -> JobSnapshot:
        self._finished.wait(timeout)
        return self.snapshot()

    @property
    def run_id(self) -> int | None:
        return self._run_id

    # --- worker side ------------------------------------------------------------------
    def _set(self, **kw: Any) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, f"_{k}", v)

    def _partial_summary(self) -> RunSummary | None:
        with self._lock:
            records = list(self._records)
        if not records or self._t0 is None:
            return None
        cfg = self.config
        return summarize(
            records,
            duration_s=time.perf_counter() - self._t0,
            max_concurrency=cfg.concurrency,
            request_rate=cfg.request_rate,
            burstiness=cfg.burstiness,
        )


def _record(req: GenerationRequest, res: Any, t0: float, due: float | None = None) -> RequestRecord:
    """The request's record, times relative to ``t0``; ``due`` is when it should have been sent."""
    return RequestRecord(
        request_id=req.request_id,
        start_s=res.start - t0,
        end_s=res.end - t0,
        chunk_times_s=[c.t - t0 for c in res.chunks],
        prompt_tokens=int(res.prompt_tokens or 0),
        output_tokens=res.output_tokens,
        error=res.error,
        usage_output_tokens=res.usage_output_tokens,
        first_any_token_s=None if res.first_any is None else res.first_any - t0,
        send_lag_ms=None if due is None else max(0.0, res.start - due) * 1000.0,
    )


def _execute(job: Job, engine: Engine | None, owns_engine: bool) -> None:
    cfg = job.config
    store = job.store
    run_id = job._run_id
    assert run_id is not None
    try:
        if engine is None:
            job._set(status="loading", phase="loading model")
            engine = create_engine(cfg.engine_options)

            def progress(msg: str, frac: float) -> None:
                job._set(phase=f"loading: {msg}")

            engine.start(progress)
        info = engine.describe()
        store.set_engine_info(run_id, info, model=info.get("model"))
        if job.cancel_event.is_set():
            raise _Cancelled
        job._set(phase="building prompts")
        sampling = cfg.sampling()
        requests = build_requests(cfg.workload, cfg.requests, sampling, engine.tokenizer())
        if cfg.warmup:
            job._set(phase=f"warm-up ({cfg.warmup} requests)")
            warm = build_requests(cfg.workload, cfg.warmup, sampling, engine.tokenizer(), prefix="warmup")
            for req in warm:
                if job.cancel_event.is_set():
                    raise _Cancelled
                res = timed_stream(engine, req, job.cancel_event)
                if res.error and not job.cancel_event.is_set():
                    raise MoEBenchError(f"warm-up request failed: {res.error}")
        engine.reset_peak_memory()
        engine.reset_expert_routing()
        if cfg.mode == "profile":
            trace = get_settings().data_dir / "traces" / f"run{run_id}.trace.json"
            session = engine.profiler(trace, with_stack=cfg.profile_with_stack)
            job._set(phase="profiling")
            with session:
                _measure(job, engine, requests, finish=False)
            job._set(phase="analysing the profile")
            res = session.result
            if res is not None:
                if res.operators:
                    store.put_artifact(run_id, ARTIFACT_OPERATORS, res.operators)
                if res.breakdown:
                    breakdown = {"rows": res.breakdown, "basis": res.time_basis, "total_ms": res.total_ms}
                    store.put_artifact(run_id, ARTIFACT_BREAKDOWN, breakdown)
                if res.trace_path:
                    store.put_artifact(run_id, ARTIFACT_TRACE, {"path": res.trace_path})
            _store_routing(store, run_id, engine)
            _finish(job, engine)
        else:
            _measure(job, engine, requests)
            _store_routing(store, run_id, engine)
    except _Cancelled:
        store.finish_run(run_id, "cancelled", error="cancelled before any request was sent")
        job._set(status="cancelled", phase="cancelled")
    except Exception as exc:  # noqa: BLE001 - every failure becomes the run's one-line reason
        reason = str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}"
        reason = " ".join(reason.split())
        summary = job._partial_summary()
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job._set(status="failed", phase="failed", error=reason, summary=summary)
    finally:
        if owns_engine and engine is not None:
            try:
                engine.stop()
            except Exception as exc:  # noqa: BLE001 - report, but keep what was measured
                job._set(phase=f"engine stop failed: {exc}")
        job._finished.set()


class _Cancelled(Exception):
    pass


def _store_routing(store: Store, run_id: int, engine: Engine) -> None:
    routing = engine.expert_routing()
    if routing is not None:
        store.put_artifact(run_id, ARTIFACT_ROUTING, routing)


def _measure(job: Job, engine: Engine, requests: list[GenerationRequest], finish: bool = True) -> None:
    cfg = job.config
    store = job.store
    run_id = job._run_id
    assert run_id is not None
    # Items are (seq, request, due offset from t0 or None: due when the slot frees).
    # A closed loop queues every request up front, then one end mark per slot; an open loop
    # queues nothing: its dispatcher adds each request at its due time.
    offsets: list[float] | None = None
    upfront: list[tuple[int, GenerationRequest, float | None] | None] = []
    if cfg.request_rate is not None:
        offsets = arrival_offsets(len(requests), cfg.request_rate, cfg.burstiness, seed=cfg.workload.seed)
    else:
        upfront = [(seq, req, None) for seq, req in enumerate(requests)] + [None] * cfg.concurrency
    todo: queue.Queue[tuple[int, GenerationRequest, float | None] | None] = queue.Queue()
    token_lock = threading.Lock()
    stop_sampler = threading.Event()
    # Every sending thread is started and parked before the clock starts, so the first
    # wave leaves together (as one asyncio client's would) instead of trickling out while
    # busy threads hold the GIL; t0 is stamped just before they are released.
    go = threading.Event()
    # The asyncio sender sets this once its session is open (aopen: imports, a warm-up round
    # trip), so that set-up is not counted as the first wave's send lag.
    loop_ready = threading.Event()
    t0 = time.perf_counter()  # provisional; the real start is stamped below, before `go`

    def on_chunk(chunk: Any) -> None:
        with token_lock:
            job._tokens += chunk.tokens

    def started() -> None:
        with job._lock:
            job._in_flight += 1

    def complete(seq: int, req: GenerationRequest, res: Any, due: float) -> bool:
        """Record one finished request; True when the engine should be checked for health."""
        rec = _record(req, res, t0, due)
        store.add_sample(run_id, seq, rec)
        with job._lock:
            job._in_flight -= 1
            job._records.append(rec)
            job._done += 1
            job._failed += 0 if rec.ok else 1
        # A failed request may mean the engine died: stop sending more if it did.
        return not rec.ok and not job.cancel_event.is_set()

    def check_health() -> None:
        reason = engine.health()
        if reason is not None:
            job._set(error=reason)
            job.cancel_event.set()

    def dispatcher() -> None:
        """Open loop: hand each request to the slots at its due time."""
        assert offsets is not None
        go.wait()
        try:
            for seq, (req, offset) in enumerate(zip(requests, offsets, strict=True)):
                delay = t0 + offset - time.perf_counter()
                if delay > 0 and job.cancel_event.wait(delay):
                    return
                if job.cancel_event.is_set():
                    return
                todo.put((seq, req, offset))
        finally:
            for _ in range(cfg.concurrency):
                todo.put(None)

    def worker() -> None:
        go.wait()
        free_since = t0  # closed loop: a request is due when its slot frees
        while not job.cancel_event.is_set():
            item = todo.get()
            if item is None or job.cancel_event.is_set():
                return
            seq, req, offset = item
            started()
            res = timed_stream(engine, req, job.cancel_event, on_chunk)
            if complete(seq, req, res, free_since if offset is None else t0 + offset):
                check_health()
            free_since = res.end

    async def send_async() -> None:
        """The same slots and dispatcher as coroutines on one event loop (engines with
        ``astream``): no thread per in-flight request, so the client costs less CPU and
        no GIL hand-offs sit between a chunk's arrival and its timestamp."""
        slots: asyncio.Queue[tuple[int, GenerationRequest, float | None] | None] = asyncio.Queue()
        for item in upfront:
            slots.put_nowait(item)

        async def a_dispatcher() -> None:
            assert offsets is not None
            try:
                for seq, (req, offset) in enumerate(zip(requests, offsets, strict=True)):
                    delay = t0 + offset - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if job.cancel_event.is_set():
                        return
                    slots.put_nowait((seq, req, offset))
            finally:
                for _ in range(cfg.concurrency):
                    slots.put_nowait(None)

        async def a_worker() -> None:
            free_since = t0
            while not job.cancel_event.is_set():
                item = await slots.get()
                if item is None or job.cancel_event.is_set():
                    return
                seq, req, offset = item
                started()
                res = await timed_astream(engine, req, job.cancel_event, on_chunk)
                if complete(seq, req, res, free_since if offset is None else t0 + offset):
                    await asyncio.to_thread(check_health)
                free_since = res.end

        try:
            await engine.aopen()
        finally:
            loop_ready.set()
        try:
            go.wait()  # nothing else runs on this loop yet
            tasks = [asyncio.create_task(a_worker()) for _ in range(cfg.concurrency)]
            if offsets is not None:
                tasks.append(asyncio.create_task(a_dispatcher()))
            watch = asyncio.gather(*tasks, return_exceptions=True)
            # A cancel reaches requests waiting on a silent server too: their tasks are
            # cancelled, and each ends as a "cancelled" request (see timed_astream).
            while not watch.done():
                await asyncio.wait([watch], timeout=0.05)
                if job.cancel_event.is_set() and not watch.done():
                    for task in tasks:
                        task.cancel()
                    await asyncio.wait([watch])
            for out in watch.result():
                if isinstance(out, Exception):
                    raise out
        finally:
            await engine.aclose()

    def sampler() -> None:
        last_t, last_tokens = t0, 0
        summary_every = 1
        for tick in itertools.count(1):
            # The first sample comes early, so a short run's charts show its first wave in flight.
            wait_s = min(cfg.sample_interval_s, FIRST_SAMPLE_S) if tick == 1 else cfg.sample_interval_s
            if stop_sampler.wait(wait_s):
                # The run ended: the output rate over the last, partial interval closes the series.
                now = time.perf_counter()
                with token_lock:
                    tokens = job._tokens
                if now - last_t >= FIRST_SAMPLE_S / 2:
                    store.add_points(run_id, [(now - t0, SERIES_OUTPUT_TOK_S, (tokens - last_tokens) / (now - last_t))])
                break
            now = time.perf_counter()
            with token_lock:
                tokens = job._tokens
            with job._lock:
                in_flight, done = job._in_flight, job._done
            points: list[tuple[float, str, float | None]] = [
                (now - t0, SERIES_OUTPUT_TOK_S, (tokens - last_tokens) / (now - last_t)),
                (now - t0, SERIES_IN_FLIGHT, float(in_flight)),
                (now - t0, SERIES_DONE, float(done)),
            ]
            points.extend(_memory_points(engine, now - t0))
            points.extend(_telemetry_points(engine, now - t0, cfg.server_metrics))
            store.add_points(run_id, points)
            reason = engine.health()
            if reason is not None:
                job._set(error=reason)
                job.cancel_event.set()
            last_t, last_tokens = now, tokens
            # The partial summary costs O(records); refresh it less often on big runs.
            if done > 5000:
                summary_every = 5
            if tick % summary_every == 0:
                job._set(summary=job._partial_summary())

    failures: list[BaseException] = []

    def run_loop() -> None:
        try:
            asyncio.run(send_async())
        except BaseException as exc:  # noqa: BLE001 - raised again in the run's thread below
            failures.append(exc)
            loop_ready.set()

    use_async = engine.async_capable()
    if use_async:
        threads = [threading.Thread(target=run_loop, name=f"run{run_id}-loop", daemon=True)]
    else:
        for item in upfront:
            todo.put(item)
        threads = [
            threading.Thread(target=worker, name=f"run{run_id}-w{i}", daemon=True) for i in range(cfg.concurrency)
        ]
        if offsets is not None:
            threads.append(threading.Thread(target=dispatcher, name=f"run{run_id}-dispatch", daemon=True))
    sampler_thread = threading.Thread(target=sampler, name=f"run{run_id}-sampler", daemon=True)
    # A full garbage collection walks the whole heap (torch, transformers: millions of
    # objects) with the GIL held, pausing every sending thread mid-stream, which would show
    # as TTFT and ITL outliers: collect once now and keep what exists out of later
    # collections until the run ends (as ``vllm bench serve`` does with its heap).
    gc.collect()
    gc.freeze()
    # Another busy thread of this process (the dashboard drawing its charts) holds the GIL
    # for up to the switch interval (5 ms) each time the event loop wants it back after
    # waiting on its sockets; a shorter interval keeps that wait out of TTFT, ITL and send
    # lag (bench/benchmarks/gil_wakeup.py measures it; figures in the README). Native runs
    # keep the default: their threads compute, and more switching would slow them.
    switch_interval = sys.getswitchinterval()
    if use_async:
        sys.setswitchinterval(min(switch_interval, SENDER_SWITCH_INTERVAL_S))
    try:
        try:
            for t in threads:
                t.start()
            first: list[tuple[float, str, float | None]] = [(0.0, SERIES_IN_FLIGHT, 0.0), (0.0, SERIES_DONE, 0.0)]
            first.extend(_memory_points(engine, 0.0))
            first.extend(_telemetry_points(engine, 0.0, cfg.server_metrics))
            store.add_points(run_id, first)
        finally:
            if use_async:
                loop_ready.wait()
            t0 = time.perf_counter()
            job._set(status="running", phase="running", t0=t0)
            go.set()
        sampler_thread.start()
        for t in threads:
            t.join()
        t_end = time.perf_counter()
        stop_sampler.set()
        sampler_thread.join()
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch_interval)
    if failures:
        raise failures[0]
    last = [(t_end - t0, SERIES_IN_FLIGHT, 0.0), (t_end - t0, SERIES_DONE, float(job._done))]
    store.add_points(run_id, [*last, *_telemetry_points(engine, t_end - t0, cfg.server_metrics)])

    if finish:
        _finish(job, engine)


def _finish(job: Job, engine: Engine) -> None:
    """Summarize what was measured and close the run with its final status."""
    cfg, store, run_id = job.config, job.store, job._run_id
    assert run_id is not None
    mem = engine.memory()
    with job._lock:
        records = list(job._records)
    # First request sent -> last request finished (warm-up excluded).
    duration = (max(r.end_s for r in records) - min(r.start_s for r in records)) if records else 0.0
    summary = summarize(
        records,
        duration_s=duration,
        peak_memory_gib=mem.peak_bytes / GIB if mem else None,
        max_concurrency=cfg.concurrency,
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
    )
    engine_error = job.snapshot().error
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
        job._set(status="failed", phase="failed", summary=summary, error=reason)
    elif job.cancel_event.is_set():
        store.finish_run(run_id, "cancelled", summary=summary, error="cancelled by the user")
        job._set(status="cancelled", phase="cancelled", summary=summary)
    elif summary.completed == 0:
        first = next((r.error for r in records if r.error), "no request completed")
        reason = f"every request failed; first error: {first}"
        store.finish_run(run_id, "failed", summary=summary, error=reason)
        job._set(status="failed", phase="failed", summary=summary, error=reason)
    else:
        store.finish_run(run_id, "completed", summary=summary)
        job._set(status="completed", phase="completed", summary=summary)


def _telemetry_points(engine: Engine, t: float, enabled: bool = True) -> list[tuple[float, str, float | None]]:
    if not enabled:
        return []
    try:
        return [(t, name, float(v)) for name, v in engine.telemetry().items()]
    except Exception:  # noqa: BLE001 - a failed scrape is a gap in the series, not a failed run
        return []


def _memory_points(engine: Engine, t: float) -> list[tuple[float, str, float | None]]:
    try:
        mem = engine.memory()
    except Exception:  # noqa: BLE001 - a telemetry hiccup must not end a run
        return []
    if mem is None:
        return []
    return [
        (t, SERIES_MEM_ALLOCATED, mem.allocated_bytes / GIB),
        (t, SERIES_MEM_RESERVED, mem.reserved_bytes / GIB),
        (t, SERIES_MEM_PEAK, mem.peak_bytes / GIB),
    ]


def start_run(
    config: RunConfig,
    store: Store,
    engine: Engine | None = None,
    on_done: Callable[[Job], None] | None = None,
) -> Job:
    """Record the run and start it in a background thread; return at once.

    With ``engine`` (already started), the run uses it and leaves it running;
    otherwise the job creates, starts and finally stops its own engine.
    """
    opts = config.engine_options
    job = Job(config, store)
    run_id = store.create_run(
        mode=config.mode,
        engine=opts.kind,
        model=opts.model,
        accelerator=opts.accelerator,
        config=config.model_dump(),
        concurrency=config.concurrency,
        name=config.name,
    )
    job._run_id = run_id

    def target() -> None:
        _execute(job, engine, owns_engine=engine is None)
        if on_done is not None:
            on_done(job)

    job.thread = threading.Thread(target=target, name=f"run-{run_id}", daemon=True)
    job.thread.start()
    return job


class JobManager:
    """The jobs of one process (the dashboard keeps one in ``st.cache_resource``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def submit(self, config: RunConfig, engine: Engine | None = None) -> Job:
        with self._lock:
            if any(j.snapshot().active for j in self._jobs.values()):
                raise ConfigError("a run is already in progress; stop it or wait for it to finish")
            job = start_run(config, self.store, engine)
            self._jobs[job.id] = job
            return job

    def active(self) -> Job | None:
        with self._lock:
            for job in self._jobs.values():
                if job.snapshot().active:
                    return job
        return None

    def latest(self, mode: str | None = None) -> Job | None:
        with self._lock:
            jobs = [j for j in self._jobs.values() if mode is None or j.config.mode == mode]
        return jobs[-1] if jobs else None

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def cancel_all(self, timeout: float = 5.0) -> None:
        for job in list(self._jobs.values()):
            job.cancel()
        for job in list(self._jobs.values()):
            job.wait(timeout)

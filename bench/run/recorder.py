"""What a run measured, off the sending loop: the recorder and the live series sampler.

:class:`Recorder` is a queue-fed sink. Senders hand it finished requests
(:class:`bench.send.core.Completion`, perf_counter times) with one queue put; its own thread
turns them into :class:`bench.metrics.RequestRecord` (times relative to the run's start,
send lag = actual - due send time, negative when a request left early), writes them to
SQLite in batches (one transaction per ~0.2 s or 500 requests) and keeps running
accumulators: counts, token totals and a :class:`Distribution` per latency metric, so
the live summary costs the same at request 100,000 as at request 10. Requests are counted
once stored, and each stored batch leaves one :class:`LiveFrame` (counts and the summary of
the same requests), which the job's snapshots hand to every reader. The final summary
is computed once, exactly, from all records (:func:`bench.metrics.summarize`).

:class:`Sampler` writes the per-second series (output tok/s, in flight, done, memory,
the engine's telemetry), polls the engine's health and stores the live summary.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.metrics.records import RequestRecord, Stat
from bench.metrics.slo import all_met, is_good, judge_summary, parse_slos
from bench.metrics.summary import RunSummary
from bench.run.host_load import SERIES_CLIENT_CPU, SERIES_OTHER_CPU, SERIES_STEAL, HostLoad
from bench.send.core import Completion
from bench.store import Store
from engines.accelerators import GIB
from engines.base import Engine
from engines.routing import ROUTING_WINDOW_S, RoutedIds, check_routing, count_routed
from engines.telemetry import (
    DeviceReading,
    TelemetrySource,
    device_prefix,
    process_tree_device_bytes,
    series_points,
)
from engines.tokens import count_tokens

# Live series written about once a second (names in the store's time series table).
SERIES_OUTPUT_TOK_S = "output_tok_s"
SERIES_IN_FLIGHT = "in_flight"
SERIES_DONE = "requests_done"
SERIES_MEM_ALLOCATED = "mem_allocated_gib"
SERIES_MEM_RESERVED = "mem_reserved_gib"
SERIES_MEM_PEAK = "mem_peak_gib"
# A launched server's own device memory (its process tree's, from telemetry that sees processes).
SERIES_SERVER_DEVICE_MEM = "server_own_device_mem_gib"

FIRST_SAMPLE_S = 0.25  # the live series' first sample, seconds after the start
WRITE_EVERY_S = 0.2
WRITE_BATCH = 500
# requests' routed expert ids counted together (engines.routing.RoutedIds): a batch of this many,
# or of this many bytes, stays in the CPU's cache (a 256-request batch took 2.5x as long a request)
ROUTED_IDS_BATCH = 64
ROUTED_IDS_BATCH_BYTES = 256 * 1024


class Distribution:
    """A running distribution: exact count, mean, std, min and max, and percentiles from a
    log-bucketed histogram with about 0.5 % relative error (mergeable, bounded in size: a
    few hundred buckets whatever the number of values). Negative values keep their sign."""

    GAMMA = 1.01
    _LOG_G = math.log(GAMMA)

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.sumsq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.buckets: dict[int, int] = {}  # signed bucket index -> count (0: zero)

    def add(self, x: float) -> None:
        self.count += 1
        self.sum += x
        self.sumsq += x * x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if x == 0:
            key = 0
        else:
            i = max(1, math.ceil(math.log(abs(x) * 1e6) / self._LOG_G))  # values >= 1e-6 resolved
            key = i if x > 0 else -i
        self.buckets[key] = self.buckets.get(key, 0) + 1

    def add_many(self, xs: list[float]) -> None:
        """:meth:`add` for many values at once (vectorized: the ITL gaps of a batch of requests)."""
        if len(xs) < 64:
            for x in xs:
                self.add(x)
            return
        import numpy as np

        a = np.asarray(xs, dtype=np.float64)
        self.count += int(a.size)
        self.sum += float(a.sum())
        self.sumsq += float(np.dot(a, a))
        self.min = min(self.min, float(a.min()))
        self.max = max(self.max, float(a.max()))
        mag = np.abs(a)
        nz = mag > 0
        keys = np.zeros(a.size, dtype=np.int64)
        keys[nz] = np.maximum(1, np.ceil(np.log(mag[nz] * 1e6) / self._LOG_G)).astype(np.int64)
        keys = np.where(a < 0, -keys, keys)
        uniq, counts = np.unique(keys, return_counts=True)
        buckets = self.buckets
        for k, n in zip(uniq.tolist(), counts.tolist(), strict=True):
            buckets[k] = buckets.get(k, 0) + n

    def merge(self, other: Distribution) -> None:
        self.count += other.count
        self.sum += other.sum
        self.sumsq += other.sumsq
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        for k, n in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + n

    def _value(self, key: int) -> float:
        if key == 0:
            return 0.0
        i = abs(key)
        mid = 2 * self.GAMMA**i / (self.GAMMA + 1) / 1e6  # the bucket's middle
        return mid if key > 0 else -mid

    def quantile(self, q: float) -> float | None:
        if not self.count:
            return None
        rank = q / 100.0 * (self.count - 1)
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen > rank:
                return min(max(self._value(key), self.min), self.max)
        return self.max

    def stat(self) -> Stat:
        if not self.count:
            return Stat(0, None, None, None, None, None, None, None, None)
        mean = self.sum / self.count
        std = math.sqrt(max(0.0, self.sumsq / self.count - mean * mean))
        p = [self.quantile(q) for q in (50, 90, 95, 99)]
        return Stat(self.count, mean, std, self.min, self.max, *p)


@dataclass(frozen=True)
class LiveFrame:
    """A running run as one consistent frame: requests stored so far, of them failed, and the
    summary of exactly those requests (None before the first is stored)."""

    done: int
    failed: int
    summary: RunSummary | None


class Recorder:
    """Queue-fed sink of finished requests: batched store writes and running accumulators."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        tokenizer: Any | None = None,
        on_failure: Callable[[], None] | None = None,
        slos: Sequence[str] | None = None,
        until_ci: str | None = None,
        on_enough: Callable[[], None] | None = None,
    ) -> None:
        from bench.metrics.confidence import StopWatch, parse_stop_rule

        # statistical stopping: on_enough() once the rule's interval is narrow enough
        self.stop_watch = StopWatch(parse_stop_rule(until_ci)) if until_ci else None
        self.on_enough = on_enough
        self.store = store
        self.run_id = run_id
        self.tokenizer = tokenizer
        self.slos = parse_slos(slos or ())
        self.good = 0  # completed requests that met every SLO (goodput)
        self.on_failure = on_failure
        self.t0: float | None = None
        self._q: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unwritten: list[tuple[int, RequestRecord]] = []  # batches the store refused, kept for the summary
        self.done = 0
        self.failed = 0
        self.cancelled = 0  # in flight when the run was cancelled (not failures)
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.usage_mismatches = 0
        self.chunks = 0  # output chunks of completed requests
        self.multi_token = 0  # completed requests with 2+ output tokens
        self.single_chunk = 0  # ... whose output came in one chunk
        self.dists = {
            k: Distribution()
            for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "send_lag_ms", "itl_token_ms", "ttft_any_ms")
        }
        self._gaps: list[float] = []  # ITL gaps of the batch being taken, added to the sketch at once
        self._token_gaps: list[float] = []  # ... per token (a k-token chunk's gap counted k times, / k)
        self.reasoning_tokens = 0  # completed requests' reasoning tokens (client count)
        self.answer_tokens = 0
        self.thinking = 0  # completed requests that streamed reasoning
        self.reasoning_reported = 0  # ... whose server reported a reasoning count
        self.reasoning_mismatches = 0
        self.reasoning_dist = Distribution()
        self._thread: threading.Thread | None = None
        self.write_error: str | None = None
        # the server's routing, summed over requests (engines.routing.served_record builds the record)
        self.routing_phases: Any | None = None  # [2, layers, experts]
        self.routing_windows: dict[int, Any] = {}  # window (request end // ROUTING_WINDOW_S) -> [layers, experts]
        self.routing_requests = 0
        self.routing_error: str | None = None  # the first bad payload's reason (the rest of the run is kept)
        # requests' ids not counted yet (engines.routing.RoutedIds): by (window, plan), counted a batch at a time
        self._routed_ids: dict[tuple[int, Any], list[tuple[str, RoutedIds]]] = {}
        self._routed_n = self._routed_bytes = 0
        # the live frame (see live()); its summary carries these fields too (max_concurrency, load)
        self.summary_fields: dict[str, Any] = {}
        self._frame = LiveFrame(0, 0, None)

    # --- senders' side ----------------------------------------------------------------
    def start(self) -> None:
        """Start the recorder's thread (before the clock starts: ``t0`` is set when it does)."""
        self._thread = threading.Thread(target=self._loop, name=f"run{self.run_id}-recorder", daemon=True)
        self._thread.start()

    def put(self, item: Completion) -> None:
        """Hand over one finished request (any thread; never blocks)."""
        self._q.put(item)

    def close(self) -> None:
        """Write what is still queued and stop the thread."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None

    # --- readers' side ----------------------------------------------------------------
    def records(self) -> list[RequestRecord]:
        """Every recorded request, read back from the store (plus any it could not take).

        Records are not kept in memory once written: a run's memory does not grow with
        the requests it completes (issue: 0.45-3.4 KB per request before)."""
        with self._lock:
            unwritten = [rec for _, rec in self._unwritten]
        stored = self.store.records(self.run_id)
        if not unwritten:
            return stored
        written = {r.request_id for r in stored}
        return stored + [r for r in unwritten if r.request_id not in written]

    def live(self) -> LiveFrame:
        """The run so far as one frame: the requests stored, of them failed, and their summary
        (taken together when the last batch was stored; a page draws all three from it)."""
        with self._lock:
            return self._frame

    def live_summary(self, duration_s: float, **kw: Any) -> RunSummary | None:
        """The summary so far from the accumulators (percentiles within ~0.5 %)."""
        with self._lock:
            return self._summary(duration_s, **kw)

    def _summary(self, duration_s: float, **kw: Any) -> RunSummary | None:
        if not self.done:
            return None
        completed = self.done - self.failed - self.cancelled

        def rate(x: float) -> float:
            return x / duration_s if duration_s > 0 else 0.0

        return RunSummary(
            requests=self.done,
            completed=completed,
            failed=self.failed,
            cancelled=self.cancelled,
            duration_s=duration_s,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            request_throughput_rps=rate(completed),
            output_throughput_tok_s=rate(self.output_tokens),
            total_throughput_tok_s=rate(self.prompt_tokens + self.output_tokens),
            ttft_ms=self.dists["ttft_ms"].stat(),
            tpot_ms=self.dists["tpot_ms"].stat(),
            itl_ms=self.dists["itl_ms"].stat(),
            e2e_ms=self.dists["e2e_ms"].stat(),
            usage_mismatches=self.usage_mismatches,
            send_lag_ms=self.dists["send_lag_ms"].stat() if self.dists["send_lag_ms"].count else None,
            single_chunk_share=self.single_chunk / self.multi_token if self.multi_token else None,
            tokens_per_chunk=self.output_tokens / self.chunks if self.chunks else None,
            itl_token_ms=self.dists["itl_token_ms"].stat(),
            **self._reasoning_fields(rate),
            **kw,
            **self._slo_fields(rate),
        )

    def _reasoning_fields(self, rate: Callable[[float], float]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.thinking:
            out.update(
                reasoning_tokens=self.reasoning_tokens,
                answer_tokens=self.answer_tokens,
                answer_throughput_tok_s=rate(self.answer_tokens),
                reasoning_ms=self.reasoning_dist.stat(),
            )
        if self.reasoning_reported:
            out["reasoning_mismatches"] = self.reasoning_mismatches
        return out

    def _slo_fields(self, rate: Callable[[float], float]) -> dict[str, Any]:
        """Goodput so far, and the verdict from the sketches' percentiles (the final one is exact)."""
        if not self.slos:
            return {}
        stats = {name: dist.stat() for name, dist in self.dists.items()}
        row = {f"{m}_{k}": v for m, st in stats.items() for k, v in asdict(st).items()}
        return {
            "slos": tuple(s.text for s in self.slos),
            "good_requests": self.good,
            "goodput_rps": rate(self.good),
            "slo_met": all_met(judge_summary(row, self.slos)),
        }

    # --- the recorder's thread --------------------------------------------------------
    def record(self, c: Completion) -> RequestRecord:
        """A completion as a record, times relative to t0 (no clamp on the send lag)."""
        t0 = self.t0 or 0.0
        output_tokens = c.output_tokens
        if c.text is not None and self.tokenizer is not None and c.error is None:
            # The sender could not count this output's tokens (no tokenizer there) and the
            # server's usage disagrees with its chunk count: count the text here.
            output_tokens = max(output_tokens, count_tokens(self.tokenizer, c.text))
        return RequestRecord(
            request_id=c.request_id,
            start_s=c.start - t0,
            end_s=c.end - t0,
            chunk_times_s=[t - t0 for t in c.chunk_times],
            prompt_tokens=c.prompt_tokens,
            output_tokens=output_tokens,
            error=c.error,
            usage_output_tokens=c.usage_output_tokens,
            first_any_token_s=None if c.first_any is None else c.first_any - t0,
            send_lag_ms=(c.start - c.due) * 1000.0,
            chunk_tokens=None if c.chunk_tokens is None else list(c.chunk_tokens),
            reasoning_chunks=c.reasoning_chunks,
            reasoning_tokens=c.reasoning_tokens,
            usage_reasoning_tokens=c.usage_reasoning_tokens,
        )

    def _add_routing(self, c: Completion, rec: RequestRecord) -> None:
        """Sum one request's routing counts into the run's (a bad payload is noted, never fatal);
        ids (:class:`RoutedIds`) wait to be counted with others (:meth:`_count_routed_ids`)."""
        window = int(max(rec.end_s, 0.0) // ROUTING_WINDOW_S)
        if isinstance(c.routing, RoutedIds):
            self._routed_ids.setdefault((window, c.routing.plan), []).append((c.request_id, c.routing))
            self._routed_n += 1
            self._routed_bytes += len(c.routing.raw)
            if self._routed_n >= ROUTED_IDS_BATCH or self._routed_bytes >= ROUTED_IDS_BATCH_BYTES:
                self._count_routed_ids()
            return
        self._sum_routing(c.request_id, c.routing, window, 1)

    def _sum_routing(self, request_id: str, value: Any, window: int, requests: int) -> None:
        """Add counts [2, layers, experts] of ``requests`` requests to the run's, in ``window``."""
        shape = None if self.routing_phases is None else self.routing_phases.shape
        arr, why = check_routing(value, shape)
        if arr is None:
            self._routing_left_out(request_id, why)
            return
        if self.routing_phases is None:
            self.routing_phases = arr.copy()
        else:
            self.routing_phases += arr
        both = arr.sum(axis=0)
        if window in self.routing_windows:
            self.routing_windows[window] += both
        else:
            self.routing_windows[window] = both
        self.routing_requests += requests

    def _routing_left_out(self, request_id: str, why: str | None) -> None:
        if self.routing_error is None:
            self.routing_error = f"request {request_id}: routing {why}; its routing is left out"

    def _count_routed_ids(self) -> None:
        """Count the requests' ids waiting, a batch per (window, plan): numpy's per-call cost once a
        batch, not once a request (engines.routing.RoutedIds)."""
        waiting, self._routed_ids, self._routed_n, self._routed_bytes = self._routed_ids, {}, 0, 0
        for (window, _plan), items in waiting.items():
            try:
                counts, bad = count_routed([ids for _, ids in items])
            except Exception as exc:  # noqa: BLE001 - this batch's routing is left out; the run goes on
                self._routing_left_out(items[0][0], f"not counted ({type(exc).__name__}: {exc})")
                continue
            for i, why in bad:
                self._routing_left_out(items[i][0], why)
            left_out = {i for i, _ in bad}
            good = [rid for i, (rid, _) in enumerate(items) if i not in left_out]
            if good:  # a shape unlike the run's earlier requests' is reported under the batch's first
                self._sum_routing(good[0], counts, window, len(good))

    def _accumulate(self, rec: RequestRecord) -> None:
        d = self.dists
        self.done += 1
        if rec.send_lag_ms is not None:
            d["send_lag_ms"].add(rec.send_lag_ms)
        if rec.cancelled:
            self.cancelled += 1
            return
        if not rec.ok:
            self.failed += 1
            return
        self.prompt_tokens += rec.prompt_tokens
        self.output_tokens += rec.counted_output_tokens
        self.usage_mismatches += rec.usage_mismatch
        self.chunks += len(rec.chunk_times_s)
        if rec.counted_output_tokens >= 2:
            self.multi_token += 1
            self.single_chunk += len(rec.chunk_times_s) == 1
        if self.slos and is_good(rec, self.slos):
            self.good += 1
        for name, value in (("ttft_ms", rec.ttft_ms), ("tpot_ms", rec.tpot_ms), ("ttft_any_ms", rec.ttft_any_ms)):
            if value is not None:
                d[name].add(value)
        d["e2e_ms"].add(rec.e2e_ms)
        times = rec.chunk_times_s
        gaps = [(times[i] - times[i - 1]) * 1000.0 for i in range(1, len(times))]
        self._gaps.extend(gaps)
        self._token_gaps.extend(gaps if rec.chunk_tokens is None else rec.itl_token_ms)
        if rec.reasoning_tokens or rec.reasoning_chunks:
            self.thinking += 1
            self.reasoning_tokens += rec.reasoning_tokens
            if (ms := rec.reasoning_ms) is not None:
                self.reasoning_dist.add(ms)
        self.answer_tokens += rec.answer_tokens
        if rec.usage_reasoning_tokens is not None:
            self.reasoning_reported += 1
            self.reasoning_mismatches += rec.reasoning_mismatch

    def _loop(self) -> None:
        pending: list[tuple[int, RequestRecord]] = []
        last_write = time.monotonic()
        stop = False
        while not stop:
            try:
                item = self._q.get(timeout=WRITE_EVERY_S)
            except queue.Empty:
                item = ...
            failed_now = False
            batch = [] if item is ... else [item]
            while len(batch) < WRITE_BATCH:  # take what else is queued, without waiting
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            for c in batch:
                if c is None:
                    stop = True
                    continue
                rec = self.record(c)
                # the stopping rule sees each completion as it comes, not when its batch is stored:
                # the point where the interval is narrow enough is exact (bench.metrics.confidence)
                if rec.ok and self.stop_watch is not None and self.stop_watch.add(rec) and self.on_enough is not None:
                    self.on_enough()
                if c.routing is not None:
                    self._add_routing(c, rec)
                pending.append((c.seq, rec))
                failed_now |= rec.failed
            if stop and self._routed_n:
                self._count_routed_ids()
            now = time.monotonic()
            if pending and (stop or len(pending) >= WRITE_BATCH or now - last_write >= WRITE_EVERY_S):
                self._write(pending)
                # Counted once stored, and the live frame taken with them: a reader's counts, its
                # summary and the store's rows describe the same requests (issue 45: the headline,
                # the charts and the sidebar showed three different counts of one run).
                self._account([rec for _, rec in pending])
                pending = []
                last_write = now
            if failed_now and self.on_failure is not None:
                self.on_failure()

    def _account(self, recs: list[RequestRecord]) -> None:
        """Add stored requests to the accumulators and take the live frame, in one lock."""
        with self._lock:
            for rec in recs:
                self._accumulate(rec)
            self.dists["itl_ms"].add_many(self._gaps)
            self.dists["itl_token_ms"].add_many(self._token_gaps)
            self._gaps, self._token_gaps = [], []
            duration = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
            self._frame = LiveFrame(self.done, self.failed, self._summary(duration, **self.summary_fields))

    def _write(self, pending: list[tuple[int, RequestRecord]]) -> None:
        try:
            self.store.add_samples(self.run_id, pending)
        except Exception as exc:  # noqa: BLE001 - kept in memory; the run reports it at the end
            with self._lock:
                self._unwritten.extend(pending)
                n = len(self._unwritten)
            self.write_error = f"could not store {n} requests: {type(exc).__name__}: {exc}"


class Sampler:
    """The per-second series of a run, its health polls and its live summary, on a thread."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        run_id: int,
        interval_s: float,
        live: Callable[[], tuple[int, int]],
        recorder: Recorder,
        server_metrics: bool,
        on_tick: Callable[[float], None],
        on_unhealthy: Callable[[str], None],
        devices: Sequence[TelemetrySource] = (),
    ) -> None:
        self.engine, self.store, self.run_id = engine, store, run_id
        self.devices = list(devices)  # device telemetry (engines.telemetry); closed by stop()
        self._dev_util: list[float] = []  # per sample: mean utilisation over the devices read
        self._dev_power: list[float] = []  # per sample: power summed over the devices read
        self._dev_mem_peak: float | None = None
        self._dev_read: set[int] = set()  # the sources that gave a reading at least once
        self.device_names: dict[str, str] = {}  # series prefix ("dev0", "h<host>_dev1") -> "NVIDIA H200"
        self.server_device_peak_gib: float | None = None  # a launched server's own device memory, highest
        self.interval_s = interval_s
        self.live = live
        self.recorder = recorder
        self.server_metrics = server_metrics
        self.on_tick = on_tick
        self.on_unhealthy = on_unhealthy
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._begun = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0
        self.host: HostLoad | None = None
        self._host_sums: dict[str, float] = {}
        self._host_n = 0
        self.busiest: list[tuple[str, int, float]] = []

    def first_points(self) -> None:
        """Series values at t=0 (before the clock starts); the host's CPU is read from here on."""
        self.host = HostLoad()
        first: list[tuple[float, str, float | None]] = [(0.0, SERIES_IN_FLIGHT, 0.0), (0.0, SERIES_DONE, 0.0)]
        first.extend(memory_points(self.engine, 0.0))
        first.extend(telemetry_points(self.engine, 0.0, self.server_metrics))
        first.extend(self._device_points(0.0, aggregate=False))
        self.store.add_points(self.run_id, first)

    def start(self) -> None:
        """Start the sampler's thread; it samples from :meth:`begin` on."""
        self._thread = threading.Thread(target=self._loop, name=f"run{self.run_id}-sampler", daemon=True)
        self._thread.start()

    def begin(self, t0: float) -> None:
        """The run's clock started at ``t0`` (perf_counter)."""
        self.t0 = t0
        self._begun.set()

    def poke(self) -> None:
        """A request failed: check the engine's health now rather than at the next tick."""
        self._wake.set()

    def stop(self, t_end: float | None) -> None:
        """Stop sampling; with ``t_end`` (the run started), write the closing points."""
        self._stop.set()
        self._wake.set()
        self._begun.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if t_end is not None:
                self._close_points(t_end)
        finally:
            for source in self.devices:
                try:
                    source.close()
                except Exception:  # noqa: BLE001 - a source that cannot close must not lose the run
                    pass

    def _close_points(self, t_end: float) -> None:
        if self.host is not None:
            self._host_point(self.host.sample())  # the last, partial interval
            self.busiest = self.host.busiest_others()
        t = t_end - self.t0
        last = [(t, SERIES_IN_FLIGHT, 0.0), (t, SERIES_DONE, float(self.recorder.done))]
        last.extend(memory_points(self.engine, t))  # the timeline reaches the end of the measured phase
        last.extend(self._device_points(t))
        self.store.add_points(self.run_id, [*last, *telemetry_points(self.engine, t, self.server_metrics)])

    def _device_points(self, t: float, aggregate: bool = True) -> list[tuple[float, str, float | None]]:
        """This second's device telemetry as series points (``dev0_util_pct``, ...); with
        ``aggregate``, also counted into the run's device means (:meth:`device_means`)."""
        readings: list[DeviceReading] = []
        for i, source in enumerate(self.devices):
            try:
                got = source.read()
            except Exception:  # noqa: BLE001 - read() should never raise; a gap, never a failed run
                continue
            if got:
                self._dev_read.add(i)
                for r in got:
                    self.device_names.setdefault(device_prefix(r), f"{r.name or r.vendor} ({source.name})")
            readings.extend(got)
        pids = self._server_pids()
        server_bytes = process_tree_device_bytes(readings, pids) if pids else None
        server_point: list[tuple[float, str, float | None]] = []
        if server_bytes is not None:
            gib = server_bytes / GIB
            server_point.append((t, SERIES_SERVER_DEVICE_MEM, gib))
            if aggregate:
                self.server_device_peak_gib = max(self.server_device_peak_gib or 0.0, gib)
        if aggregate and readings:
            utils = [r.util_pct for r in readings if r.util_pct is not None]
            powers = [r.power_w for r in readings if r.power_w is not None]
            mems = [r.mem_used_bytes for r in readings if r.mem_used_bytes is not None]
            if utils:
                self._dev_util.append(sum(utils) / len(utils))
            if powers:
                self._dev_power.append(sum(powers))
            if mems:
                self._dev_mem_peak = max(self._dev_mem_peak or 0.0, sum(mems) / GIB)
        return [*server_point, *((t, name, v) for name, v in series_points(readings).items())]

    def _server_pids(self) -> list[int]:
        """The launched server's process tree (empty for in-process and remote engines)."""
        try:
            return self.engine.server_pids()
        except Exception:  # noqa: BLE001 - a process that just went away: no point this second
            return []

    def device_errors(self) -> list[str]:
        """One line for each device source that never gave a reading during the run."""
        return [
            f"{source.name}: {source.last_error or 'no readings'}"
            for i, source in enumerate(self.devices)
            if i not in self._dev_read
        ]

    def device_means(self) -> dict[str, float | None]:
        """The run's device figures for its summary (see bench.metrics: ``device_*``)."""
        return {
            "device_util_pct": sum(self._dev_util) / len(self._dev_util) if self._dev_util else None,
            "device_power_w": sum(self._dev_power) / len(self._dev_power) if self._dev_power else None,
            "device_mem_used_gib": self._dev_mem_peak,
        }

    def _host_point(self, shares: dict[str, float]) -> dict[str, float]:
        for name, v in shares.items():
            self._host_sums[name] = self._host_sums.get(name, 0.0) + v
        self._host_n += 1
        return shares

    def host_means(self) -> dict[str, float | None]:
        """Mean host shares over the run's samples: other processes' and our own cores, steal %."""
        n = self._host_n

        def mean(name: str) -> float | None:
            return self._host_sums.get(name, 0.0) / n if n else None

        return {
            "other_cpu_cores": mean(SERIES_OTHER_CPU),
            "client_cpu_cores": mean(SERIES_CLIENT_CPU),
            "steal_pct": mean(SERIES_STEAL),
        }

    def _health(self) -> None:
        reason = self.engine.health()
        if reason is not None:
            self.on_unhealthy(reason)

    def _loop(self) -> None:
        self._begun.wait()
        if self._stop.is_set() and not self.t0:
            return
        t0 = self.t0
        last_t, last_tokens = t0, 0
        next_tick = t0 + min(self.interval_s, FIRST_SAMPLE_S)
        while True:
            self._wake.wait(max(0.0, next_tick - time.perf_counter()))
            if self._stop.is_set():
                # The output rate over the last, partial interval closes the series.
                now = time.perf_counter()
                tokens, _ = self.live()
                if now - last_t >= FIRST_SAMPLE_S / 2:
                    rate = (tokens - last_tokens) / (now - last_t)
                    self.store.add_points(self.run_id, [(now - t0, SERIES_OUTPUT_TOK_S, rate)])
                return
            if self._wake.is_set():  # poked by a failed request
                self._wake.clear()
                self._health()
                continue
            now = time.perf_counter()
            tokens, in_flight = self.live()
            points: list[tuple[float, str, float | None]] = [
                (now - t0, SERIES_OUTPUT_TOK_S, (tokens - last_tokens) / (now - last_t)),
                (now - t0, SERIES_IN_FLIGHT, float(in_flight)),
                (now - t0, SERIES_DONE, float(self.recorder.done)),
            ]
            points.extend(memory_points(self.engine, now - t0))
            points.extend(telemetry_points(self.engine, now - t0, self.server_metrics))
            points.extend(self._device_points(now - t0))
            if self.host is not None:
                points.extend((now - t0, name, v) for name, v in self._host_point(self.host.sample()).items())
            self.store.add_points(self.run_id, points)
            self._health()
            self.on_tick(now - t0)
            last_t, last_tokens = now, tokens
            next_tick = max(next_tick + self.interval_s, now + self.interval_s / 4)


def telemetry_points(engine: Engine, t: float, enabled: bool = True) -> list[tuple[float, str, float | None]]:
    if not enabled:
        return []
    try:
        return [(t, name, float(v)) for name, v in engine.telemetry().items()]
    except Exception:  # noqa: BLE001 - a failed scrape is a gap in the series, not a failed run
        return []


def memory_points(engine: Engine, t: float) -> list[tuple[float, str, float | None]]:
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

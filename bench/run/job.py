"""A run as a background task: :class:`Job` and its frozen :class:`JobSnapshot`.

A run's statuses (the store uses the same words, plus ``interrupted`` for a run whose
process ended without finishing it)::

    pending -> loading -> running -> completed | failed | cancelled
    pending | loading -> failed | cancelled

The runner (:mod:`bench.run.execute`) is the worker; it tells the job what it measures through
:meth:`Job.attach_run`, :meth:`Job.attach_recorder`; pages and the CLI poll snapshots.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.config import RunConfig
from bench.metrics.summary import RunSummary
from bench.run.recorder import LiveFrame
from bench.run.task import BackgroundTask


@dataclass(frozen=True)
class JobSnapshot:
    """What a run looks like at one moment; safe to hand to any thread."""

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
        return self.status in BackgroundTask.ACTIVE

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


class Job(BackgroundTask):
    """A run. The runner (:mod:`bench.run.execute`) is its worker; pages and the CLI poll snapshots."""

    def __init__(self, config: RunConfig, store: Any) -> None:
        super().__init__("run")
        self.config = config
        self.store = store
        self._run_id: int | None = None
        self._t0: float | None = None
        self._summary: RunSummary | None = None
        # Set by the runner once sending starts: the recorder's live frame, and requests in flight
        self._live: Callable[[], LiveFrame] | None = None
        self._in_flight: Callable[[], int] | None = None
        # Set by the runner: () -> the records so far (for a failed run's partial summary)
        self._records: Callable[[], list[Any]] | None = None
        self.write_error: str | None = None  # requests the store could not take (kept for the summary)
        self.stop_met_at: int | None = None  # completed requests when until_ci was met (None: not met)
        # (summed counts [2, layers, experts], windows, requests, first bad payload) a server reported
        self.served_routing: tuple[Any, dict[int, Any], int, str | None] | None = None
        self.host: tuple[dict[str, float | None], list[tuple[str, int, float]]] | None = None  # host load, busiest
        self.devices: dict[str, float | None] | None = None  # device telemetry means for the summary
        self.client_cpu: dict[str, float] | None = None  # the sending loops' run-queue wait (bench.send.cpu_wait)
        self.server_device_peak_gib: float | None = None  # a launched server's own device memory, highest

    @property
    def run_id(self) -> int | None:
        return self._run_id

    def snapshot(self) -> JobSnapshot:
        """The run now. Its counts and its summary come from one frame (the recorder's
        :meth:`~bench.run.recorder.Recorder.live` while it runs, the final summary after), so
        whoever draws ``done`` and whoever draws ``summary`` shows the same requests."""
        live, in_flight_of = self._live, self._in_flight
        frame = live() if live is not None else None
        in_flight = in_flight_of() if in_flight_of is not None else 0
        with self._lock:
            elapsed = time.perf_counter() - (self._t0 or self._created)
            if self._status not in ("loading", "running") and self._summary is not None:
                elapsed = self._summary.duration_s
            summary = self._summary  # the final one (or a failed run's partial one), once set
            if summary is None and frame is not None:
                summary = frame.summary
            done, failed = (frame.done, frame.failed) if frame is not None else (0, 0)
            if self._summary is not None and frame is None:
                done, failed = self._summary.requests, self._summary.failed
            return JobSnapshot(
                job_id=self.id,
                run_id=self._run_id,
                status=self._status,
                phase=self._phase,
                done=done,
                total=self.config.requests,
                failed=failed,
                in_flight=in_flight if self._status == "running" else 0,
                elapsed_s=elapsed,
                error=self._error,
                summary=summary,
                mode=self.config.mode,
                config=self.config.model_dump(),
            )

    def attach_run(self, run_id: int) -> None:
        """The run's id in the store (set once, by :func:`bench.run.manager.start_run` or the engine host)."""
        with self._lock:
            self._run_id = run_id

    def attach_recorder(
        self, records: Callable[[], list[Any]], live: Callable[[], LiveFrame], in_flight: Callable[[], int]
    ) -> None:
        """Set by the runner once sending starts: the records so far (for a failed run's partial
        summary), the recorder's live frame and the requests in flight, for snapshots."""
        self._records = records
        self._live = live
        self._in_flight = in_flight

    def records(self) -> list[Any]:
        """The records measured so far ([] before sending starts)."""
        records = self._records
        return records() if records is not None else []

    def set_summary(self, summary: RunSummary | None) -> None:
        with self._lock:
            self._summary = summary

    def wait(self, timeout: float | None = None) -> JobSnapshot:
        self.join(timeout)
        return self.snapshot()

"""Native vs vLLM in the background for the Compare page: :class:`CompareTask` runs
:func:`bench.analysis.compare.compare_engines` as a background task; pages read ``state()``. No Streamlit here."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from bench.config import RunConfig
from bench.run.task import BackgroundTask, error_reason
from bench.store import Store
from engines.errors import ConfigError

# --- native vs vLLM in the background (Compare page) -----------------------------------------------


@dataclass(frozen=True)
class CompareState:
    """A comparison at one moment. ``status``: idle | running | done | failed | cancelled."""

    status: str = "idle"
    message: str = ""
    fraction: float = 0.0
    error: str | None = None
    native_run_id: int | None = None
    vllm_run_id: int | None = None
    notes: tuple[str, ...] = ()
    task: int = 0  # increments with every start, so a page applies a result once
    started_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.status == "running"


class CompareRun(BackgroundTask):
    """One native-vs-vLLM comparison: ``pending -> running -> done | failed | cancelled``.

    :class:`CompareTask` moves it to ``running`` before starting it, so its state is never ``pending``.
    """

    TRANSITIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "pending": ("running", "failed", "cancelled"),
        "running": ("done", "failed", "cancelled"),
        "done": (),
        "failed": (),
        "cancelled": (),
    }
    ACTIVE: ClassVar[tuple[str, ...]] = ("pending", "running")

    def __init__(self, number: int) -> None:
        super().__init__("compare")
        self.number = number
        self._native_run_id: int | None = None
        self._vllm_run_id: int | None = None
        self._notes: tuple[str, ...] = ()

    def snapshot(self) -> CompareState:
        with self._lock:
            return CompareState(
                status=self._status,
                message=self._phase,
                fraction=self._fraction,
                error=self._error,
                native_run_id=self._native_run_id,
                vllm_run_id=self._vllm_run_id,
                notes=self._notes,
                task=self.number,
                started_at=self.created_at,
            )


class CompareTask:
    """Runs :func:`bench.analysis.compare.compare_engines` in the background; pages read ``state()``.

    Each comparison is one :class:`CompareRun` (a :class:`bench.run.task.BackgroundTask`); this object
    keeps the latest. The worker never touches Streamlit: pages read immutable :class:`CompareState`.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()  # guards which comparison is current
        self._run: CompareRun | None = None

    def _current(self) -> CompareRun | None:
        with self._lock:
            return self._run

    def state(self) -> CompareState:
        run = self._current()
        return run.snapshot() if run is not None else CompareState()

    @property
    def running(self) -> bool:
        return self.state().running

    def start(self, config: RunConfig, vllm_options: dict[str, Any] | None = None) -> None:
        """Start native then vLLM on ``config``'s workload; :class:`ConfigError` while one is running."""
        options = dict(vllm_options or {})
        with self._lock:
            if self._run is not None and self._run.active:
                raise ConfigError("a native-vs-vLLM comparison is already running")
            run = CompareRun(self._run.number + 1 if self._run is not None else 1)
            run.transition("running", phase="starting")  # before its thread starts: readers never see "pending"
            self._run = run
        run.start(lambda: self._compare(run, config, options))

    def _compare(self, run: CompareRun, config: RunConfig, vllm_options: dict[str, Any]) -> None:
        from bench.analysis.compare import compare_engines

        cancel = run.cancel_event
        try:
            result = compare_engines(config, self.store, vllm_options, progress=run.report, cancel=cancel)
        except Exception as exc:  # noqa: BLE001 - every failure is the comparison's one-line reason
            run.transition("cancelled" if cancel.is_set() else "failed", error=error_reason(exc))
            return
        run.transition(
            "cancelled" if cancel.is_set() else "done",
            phase="done",
            fraction=1.0,
            native_run_id=result.native_run_id,
            vllm_run_id=result.vllm_run_id,
            notes=tuple(result.notes),
        )

    def cancel(self) -> None:
        run = self._current()
        if run is not None:
            run.cancel()

    def wait(self, timeout: float | None = None) -> CompareState:
        run = self._current()
        if run is not None:
            run.join(timeout)
        return self.state()

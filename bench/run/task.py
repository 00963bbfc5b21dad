"""Background work with one state machine: :class:`BackgroundTask`.

A :class:`BackgroundTask` is a worker thread, a lock, a status with the transitions it
allows, a phase line, a progress fraction, an error, a cancel event and a finished event.
Only the worker writes (the caller may set the first status before :meth:`~BackgroundTask.start`);
readers take copies: :meth:`BackgroundTask.state` (a :class:`TaskState`) or a subclass's own
frozen snapshot. A run (:class:`bench.run.job.Job`), the dashboard's engine slot operations, its
compare task, sweeps and the tuning ablation are all background tasks, so cancelling, waiting and
reading state work the same everywhere.

A subclass with other statuses declares its own ``TRANSITIONS`` and ``ACTIVE``; the class
is checked when it is defined: every active status can go to ``FAILED`` (so a worker that
dies can always be marked failed) and every other status is final.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from engines.errors import MoEBenchError


class TransitionError(RuntimeError):
    """A task was asked to move to a status its state machine does not allow from where it is."""


def error_reason(exc: BaseException) -> str:
    """``exc`` as the one-line reason a task, a page or the CLI shows."""
    reason = str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}"
    return " ".join(reason.split())


@dataclass(frozen=True)
class TaskState:
    """What any background task looks like at one moment; safe to hand to any thread."""

    task_id: str
    name: str
    status: str
    phase: str
    fraction: float
    error: str | None
    active: bool
    created_at: float  # wall clock (time.time()) when the task was made
    since: float  # wall clock of the last status change


class BackgroundTask:
    """A thread with a status, a phase, a fraction, an error and a cancel event (see the module docstring)."""

    TRANSITIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "pending": ("loading", "running", "completed", "failed", "cancelled"),
        "loading": ("running", "completed", "failed", "cancelled"),
        "running": ("completed", "failed", "cancelled"),
        "completed": (),
        "failed": (),
        "cancelled": (),
    }
    ACTIVE: ClassVar[tuple[str, ...]] = ("pending", "loading", "running")
    INITIAL: ClassVar[str] = "pending"
    FAILED: ClassVar[str] = "failed"  # where a worker that ends without a final status lands

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_machine(cls)

    def __init__(self, name: str = "task") -> None:
        self.id = uuid.uuid4().hex[:12]
        self.name = name
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._status = self.INITIAL
        self._phase = "queued"
        self._fraction = 0.0
        self._error: str | None = None
        self._created = time.perf_counter()
        self.created_at = time.time()
        self._since = self.created_at
        self.thread: threading.Thread | None = None

    # --- worker side ------------------------------------------------------------------
    def start(self, target: Callable[[], None]) -> None:
        """Run ``target`` on a daemon thread; the task is finished when it returns.

        ``target`` should end the task (move it to a final status). One that returns without
        doing so, or raises, leaves the task ``FAILED`` with a reason; the exception still
        reaches :func:`threading.excepthook`, so its traceback is not lost.
        """
        if self.thread is not None:
            raise TransitionError(f"{self.name}: already started")

        def body() -> None:
            reason = "the task ended without a result"
            try:
                target()
            except Exception as exc:
                reason = error_reason(exc)
                raise
            finally:
                try:
                    if self.active:
                        self.transition(self.FAILED, error=self.error or reason)
                finally:
                    self._finished.set()

        self.thread = threading.Thread(target=body, name=self.name, daemon=True)
        self.thread.start()

    def transition(self, status: str, phase: str | None = None, error: str | None = None, **extra: Any) -> None:
        """Move to ``status`` (raises :class:`TransitionError` when not allowed from here).

        ``extra`` sets the subclass's own fields (``t0=...`` sets ``self._t0``) under the same
        lock, so readers see them change together with the status.
        """
        with self._lock:
            if status != self._status and status not in self.TRANSITIONS.get(self._status, ()):
                raise TransitionError(f"{self.name}: cannot go from {self._status} to {status}")
            unknown = [k for k in extra if not hasattr(self, f"_{k}")]
            if unknown:
                raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(unknown)}")
            if status != self._status:
                self._since = time.time()
            self._status = status
            self._phase = phase if phase is not None else status
            if error is not None:
                self._error = error
            for k, v in extra.items():
                setattr(self, f"_{k}", v)

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase

    def report(self, phase: str, fraction: float) -> None:
        """Set the phase line and the progress fraction (clamped to [0, 1]); an engine's progress callback."""
        with self._lock:
            self._phase = phase
            self._fraction = max(0.0, min(1.0, float(fraction)))

    def set_error(self, error: str) -> None:
        with self._lock:
            self._error = error

    # --- caller side ------------------------------------------------------------------
    @property
    def status(self) -> str:
        with self._lock:
            return self._status

    @property
    def active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def error(self) -> str | None:
        with self._lock:
            return self._error

    @property
    def fraction(self) -> float:
        with self._lock:
            return self._fraction

    def state(self) -> TaskState:
        """The task now, as one consistent copy."""
        with self._lock:
            return TaskState(
                task_id=self.id,
                name=self.name,
                status=self._status,
                phase=self._phase,
                fraction=self._fraction,
                error=self._error,
                active=self._status in self.ACTIVE,
                created_at=self.created_at,
                since=self._since,
            )

    def cancel(self) -> None:
        self.cancel_event.set()

    def finished(self) -> bool:
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the task to finish; True when it has."""
        return self._finished.wait(timeout)


def _check_machine(cls: type[BackgroundTask]) -> None:
    """Refuse, when a task class is defined, a state machine a dying worker could get stuck in."""
    table, name = cls.TRANSITIONS, cls.__name__
    if cls.INITIAL not in table or cls.FAILED not in table:
        raise TypeError(f"{name}: TRANSITIONS needs the initial {cls.INITIAL!r} and the failed {cls.FAILED!r} status")
    if any(s not in table for s in cls.ACTIVE):
        raise TypeError(f"{name}: ACTIVE {cls.ACTIVE} names a status TRANSITIONS does not list")
    for status, targets in table.items():
        if any(t not in table for t in targets):
            raise TypeError(f"{name}: {status} -> {targets} names a status TRANSITIONS does not list")
        if status in cls.ACTIVE and cls.FAILED not in targets:
            raise TypeError(f"{name}: active status {status!r} must be able to go to {cls.FAILED!r}")
        if status not in cls.ACTIVE and targets:
            raise TypeError(f"{name}: {status!r} is not in ACTIVE, so it must be final")


_check_machine(BackgroundTask)

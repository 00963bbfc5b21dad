"""Long-lived objects of the dashboard process, from ``st.cache_resource``.

The store, the job manager, the loaded engine and the sweep in progress live here, once per
process and per database, so leaving a page or reloading the browser neither stops nor loses
a run or a sweep.
Pages read them (snapshots) and call their methods; they never replace them.

:class:`EngineSlot` holds the one loaded engine. Each load and unload is a
:class:`bench.run.task.BackgroundTask` (an :class:`EngineOperation`) whose worker reports progress;
pages read it as an immutable :class:`EngineState`. The worker never touches Streamlit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import streamlit as st

from bench.run import engine_host
from bench.run.manager import JobManager
from bench.run.task import BackgroundTask, error_reason
from bench.store import Store
from bench.sweep.spec import CapacitySpec, SweepSpec
from bench.sweep.task import SweepSnapshot, SweepTask
from dashboard.compare_task import CompareTask
from engines.accelerators import MemoryStats, get_accelerator
from engines.base import Engine, engine_class, parse_options
from engines.errors import AcceleratorUnavailable, ConfigError, EngineUnavailable
from engines.settings import get_settings


@dataclass(frozen=True)
class EngineState:
    """The slot at one moment. ``status``: empty | loading | ready | failed | stopping."""

    status: str = "empty"
    message: str = "no model loaded"
    fraction: float = 0.0
    error: str | None = None
    options: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    since: float = 0.0

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def busy(self) -> bool:
        return self.status in ("loading", "stopping")


class EngineOperation(BackgroundTask):
    """One load or unload of the slot's engine, as a background task.

    A load goes ``pending -> loading -> ready | failed``; an unload ``pending -> stopping -> empty``
    (a stop that raises still ends ``empty``, with the reason as the error). The slot moves a new
    operation to ``loading`` or ``stopping`` before starting it, so its state is never ``pending``.
    """

    TRANSITIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "pending": ("loading", "stopping", "failed"),
        "loading": ("ready", "failed"),
        "stopping": ("empty", "failed"),
        "ready": (),
        "failed": (),
        "empty": (),
    }
    ACTIVE: ClassVar[tuple[str, ...]] = ("pending", "loading", "stopping")

    def __init__(self, name: str, options: dict[str, Any] | None) -> None:
        super().__init__(name)
        self._options = options
        self._info: dict[str, Any] = {}
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine | None:
        """The started engine, once this load is ready."""
        with self._lock:
            return self._engine if self._status == "ready" else None

    def snapshot(self) -> EngineState:
        with self._lock:
            return EngineState(
                self._status, self._phase, self._fraction, self._error, self._options, self._info, self._since
            )  # fmt: skip


def _load(op: EngineOperation, engine: Engine, old: Engine | None) -> None:
    """Worker of a load: stop the previous engine, start ``engine``, end ``op`` ready or failed."""
    try:
        if old is not None:
            op.report("stopping the previous engine", 0.0)
            old.stop()
        engine.start(op.report)
        info = engine.describe()
        op.transition("ready", phase="ready", fraction=1.0, info=info, engine=engine)
    except Exception as exc:  # noqa: BLE001 - any load failure is shown as the slot's one-line error
        reason = error_reason(exc)
        try:
            engine.stop()
        except Exception as stop_exc:  # noqa: BLE001 - keep the load error; add the stop error to it
            reason += f" (and stopping it failed: {type(stop_exc).__name__}: {stop_exc})"
        op.transition("failed", phase="load failed", error=reason)


def _unload(op: EngineOperation, engine: Engine | None) -> None:
    """Worker of an unload: stop ``engine`` (if any) and end ``op`` empty."""
    error = None
    try:
        if engine is not None:
            engine.stop()
    except Exception as exc:  # noqa: BLE001 - shown to the user as the slot's error
        error = f"stopping the engine failed: {type(exc).__name__}: {exc}"
    op.transition("empty", phase="no model loaded", error=error, options=None)


class EngineSlot:
    """The engine the dashboard benchmarks with: at most one, loaded in the background.

    Each load or unload is one :class:`EngineOperation`; the slot keeps the latest and
    reads its state (and its engine, once ready) from it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards which operation is current
        self._op: EngineOperation | None = None
        self._created = time.time()

    def _current(self) -> EngineOperation | None:
        with self._lock:
            return self._op

    def state(self) -> EngineState:
        op = self._current()
        return op.snapshot() if op is not None else EngineState(since=self._created)

    def engine(self) -> Engine | None:
        """The started engine, or None while none is ready."""
        op = self._current()
        return op.engine if op is not None else None

    def _begin(
        self, name: str, status: str, phase: str, options: dict[str, Any] | None
    ) -> tuple[EngineOperation, Engine | None]:
        """Make the next operation current; return it and the engine the current one holds."""
        with self._lock:
            current = self._op
            if current is not None and current.active:
                raise ConfigError("the engine is busy loading or unloading; wait for it to finish")
            old = current.engine if current is not None else None
            if options is None and current is not None:
                options = current.snapshot().options
            op = EngineOperation(name, options)
            op.transition(status, phase=phase)  # before its thread starts: readers never see "pending"
            self._op = op
            return op, old

    def load(self, options: dict[str, Any]) -> None:
        """Validate ``options`` now (errors raise here, as one line) and load in the background.

        A loaded engine is stopped first. Raises :class:`ConfigError` while another load
        or unload is in progress.
        """
        require_operator()
        opts = parse_options(options)
        avail = engine_class(opts.kind).availability()
        if not avail.ok:
            raise EngineUnavailable(f"engine '{opts.kind}' is unavailable: {avail.reason}")
        acc = get_accelerator(opts.accelerator).availability()
        if not acc.ok:
            raise AcceleratorUnavailable(f"accelerator '{opts.accelerator}' is unavailable: {acc.reason}")
        engine = engine_host.make_engine(opts)
        op, old = self._begin("engine-load", "loading", "starting", opts.model_dump())
        op.start(lambda: _load(op, engine, old))

    def unload(self) -> None:
        """Stop the engine in the background (the slot ends empty even when none was loaded)."""
        require_operator()
        op, engine = self._begin("engine-unload", "stopping", "unloading", None)
        op.start(lambda: _unload(op, engine))

    def wait(self, timeout: float | None = None) -> EngineState:
        """Wait for a load/unload in progress (tests and scripts)."""
        op = self._current()
        if op is not None:
            op.join(timeout)
        return self.state()

    def memory(self) -> MemoryStats | None:
        """Memory of the loaded engine now; None when none is loaded or it cannot tell."""
        engine = self.engine()
        if engine is None:
            return None
        try:
            return engine.memory()
        except Exception:  # noqa: BLE001 - a telemetry hiccup shows as "not available", never as a number
            return None


class SweepHolder:
    """The sweep or capacity search of this process: at most one, and never beside a run.

    Each run the sweep starts is handed to the job manager (:meth:`JobManager.adopt`), so the
    sidebar and the run pages see it as the run in progress and refuse to start another.
    """

    def __init__(self, store: Store, manager: JobManager) -> None:
        self._store = store
        self._manager = manager
        self._lock = threading.Lock()  # guards which task is current
        self._task: SweepTask | None = None

    def current(self) -> SweepTask | None:
        """The latest sweep started in this process (finished or not), or None."""
        with self._lock:
            return self._task

    def snapshot(self) -> SweepSnapshot | None:
        task = self.current()
        return task.snapshot() if task is not None else None

    def active(self) -> bool:
        """Whether a sweep is running (between its runs too)."""
        task = self.current()
        return task is not None and task.active

    def start(self, spec: SweepSpec | CapacitySpec, engine: Engine | None) -> SweepTask:
        """Start ``spec`` on ``engine`` in the background; :class:`ConfigError` (one line) when a
        sweep or a run is already in progress."""
        require_operator()
        with self._lock:
            if self._task is not None and self._task.active:
                raise ConfigError("a sweep is already in progress; stop it or wait for it to finish")
            job = self._manager.active()
            if job is not None:
                raise ConfigError(f"a {job.config.mode} run is in progress; stop it or wait for it to finish")
            task = SweepTask(spec, self._store, engine=engine, on_run=self._manager.adopt)
            task.begin()
            self._task = task
            return task

    def cancel(self) -> None:
        """Stop the sweep in progress (its run in progress too); finished runs stay stored."""
        require_operator()
        task = self.current()
        if task is not None:
            task.cancel()


# This process draws charts: engines whose model computes in-process load in an engine host
# (a child process) unless MOEBENCH_MODEL_HOST=inline.
engine_host.enable()


@st.cache_resource(show_spinner=False)
def _store(db_path: str) -> Store:
    return Store(db_path)


@st.cache_resource(show_spinner=False)
def _job_manager(db_path: str) -> JobManager:
    return JobManager(_store(db_path))


@st.cache_resource(show_spinner=False)
def _engine_slot(db_path: str) -> EngineSlot:
    return EngineSlot()


@st.cache_resource(show_spinner=False)
def _sweep_holder(db_path: str) -> SweepHolder:
    return SweepHolder(_store(db_path), _job_manager(db_path))


@st.cache_resource(show_spinner=False)
def _compare_task(db_path: str) -> CompareTask:
    return CompareTask(_store(db_path))


@st.cache_resource(show_spinner=False)
def _ablation_holder(db_path: str) -> dict[str, Any]:
    return {"task": None}


def get_compare_task() -> CompareTask:
    """The background native-vs-vLLM comparison of this process (the Compare page starts it; the
    sidebar shows it)."""
    return _compare_task(db_path())


def get_ablation_holder() -> dict[str, Any]:
    """This process's tuning ablation, as ``{"task": AblationTask | None}`` (the Tuning page starts it;
    the sidebar shows it)."""
    return _ablation_holder(db_path())


def db_path() -> str:
    return str(get_settings().db_path)


def get_store() -> Store:
    """The results database of this process (``MOEBENCH_DATA_DIR`` picks it)."""
    return _store(db_path())


def get_job_manager() -> JobManager:
    """The job manager: runs keep going when the page that started them is gone."""
    return _job_manager(db_path())


def get_engine_slot() -> EngineSlot:
    """The loaded engine of this process."""
    return _engine_slot(db_path())


def get_sweep_holder() -> SweepHolder:
    """The sweep or capacity search of this process (outlives pages and sessions)."""
    return _sweep_holder(db_path())


VIEWER_REASON = "viewer mode: this dashboard is read-only (an operator runs `make run` on the benchmarking machine)"


def viewer() -> bool:
    """The dashboard is in viewer mode (``MOEBENCH_MODE=viewer``, ``make demo``): read-only."""
    return get_settings().mode.strip().lower() == "viewer"


def require_operator() -> None:
    """Refuse an action in viewer mode (a disabled button is not the only guard: a crafted
    client could still send the click)."""
    if viewer():
        raise ConfigError(VIEWER_REASON)


def import_tuning_runs(store: Store) -> list[str]:
    """The saved GPU tuning runs imported into ``store`` (the Tuning page's import); refused in
    viewer mode."""
    from bench.analysis import tuning

    require_operator()
    return tuning.import_saved(store)


def cancel(task: Any) -> None:
    """Stop a background task (a run, a comparison, an ablation) from a button: refused in viewer
    mode whatever the client sends (the button is also off there)."""
    if viewer():
        return
    task.cancel()


def busy_reason() -> str | None:
    """Why a new run or sweep cannot start now (a run or a sweep in progress), or None."""
    if get_sweep_holder().active():
        return "A sweep is in progress; stop it on the Sweep page or wait for it to finish."
    job = get_job_manager().active()
    if job is not None:
        return f"A {job.config.mode} run is in progress; stop it or wait for it to finish."
    return None

"""Long-lived objects of the dashboard process, from ``st.cache_resource``.

The store, the job manager and the loaded engine live here, once per process and per
database, so leaving a page or reloading the browser neither stops nor loses a run.
Pages read them (snapshots) and call their methods; they never replace them.

:class:`EngineSlot` holds the one loaded engine. Loading and unloading happen in a
background thread that reports progress into an immutable :class:`EngineState`;
the thread never touches Streamlit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import streamlit as st

from bench.runner import JobManager
from bench.store import Store
from engines.accelerators import MemoryStats, get_accelerator
from engines.base import Engine, create_engine, engine_class, parse_options
from engines.errors import AcceleratorUnavailable, ConfigError, EngineUnavailable, MoEBenchError
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


class EngineSlot:
    """The engine the dashboard benchmarks with: at most one, loaded in the background."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._state = EngineState(since=time.time())
        self._thread: threading.Thread | None = None

    def state(self) -> EngineState:
        with self._lock:
            return self._state

    def engine(self) -> Engine | None:
        """The started engine, or None while none is ready."""
        with self._lock:
            return self._engine if self._state.ready else None

    def _set(self, **changes: Any) -> None:
        with self._lock:
            self._state = replace(self._state, **changes)

    def load(self, options: dict[str, Any]) -> None:
        """Validate ``options`` now (errors raise here, as one line) and load in the background.

        A loaded engine is stopped first. Raises :class:`ConfigError` while another load
        or unload is in progress.
        """
        opts = parse_options(options)
        avail = engine_class(opts.kind).availability()
        if not avail.ok:
            raise EngineUnavailable(f"engine '{opts.kind}' is unavailable: {avail.reason}")
        acc = get_accelerator(opts.accelerator).availability()
        if not acc.ok:
            raise AcceleratorUnavailable(f"accelerator '{opts.accelerator}' is unavailable: {acc.reason}")
        engine = create_engine(opts)
        with self._lock:
            if self._state.busy:
                raise ConfigError("the engine is busy loading or unloading; wait for it to finish")
            old = self._engine
            self._engine = None
            self._state = EngineState(
                "loading", "starting", 0.0, None, opts.model_dump(), {}, time.time()
            )  # fmt: skip
        self._thread = threading.Thread(target=self._load, args=(engine, old), name="engine-load", daemon=True)
        self._thread.start()

    def _load(self, engine: Engine, old: Engine | None) -> None:
        try:
            if old is not None:
                self._set(message="stopping the previous engine", fraction=0.0)
                old.stop()

            def progress(msg: str, frac: float) -> None:
                self._set(message=msg, fraction=max(0.0, min(1.0, float(frac))))

            engine.start(progress)
            info = engine.describe()
            with self._lock:
                self._engine = engine
                self._state = EngineState(
                    "ready", "ready", 1.0, None, self._state.options, info, time.time()
                )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - any load failure is shown as the slot's one-line error
            reason = str(exc) if isinstance(exc, MoEBenchError) else f"{type(exc).__name__}: {exc}"
            reason = " ".join(reason.split())
            try:
                engine.stop()
            except Exception as stop_exc:  # noqa: BLE001 - keep the load error; add the stop error to it
                reason += f" (and stopping it failed: {type(stop_exc).__name__}: {stop_exc})"
            self._set(status="failed", message="load failed", error=reason, since=time.time())

    def unload(self) -> None:
        """Stop the engine in the background; a no-op when none is loaded."""
        with self._lock:
            if self._state.busy:
                raise ConfigError("the engine is busy loading or unloading; wait for it to finish")
            engine = self._engine
            self._engine = None
            self._state = EngineState("stopping", "unloading", 0.0, None, self._state.options, {}, time.time())

        def _stop() -> None:
            error = None
            try:
                if engine is not None:
                    engine.stop()
            except Exception as exc:  # noqa: BLE001 - shown to the user as the slot's error
                error = f"stopping the engine failed: {type(exc).__name__}: {exc}"
            self._set(status="empty", message="no model loaded", error=error, options=None, since=time.time())

        self._thread = threading.Thread(target=_stop, name="engine-unload", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> EngineState:
        """Wait for a load/unload in progress (tests and scripts)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
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


@st.cache_resource(show_spinner=False)
def _store(db_path: str) -> Store:
    return Store(db_path)


@st.cache_resource(show_spinner=False)
def _job_manager(db_path: str) -> JobManager:
    return JobManager(_store(db_path))


@st.cache_resource(show_spinner=False)
def _engine_slot(db_path: str) -> EngineSlot:
    return EngineSlot()


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

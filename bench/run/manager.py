"""Starting runs: :func:`start_run` and the :class:`JobManager` of one process (the top of the run wing)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from bench.config import RunConfig
from bench.run.engine_host import HostedEngine, RemoteJob, wants_host
from bench.run.execute import execute
from bench.run.job import Job
from bench.store import Store
from engines.base import Engine
from engines.errors import ConfigError


def start_run(
    config: RunConfig,
    store: Store,
    engine: Engine | None = None,
    on_done: Callable[[Job], None] | None = None,
    sweep_id: int | None = None,
    sweep_point: dict[str, Any] | None = None,
) -> Job:
    """Record the run and start it in a background thread; return at once.

    With ``engine`` (already started), the run uses it and leaves it running;
    otherwise the job creates, starts and finally stops its own engine. A hosted engine
    (:mod:`bench.run.engine_host`, the dashboard's native engine) runs the run in its host process.
    """
    opts = config.engine_options
    hosted: HostedEngine | None = None
    if isinstance(engine, HostedEngine):
        hosted = engine
    elif engine is None and wants_host(opts):
        hosted = HostedEngine(opts)  # this run's own host: loaded, used and stopped by the job
    job: Job = RemoteJob(config, store, hosted, owns_engine=engine is None) if hosted else Job(config, store)
    job.attach_run(
        store.create_run(
            mode=config.mode,
            engine=opts.kind,
            model=opts.model,
            accelerator=opts.accelerator,
            config=config.model_dump(),
            concurrency=config.concurrency,
            name=config.name,
            sweep_id=sweep_id,
            sweep_point=sweep_point,
        )
    )

    def target() -> None:
        if isinstance(job, RemoteJob):
            job.follow()  # the run executes in the engine host; this thread mirrors it
        else:
            execute(job, engine, owns_engine=engine is None)
        if on_done is not None:
            on_done(job)

    job.name = f"run-{job.run_id}"
    job.start(target)
    return job


class JobManager:
    """The jobs of one process (the dashboard keeps one in ``st.cache_resource``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def submit(self, config: RunConfig, engine: Any = None) -> Job:
        with self._lock:
            if any(j.active for j in self._jobs.values()):
                raise ConfigError("a run is already in progress; stop it or wait for it to finish")
            job = start_run(config, self.store, engine)
            self._jobs[job.id] = job
            return job

    def adopt(self, job: Job) -> None:
        """Track a job started elsewhere (a sweep's run), so pages see it as the run in progress."""
        with self._lock:
            self._jobs[job.id] = job

    def active(self) -> Job | None:
        with self._lock:
            for job in self._jobs.values():
                if job.active:
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
            job.join(timeout)

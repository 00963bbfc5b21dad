"""An engine host: a child process that holds an in-process model (the native engine) and runs
its benchmarks, so the process that draws the charts never shares a GIL with the model.

Why: the native engine computes in the process that loads it, and every torch call releases
and re-takes the GIL. In the dashboard that process also builds and serialises Plotly charts
for every open page; measured with ``studies/cli_vs_dashboard.py`` a native run
watched in the browser reached 0.11x of the same run from the CLI. HTTP engines already send
from processes of their own (:class:`bench.send.processes.ProcessSender`); this module does the same
for the model itself.

- :class:`HostedEngine`: an :class:`~engines.base.Engine` whose ``start`` spawns a host
  process (``spawn``: a fresh interpreter, no Streamlit) and loads the real engine there;
  ``describe``, ``memory``, ``health`` and ``stop`` are calls to it.
- :class:`RemoteJob`: a :class:`~bench.run.job.Job` whose run executes in the host with the
  same runner as the CLI (:func:`bench.run.execute.execute`: same sender, recorder, sampler and
  store writes). The parent records the run (so its id is known at once), then mirrors the
  host's job snapshot every :data:`POLL_S`; Stop reaches the host's run through a shared flag
  (:func:`_watch_cancel`), not behind the pipe's calls. A host that dies ends
  the run ``failed`` with the reason and the exact summary of the requests it stored.

Hosting is off unless a process turns it on (:func:`enable`); the dashboard does, through
``Settings.model_host`` (``process`` by default, ``inline`` for the old behaviour); the CLI
does not (it draws nothing, so the model may share its process, as in ``vllm bench``).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import signal
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any

from bench.run.job import Job, JobSnapshot
from bench.run.task import error_reason
from bench.send.processes import main_not_reimported
from engines.base import Engine, EngineOptions, ProgressFn, engine_class
from engines.errors import EngineUnavailable, MoEBenchError

POLL_S = 0.1  # how often a RemoteJob reads its run's state from the host
CANCEL_POLL_S = 0.02  # how often the host looks at the shared cancel flag of its run
STOP_TIMEOUT_S = 30.0  # a host asked to stop gets this long before it is terminated
_hosting = False
_hosts: weakref.WeakSet[_Host] = weakref.WeakSet()


class HostGone(MoEBenchError):
    """The engine host process exited (or its pipe broke)."""


def enable(on: bool = True) -> None:
    """Turn hosting on (or off) for this process: engines with an in-process model load in a host."""
    global _hosting
    _hosting = on


def hosting() -> bool:
    """Whether this process hosts models now: turned on by :func:`enable`, and not set to
    ``inline`` in the settings (``MOEBENCH_MODEL_HOST``, read on each call)."""
    from engines.settings import get_settings

    return _hosting and get_settings().model_host.strip().lower() != "inline"


def wants_host(options: EngineOptions) -> bool:
    """Whether an engine of these options would be hosted in this process."""
    return bool(getattr(engine_class(options.kind), "model_in_process", False)) and hosting()


def make_engine(options: EngineOptions) -> Engine:
    """The engine for ``options`` as this process runs it: hosted where :func:`wants_host`, else inline."""
    from engines.base import create_engine

    return HostedEngine(options) if wants_host(options) else create_engine(options)


# --- the host process ------------------------------------------------------------------------


def _watch_cancel(job: Job, seq: int, cancel_seq: Any) -> None:
    """Cancel ``job`` (the host's run number ``seq``) once the parent writes ``seq`` into the shared
    ``cancel_seq``: a Stop reaches the run without the pipe, which queues it behind any call in
    progress (the sidebar's memory read, the mirror's snapshot) and the host's command loop."""
    while not job.finished():
        if cancel_seq.value == seq:
            job.cancel()
            return
        time.sleep(CANCEL_POLL_S)


def _host_main(conn: Connection, cancel_seq: Any = None) -> None:
    """The host's loop: one command at a time from the parent; runs execute on their own threads."""
    from bench.run.execute import execute
    from bench.store import Store
    from engines.base import create_engine

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops us through the pipe
    engine: Engine | None = None
    stores: dict[str, Store] = {}
    jobs: dict[str, Job] = {}

    def stop_all() -> None:
        for job in jobs.values():
            job.cancel()
        for job in jobs.values():
            job.join(STOP_TIMEOUT_S / 2)
        if engine is not None:
            engine.stop()

    try:
        while True:
            try:
                tag, cmd, args = conn.recv()
            except (EOFError, OSError):  # the parent is gone: stop what runs and leave
                break
            try:
                if cmd == "load":
                    options = args

                    def progress(msg: str, frac: float, tag: int = tag) -> None:
                        conn.send(("progress", tag, (msg, frac)))

                    engine = create_engine(options)
                    engine.start(progress)
                    value: Any = engine.describe()
                elif engine is None:
                    raise EngineUnavailable("the engine host has no engine loaded")
                elif cmd == "memory":
                    value = engine.memory()
                elif cmd == "health":
                    value = engine.health()
                elif cmd == "run":
                    config, db_path, run_id, seq = args
                    store = stores.get(db_path) or stores.setdefault(db_path, Store(db_path))
                    job = Job(config, store)
                    job.attach_run(run_id)
                    job.name = f"run-{run_id}"
                    job.start(lambda job=job, engine=engine: execute(job, engine, owns_engine=False))
                    jobs[job.id] = job
                    if cancel_seq is not None:
                        threading.Thread(
                            target=_watch_cancel, args=(job, seq, cancel_seq), name=f"run-{run_id}-cancel", daemon=True
                        ).start()
                    value = job.id
                elif cmd == "snapshot":
                    value = jobs[args].snapshot()
                elif cmd == "cancel":
                    jobs[args].cancel()
                    value = None
                elif cmd == "stop":
                    stop_all()
                    engine = None
                    conn.send(("ok", tag, None))
                    return
                else:
                    raise ValueError(f"unknown command {cmd!r}")
                conn.send(("ok", tag, value))
            except Exception as exc:  # noqa: BLE001 - every failure goes back as its one-line reason
                conn.send(("error", tag, error_reason(exc)))
    finally:
        with contextlib.suppress(Exception):
            stop_all()


class _Host:
    """The parent's handle on one host process: call commands, one at a time."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # The number of the run to cancel (see _watch_cancel); runs are numbered from 1 by submit.
        self.cancel_seq = ctx.Value("q", 0)
        self._runs = 0
        self.proc = ctx.Process(
            target=_host_main, args=(child, self.cancel_seq), name="moebench-engine-host", daemon=True
        )
        with main_not_reimported():  # not the Streamlit runner again in the child
            self.proc.start()
        child.close()
        self._lock = threading.Lock()
        self._tag = 0
        self.exit_reason: str | None = None
        _hosts.add(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def gone(self) -> str | None:
        """None while the host lives; else why it is gone."""
        if self.exit_reason is not None:
            return self.exit_reason
        if not self.proc.is_alive():
            self.exit_reason = f"the engine host process (pid {self.proc.pid}) exited with code {self.proc.exitcode}"
        return self.exit_reason

    def call(self, cmd: str, args: Any = None, progress: ProgressFn | None = None) -> Any:
        with self._lock:
            if (reason := self.gone()) is not None:
                raise HostGone(reason)
            self._tag += 1
            tag = self._tag
            try:
                self.conn.send((tag, cmd, args))
                while True:
                    if not self.conn.poll(0.5):
                        if (reason := self.gone()) is not None:
                            raise HostGone(reason)
                        continue
                    kind, got, value = self.conn.recv()
                    if got != tag:
                        continue  # a reply to an earlier call given up on
                    if kind == "progress":
                        if progress is not None:
                            progress(*value)
                        continue
                    if kind == "error":
                        raise MoEBenchError(value)
                    return value
            except (EOFError, OSError, BrokenPipeError) as exc:
                self.proc.join(2.0)
                raise HostGone(self.gone() or f"the engine host's pipe broke: {exc}") from exc

    def close(self) -> None:
        """Stop the host: ask, then terminate, then kill; returns when the process is gone."""
        if self.proc.is_alive():
            with contextlib.suppress(Exception):
                self.call("stop")
            self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self.exit_reason = self.exit_reason or "the engine host was stopped"
        with contextlib.suppress(Exception):
            self.conn.close()


@atexit.register
def _close_hosts() -> None:
    for host in list(_hosts):
        with contextlib.suppress(Exception):
            host.close()


# --- the parent's engine and job ------------------------------------------------------------


class HostedEngine(Engine):
    """An engine whose model lives in an engine host process (see the module docstring)."""

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.kind = options.kind  # type: ignore[misc] - the hosted engine's kind, per instance
        self._host: _Host | None = None
        self._info: dict[str, Any] = {}

    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        report = progress or (lambda msg, frac: None)
        report("starting the engine host process", 0.05)
        self._host = _Host()
        try:
            info = self._host.call("load", self.options, progress=report)
        except BaseException:
            self._host.close()
            raise
        self._info = {**info, "engine_host_pid": self._host.pid}
        self.started = True

    @property
    def host(self) -> _Host:
        if self._host is None:
            raise EngineUnavailable("the engine is not started; load the model first")
        return self._host

    def describe(self) -> dict[str, Any]:
        return dict(self._info) or super().describe()

    def memory(self) -> Any:
        return self.host.call("memory") if self.started else None

    def health(self) -> str | None:
        if self._host is None:
            return None
        try:
            return self.host.call("health")
        except HostGone as exc:
            return str(exc)

    def stop(self) -> None:
        if self._host is not None:
            self._host.close()
        self.started = False

    def submit(self, job: RemoteJob) -> str:
        """Start ``job``'s run in the host; the host's id of it. The run gets the next number,
        which :meth:`cancel_run` writes into the shared cancel flag."""
        host = self.host
        host._runs += 1
        job.host_seq = host._runs
        return host.call("run", (job.config, str(job.store.path), job.run_id, job.host_seq))

    def cancel_run(self, seq: int) -> None:
        """Cancel the host's run number ``seq`` at once, through shared memory (not the pipe)."""
        if self._host is not None:
            self._host.cancel_seq.value = seq


class RemoteJob(Job):
    """A run executed in an engine host, mirrored here (see the module docstring)."""

    def __init__(self, config: Any, store: Any, engine: HostedEngine, owns_engine: bool) -> None:
        super().__init__(config, store)
        self.engine = engine
        self.owns_engine = owns_engine
        self._remote: JobSnapshot | None = None
        self.host_seq: int | None = None  # the run's number in the host (HostedEngine.submit)

    def cancel(self) -> None:
        """Stop the run: the host sees it within :data:`CANCEL_POLL_S`, whatever the pipe is busy with."""
        super().cancel()
        if self.host_seq is not None and self.active:
            self.engine.cancel_run(self.host_seq)

    def snapshot(self) -> JobSnapshot:
        with self._lock:
            remote, status, phase, error = self._remote, self._status, self._phase, self._error
        if remote is None:
            return super().snapshot()
        return JobSnapshot(
            job_id=self.id,
            run_id=self._run_id,
            status=status,
            phase=phase,
            done=remote.done,
            total=remote.total,
            failed=remote.failed,
            in_flight=remote.in_flight if status == "running" else 0,
            elapsed_s=remote.elapsed_s,
            error=error,
            summary=remote.summary,
            mode=remote.mode,
            config=remote.config,
        )

    def _mirror(self, snap: JobSnapshot) -> None:
        with self._lock:
            self._remote = snap
            self._summary = snap.summary
        if snap.status != self.status and snap.status in self.TRANSITIONS[self.status]:
            self.transition(snap.status, phase=snap.phase, error=snap.error)
        else:  # the same status, or the host's "pending" while this side already says "loading"
            with self._lock:
                self._phase = snap.phase
                self._error = snap.error or self._error

    def follow(self) -> None:
        """The worker: (load the engine if owned,) start the run in the host and mirror it to its end."""
        assert self.run_id is not None
        engine, run_id = self.engine, self.run_id
        try:
            if self.owns_engine:
                self.transition("loading", phase="loading model")
                engine.start(lambda msg, frac: self.set_phase(f"loading: {msg}"))
            if self.cancel_event.is_set():
                self.store.finish_run(run_id, "cancelled", error="cancelled before any request was sent")
                self.transition("cancelled")
                return
            remote_id = engine.submit(self)
            cancel_sent = False
            while True:
                if self.cancel_event.is_set() and not cancel_sent:
                    engine.host.call("cancel", remote_id)
                    cancel_sent = True
                snap = engine.host.call("snapshot", remote_id)
                self._mirror(snap)
                if not snap.active:
                    return
                self.cancel_event.wait(POLL_S) if not cancel_sent else time.sleep(POLL_S)
        except HostGone as exc:
            reason = f"engine failed during the run: {exc}"
            self.store.finish_lost_run(run_id, "failed", error=reason)
            self.transition("failed", error=reason)
        except Exception as exc:  # noqa: BLE001 - a load failure is the run's one-line reason
            reason = error_reason(exc)
            self.store.finish_lost_run(run_id, "failed", error=reason)
            self.transition("failed", error=reason)
        finally:
            if self.owns_engine:
                with contextlib.suppress(Exception):
                    engine.stop()

"""Managed server subprocesses: start, wait until healthy, keep the log, stop the whole tree.

Used by every engine that runs a server of its own (vLLM now; Triton and LMDeploy later).

- Commands are argv lists, never shell strings; ports come from :func:`free_port`.
- Output (stdout and stderr) goes to a log file under ``<data dir>/logs`` that the UI can
  show; :meth:`ManagedProcess.tail` returns its last lines for error messages.
- The server runs in its own session (so its process group holds the server and every
  worker it forks) behind a tiny stdlib trampoline that, before ``exec``-ing the real
  command, forks a watchdog. The watchdog waits on a pidfd of *this* process and, if this
  process dies in any way (crash, SIGKILL), terminates the server's process group. That
  is PR_SET_PDEATHSIG's job done right: PDEATHSIG fires when the *thread* that forked the
  child exits, and engines are started from short-lived worker threads.
- :meth:`ManagedProcess.stop` kills the process tree (psutil children, then the process
  group): SIGTERM, a grace period, then SIGKILL. Every live process is also stopped at
  interpreter exit (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from engines.errors import EngineUnavailable, one_line
from engines.settings import get_settings

ProgressFn = Callable[[str, float], None]

# Runs with ``python -I -c``: argv[1] = launcher pid, argv[2:] = the real command.
# Stdlib only; it must work under any interpreter. The watchdog is forked before exec so
# it can hold a pidfd of the launcher; it leaves the server's process group, and exits on
# its own once that group is empty.
_TRAMPOLINE = r"""
import os, select, shutil, signal, sys, time
launcher = int(sys.argv[1])
cmd = sys.argv[2:]
scratch = os.environ.get("MOEBENCH_SERVER_TMP")
def gone():
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    os._exit(0)
if os.getppid() != launcher:
    sys.exit(70)  # the launcher died before we started
try:
    pidfd = os.pidfd_open(launcher)
except (AttributeError, OSError):
    pidfd = None
pgid = os.getpgid(0)
if os.fork() == 0:
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        poller = select.poll()
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        while True:
            if pidfd is not None:
                dead = bool(poller.poll(500))
            else:
                time.sleep(0.5)
                try:
                    os.kill(launcher, 0)
                    dead = False
                except ProcessLookupError:
                    dead = True
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                gone()
            except PermissionError:
                pass
            if dead:
                for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
                    try:
                        os.killpg(pgid, sig)
                    except ProcessLookupError:
                        gone()
                    deadline = time.monotonic() + wait
                    while time.monotonic() < deadline:
                        time.sleep(0.1)
                        try:
                            os.killpg(pgid, 0)
                        except ProcessLookupError:
                            gone()
                time.sleep(0.5)
                gone()
    finally:
        os._exit(0)
if pidfd is not None:
    os.close(pidfd)
os.execvp(cmd[0], cmd)
"""

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


def inductor_cache_dir() -> str:
    """torch inductor's default cache folder (``<tmp>/torchinductor_<user>``), computed here
    so that a server given its own TMPDIR keeps compiling into the shared one."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def logs_dir() -> Path:
    """Where server logs are kept: ``logs/`` beside the store (``MOEBENCH_LOGS_DIR`` overrides)."""
    path = get_settings().logs_dir
    path.mkdir(parents=True, exist_ok=True)
    return path


def kill_tree(pid: int, timeout: float = 10.0, pgid: int | None = None) -> None:
    """SIGTERM ``pid``, its descendants and process group ``pgid``; SIGKILL what is left after ``timeout``."""
    import psutil

    procs: list[psutil.Process] = []
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass

    def signal_all(sig: int) -> None:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                p.send_signal(sig)

    signal_all(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    if alive or (pgid is not None and _group_alive(pgid)):
        signal_all(signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ManagedProcess:
    """One server subprocess owned by this process. See the module docstring."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str = "server",
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: Path | None = None,
        private_tmp: bool = True,
    ) -> None:
        if isinstance(argv, str) or not argv:
            raise ValueError("argv must be a non-empty list of strings, not a shell string")
        self.argv = [str(a) for a in argv]
        self.name = name
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = log_path or logs_dir() / f"{name}-{stamp}-{os.getpid()}-{id(self) & 0xFFFF:04x}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self._stopped = False
        # The server's own TMPDIR, removed once its process group is gone (here or by the
        # watchdog): vLLM alone leaves a dozen ZMQ sockets and rendezvous files per start.
        self.private_tmp = private_tmp
        self.tmp_dir: Path | None = None

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> ManagedProcess:
        """Spawn the command (in its own session, behind the watchdog trampoline)."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.private_tmp and not (self.env and "TMPDIR" in self.env):
            # Short prefix: AF_UNIX socket paths under it must stay below 108 bytes.
            self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"mb-{re.sub(r'[^A-Za-z0-9_.-]', '-', self.name)[:12]}-"))
            env["TMPDIR"] = env["MOEBENCH_SERVER_TMP"] = str(self.tmp_dir)
            # Caches that outlive a server stay where torch keeps them by default.
            env.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
        full = [sys.executable, "-I", "-c", _TRAMPOLINE, str(os.getpid()), *self.argv]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    full,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                self._remove_tmp()
                raise EngineUnavailable(f"could not start {self.name}: {exc}") from exc
        self.started_at = time.time()
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def returncode(self) -> int | None:
        """None while running; the exit status once it has exited (negative: killed by a signal)."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_reason(self) -> str | None:
        """None while running; else one line such as "exited with code 1" or "killed by SIGKILL"."""
        if self.proc is None:
            return f"{self.name} was never started"
        code = self.proc.poll()
        if code is None:
            return None
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            return f"{self.name} was killed by {sig} (exit code {code})"
        return f"{self.name} exited with code {code}"

    def tail(self, lines: int = 20) -> list[str]:
        """The last ``lines`` non-empty lines of the log."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 64 * 1024))
                data = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        out: deque[str] = deque(maxlen=lines)
        for line in data.splitlines():
            if line.strip():
                out.append(line.rstrip())
        return list(out)

    def tail_one_line(self, lines: int = 4, limit: int = 600) -> str:
        """The last log lines joined with `` | `` (for one-line error reasons)."""
        return one_line(" | ".join(self.tail(lines)), limit)

    def wait_ready(
        self,
        probe: Callable[[], bool],
        timeout: float,
        *,
        interval: float = 0.5,
        progress: ProgressFn | None = None,
        what: str = "ready",
    ) -> float:
        """Call ``probe`` until it returns True; return the seconds it took.

        Raises :class:`EngineUnavailable` (with the last log lines) when the process
        exits first or ``timeout`` passes; on timeout the process is stopped.
        """
        t0 = time.monotonic()
        while True:
            reason = self.exit_reason()
            if reason is not None:
                raise EngineUnavailable(
                    f"{reason} before it was {what}; log {self.log_path}; last lines: {self.tail_one_line()}"
                )
            try:
                if probe():
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not up yet; any probe error means "try again"
                pass
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                tail = self.tail_one_line()
                self.stop()
                raise EngineUnavailable(
                    f"{self.name} was not {what} after {timeout:.0f} s; log {self.log_path}; last lines: {tail}"
                )
            if progress is not None:
                last = self.tail(1)
                progress(f"waiting for {self.name} ({elapsed:.0f} s): {one_line(last[0], 120) if last else ''}", 0.0)
            time.sleep(interval)

    def wait_http(
        self, url: str, timeout: float, *, progress: ProgressFn | None = None, interval: float = 0.5
    ) -> float:
        """Wait until ``GET url`` answers 200 (see :meth:`wait_ready`)."""
        import httpx

        def probe() -> bool:
            return httpx.get(url, timeout=2.0).status_code == 200

        return self.wait_ready(probe, timeout, interval=interval, progress=progress, what=f"healthy at {url}")

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and return its exit status."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        code = self.proc.wait(timeout)
        if not _group_alive(self.proc.pid):
            self._remove_tmp()
        self._forget()
        return code

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server and every process it started; idempotent."""
        if self.proc is None or self._stopped:
            return
        self._stopped = True
        pid = self.proc.pid
        kill_tree(pid, timeout=timeout, pgid=pid)  # start_new_session: pgid == pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        # Members of the group that are no longer our descendants (re-parented) may still be
        # exiting: stop returns only once the whole group is gone.
        deadline = time.monotonic() + timeout
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            end = time.monotonic() + 5.0
            while _group_alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
        self._remove_tmp()
        self._forget()

    def _remove_tmp(self) -> None:
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> ManagedProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, log={str(self.log_path)!r})"


def creeping_progress(report: ProgressFn, lo: float, hi: float, expected_s: float = 60.0) -> ProgressFn:
    """Map a server's start-up messages into ``lo..hi``: servers report no fraction, so the
    bar creeps towards ``hi`` over about ``expected_s`` seconds."""
    t0 = time.monotonic()

    def inner(msg: str, frac: float) -> None:
        elapsed = time.monotonic() - t0
        report(msg, lo + (hi - lo) * min(0.95, elapsed / expected_s))

    return inner


def live_processes() -> list[ManagedProcess]:
    """Processes started here and not yet stopped."""
    with _LIVE_LOCK:
        return list(_LIVE)


def stop_all(timeout: float = 5.0) -> None:
    """Stop every managed process (registered with ``atexit``)."""
    for proc in live_processes():
        with contextlib.suppress(Exception):
            proc.stop(timeout=timeout)


atexit.register(stop_all)

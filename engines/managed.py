"""What the server engines (vllm, triton, lmdeploy) share: a managed-server base and the
probe of the interpreter that would run the server.

:class:`ServerEngine` is an HTTP engine that reaches a running server at ``base_url`` or
launches its own (:mod:`engines.launch`); :func:`probe_interpreter` asks another Python
environment what it has installed without importing anything heavy here.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from functools import lru_cache
from typing import Any, ClassVar

from engines.accelerators import MemoryStats
from engines.base import EngineOptions, ProgressFn
from engines.errors import one_line
from engines.http_client import HTTPEngine
from engines.http_errors import httpx_client
from engines.launch import ManagedProcess, creeping_progress
from engines.models import checkpoint_stats
from engines.settings import get_settings


def probe_interpreter(python: str, script: str, timeout: float = 60.0, missing: str = "") -> dict[str, Any]:
    """Run ``script`` (stdlib only; its last stdout line is a JSON object) in the interpreter
    ``python`` with ``-I``, and return that object; on failure ``{"error": <one line>}``.

    Cached per interpreter path, modification time and PYTHONPATH, so a rebuilt environment is
    probed again. ``missing`` is appended to the reason when the interpreter does not exist (how to
    make one).
    """
    try:
        mtime = os.stat(python).st_mtime
    except OSError:
        return {"error": f"the interpreter {python} does not exist{missing}"}
    return dict(_probe_cached(python, mtime, os.environ.get("PYTHONPATH", ""), script, timeout))


# -I keeps this folder's packages out of the probe, and with them PYTHONPATH; but a server started
# from here inherits PYTHONPATH (vLLM installed with pip --target on a machine without an index), so
# the probe sees what the server will see.
_SEE_PYTHONPATH = (
    "import os, sys; sys.path[:0] = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]\n"
)


@lru_cache(maxsize=16)
def _probe_cached(python: str, mtime: float, pythonpath: str, script: str, timeout: float) -> dict[str, Any]:
    del mtime, pythonpath  # part of the cache key only
    try:
        out = subprocess.run(
            [python, "-I", "-c", _SEE_PYTHONPATH + script], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{python} did not answer the probe within {timeout:g} s"}
    except OSError as exc:
        return {"error": f"cannot run {python}: {one_line(exc, 200)}"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{python} failed: {one_line(last, 200)}"}
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"{python} printed no probe result"}
    if not isinstance(info, dict):
        return {"error": f"{python} printed no probe result"}
    return info


def process_tree_rss(pid: int) -> int | None:
    """Resident memory of process ``pid`` and all its descendants, in bytes; None when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue  # ended between the listing and the read
    return total


class ServerEngine(HTTPEngine):
    """An HTTP engine that reaches a running server at ``base_url`` or launches its own.

    Shared by the vllm, triton and lmdeploy engines (vllm and lmdeploy mix in
    :class:`~engines.openai_http.OpenAIEngine` for the protocol): the launch (argv list, free port,
    ready wait with the log's last lines on failure, the whole tree stopped on any error),
    a long-lived probe client for metrics and health (``httpx.get`` would build a client and
    an SSL context per call, holding the GIL while requests stream), and the health rule
    (the process exited, or the ready URL has not answered for 15 s).
    """

    server_label: ClassVar[str] = "server"

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self._url: str | None = getattr(options, "base_url", None)
        self.server: ManagedProcess | None = None
        self.argv: list[str] = []
        self.load_seconds = 0.0
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self._health_fail_since: float | None = None
        self._peak_rss = 0  # highest RSS of a launched server's process tree seen
        self.checkpoint_dir: str | None = None  # the checkpoint a launched server was given

    @property
    def base_url(self) -> str:
        return self._url or ""

    def health_url(self) -> str:
        """The URL that answers 200 while the server can serve."""
        raise NotImplementedError

    def attach_sender(self, spec: dict[str, Any]) -> None:
        self._url = spec["base_url"]  # a launched server's URL is known only after start
        if hasattr(self, "model_name"):
            self.model_name = spec["served_name"]
        super().attach_sender(spec)

    def launch(
        self,
        argv: list[str],
        url: str,
        report: ProgressFn,
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Start ``argv``, wait until :meth:`health_url` answers, then connect and check."""
        t0 = time.perf_counter()
        self.argv = argv
        self.server = ManagedProcess(argv, name=self.server_label, env=env).start()
        self._url = url
        try:
            wait = timeout or get_settings().server_start_timeout_s
            self.server.wait_http(self.health_url(), wait, progress=creeping_progress(report, 0.2, 0.9))
            self._client = self._make_client()
            self._check_server()
        except BaseException:
            self.server.stop()
            raise
        self.load_seconds = time.perf_counter() - t0

    def probe_client(self) -> Any:
        import httpx

        with self._probe_lock:
            if self._probe is None:
                self._probe = httpx_client(timeout=5.0, limits=httpx.Limits(max_connections=4))
            return self._probe

    def stop(self) -> None:
        super().stop()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()
                self._probe = None
        if self.server is not None:
            self.server.stop()

    def health(self) -> str | None:
        """None while the server runs and answers; else why not (one line)."""
        if self.server is not None:
            reason = self.server.exit_reason()
            if reason is not None:
                what = reason.removeprefix(f"{self.server.name} ")
                return f"{self.label} {what}; last log lines: {self.server.tail_one_line(3)}"
        if not self.base_url:
            return None
        import httpx

        try:
            ok = self.probe_client().get(self.health_url(), timeout=5.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._health_fail_since = None
            return None
        # A busy server may miss one probe: report only after 15 s without an answer.
        now = time.monotonic()
        if self._health_fail_since is None:
            self._health_fail_since = now
        if now - self._health_fail_since > 15.0:
            return f"{self.label} at {self.base_url} has not answered {self.health_url()} for 15 s"
        return None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            managed=self.server is not None,
            server_argv=self.argv,
            log_path=str(self.server.log_path) if self.server is not None else None,
            load_seconds=round(self.load_seconds, 3),
        )
        if self.server is not None:
            # A server MoE Bench started here: what it was given, and where it runs.
            info.update(device=self.device_label(), dtype=self.served_dtype())
            if self.checkpoint_dir:
                stats = checkpoint_stats(self.checkpoint_dir)
                if stats is not None:
                    info.update(stats)
        return info

    def device_label(self) -> str:
        """Where the launched server computes: the GPU's own name on CUDA (``NVIDIA H100 80GB
        HBM3``, as the native engine records it: the card a run is compared and limited on),
        else its accelerator option."""
        kind = str(getattr(self.options, "accelerator", "") or "")
        if kind == "cuda":
            from engines.telemetry import cuda_device_name

            return cuda_device_name() or kind
        return kind

    def served_dtype(self) -> str:
        """The dtype the launched server was told to use (an engine that resolves ``auto`` says so)."""
        return str(getattr(self.options, "dtype", "") or "")

    def memory(self) -> MemoryStats | None:
        """A launched server's memory: the RSS of its whole process tree (workers included),
        with the highest seen since :meth:`reset_peak_memory` as the peak. Device memory
        (GPU/NPU) is not in RSS; a remote server (``base_url``) has none to read here."""
        if self.server is None:
            return None
        rss = process_tree_rss(self.server.pid)
        if rss is None:
            return None
        self._peak_rss = max(self._peak_rss, rss)
        return MemoryStats(rss, rss, self._peak_rss, "server process tree RSS")

    def server_pids(self) -> list[int]:
        """The launched server's pid and its descendants' (workers); empty when none runs."""
        if self.server is None:
            return []
        import psutil

        try:
            root = psutil.Process(self.server.pid)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return []

    def reset_peak_memory(self) -> None:
        if self.server is not None:
            self._peak_rss = process_tree_rss(self.server.pid) or 0

"""Dashboard fixtures: AppTest factory, fresh data folders, the session's store, a real server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.store import Store

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "app.py"
# What `make run` starts: app.py served behind the host guard (dashboard/serve.py).
SERVE = ROOT / "dashboard" / "serve.py"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_dashboard(env: Mapping[str, str], log_path: Path, timeout_s: float = 60) -> Iterator[str]:
    """The dashboard as `make run` starts it, on a free port; yields its URL once healthy.

    The process (and its group) is killed at the end; its output goes to ``log_path``.
    """
    port = free_port()
    argv = [
        sys.executable, "-m", "streamlit", "run", str(SERVE),
        "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
    ]  # fmt: skip
    log = open(log_path, "wb")  # closed in the finally below, once the process is gone
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"streamlit exited with {proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"streamlit did not become healthy within {timeout_s:.0f} s; see {log_path}")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()


@pytest.fixture
def fresh_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder of its own (so an empty database), for this test only."""
    folder = tmp_path / "data"
    monkeypatch.setenv("MOEBENCH_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def app_test(monkeypatch: pytest.MonkeyPatch) -> Callable[..., object]:
    """A factory for an AppTest of the real app (after a first run, so pages can be switched).
    AppTest runs app.py itself: it stands in for serve.py, so it says the guard is in front."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MOEBENCH_GUARDED", "1")

    def make(page: str | None = None, timeout: float = 60) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=timeout)
        at.run()
        if page is not None:
            at.switch_page(page)
            at.run()
        return at

    return make


@pytest.fixture
def session_store(moebench_data: Path) -> Iterator[Store]:
    """The store the app uses in this test session (same database file)."""
    from engines.settings import get_settings

    store = Store(get_settings().db_path)
    yield store
    store.close()

"""Driving the real dashboard in Chromium with Playwright: start it (as ``make run`` does, on a data
folder of its own), open a page from the sidebar, type a number, wait for the script run to end.
Used by the end-to-end tests and by the dashboard studies (studies/dashboard_live.py,
studies/cli_vs_dashboard.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_dashboard(data_dir: Path, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = _free_port()
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "serve.py"),
        "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
    ]  # fmt: skip
    out = log.open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.read().strip() == b"ok":
                    return url, proc
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the dashboard did not start; see {log}")


def wait_idle(page: Any) -> None:
    """Wait until the script run finishes (Streamlit's status widget goes away)."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=60_000)


def goto_page(page: Any, title: str) -> float:
    """Open a page from the sidebar; seconds until its heading shows and the script run ends."""
    t = time.perf_counter()
    link = page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=title, exact=True)
    heading = page.locator('[data-testid="stMain"]').get_by_role("heading", name=title, exact=True).first
    for attempt in range(4):
        # A click that lands while a live page redraws can be lost (seen once in CI mid-run: the
        # heading never came): click again rather than wait the whole minute on one click.
        link.click()
        try:
            heading.wait_for(timeout=15_000)
            break
        except Exception:  # playwright's TimeoutError; the last one is raised
            if attempt == 3:
                raise
    wait_idle(page)
    return time.perf_counter() - t


def set_number(page: Any, label: str, value: int) -> None:
    """Type a number and let the app rerun with it. On a loaded machine the rerun may not have
    started when the status widget is first checked, so wait a moment, then check the value took."""
    box = page.locator('[data-testid="stMain"]').get_by_role("spinbutton", name=label, exact=True)
    for _ in range(3):
        box.fill(str(value))
        box.press("Enter")
        time.sleep(0.7)
        wait_idle(page)
        if box.input_value() == str(value):
            return
    raise AssertionError(f"{label} did not take the value {value}")

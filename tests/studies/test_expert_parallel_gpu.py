"""The EP GPU study's run control: a point past ``--timeout`` is stopped with everything it started
(the CLI's engine and expert-parallel ranks), so the next point finds the GPUs free."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from studies.expert_parallel_gpu import stop_group


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is gone too
        return f.read().split(") ")[1][0] != "Z"


def test_a_run_past_its_timeout_is_stopped_with_its_children() -> None:
    # a parent that ignores SIGTERM (SIGKILL follows) and a child that would outlive it
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(c.pid, flush=True); "
        "time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    child = int(p.stdout.readline())
    t0 = time.monotonic()
    stop_group(p, grace_s=1.0)
    assert p.returncode is not None and p.returncode < 0  # killed, not exited
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    assert time.monotonic() - t0 < 30

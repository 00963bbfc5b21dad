"""What else ran on the host during a run: CPU of the host, of MoE Bench's own process
tree (the dashboard or the CLI, its engine host, sender processes, managed servers) and of
everything else, per second.

A figure measured while other programs competed for the CPU is not the engine's: the
summary carries a one-line ``disturbance`` reason when other processes used half a core
or more on average, when the hypervisor stole CPU (``steal``, Linux VMs), or when the
client fell behind its schedule (the send-lag rule of :mod:`bench.metrics.client_bound`).

Reading the host's CPU is one ``/proc/stat`` read and our tree's a few ``/proc/<pid>``
reads per sample, on the sampler's thread; the busiest other processes are found from
two snapshots of every process, at the start and at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import psutil

SERIES_HOST_CPU = "host_cpu_pct"  # busy share of all the host's cores, %
SERIES_STEAL = "host_steal_pct"  # CPU time the hypervisor took, % of all cores
SERIES_CLIENT_CPU = "client_cpu_cores"  # MoE Bench's process tree (client, senders, managed servers), cores
SERIES_OTHER_CPU = "other_cpu_cores"  # every other process, cores
HOST_SERIES = (SERIES_HOST_CPU, SERIES_STEAL, SERIES_CLIENT_CPU, SERIES_OTHER_CPU)

OTHER_CORES_LIMIT = 0.5  # other processes busier than this on average disturb a run
STEAL_LIMIT_PCT = 5.0
BUSY_OTHER_CORES = 0.1  # a process this busy on average is named among the others


def is_moebench_process(argv: Sequence[str]) -> bool:
    """Whether a command line is one of MoE Bench's own: the dashboard (``streamlit run
    dashboard/serve.py`` or ``app.py``), the CLI (``python -m bench ...``, ``moebench``)."""
    args = [str(a) for a in argv]
    if any(a.replace("\\", "/").endswith(("dashboard/serve.py", "dashboard/app.py")) for a in args):
        return True
    if any(a == "-m" and nxt.split(".")[0] == "bench" for a, nxt in pairwise(args)):
        return True
    return any(a.replace("\\", "/").rsplit("/", 1)[-1] == "moebench" for a in args[:2])


def own_root(proc: psutil.Process | None = None) -> psutil.Process:
    """The top of MoE Bench's own process tree around ``proc`` (this process by default): its
    parents while they are MoE Bench's (:func:`is_moebench_process`). A run measured in the engine
    host then counts the dashboard that started it, its other children and their senders as its
    own, not as "other processes" that disturbed it."""
    top = proc or psutil.Process()
    try:
        parent = top.parent()
        while parent is not None and is_moebench_process(parent.cmdline()):
            top, parent = parent, parent.parent()
    except psutil.Error:
        pass  # a parent ended or cannot be read: what was found so far
    return top


def _tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds (user + system) of ``root`` and its live descendants, and of the children it has reaped."""
    total = 0.0
    try:
        t = root.cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
        kids = root.children(recursive=True)
    except psutil.Error:
        return total
    for p in kids:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # ended between the listing and the read
        total += t.user + t.system
    return total


@dataclass
class _Reading:
    wall: float
    busy: float
    steal: float
    total: float
    ours: float


class HostLoad:
    """Per-interval CPU shares of the host, of our process tree and of the others."""

    def __init__(self, root: psutil.Process | None = None) -> None:
        self.root = root or own_root()
        self.cores = psutil.cpu_count() or 1
        self._last = self._read()
        self._start_procs = _process_cpu()
        self._start_wall = time.monotonic()

    def _read(self) -> _Reading:
        t = psutil.cpu_times()
        steal = getattr(t, "steal", 0.0)
        idle = t.idle + getattr(t, "iowait", 0.0)
        total = sum(t)
        # guest time is already counted in user (Linux): leave it out of the sum
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        return _Reading(time.monotonic(), total - idle - steal, steal, total, _tree_cpu_s(self.root))

    def sample(self) -> dict[str, float]:
        """The shares since the last sample (or since construction)."""
        now, last = self._read(), self._last
        self._last = now
        wall = max(1e-6, now.wall - last.wall)
        total = max(1e-6, now.total - last.total)
        busy, ours = now.busy - last.busy, now.ours - last.ours
        return {
            SERIES_HOST_CPU: 100.0 * busy / total,
            SERIES_STEAL: 100.0 * (now.steal - last.steal) / total,
            SERIES_CLIENT_CPU: max(0.0, ours / wall),
            SERIES_OTHER_CPU: max(0.0, (busy - ours) / wall),
        }

    def busiest_others(self, limit: int = 3) -> list[tuple[str, int, float]]:
        """(name, pid, mean cores) of the busiest processes outside our tree since construction."""
        wall = max(1e-6, time.monotonic() - self._start_wall)
        ours = {self.root.pid}
        try:
            ours.update(p.pid for p in self.root.children(recursive=True))
        except psutil.Error:
            pass
        end = _process_cpu()
        rows = []
        for pid, (name, cpu) in end.items():
            if pid in ours:
                continue
            before = self._start_procs.get(pid)
            used = cpu - (before[1] if before is not None and before[0] == name else 0.0)
            if used / wall >= BUSY_OTHER_CORES:
                rows.append((name, pid, used / wall))
        return sorted(rows, key=lambda r: -r[2])[:limit]


def _process_cpu() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        t = p.info.get("cpu_times")
        if t is not None:
            out[p.pid] = (p.info.get("name") or "?", t.user + t.system)
    return out


def disturbance(
    other_cores: float | None,
    steal_pct: float | None,
    client_bound: str | None,
    busiest: Sequence[tuple[str, int, float]] = (),
) -> str | None:
    """One line saying what disturbed a run, or ``None``."""
    reasons = []
    if other_cores is not None and other_cores >= OTHER_CORES_LIMIT:
        names = ", ".join(f"{n} (pid {pid}, {c:.1f})" for n, pid, c in busiest)
        reasons.append(f"other processes used {other_cores:.1f} CPU cores on average" + (f": {names}" if names else ""))
    if steal_pct is not None and steal_pct >= STEAL_LIMIT_PCT:
        reasons.append(f"the hypervisor took {steal_pct:.0f}% of the CPU (steal)")
    if client_bound:
        reasons.append(client_bound)
    return "; ".join(reasons) if reasons else None

"""Whether the sending loop got a CPU when a chunk arrived, and how it asks for one.

A client stamps a chunk when its loop reads it, not when the bytes arrived: a loop that is
runnable but not running (waiting on the kernel's run queue) stamps late, and the chunks
read after the wait look like a burst (TTFT inflated, TPOT near 0). Against a vLLM CPU
server on a 2-core machine this was the stall of issue 45: vLLM pins its worker to one
core and its engine core spins on the other while requests are in flight; the sending
thread waited there 88-223 ms at a time (0.4-4.0 s in a 2-4.5 s run) while the wire
(tcpdump) showed every chunk on time.

- :func:`lift_priority`: a sender process asks for the round-robin real-time class where
  the OS allows it (measured: 6 of 6 runs clean, TTFT p90 35-39 ms beside vllm bench's
  38-50 ms, where 6-7 of 8 had stalled);
- :func:`own_session`: a session of its own, so with autogroup scheduling it competes as
  its own group, as the server launched in its own session does;
- :class:`CpuWait`: the sending thread's run-queue wait over the measured window, from
  ``/proc/thread-self/schedstat`` (Linux), so a run whose client waited anyway says so
  (:func:`starved`) instead of passing the wait off as the server's latency.
"""

from __future__ import annotations

import os

SCHEDSTAT = "/proc/thread-self/schedstat"
# A sending loop that waited on the run queue for more than this share of the measured window
# (and at least CPU_WAIT_MIN_MS) made the run's latencies partly the client's: the run says so.
CPU_WAIT_LIMIT_FRACTION = 0.02
CPU_WAIT_MIN_MS = 50.0


def _read() -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on the run queue) of the calling thread; None where unknown."""
    try:
        with open(SCHEDSTAT, encoding="ascii") as f:
            run_ns, wait_ns, *_ = f.read().split()
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


class CpuWait:
    """The calling thread's CPU time and run-queue wait between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self._start: tuple[int, int] | None = None

    def start(self) -> None:
        self._start = _read()

    def stop(self) -> dict[str, float] | None:
        """{"run_ms", "wait_ms"} of the window, or None where the kernel does not say."""
        end = _read()
        if self._start is None or end is None:
            return None
        return {"run_ms": (end[0] - self._start[0]) / 1e6, "wait_ms": (end[1] - self._start[1]) / 1e6}


def combine(parts: list[dict[str, float]]) -> dict[str, float] | None:
    """Several sending threads' figures: their sums, and the largest single wait."""
    if not parts:
        return None
    return {
        "run_ms": sum(p["run_ms"] for p in parts),
        "wait_ms": sum(p["wait_ms"] for p in parts),
        "max_wait_ms": max(p["wait_ms"] for p in parts),
        "loops": float(len(parts)),
    }


def starved(cpu: dict[str, float] | None, duration_s: float | None) -> str | None:
    """One line when the busiest sending loop waited for a CPU past the limit, else None."""
    if not cpu or not duration_s or duration_s <= 0:
        return None
    worst = cpu.get("max_wait_ms", cpu.get("wait_ms", 0.0))
    if worst < max(CPU_WAIT_MIN_MS, CPU_WAIT_LIMIT_FRACTION * duration_s * 1000):
        return None
    return (
        f"the sending loop waited {worst:.0f} ms for a CPU in a {duration_s:.1f} s run (run queue): "
        "its latencies include that wait (a CPU-starved client; give it a core of its own)"
    )


SENDER_RT_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own


def lift_priority(setting: str) -> str | None:
    """Put the calling thread (and the threads it starts later) in the SCHED_RR class at
    :data:`SENDER_RT_PRIORITY` when ``setting`` is "realtime"; the reason why not, or None.

    A sending loop spends a few per cent of a core (parsing events, stamping chunks); as a
    real-time thread it runs the moment a chunk arrives instead of after the run queue's
    other threads, such as a vLLM CPU server's spinning engine core. The kernel keeps 5 % of
    each core for normal threads (sched_rt_runtime_us), so a runaway loop cannot lock a core.
    """
    if setting != "realtime":
        return f"sender priority is {setting!r}"
    if not hasattr(os, "sched_setscheduler"):
        return "no real-time scheduling on this system"
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(SENDER_RT_PRIORITY))
    except (OSError, AttributeError) as exc:  # EPERM without root or CAP_SYS_NICE
        return f"real-time priority refused ({getattr(exc, 'strerror', None) or exc})"
    return None


def own_session() -> str | None:
    """Make this process the leader of a new session (its own autogroup); the reason why not, or None."""
    if not hasattr(os, "setsid"):
        return "no sessions on this system"
    try:
        os.setsid()
    except OSError as exc:  # already a session leader, or not allowed
        return f"setsid: {exc.strerror or exc}"
    return None

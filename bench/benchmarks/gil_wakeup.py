"""How long an asyncio loop waits for the GIL after a wake-up while another thread of the
same process runs Python code (as the dashboard does while it draws charts during a run).

The runner's asyncio sender lowers the GIL switch interval while it measures
(``bench.runner.SENDER_SWITCH_INTERVAL_S``); this prints the wake-up delay of a 2 ms sleep
at the default interval and at the runner's, so the choice stays checked by a figure.

    python -m bench.benchmarks.gil_wakeup [--samples 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time

from bench.runner import SENDER_SWITCH_INTERVAL_S

SLEEP_S = 0.002


def _busy(stop: threading.Event) -> None:
    """Pure-Python work that never blocks (a chart being built)."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


async def _wakeups(samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        await asyncio.sleep(SLEEP_S)
        out.append((time.perf_counter() - t - SLEEP_S) * 1000.0)
    return out


def measure(interval_s: float, samples: int, busy: bool = True) -> list[float]:
    """Wake-up delays (ms past the 2 ms sleep) at this switch interval, with or without a busy thread."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    stop = threading.Event()
    thread = threading.Thread(target=_busy, args=(stop,), daemon=True)
    if busy:
        thread.start()
    try:
        return asyncio.run(_wakeups(samples))
    finally:
        stop.set()
        if busy:
            thread.join()
        sys.setswitchinterval(old)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.benchmarks.gil_wakeup", description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=500)
    args = p.parse_args(argv)
    default = sys.getswitchinterval()
    rows = [
        ("no busy thread", default, False),
        ("busy thread, default interval", default, True),
        ("busy thread, runner's interval", SENDER_SWITCH_INTERVAL_S, True),
    ]
    print(f"{'case':<32}{'interval ms':>12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    p50 = {}
    for label, interval, busy in rows:
        lat = sorted(measure(interval, args.samples, busy))
        q = statistics.quantiles(lat, n=100)
        p50[label] = q[49]
        print(f"{label:<32}{interval * 1000:>12.1f}{q[49]:>9.2f}{q[89]:>9.2f}{q[98]:>9.2f}")
    a, b = p50["busy thread, default interval"], p50["busy thread, runner's interval"]
    print(f"\nwake-up delay with a busy thread: {a:.2f} ms -> {b:.2f} ms at the median ({a / max(b, 1e-9):.1f}x less)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

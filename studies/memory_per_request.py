"""Memory per completed request, and how soon the first request leaves, for a long run.

Runs one closed-loop run in this process (as the dashboard does) and samples the Python
heap this process holds (``tracemalloc``'s traced size, after a collection) as requests
complete: at 20 %, 60 % and 100 % of them (tracing starts once the run is sending; the
sender processes are not traced). The growth from one checkpoint to the next,
divided by the requests completed in between, is what a completed request leaves behind.
Records now go to the store and are not kept, so both figures should be near zero. Before:
about 0.45 KB per request on the openai engine, 3.4 KB on native, never freed. The
process's RSS at the end is printed too; RSS moves by megabytes with the allocator and
SQLite's page caches, so it is no per-request measure on runs this short.

Engines: ``openai`` against :mod:`bench.stub_server` (a zero-compute streaming
server: many requests quickly) and ``native`` (the tiny model on this machine's CPU).
Also printed: seconds from the run being started to its first request leaving (prompts
are built a block at a time, so it should not grow with ``--requests``).
Figures, not a test: the exit status is 0 whatever they are.

    python -m studies.memory_per_request [--engine openai native] [--requests 20000] \\
        [--native-requests 1500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from bench.stub_server import start_stub_server
from engines.models import resolve_model


def _heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def one_run(engine: dict[str, Any], requests: int, concurrency: int, store: Store) -> dict[str, float]:
    """One run; RSS growth per request early (20 -> 60 %) and late (60 -> 100 %), and the time to the first request."""
    cfg = RunConfig.build(
        engine=engine,
        mode="concurrency",
        workload={"source": "random", "input_len": 32, "output_len": 8},
        requests=requests,
        concurrency=concurrency,
        warmup=1,
    )
    t_start = time.perf_counter()
    job = start_run(cfg, store)
    checkpoints = [max(1, requests // 5), max(2, requests * 3 // 5)]
    first_sent: float | None = None
    marks: list[tuple[int, int]] = []
    while True:
        snap = job.wait(0.05)
        if first_sent is None and snap.status == "running":
            first_sent = time.perf_counter() - t_start
            tracemalloc.start(1)  # from here: tracing slows Python, and the start-up is timed
        if len(marks) < len(checkpoints) and snap.done >= checkpoints[len(marks)]:
            marks.append((snap.done, _heap()))
        if not snap.active:
            break
    marks.append((snap.done, _heap()))
    tracemalloc.stop()
    if snap.status != "completed" or len(marks) != 3:
        raise SystemExit(f"run {snap.run_id} {snap.status}: {snap.error}")

    def per_request(a: tuple[int, int], b: tuple[int, int]) -> float:
        return (b[1] - a[1]) / max(1, b[0] - a[0])

    return {
        "early_b": per_request(marks[0], marks[1]),
        "late_b": per_request(marks[1], marks[2]),
        "first_request_s": first_sent or 0.0,
        "rss_mib": psutil.Process().memory_info().rss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", nargs="+", default=["openai", "native"], choices=["openai", "native"])
    p.add_argument("--requests", type=int, default=20000, help="requests of an openai run")
    p.add_argument("--native-requests", type=int, default=1500, help="requests of a native run")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    _, model_dir = resolve_model("tiny-deepseek-v3")  # the tiny model's folder: its tokenizer
    url, stub = start_stub_server(itl_ms=0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "db.sqlite")
            rows: dict[str, list[dict[str, float]]] = {e: [] for e in args.engine}
            for r in range(args.rounds):
                order = args.engine if r % 2 == 0 else list(reversed(args.engine))  # ABBA
                for kind in order:
                    if kind == "openai":
                        engine = {"kind": "openai", "base_url": url, "model": "tiny-deepseek-v3",
                                  "tokenizer": str(model_dir)}  # fmt: skip
                        rows[kind].append(one_run(engine, args.requests, 64, store))
                    else:
                        rows[kind].append(one_run({"kind": "native"}, args.native_requests, 4, store))
                    print(f"round {r + 1} {kind}: {rows[kind][-1]}", flush=True)
    finally:
        stub.stop()
    print(f"\n{'engine':<8}{'requests':>10}{'B/req 20-60 %':>22}{'B/req 60-100 %':>22}{'first request s':>20}"
          f"{'RSS MiB':>9}")  # fmt: skip
    for kind, rs in rows.items():
        n = args.requests if kind == "openai" else args.native_requests

        def runs(key: str, fmt: str, rs: list[dict[str, float]] = rs) -> str:
            return " / ".join(format(x[key], fmt) for x in rs)

        print(
            f"{kind:<8}{n:>10}{runs('early_b', '.0f'):>22}{runs('late_b', '.0f'):>22}"
            f"{runs('first_request_s', '.2f'):>20}{statistics.median(x['rss_mib'] for x in rs):>9.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

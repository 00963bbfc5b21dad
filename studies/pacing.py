"""Pacing: how closely open-loop arrivals leave at their due times as the rate grows.

Runs MoE Bench open-loop (Poisson, ``--request-rate R``) against the zero-compute stub
server (:mod:`bench.stub_server`, ``--itl-ms`` spacing its events so requests
overlap as on a real server) at each rate and worker count, and prints per run: the rate
the schedule asked for, the rate at which requests actually left (requests / time from the
first to the last send), and the send lag (actual - due send time) p50 / p90 / p99 / max.
AIPerf reports that event-loop timers under-deliver past ~500 req/s; this shows where ours
stand on this machine. Figures, not a test; exit status 0.

    python -m studies.pacing [--rates 100 500 1000 2000] [--workers 1 2] [--requests 3000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import RunConfig
from bench.metrics.records import percentile
from bench.run.manager import start_run
from bench.send.schedule import arrival_offsets
from bench.store import Store
from bench.stub_server import start_stub_server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.pacing", description=__doc__.split("\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[100.0, 500.0, 1000.0, 2000.0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=1024, help="cap on requests in flight")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--itl-ms", type=float, default=5.0, help="the stub's gap between events")
    args = p.parse_args(argv)

    url, server = start_stub_server(itl_ms=args.itl_ms)
    work = Path(tempfile.mkdtemp(prefix="pacing-"))
    store = Store(work / "pacing.sqlite")
    print(
        f"{args.requests} requests per run, Poisson arrivals, cap {args.concurrency} in flight, "
        f"{args.output_len} output tokens {args.itl_ms:g} ms apart (stub server)\n"
    )
    print(
        f"{'asked req/s':>11} {'workers':>7} {'scheduled':>9} {'sent req/s':>10} "
        f"{'lag p50 ms':>10} {'p90':>7} {'p99':>7} {'max':>8}"
    )
    try:
        for rate in args.rates:
            for workers in args.workers:
                cfg = RunConfig.build(
                    engine={"kind": "openai", "model": "tiny-deepseek-v3", "base_url": url},
                    mode="concurrency",
                    workload={"source": "builtin", "output_len": args.output_len},
                    requests=args.requests,
                    concurrency=args.concurrency,
                    request_rate=rate,
                    workers=workers,
                    server_metrics=False,
                    name=f"pacing {rate:g} req/s, {workers} worker(s)",
                )
                snap = start_run(cfg, store).wait(600)
                if snap.status != "completed":
                    print(f"{rate:>11g} {workers:>7} run {snap.status}: {snap.error}")
                    continue
                recs = store.records(snap.run_id)  # type: ignore[arg-type]
                due = arrival_offsets(args.requests, rate, 1.0, seed=0)
                scheduled = (len(due) - 1) / due[-1]
                starts = sorted(r.start_s for r in recs)
                lags = [r.send_lag_ms for r in recs if r.send_lag_ms is not None]
                sent = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0

                def f(q: float, xs: list[float] = lags) -> str:
                    v = percentile(xs, q)
                    return "-" if v is None else f"{v:.2f}"

                print(
                    f"{rate:>11g} {workers:>7} {scheduled:>9.0f} {sent:>10.0f} "
                    f"{f(50):>10} {f(90):>7} {f(99):>7} {max(lags):>8.2f}",
                    flush=True,
                )
    finally:
        server.stop()
    print(
        "\nscheduled: the rate of the drawn arrival times (Poisson: a few % off the asked rate); sent req/s: "
        "requests / (last send - first send). Lag: actual - due send time."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How closely a replayed trace keeps its schedule: send lag of a Mooncake trace at 200 req/s
against the stub server, beside a Poisson open loop at the same mean rate.

Each round writes a fresh synthetic trace (``python -m bench trace synth``: ``--requests`` at
``--rate`` req/s, 4 prefix groups, 768-token prompts built from hash-id blocks, 8 output tokens)
and runs, through the CLI against :mod:`bench.stub_server` (``--itl-ms``), the trace replay and a
``--request-rate`` Poisson run of the same size, alternating which goes first (ABBA). Each run's
send lag (actual - due send time) p50 / p90 / p99 / max comes from the stored per-request rows;
the table lists every round, then the median and range over rounds per arm.

    python -m studies.trace_replay [--rounds 4] [--requests 2000] [--rate 200] [--workers 2]

Figures, not a test: the exit status is 0 whatever they are.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.stub_server import start_stub_server
from engines.settings import PROJECT_ROOT

MODEL = "tiny-deepseek-v3"


def lags(db: Path) -> tuple[int, list[float]]:
    with sqlite3.connect(db) as con:
        rows = [r[0] for r in con.execute("SELECT send_lag_ms FROM samples WHERE error = ''")]
    return len(rows), [float(np.percentile(rows, q)) for q in (50, 90, 99)] + [max(rows)]


def run(arm: str, url: str, trace: Path, args: argparse.Namespace, work: Path, k: int) -> tuple[int, list[float]]:
    db = work / f"{arm}-{k}.sqlite"
    common = ["--engine", "openai", "--base-url", url, "--model", MODEL, "--requests", str(args.requests),
              "--workers", str(args.workers), "--warmup", "1", "--db", str(db), "--quiet"]  # fmt: skip
    if arm == "trace":
        load = ["--prompts", "trace", "--prompt-file", str(trace)]
    else:
        load = ["--input-len", "768", "--output-len", "8", "--request-rate", str(args.rate), "--concurrency", "1024"]
    p = subprocess.run([sys.executable, "-m", "bench", "run", *common, *load], cwd=PROJECT_ROOT, capture_output=True,
                       text=True, timeout=900)  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"{arm} run failed: {p.stderr.strip().splitlines()[-1:]}")
    return lags(db)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    args = ap.parse_args(argv)
    out: dict[str, list[list[float]]] = {"trace": [], "poisson": []}
    with tempfile.TemporaryDirectory(prefix="trace-replay-") as tmp:
        work = Path(tmp)
        url, proc = start_stub_server(itl_ms=args.itl_ms)
        try:
            print(f"{'round':>5} {'arm':<8} {'sent':>6} {'lag p50':>9} {'p90':>8} {'p99':>8} {'max':>8}  (ms)")
            for k in range(args.rounds):
                trace = work / f"trace-{k}.jsonl"
                subprocess.run([sys.executable, "-m", "bench", "trace", "synth", "--out", str(trace), "--requests",
                                str(args.requests), "--rate", str(args.rate), "--seed", str(k), "--output-len", "8"],
                               cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=300)  # fmt: skip
                order = ("trace", "poisson") if k % 2 == 0 else ("poisson", "trace")
                for arm in order:
                    n, figs = run(arm, url, trace, args, work, k)
                    out[arm].append(figs)
                    print(f"{k:>5} {arm:<8} {n:>6} " + " ".join(f"{v:>8.2f}" for v in figs), flush=True)
        finally:
            proc.stop()
    print("\nmedian over rounds [min..max]")
    for arm, rows in out.items():
        cols = list(zip(*rows, strict=True))
        cells = [f"{statistics.median(c):.2f} [{min(c):.2f}..{max(c):.2f}]" for c in cols]
        print(f"{arm:<8} p50 {cells[0]}  p90 {cells[1]}  p99 {cells[2]}  max {cells[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

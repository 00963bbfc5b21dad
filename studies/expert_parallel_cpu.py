"""Expert parallelism of the native engine on this CPU: what splitting the tiny model's routed
experts over 2 processes costs a request, where the time goes, and what the link gives.

- Latency: ``--rounds`` ABBA rounds (one process, EP 2, EP 2, one process, ...) of a latency run
  through the CLI (``python -m bench run --mode latency``, one request at a time): TPOT and TTFT
  p50 / p90 / p99 of each arm, and the ratio EP 2 / one process of TPOT p50 per pair.
- Where the time goes: one profile run at EP 2: the bottleneck breakdown's shares, and the run's
  ``communication`` artifact (bytes per MoE layer exchange, time inside the all-to-alls per rank).
- The link: ``python -m bench a2a --ranks 2`` (gloo between two processes of this machine).

    python -m studies.expert_parallel_cpu [--rounds 2] [--requests 20] [--output-len 32]

Figures, not a test: the exit status is 0 whatever they are.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _run(db: Path, ep: int, mode: str, requests: int, input_len: int, output_len: int) -> tuple[Store, int]:
    argv = [sys.executable, "-m", "bench", "run", "--quiet", "--engine", "native", "--model", "tiny-deepseek-v3",
            "--accelerator", "cpu", "--mode", mode, "--requests", str(requests), "--input-len", str(input_len),
            "--output-len", str(output_len), "--warmup", "2", "--db", str(db), "--engine-opt",
            f"expert_parallel={ep}"]  # fmt: skip
    if mode == "profile":
        argv += ["--concurrency", "2"]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"run failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    store = Store(db)
    return store, max(r.id for r in store.list_runs())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ep-study-"))
    db = tmp / "ep.sqlite"
    arms: dict[int, list] = {1: [], 2: []}
    ratios = []
    for r in range(args.rounds):
        order = (1, 2, 2, 1) if r % 2 == 0 else (2, 1, 1, 2)
        got: dict[int, list] = {1: [], 2: []}
        for ep in order:
            store, run_id = _run(db, ep, "latency", args.requests, args.input_len, args.output_len)
            s = store.get_run(run_id).summary
            got[ep].append(s)
            arms[ep].append(s)
            store.close()
        for a, b in zip(got[1], got[2], strict=True):
            ratios.append(b.tpot_ms.p50 / a.tpot_ms.p50)
    print(f"latency runs: {args.requests} requests, {args.input_len} in / {args.output_len} out, "
          f"{args.rounds} ABBA rounds (float32, the tiny DeepSeek-V3, 2 CPU cores)")  # fmt: skip
    print(f"  {'arm':<14}{'TPOT p50':>10}{'p90':>8}{'p99':>8}{'TTFT p50':>10}{'p90':>8}{'p99':>8}   (ms; per run)")
    for ep, runs in arms.items():
        for s in runs:
            print(f"  {'one process' if ep == 1 else 'EP 2':<14}{s.tpot_ms.p50:>10.2f}{s.tpot_ms.p90:>8.2f}"
                  f"{s.tpot_ms.p99:>8.2f}{s.ttft_ms.p50:>10.2f}{s.ttft_ms.p90:>8.2f}{s.ttft_ms.p99:>8.2f}")  # fmt: skip
    gm = math.exp(statistics.fmean(math.log(x) for x in ratios))
    print(f"  TPOT p50 EP 2 / one process: {gm:.2f} geometric mean ({min(ratios):.2f}-{max(ratios):.2f}, "
          f"{len(ratios)} pairs)")  # fmt: skip

    store, run_id = _run(db, 2, "profile", 4, args.input_len, 16)
    bd = store.artifact(run_id, "profile_breakdown")
    comm = store.artifact(run_id, "communication")
    store.close()
    print(f"profile run at EP 2 (4 requests, 2 in flight, 16 out): share of {bd['basis']} time")
    print("  " + ", ".join(f"{r['category']} {r['share_pct']:.1f} %" for r in bd["rows"] if r["share_pct"] >= 0.05))
    for r in comm["ranks"]:
        print(f"  rank {r['rank']}: {r['layers']} MoE layer exchanges, sent {r['sent_bytes']:,} B, received "
              f"{r['recv_bytes']:,} B, {r['seconds'] * 1e3:.1f} ms in all-to-alls, {r['expert_seconds'] * 1e3:.1f} ms "
              f"in its experts")  # fmt: skip
    print(f"  bytes per MoE layer exchange: {comm['bytes_per_exchange']:,.0f}")
    a2a = [sys.executable, "-m", "bench", "a2a", "--ranks", "2", "--max-mib", "16", "--iters", "20", "--json",
           str(tmp / "a2a.json")]  # fmt: skip
    p = subprocess.run(a2a, cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(p.stdout.strip() or p.stderr.strip())
    print(json.dumps({"tmp": str(tmp)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

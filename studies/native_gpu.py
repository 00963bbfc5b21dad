"""Native engine on a CUDA GPU: a profile run and latency/concurrency runs, exported as bundles.

Made for the lent H200 (see docs/accelerators.md): builds the ``random-v2-lite-shape`` model
(DeepSeek-V2-Lite's shape, random bf16 weights) directly on the GPU, runs

1. a profile run (torch.profiler, CPU + CUDA activities) -> operator table, bottleneck
   breakdown, expert routing, memory timeline;
2. latency runs at batch 1 and concurrency runs at 16 in flight (native = no batching
   across requests: each request runs its own ``generate``);

prints the figures and writes each run as a bundle (``python -m bench import FILE``)
under ``--out``. Usage: ``python studies/native_gpu.py --out DIR``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import RunConfig
from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_TRACE
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="random-v2-lite-shape")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--profile-output-len", type=int, default=8, help="shorter: profiles grow fast")
    ap.add_argument("--skip-concurrency", action="store_true")
    ap.add_argument("--only-profile", action="store_true")
    ap.add_argument("--db", help="SQLite file (default: OUT/gpu.sqlite)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(Path(args.db) if args.db else out / "gpu.sqlite")
    t0 = time.perf_counter()
    engine = create_engine({"kind": "native", "model": args.model, "accelerator": "cuda", "dtype": "bfloat16"})
    engine.start()
    info = engine.describe()
    print(
        f"loaded {info['model']} on {info['device']}: {info['parameters'] / 1e9:.2f} B params, "
        f"{info['weights_gib']:.1f} GiB, {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    def run(name: str, output_len: int = args.output_len, **kw: object) -> int:
        cfg = RunConfig.build(
            engine={"kind": "native", "model": args.model, "accelerator": "cuda", "dtype": "bfloat16"},
            workload={"source": "random", "input_len": args.input_len, "output_len": output_len},
            name=name,
            **kw,
        )
        t = time.perf_counter()
        snap = start_run(cfg, store, engine=engine).wait(540)
        s = snap.summary
        print(f"\n== {name}: {snap.status} in {time.perf_counter() - t:.1f} s", flush=True)
        if snap.error:
            print("error:", snap.error)
        if s is not None:
            print(
                f"   {s.completed}/{s.requests} ok, {s.output_throughput_tok_s:.1f} out tok/s, "
                f"TTFT p50 {s.ttft_ms.p50:.1f} ms, TPOT p50 {s.tpot_ms.p50:.2f} ms, "
                f"E2E p99 {s.e2e_ms.p99:.0f} ms, peak {s.peak_memory_gib:.2f} GiB",
                flush=True,
            )
        bundle = out / f"{name}.json"
        bundle.write_text(json.dumps(store.export_bundle(snap.run_id)))  # type: ignore[arg-type]
        return snap.run_id  # type: ignore[return-value]

    pid = run("h200-profile", output_len=args.profile_output_len, mode="profile", requests=2, concurrency=1, warmup=1)
    trace = store.artifact(pid, ARTIFACT_TRACE)
    if trace:
        with open(trace["path"], "rb") as src, gzip.open(out / "h200-profile.trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    bd = store.artifact(pid, ARTIFACT_BREAKDOWN)
    if bd:
        print(f"\nbreakdown ({bd['basis']} time, total {bd['total_ms']:.1f} ms)")
        for row in bd["rows"]:
            dev = "-" if row.get("device_ms") is None else f"{row['device_ms']:.1f}"
            print(
                f"   {row['category']:<16} cpu {row['cpu_ms']:>9.1f} ms  device {dev:>9} ms {row['share_pct']:>6.1f} %"
            )
    if args.only_profile:
        engine.stop()
        return 0
    run("h200-latency-bs1", mode="latency", requests=4, warmup=1)
    if not args.skip_concurrency:
        run("h200-concurrency-16", mode="concurrency", requests=32, concurrency=16, warmup=0)
    engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

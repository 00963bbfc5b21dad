"""The expert-parallel study (issue 37): ms per decode step of the native engine at EP 1 / 2 / 4 /
8 and batch 1 ... 512, and where a step's time goes (attention, routed experts, communication),
against the HBM roofline and the link's datasheet figure. Everything through the product's own
CLI: per (EP, batch) point one concurrency run (``batch_size`` = concurrency = requests = the
batch: every request of the point decodes in one batch; its TPOT is the step) and one profile
run of the same point (the bottleneck breakdown, on the device's time where it has kernels), each
loading the model anew; ``--bundles DIR`` exports every run (``export --bundle``) for
``examples/``, where the Profiling page shows them.

    python -m studies.expert_parallel_gpu --model random-v2-lite-shape --ep 1,2,4,8 \\
        --batches 1,32,128,512 --accelerator cuda --dtype bfloat16 [--bundles DIR] [--json F]
    python -m studies.expert_parallel_gpu --model random-v3-layers --ep 8 --batches 1,32,128,512 ...

EP N needs N GPUs on cuda (one rank each); on a CPU it runs with gloo (``--accelerator cpu``,
the tiny model: the script's own check). Figures, not a test: the exit status is 0 whatever they
are, 1 if a run failed (its one-line reason printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.store import Store

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ("attention_kv", "routed_experts", "moe_routing", "shared_experts", "communication", "other")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _cli(args: argparse.Namespace, db: Path, ep: int, batch: int, mode: str) -> tuple[int | None, str]:
    argv = [sys.executable, "-m", "bench", "run", "--quiet", "--engine", "native", "--model", args.model,
            "--accelerator", args.accelerator, "--dtype", args.dtype, "--mode", mode, "--requests", str(batch),
            "--concurrency", str(batch), "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--warmup", str(batch if mode == "concurrency" else min(batch, 2)), "--db", str(db),
            "--engine-opt", f"expert_parallel={ep}", "--engine-opt", f"batch_size={batch}",
            "--name", f"EP {ep} batch {batch} {mode}"]  # fmt: skip
    if args.engine_opt:
        for opt in args.engine_opt:
            argv += ["--engine-opt", opt]
    t0 = time.perf_counter()
    # its own process group: a run past --timeout is stopped with everything it started (the
    # engine, the other ranks), so the next point finds the GPUs free
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    try:
        _out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stop_group(p)
        return None, f"{mode} run stopped after --timeout {args.timeout:.0f} s"
    spent = time.perf_counter() - t0
    if p.returncode != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"
        return None, f"{mode} run failed after {spent:.0f} s: {last}"
    store = Store(db)
    try:
        return max(r.id for r in store.list_runs()), f"{spent:.0f} s"
    finally:
        store.close()


def stop_group(p: subprocess.Popen[str], grace_s: float = 30.0) -> None:
    """SIGTERM to the run's process group (the CLI stops its engine and ranks), SIGKILL after
    ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        try:
            p.communicate(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def point(args: argparse.Namespace, db: Path, ep: int, batch: int) -> dict[str, Any]:
    row: dict[str, Any] = {"ep": ep, "batch": batch}
    run_id, why = _cli(args, db, ep, batch, "concurrency")
    if run_id is None:
        return {**row, "error": why}
    store = Store(db)
    try:
        run = store.get_run(run_id)
        s = run.summary
        limits = store.artifact(run_id, "limits") or {}
        comm = store.artifact(run_id, "communication") or {}
        row.update(
            run=run_id,
            device=run.engine_info.get("device"),
            tpot_ms={"p50": s.tpot_ms.p50, "p90": s.tpot_ms.p90, "p99": s.tpot_ms.p99},
            output_tok_s=s.output_throughput_tok_s,
            tpot_limit_ms=limits.get("tpot_limit_ms"),
            bytes_per_exchange=comm.get("bytes_per_exchange"),
            rank0_a2a_gbps=(comm.get("ranks") or [{}])[0].get("a2a_gbps"),
        )
    finally:
        store.close()
    if args.no_profile:
        return row
    prof_id, why = _cli(args, db, ep, batch, "profile")
    if prof_id is None:
        return {**row, "profile_error": why}
    store = Store(db)
    try:
        bd = store.artifact(prof_id, "profile_breakdown") or {}
        shares = {r["category"]: r["share_pct"] for r in bd.get("rows", [])}
        row.update(profile_run=prof_id, basis=bd.get("basis"), split_pct={k: shares.get(k) for k in SPLIT})
    finally:
        store.close()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random-v2-lite-shape")
    ap.add_argument("--ep", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--batches", type=_ints, default=[1, 32, 128, 512])
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--engine-opt", action="append", help="more engine options for every run (KEY=VALUE)")
    ap.add_argument("--no-profile", action="store_true", help="the concurrency runs only (no split)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per CLI run")
    ap.add_argument("--db", type=Path, help="keep the runs in this store (default: a temporary one)")
    ap.add_argument("--bundles", type=Path, help="export every run as a bundle into this folder")
    ap.add_argument("--json", type=Path, help="write the table as JSON")
    args = ap.parse_args(argv)
    db = args.db or Path(tempfile.mkdtemp(prefix="ep-gpu-")) / "ep.sqlite"
    rows, failed = [], 0
    print(f"{args.model} on {args.accelerator} ({args.dtype}), {args.input_len} in / {args.output_len} out; store {db}")
    head = f"  {'EP':>3}{'batch':>6}{'TPOT p50':>10}{'p90':>8}{'p99':>8}{'limit':>8}{'tok/s':>10}"
    print(head + "".join(f"{k[:12]:>14}" for k in SPLIT) + f"{'B/exchange':>12}{'a2a GB/s':>10}")
    for ep in args.ep:
        for batch in args.batches:
            row = point(args, db, ep, batch)
            rows.append(row)
            if args.json:  # after every point: what was measured survives a later point's failure
                args.json.write_text(json.dumps(rows, indent=1) + "\n")
            if "error" in row:
                failed += 1
                print(f"  {ep:>3}{batch:>6}  {row['error']}", flush=True)
                continue
            t = row["tpot_ms"]
            lim = f"{row['tpot_limit_ms']:.3g}" if row.get("tpot_limit_ms") else "-"
            split = row.get("split_pct") or {}
            cells = "".join(f"{split[k]:>13.1f}%" if split.get(k) is not None else f"{'-':>14}" for k in SPLIT)
            per = f"{row['bytes_per_exchange']:,.0f}" if row.get("bytes_per_exchange") else "-"
            rate = f"{row['rank0_a2a_gbps']:.3g}" if row.get("rank0_a2a_gbps") else "-"
            print(f"  {ep:>3}{batch:>6}{t['p50']:>10.2f}{t['p90']:>8.2f}{t['p99']:>8.2f}{lim:>8}"
                  f"{row['output_tok_s']:>10.0f}{cells}{per:>12}{rate:>10}", flush=True)  # fmt: skip
            if row.get("profile_error"):
                print(f"       {row['profile_error']}")
    if rows and rows[0].get("device"):
        print(f"device: {rows[0]['device']}; split: share of the profile run's {rows[-1].get('basis')} time")
    if args.bundles:
        args.bundles.mkdir(parents=True, exist_ok=True)
        for row in rows:
            for key in ("run", "profile_run"):
                if row.get(key):
                    out = args.bundles / f"ep{row['ep']}-batch{row['batch']}-{key.replace('_run', '')}.json"
                    cmd = [sys.executable, "-m", "bench", "export", str(row[key]), "--bundle", "--out", str(out),
                           "--db", str(db)]  # fmt: skip
                    subprocess.run(cmd, cwd=ROOT, check=False, timeout=300)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The native engine's fastest configuration on a CUDA GPU, through the product's own commands.

Each part runs ``python -m bench ...`` as a user would (a subprocess, its own exit status and
output), on ``random-v2-lite-shape`` in bf16, 128 tokens in and 64 out, with NVML telemetry on:

- ``tune``: ``bench tune`` at batch 128 for the fastest configuration (the study figure);
- ``concurrency``: ``bench run`` with the same options, ``batch_size=128``, 128 in flight,
  256 requests: its output tok/s against ``tune``'s, the ratio printed (the product path must
  reach 0.9x);
- ``plain``: the engine with no options, latency, 3 requests, with ``MOEBENCH_EXIT_THREADS``:
  the process must exit 0 with no ``terminate called`` (an H100 run once aborted at exit);
- ``fp32``: ``studies/lean_float32_check.py`` on the GPU (the lean kernels against transformers');
- ``latency``: the fastest configuration at batch 1, one request at a time;
- ``profile``: a profile run of the fastest configuration;
- ``sweep``: ``bench sweep`` over 1, 8, 32 and 128 in flight (each captured before its clock);
- ``hosted``: the dashboard's run path without its page: the engine in an engine host process
  (as ``dashboard/services.py`` loads it), ``start_run`` as the Start button calls it, batch 128.

Every run is stored in ``OUT/showcase.sqlite`` and written as a bundle ``OUT/<card>-fast-*.json``
(``python -m bench import FILE``); the sweep's SQLite file holds its sweep. Prints each command,
its exit status, wall time and output tail, and ``OUT/showcase.json`` the figures. Usage (on the
GPU, from the repository root)::

    python studies/showcase_gpu.py --out DIR --parts tune,concurrency,plain,fp32
    python studies/showcase_gpu.py --out DIR --parts sweep,latency,profile
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run.artifacts import ARTIFACT_TRACE  # noqa: E402
from bench.store import Store  # noqa: E402

FAST = {
    "cache": "static",
    "cuda_graphs": "true",
    "compile": "default",
    "mla": "absorbed",
    "experts_impl": "lean_grouped_mm",
    "router": "lean",
}
MODEL = ["--model", "random-v2-lite-shape", "--accelerator", "cuda", "--dtype", "bfloat16"]
LENGTHS = ["--input-len", "128", "--output-len", "64"]
TUNE_CONFIG = "cuda_graphs_compile_mla_lean_router"


def opts(extra: dict[str, str] | None = None) -> list[str]:
    out: list[str] = []
    for k, v in {**FAST, **(extra or {})}.items():
        out += ["--engine-opt", f"{k}={v}"]
    return out


def card_prefix() -> str:
    """'h100', 'h200', ... from the first GPU's name (or 'gpu')."""
    try:
        import torch

        name = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a label only
        return "gpu"
    m = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return m.group(1).lower() if m else "gpu"


def call(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    print("\n$ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    wall = time.perf_counter() - t
    print(text[-3500:], flush=True)
    print(f"(rc {rc}, {wall:.0f} s)", flush=True)
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(wall, 1), "aborted": "terminate called" in text,
            "tail": text[-1500:]}  # fmt: skip


def export(store: Store, name: str, out: Path) -> dict[str, Any] | None:
    """The newest run called ``name``: its bundle written to OUT/name.json, its headline figures."""
    runs = [r for r in store.list_runs() if r.name == name]
    if not runs:
        return None
    run = max(runs, key=lambda r: r.id)
    (out / f"{name}.json").write_text(json.dumps(store.export_bundle(run.id)))
    trace = store.artifact(run.id, ARTIFACT_TRACE)  # a profile's torch trace, beside its bundle
    if trace and Path(trace["path"]).exists():
        with open(trace["path"], "rb") as src, gzip.open(out / f"{name}.trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    s = run.summary
    return {
        "run_id": run.id,
        "status": run.status,
        "output_tok_s": s.output_throughput_tok_s if s else None,
        "ttft_p50_ms": s.ttft_ms.p50 if s else None,
        "tpot_p50_ms": s.tpot_ms.p50 if s else None,
        "tpot_p99_ms": s.tpot_ms.p99 if s else None,
    }


def tune_tok_s(folder: Path) -> float | None:
    """The tune's output tok/s for the fastest configuration at batch 128 (from its results file)."""
    for f in sorted(folder.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        rows = data.get("rows") if isinstance(data, dict) else None
        for row in rows or []:
            if row.get("config") == TUNE_CONFIG and int(row.get("batch", 0)) == 128 and row.get("output_tok_s"):
                return float(row["output_tok_s"])
    return None


HOSTED_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from bench.config import RunConfig
from bench.run import engine_host
from bench.run.manager import start_run
from bench.store import Store
db, name, fast = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
engine_host.enable()  # as the dashboard does: the model loads in an engine host process
engine = {"kind": "native", "model": "random-v2-lite-shape", "accelerator": "cuda", "dtype": "bfloat16", **fast}
cfg = RunConfig.build(engine=engine, mode="concurrency", concurrency=128, requests=256, warmup=0, name=name,
                      workload={"source": "random", "input_len": 128, "output_len": 64})
eng = engine_host.make_engine(cfg.engine_options)
print("hosted:", type(eng).__name__, flush=True)
t = time.perf_counter(); eng.start(); print(f"loaded in {time.perf_counter() - t:.1f} s", flush=True)
snap = start_run(cfg, Store(db), engine=eng).wait(500)
s = snap.summary
print(snap.status, snap.error or "", f"{s.output_throughput_tok_s:.1f} tok/s, TTFT p50 {s.ttft_ms.p50:.1f} ms, "
      f"p99 {s.ttft_ms.p99:.1f}, TPOT p50 {s.tpot_ms.p50:.2f} ms" if s else "", flush=True)
eng.stop()
"""


def hosted_run(db: Path, out: Path, name: str, budget: float) -> dict[str, Any]:
    """The dashboard's run path without its page: the engine in an engine host process
    (``bench.run.engine_host``, as ``dashboard/services.py`` loads it), the run started with
    ``start_run`` as the page's Start button does, batch 128 (a subprocess, like the CLI parts)."""
    fast = {**FAST, "cuda_graphs": True, "batch_size": 128, "capture_sizes": "128"}
    return call([sys.executable, "-c", HOSTED_SCRIPT, str(db), name, json.dumps(fast)], budget)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="tune,concurrency,plain,fp32")
    ap.add_argument("--budget-s", type=float, default=560, help="stop starting parts after this many seconds")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db = out / "showcase.sqlite"
    py = [sys.executable, "-m", "bench"]
    card = card_prefix()
    t0 = time.perf_counter()
    results: dict[str, Any] = {"card": card, "parts": {}}

    def left() -> float:
        return a.budget_s - (time.perf_counter() - t0)

    for part in [p.strip() for p in a.parts.split(",") if p.strip()]:
        if left() < 30:
            results["parts"][part] = {"skipped": "the call's time budget ran out"}
            print(f"\n{part}: skipped, budget out", flush=True)
            continue
        name = f"{card}-fast-{part}"
        if part == "tune":
            res = call([*py, "tune", "--out", str(out / "tune"), "--configs", f"{TUNE_CONFIG}@128"], left())
        elif part == "concurrency":
            name = f"{card}-fast-concurrency-128"
            res = call(
                [*py, "--db", str(db), "run", "--engine", "native", *MODEL, *LENGTHS,
                 *opts({"batch_size": "128", "capture_sizes": "128"}), "--mode", "concurrency",
                 "--concurrency", "128", "--requests", "256", "--warmup", "0", "--name", name],
                left(),
            )  # fmt: skip
        elif part == "plain":
            name = f"{card}-plain-latency"
            res = call(
                [*py, "--db", str(db), "run", "--engine", "native", *MODEL, *LENGTHS, "--mode", "latency",
                 "--requests", "3", "--name", name],
                left(), env={"MOEBENCH_EXIT_THREADS": "1", "PYTHONFAULTHANDLER": "1"},
            )  # fmt: skip
        elif part == "fp32":
            res = call(
                [sys.executable, "studies/lean_float32_check.py", "--device", "cuda", "--layers", "6",
                 "--out", str(out / "lean-float32.json")],
                left(),
            )  # fmt: skip
        elif part == "latency":
            name = f"{card}-fast-latency-bs1"
            res = call(
                [*py, "--db", str(db), "run", "--engine", "native", *MODEL, *LENGTHS,
                 *opts({"batch_size": "1", "capture_sizes": "1"}), "--mode", "latency", "--requests", "16",
                 "--warmup", "1", "--name", name],
                left(),
            )  # fmt: skip
        elif part == "profile":
            res = call(
                [*py, "--db", str(db), "run", "--engine", "native", *MODEL, "--input-len", "128", "--output-len",
                 "8", *opts({"batch_size": "1", "capture_sizes": "1"}), "--mode", "profile", "--requests", "2",
                 "--warmup", "1", "--name", name],
                left(),
            )  # fmt: skip
        elif part == "hosted":
            res = hosted_run(db, out, f"{card}-fast-hosted-128", left())
            name = f"{card}-fast-hosted-128"
        elif part == "sweep":
            res = call(
                [*py, "--db", str(db), "sweep", "--engine", "native", *MODEL, *LENGTHS,
                 *opts({"batch_size": "128", "capture_sizes": "1,8,32,128"}), "--mode", "concurrency",
                 "--concurrency", "1,8,32,128", "--duration", "15", "--requests", "3000",
                 "--warmup", "0", "--name", name, "--html", str(out / f"{name}.html")],
                left(),
            )  # fmt: skip
        else:
            print(f"unknown part {part}")
            continue
        if db.exists() and part in ("concurrency", "plain", "latency", "profile", "hosted"):
            res["run"] = export(Store(db), name, out)
        results["parts"][part] = res
        (out / "showcase.json").write_text(json.dumps(results, indent=2))
    tuned = tune_tok_s(out / "tune")
    for part, label in (("concurrency", "CLI"), ("hosted", "dashboard path (engine host)")):
        got = results["parts"].get(part, {}).get("run")
        if tuned and got and got.get("output_tok_s"):
            results[f"ratio_{part}_over_tune"] = got["output_tok_s"] / tuned
            print(f"\n{label} {got['output_tok_s']:.0f} tok/s / tune {tuned:.0f} tok/s = "
                  f"{results[f'ratio_{part}_over_tune']:.3f}x")  # fmt: skip
    (out / "showcase.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""vLLM beside the native engine on one CUDA GPU, through the product's own commands (issue 47).

Each part runs ``python -m bench ...`` as a user would, on ``random-v2-lite-shape`` in bf16 (vLLM
serves it with ``--load-format dummy``: the same shape with random weights), 128 tokens in and
64 out, NVML telemetry on, all runs in one SQLite store, each written as a bundle
``OUT/<card>-<engine>-<part>.json`` and the figures in ``OUT/served.json``:

- ``vllm``: vLLM's managed server (CUDA graphs and torch.compile on: ``enforce_eager=false``),
  batch 1 (one request at a time, 20 requests) and 128 in flight (256 requests);
- ``native``: the native engine's fast CUDA options (docs/native-engine.md), the same two loads
  (128 in flight with ``batch_size=128 capture_sizes=128``);
- ``compare``: ``bench compare-engines`` at 128 in flight with both engines' options;
- ``routing``, ``ngram-bs1``: vLLM with its routed experts recorded, and with n-gram speculation;
- ``sweep``: a vLLM sweep over 1, 8, 32 and 128 in flight (12 s a point), as a sweep bundle.

vLLM must be importable by the interpreter that runs this (``MOEBENCH_VLLM_PYTHON`` or this one).
On a machine without a package index it was installed from a stripped wheel and its missing
dependencies carried as wheels (docs/engines.md, "vLLM on a CUDA GPU"). Usage, on the GPU::

    PYTHONPATH=/tmp/site python studies/served_gpu.py --out DIR --parts vllm,native
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.store import Store  # noqa: E402
from studies.showcase_gpu import FAST, call, card_prefix, export  # noqa: E402

NATIVE_FAST = FAST  # the native engine's fast CUDA options, as the showcase runs them
VLLM_OPTS = {"enforce_eager": "false", "start_timeout_s": "400"}
COMMON = ["--accelerator", "cuda", "--dtype", "bfloat16", "--input-len", "128", "--output-len", "64"]
LOADS = {
    "latency-bs1": ["--mode", "latency", "--requests", "20"],
    # a warm-up of 128 at 128 in flight: vLLM compiles its fused-MoE kernel for each new batch size it
    # meets, and without it the first wave of 128 waited ~1 s on the compile (2026-12-08, H100)
    "concurrency-128": ["--mode", "concurrency", "--concurrency", "128", "--requests", "256", "--warmup", "128"],
}
# vLLM-only parts: expert routing from the server (a non-streamed pass after the measured window),
# n-gram speculative decoding at batch 1, and a sweep of the in-flight count
VLLM_PARTS = {
    "routing": ["--mode", "concurrency", "--concurrency", "8", "--requests", "64", "--warmup", "16",
                "--engine-opt", "routed_experts=true", "--engine-opt", "routing_pass=16"],
    "ngram-bs1": ["--mode", "latency", "--requests", "20", "--engine-opt", "speculative_method=ngram"],
}  # fmt: skip


def opts(flag: str, values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in (flag, f"{k}={v}")]


def figures(store: Store, name: str, out: Path) -> dict[str, Any] | None:
    """The newest run called ``name``: its bundle written to OUT/name.json (showcase_gpu.export),
    its percentiles and device figures."""
    found = export(store, name, out)
    run = store.get_run(found["run_id"]) if found else None
    s = run.summary if run else None
    if found is None or s is None:
        return found
    stat = {
        k: {q: getattr(getattr(s, k), q, None) for q in ("p50", "p90", "p99")}
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    }
    return {**found, **stat, "device_mem_used_gib": s.device_mem_used_gib, "device_power_w": s.device_power_w,
            "device_util_pct": s.device_util_pct}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="vllm,native")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = out / "served.sqlite"
    card = card_prefix()
    py = [sys.executable, "-m", "bench", "--db", str(db)]
    results: dict[str, Any] = {"card": card, "calls": [], "runs": {}}
    names: list[str] = []
    for part in args.parts.split(","):
        if part in ("vllm", "native"):
            engine = ["--engine", part, "--model", "random-v2-lite-shape", *COMMON]
            engine += opts("--engine-opt", VLLM_OPTS if part == "vllm" else NATIVE_FAST)
            for load, argv in LOADS.items():
                extra = []
                if part == "native" and load == "concurrency-128":
                    extra = opts("--engine-opt", {"batch_size": "128", "capture_sizes": "128"})
                name = f"{card}-{part}-{load}"
                results["calls"].append(call([*py, "run", *engine, *extra, *argv, "--name", name], args.timeout))
                names.append(name)
        elif part in VLLM_PARTS:
            name = f"{card}-vllm-{part}"
            engine = ["--engine", "vllm", "--model", "random-v2-lite-shape", *COMMON, *opts("--engine-opt", VLLM_OPTS)]
            results["calls"].append(call([*py, "run", *engine, *VLLM_PARTS[part], "--name", name], args.timeout))
            names.append(name)
        elif part == "sweep":
            engine = ["--engine", "vllm", "--model", "random-v2-lite-shape", *COMMON, *opts("--engine-opt", VLLM_OPTS)]
            cmd = [*py, "sweep", *engine, "--mode", "concurrency", "--concurrency", "1,8,32,128", "--duration", "12",
                   "--requests", "3000", "--warmup", "8", "--name", f"{card}-vllm-sweep"]  # fmt: skip
            results["calls"].append(call(cmd, args.timeout))
        elif part == "compare":
            name = f"{card}-compare-128"
            cmd = [*py, "compare-engines", "--model", "random-v2-lite-shape", "--accelerator", "cuda", "--dtype",
                   "bfloat16", "--mode", "concurrency", "--concurrency", "128", "--requests", "256", "--input-len",
                   "128", "--output-len", "64", "--warmup", "128", "--name", name,
                   *opts("--native-opt", {**NATIVE_FAST, "batch_size": "128", "capture_sizes": "128"}),
                   *opts("--vllm-opt", VLLM_OPTS)]  # fmt: skip
            results["calls"].append(call(cmd, 2 * args.timeout))
            names += [f"{name}-native", f"{name}-vllm"]
    store = Store(db)
    results["runs"] = {n: figures(store, n, out) for n in names}
    for sweep in store.list_sweeps():
        (out / f"{sweep.name or f'sweep-{sweep.id}'}.sweep.json").write_text(
            json.dumps(store.export_sweep_bundle(sweep.id))
        )
    (out / "served.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(results["runs"], indent=1, default=str))
    return 0 if all(c["rc"] == 0 for c in results["calls"]) else 1


if __name__ == "__main__":
    sys.exit(main())

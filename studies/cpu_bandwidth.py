"""This machine's memory bandwidth and float32 matmul throughput: the ``cpu`` limits' figures.

Measured with numpy, the way :func:`bench.metrics.cpu_limits.measure_cpu` does it (one implementation):
a large-array copy (bytes read + bytes written per second, STREAM's convention) and a sum
over the array (bytes read per second), then a float32 matmul (``2 n^3`` FLOP per product).
Each is repeated ``--rounds`` times after a warm-up, and the median / min / max are
printed. The array should be several times the last-level cache (32 MiB L3 on the machine
this was written on) or the figure is cache bandwidth, not memory's. Then the limits those
figures imply for the model presets built from config (tiny and V2-Lite-shaped), and for
comparison the same on the spec table's accelerators.
Figures, not a test: the exit status is 0 whatever they are.

    python -m studies.cpu_bandwidth [--rounds 7] [--array-mib 256] [--matmul-n 2048]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metrics.accelerator_specs import SPECS
from bench.metrics.cpu_limits import cpu_spec, measure_cpu_uncached
from bench.metrics.roofline import limits, preset_config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.cpu_bandwidth", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--array-mib", type=int, default=256, help="size of each array (two are allocated)")
    p.add_argument("--matmul-n", type=int, default=2048, help="square float32 matmul size")
    p.add_argument("--dtype", default="bf16", help="weights' dtype for the limits printed after")
    args = p.parse_args(argv)

    m = measure_cpu_uncached(rounds=args.rounds, array_mib=args.array_mib, matmul_n=args.matmul_n)
    print(f"{args.rounds} rounds, {args.array_mib} MiB arrays, {args.matmul_n}^2 matmul; {m.threads_note}")
    print(f"{'':22} {'median':>10} {'min':>10} {'max':>10}")
    for label, stat, unit in (
        ("copy (read+write)", m.copy_gb_s, "GB/s"),
        ("read (sum)", m.read_gb_s, "GB/s"),
        ("float32 matmul", m.matmul_gflops, "GFLOP/s"),
    ):
        print(f"{label:22} {stat.median:>10.1f} {stat.min:>10.1f} {stat.max:>10.1f}  {unit}")
    print(f"measured in {m.seconds:.2f} s\n")

    spec = cpu_spec(m)
    for preset in ("tiny-deepseek-v3", "random-v2-lite-shape"):
        lim = limits(preset_config(preset), spec, dtype=args.dtype, name=preset)
        print(lim.describe())
        print(f"    batch 1 / 8 / 64: {', '.join(f'{lim.max_tok_s_at(b):,.1f}' for b in (1, 8, 64))} tok/s at most")
    print()
    v2 = preset_config("random-v2-lite-shape")
    for key in SPECS:
        print(limits(v2, key, dtype=args.dtype, name="random-v2-lite-shape").describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

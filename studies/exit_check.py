"""Clean exits: each kind of run from the CLI exits 0, prints no ``terminate called``, and leaves
no process of its own behind one second after it returns.

Runs ``python -m bench run`` (a subprocess, as a user would) on the native engine for each kind
asked for, and after each: its exit status, whether stderr holds ``terminate called`` or an
abort, the threads it named alive at exit (``MOEBENCH_EXIT_THREADS=1``), and the processes
that were not there before it started and are still there one second after it returned
(read from ``/proc``: their pid, state and command line). Kinds:

- ``latency``: 3 requests one at a time;
- ``batching``: concurrency 8 with the engine's batcher (``batch_size=8``), 16 requests;
- ``profile``: a profile run of 2 requests;
- ``sweep``: ``bench sweep`` over 1 and 4 in flight.

On a GPU (``--accelerator cuda``, ``random-v2-lite-shape`` in bf16) or on this machine's CPU
(``--accelerator cpu``, the tiny model). Prints one line per run and ``OK``/``FAIL`` at the end
(exit status 0 either way: figures, not a test)::

    python studies/exit_check.py --accelerator cuda --out DIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def processes() -> dict[int, str]:
    """pid -> "state cmdline" of every process now (from /proc)."""
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (d / "stat").read_text().split(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if not cmd:
            continue  # a kernel thread (no command line): the kernel's, not a process a run left
        out[int(d.name)] = f"{state} {cmd[:160]}"
    return out


def run(argv: list[str], timeout: float) -> tuple[int, str, float, list[str]]:
    before = processes()
    env = {**os.environ, "MOEBENCH_EXIT_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)  # fmt: skip
    wall = time.monotonic() - t0
    time.sleep(1.0)
    me = os.getpid()
    left = [f"{pid} {what}" for pid, what in processes().items() if pid not in before and pid != me]
    return p.returncode, p.stdout + p.stderr, wall, left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accelerator", choices=("cuda", "cpu"), default="cpu")
    ap.add_argument("--kinds", default="latency,batching,profile,sweep")
    ap.add_argument("--out", type=Path, default=Path("exit-check"))
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    db = str(args.out / "exit.sqlite")
    if args.accelerator == "cuda":
        model = ["--model", "random-v2-lite-shape", "--accelerator", "cuda", "--dtype", "bfloat16"]
    else:
        model = ["--model", "tiny-deepseek-v3", "--accelerator", "cpu"]
    common = [*model, "--engine", "native", "--input-len", "64", "--output-len", "16", "--db", db, "--quiet"]
    kinds = {
        "latency": ["run", *common, "--mode", "latency", "--requests", "3"],
        "batching": [
            "run",
            *common,
            "--mode",
            "concurrency",
            "--concurrency",
            "8",
            "--requests",
            "16",
            "--engine-opt",
            "batch_size=8",
        ],
        "profile": ["run", *common, "--mode", "profile", "--requests", "2"],
        "sweep": ["sweep", *common, "--concurrency", "1,4", "--requests", "8"],
    }
    failures = 0
    for kind in args.kinds.split(","):
        rc, out, wall, left = run(kinds[kind], args.timeout)
        aborted = "terminate called" in out or "Aborted" in out or "Fatal Python error" in out
        threads = next((line for line in out.splitlines() if line.startswith("threads alive at exit")), "-")
        ok = rc == 0 and not aborted and not left
        failures += not ok
        print(f"{kind:<9} rc {rc}  {wall:6.1f} s  abort: {'yes' if aborted else 'no'}  {threads}  "
              f"left after 1 s: {left or 'none'}", flush=True)  # fmt: skip
        if not ok:
            print("  " + "\n  ".join(out.strip().splitlines()[-12:]), flush=True)
    print("OK" if failures == 0 else f"FAIL ({failures} run(s))", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench a2a``: the all-to-all bandwidth between N ranks on this machine, the link an
expert-parallel run (``--engine-opt expert_parallel=N``) sends its tokens over, set against the
accelerator's datasheet link figure where the catalogue has one."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.metrics.run_limits import link_figure
from engines.errors import ConfigError

SWEEP_TIMEOUT_S = 600
A2A_MAX_RANKS = 64  # the most processes one sweep starts on this machine (NVLink domains: 8; a 64-core CPU host)
A2A_MAX_MIB = 4096  # the largest message to each peer


def add_a2a_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=2, help="processes (one GPU each on cuda)")
    p.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda"), help="gloo on cpu, NCCL on cuda")
    p.add_argument("--max-mib", type=float, default=16.0, help="the largest message to each peer (MiB)")
    p.add_argument("--iters", type=int, default=10, help="timed repetitions per size (the median is reported)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=cmd_a2a)


def run_sweep(ranks: int, accelerator: str, max_mib: float, iters: int) -> list[dict[str, Any]]:
    """The sweep's rows (engines.expert_parallel.sweep under torch's launcher), or ConfigError in one line."""
    from engines.launch import free_port

    if not 2 <= ranks <= A2A_MAX_RANKS:
        raise ConfigError(f"--ranks {ranks}: an all-to-all here takes 2 to {A2A_MAX_RANKS} ranks")
    cores = os.cpu_count() or 1
    if accelerator == "cpu" and ranks > max(2, cores):
        raise ConfigError(f"--ranks {ranks} on cpu: this machine has {cores} cores (one rank each at most)")
    from engines.expert_parallel import SWEEP_MIN_BYTES

    least = SWEEP_MIN_BYTES / 2**20
    if not least <= max_mib <= A2A_MAX_MIB or iters < 1:
        raise ConfigError(
            f"--max-mib takes {least:g} to {A2A_MAX_MIB} (the sweep's first message is "
            f"{SWEEP_MIN_BYTES // 1024} KiB) and --iters at least 1"
        )
    if accelerator == "cuda":
        import torch

        if torch.cuda.device_count() < ranks:
            have = torch.cuda.device_count()
            raise ConfigError(f"--ranks {ranks} on cuda needs {ranks} GPUs (one rank each); this machine has {have}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
           str(free_port()), "-m", "engines.expert_parallel", "--sweep", "--accelerator", accelerator, "--max-mib",
           str(max_mib), "--iters", str(iters)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    rows = [json.loads(x.removeprefix("EP-SWEEP ")) for x in p.stdout.splitlines() if x.startswith("EP-SWEEP ")]
    if p.returncode == 0 and not rows:  # its stderr is torch's banner, not a reason
        raise ConfigError(f"the all-to-all sweep measured no size up to {max_mib:g} MiB")
    if p.returncode != 0:
        tail = " | ".join(x for x in p.stderr.strip().splitlines()[-3:])
        raise ConfigError(f"the all-to-all sweep failed (exit {p.returncode}): {tail[-400:]}")
    return rows


def format_sweep(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    link = link_figure("cuda", {"device": first["device"]}) if first["device"] != "cpu" else None
    head = f"all-to-all over {first['world']} ranks ({first['backend']}, {first['device']})"
    if link:
        head += f"; {link[0]} link {link[1]:g} GB/s both ways (datasheet)"
    lines = [head, f"  {'to each peer':>14}{'median us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}{'peers GB/s':>12}"
             + ("  of link" if link else "")]  # fmt: skip
    for r in rows:
        size = r["bytes_per_peer"]
        label = f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"
        share = f"  {r['peer_gb_s_both_ways'] / link[1] * 100:6.1f} %" if link else ""
        lines.append(
            f"  {label:>14}{r['median_us']:>12.1f}{r['algbw_gb_s']:>12.3f}{r['busbw_gb_s']:>12.3f}"
            f"{r['peer_gb_s_both_ways']:>12.3f}{share}"
        )
    lines.append(
        "  algbw, busbw: as nccl-tests define them for all-to-all; peers GB/s: bytes a rank sent to and received "
        "from the others / time"
    )
    return "\n".join(lines)


def cmd_a2a(args: argparse.Namespace) -> int:
    rows = run_sweep(args.ranks, args.accelerator, args.max_mib, args.iters)
    print(format_sweep(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0

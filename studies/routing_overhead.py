"""What collecting a served engine's routing costs: the client's request rate with and without
``routed_experts``, and the store's size for a long run with it.

Both against :mod:`bench.stub_server` started with ``--routed-experts sglang`` (SGLang's
encoding: a response-level event of base64 int32 ids, [tokens - 1, hidden layers, top-k],
after the last token), so what changes between the two arms is only the client's work: asking
for routing, reading the extra event, decoding it and counting it into the run (the stub also
encodes it, on its own core). Two model shapes:

- ``tiny``: the tiny DeepSeek-V3 (3 layers, 1 dense, 8 experts, top-2): ~32 bytes of base64 per token;
- ``v3``: DeepSeek-V3's routing layout (61 layers, 3 dense, 256 experts, top-8), ~2.6 kB per
  token; the client reads that layout from a folder holding the tiny tokenizer and a config.json
  with V3's MoE sizes (the stub plants ids in that shape; no V3 weights are involved).

Rate: ``--rounds`` ABBA rounds (off, on, on, off, ...) of ``--num-prompts`` requests at
``--concurrency`` through the CLI (``python -m bench run --engine openai``); each arm's req/s
is the run's own (completed / duration), the ratio on/off per pair of the round, reported as the
geometric mean and the min-max spread. Size: one run of ``--size-requests`` with routing on and one
with it off; the SQLite files' sizes after the run (and the routing artifact's own bytes).

Each arm also prints the client's CPU a request inside the run (the run's own sampler:
MoE Bench's process tree, start-up left out) and how busy the stub was (its CPU over the run's
duration: well under 100 % means the client, not the stub, set the rate).

    python -m studies.routing_overhead [--shapes tiny v3] [--rounds 4] [--num-prompts 2000] \\
        [--concurrency 64] [--input-len 64 --output-len 32] [--size-requests 10000] [--itl-ms 2] [--pin]

With ``--itl-ms`` 0 (the default) the client runs flat out and is the limit: the rate drop is
its CPU cost. With ``--itl-ms 2`` the stub streams like a decoding server (32 tokens >= 64 ms a
request), the client has CPU to spare, and the ratio shows whether routing costs achieved
throughput where a real server is the limit.

Figures, not a test: the exit status is 0 whatever they are.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stub_server import start_stub_server
from engines.launch import ManagedProcess, free_port
from engines.settings import PROJECT_ROOT

MODEL = "tiny-deepseek-v3"
LENGTHS = [64, 32]  # input, output tokens a request (--input-len, --output-len)
SHAPES = {"tiny": (3, 1, 8, 2), "v3": (61, 3, 256, 8)}


def v3_layout_folder(work: Path) -> Path:
    """The tiny tokenizer beside a config.json with DeepSeek-V3's MoE sizes (routing layout only)."""
    from engines.models import tiny_path

    src = Path(tiny_path())
    folder = work / "v3-layout"
    folder.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, folder / f.name)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    cfg.update(num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256, num_experts_per_tok=8, n_group=8)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def run_cli(
    url: str,
    db: Path,
    requests: int,
    concurrency: int,
    routing: bool,
    tokenizer: Path | None,
    pin: bool = False,
    stub_pid: int | None = None,
) -> dict:
    argv = [*(["taskset", "-c", "0"] if pin else []),
            sys.executable, "-m", "bench", "run", "--engine", "openai", "--base-url", url, "--model", MODEL,
            "--mode", "concurrency", "--requests", str(requests), "--concurrency", str(concurrency),
            "--input-len", str(LENGTHS[0]), "--output-len", str(LENGTHS[1]),
            "--no-server-metrics", "--quiet", "--db", str(db)]  # fmt: skip
    if routing:
        argv += ["--engine-opt", "routed_experts=true"]
    if tokenizer is not None:
        argv += ["--engine-opt", f"tokenizer={tokenizer}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    stub_before = _cpu_s(stub_pid)
    proc = subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1800)
    stub_cpu_s = _cpu_s(stub_pid) - stub_before
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    con = sqlite3.connect(db)
    try:
        rid, summary = con.execute("SELECT id, summary_json FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        art = con.execute(
            "SELECT name, length(content_json) FROM artifacts WHERE run_id=? AND name LIKE 'expert_routing%'", (rid,)
        ).fetchall()
        # the run's own sampler: MoE Bench's process tree's CPU (cores) each second of the run
        tree = [v for (v,) in con.execute(
            "SELECT value FROM timeseries WHERE run_id=? AND name='client_cpu_cores' AND value IS NOT NULL", (rid,)
        )]  # fmt: skip
    finally:
        con.close()
    s = json.loads(summary)
    duration = s["duration_s"]
    return {
        # CPU a request inside the measured window (start-up left out): the tree's mean cores x the
        # run's duration / completed requests; and the stub's busy share of one core over the run
        "window_cpu_ms": statistics.fmean(tree) * duration * 1000.0 / max(1, s["completed"]) if tree else math.nan,
        "stub_busy": stub_cpu_s / duration if stub_pid and duration else math.nan,
        "rc": proc.returncode,
        "stderr": proc.stderr.strip().splitlines()[-1:] if proc.returncode else [],
        "rps": s["request_throughput_rps"],
        "cpu_ms": cpu_s * 1000.0 / max(1, requests),  # the CLI's CPU per request, start-up included
        "completed": s["completed"],
        "failed": s["failed"],
        "routing_bytes": dict(art),
        "imbalance": s.get("moe_imbalance_max"),
    }


def _cpu_s(pid: int | None) -> float:
    """A process's user + system CPU seconds so far (0 without a pid)."""
    if not pid:
        return 0.0
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def start_stub(shape: tuple[int, ...], itl_ms: float = 0.0, pin: bool = False) -> tuple[str, Any]:
    if shape == SHAPES["tiny"] and not itl_ms and not pin:
        return start_stub_server(model=MODEL, routed_experts="sglang")
    port = free_port()
    argv = [*(["taskset", "-c", "1"] if pin else []),
            sys.executable, "-m", "bench.stub_server", "--port", str(port), "--model", MODEL, "--itl-ms", str(itl_ms),
            "--routed-experts", "sglang", "--routing-shape", ",".join(map(str, shape))]  # fmt: skip
    proc = ManagedProcess(argv, name="stub-server", cwd=PROJECT_ROOT).start()
    proc.wait_http(f"http://127.0.0.1:{port}/health", 30, interval=0.1)
    return f"http://127.0.0.1:{port}/v1", proc


def study(name: str, args: argparse.Namespace, work: Path) -> None:
    shape = SHAPES[name]
    tokenizer = v3_layout_folder(work) if name == "v3" else None
    url, stub = start_stub(shape, args.itl_ms, args.pin)
    try:
        ratios, on_rps, off_rps, cpu = [], [], [], []
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            got = {}
            for routing in order:
                db = work / f"{name}-rate-{r}-{int(routing)}.sqlite"
                got[routing] = run_cli(
                    url, db, args.num_prompts, args.concurrency, routing, tokenizer, args.pin, stub.pid
                )
                if got[routing]["rc"] or got[routing]["failed"]:
                    print(f"  round {r} routing={routing}: rc {got[routing]['rc']} {got[routing]['stderr']}")
            on_rps.append(got[True]["rps"])
            off_rps.append(got[False]["rps"])
            ratios.append(got[True]["rps"] / got[False]["rps"])
            cpu.append(got[True]["window_cpu_ms"] - got[False]["window_cpu_ms"])
            arms = ", ".join(
                f"{arm} {got[k]['rps']:.0f} req/s ({got[k]['window_cpu_ms'] * 1000:.0f} us client CPU/req in the run, "
                f"{got[k]['cpu_ms']:.2f} ms with start-up; stub busy {got[k]['stub_busy']:.0%} of a core)"
                for arm, k in (("off", False), ("on", True))
            )
            print(f"  {name} round {r} ({'off,on' if r % 2 == 0 else 'on,off'}): {arms}, on/off {ratios[-1]:.3f}",
                  flush=True)  # fmt: skip
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"{name}: rate with routing / without: geometric mean {gm:.3f} (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}) over {len(ratios)} ABBA rounds; off {min(off_rps):.0f}-{max(off_rps):.0f} req/s, "
              f"on {min(on_rps):.0f}-{max(on_rps):.0f} req/s; client CPU per request in the run "
              f"{statistics.median(cpu) * 1000:+.0f} us (median; {min(cpu) * 1000:+.0f} to "
              f"{max(cpu) * 1000:+.0f})", flush=True)  # fmt: skip
        if args.size_requests:
            sizes = {}
            for routing in (False, True):
                db = work / f"{name}-size-{int(routing)}.sqlite"
                res = run_cli(url, db, args.size_requests, args.concurrency, routing, tokenizer)
                sizes[routing] = (db.stat().st_size, res)
            off_b, on_b = sizes[False][0], sizes[True][0]
            res = sizes[True][1]
            print(f"{name}: {args.size_requests} requests: store {off_b / 2**20:.2f} MiB without routing, "
                  f"{on_b / 2**20:.2f} MiB with (+{(on_b - off_b) / 2**20:.2f} MiB); routing artifact "
                  f"{res['routing_bytes']} bytes; completed {res['completed']}, failed {res['failed']}, "
                  f"moe_imbalance_max {res['imbalance']}", flush=True)  # fmt: skip
    finally:
        stub.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "v3"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=LENGTHS[0])
    p.add_argument(
        "--output-len",
        type=int,
        default=LENGTHS[1],
        help="tokens a request: SGLang sends the routing as one more event a request, so its share of the "
        "client's work shrinks as outputs grow",
    )
    p.add_argument("--size-requests", type=int, default=10000)
    p.add_argument(
        "--itl-ms", type=float, default=0.0, help="the stub's gap between tokens: > 0 paces it like a decoding server"
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="the stub on CPU 1, the client on CPU 0 (taskset): the client's rate is then its own, not shared "
        "with the stub's extra work",
    )
    args = p.parse_args(argv)
    LENGTHS[:] = [args.input_len, args.output_len]
    with tempfile.TemporaryDirectory(prefix="routing-overhead-") as tmp:
        for name in args.shapes:
            study(name, args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Client capacity: how many requests per second MoE Bench's client can drive, next to ``vllm bench serve``.

Both clients run against :mod:`bench.stub_server`, a zero-compute streaming
server, so what limits the rate is the client itself (check the ``stub CPU`` line: the
server's own CPU per request and the ceiling it implies). For each concurrency, each round
runs MoE Bench (its CLI, ``python -m bench run --engine openai``, once per ``--workers``
value) and ``vllm bench serve`` (from ``.venv-vllm``) on the same workload: random prompts,
``--input-len`` / ``--output-len`` tokens, ``ignore_eos``, ``--num-prompts`` requests, a
closed loop of ``--concurrency`` in flight. Rounds alternate the order (ABBA: ours then
theirs, theirs then ours, ...) so drift on a shared machine hits both alike.

How to read the table (one per concurrency):
- ``req/s``: completed requests / the client's own duration, mean over the rounds.
- ``ratio``: ours / vllm bench, from the two runs of each round, as the geometric mean over
  the rounds and the min-max spread: 1.00 means MoE Bench drives the same rate; below 1 it
  is the slower client.
- ``send lag``: MoE Bench's per-request send lag (a closed loop's slot freed -> the next
  request sent), p50 / p99: a high figure means its loop was too busy to send on time.
- ``TTFT``: each client's own p50 / p99; against a zero-compute server it is almost all
  client-side delay (event loop, parsing), so lower is better.
- ``client CPU s``: CPU seconds of the whole client process tree, start-up included.
- ``stub busy``: the stub server's CPU seconds over the run's duration (100 % = one core):
  well below 100 % x ``--stub-processes`` means the server was not what limited the rate.
Figures, not a test: the exit status is 0 whatever they are.

With ``--ray-address ADDR`` (or ``--local-ray``: a one-node cluster started for the
benchmark and stopped after it) each ``--workers`` value also runs as ``ours W=N ray``: the
same CLI with ``--ray-address``, its sending loops on Ray actors (see bench.send.ray).

    python -m studies.client_capacity [--concurrency 64 256 1024] [--num-prompts 2000] \\
        [--rounds 2] [--workers 1 2] [--input-len 32 --output-len 32] [--stub-processes 1] [--local-ray]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metrics.records import percentile
from bench.stub_server import start_stub_server
from engines.launch import ManagedProcess
from engines.settings import PROJECT_ROOT
from studies.parity_vllm import vllm_bench_argv

MODEL = "tiny-deepseek-v3"  # the served name; its preset gives both clients the tiny tokenizer


def _pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of values, as MoE Bench's summaries compute it (numpy's linear method)."""
    return percentile([v for v in values if v is not None], q * 100)


def _children_cpu_s() -> float:
    """CPU seconds of every child process this process has reaped so far (and of their reaped children)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds so far of a live process and its live descendants."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _run(argv: list[str], name: str, log: Path, timeout: float, env: dict[str, str] | None = None) -> str | None:
    """Run one client to the end; None when it exited 0, else a one-line reason."""
    proc = ManagedProcess(argv, name=name, env=env, cwd=PROJECT_ROOT, log_path=log).start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.stop()
        return f"{name} did not finish within {timeout:.0f} s; log {log}"
    finally:
        proc.stop()
    if code != 0:
        return f"{name} {proc.exit_reason()}: {proc.tail_one_line(4)}; log {log}"
    return None


def our_python() -> str:
    """The main environment's interpreter (``.venv``), else this one."""
    local = PROJECT_ROOT / ".venv" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


def has_workers_flag() -> bool:
    """Whether ``python -m bench run`` takes ``--workers`` (added while this was written)."""
    out = subprocess.run(
        [our_python(), "-m", "bench", "run", "--help"], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120
    )
    return "--workers" in out.stdout


def run_ours(
    args: argparse.Namespace, url: str, concurrency: int, workers: int, work: Path, tag: str, ray: str | None = None
) -> dict[str, Any]:
    """One MoE Bench CLI run; its figures from the run's SQLite file."""
    db = work / f"ours-{tag}.sqlite"
    argv = [
        our_python(),
        "-m",
        "bench",
        "run",
        "--engine",
        "openai",
        "--engine-opt",
        f"base_url={url}",
        "--model",
        MODEL,
        "--mode",
        "concurrency",
        "--requests",
        str(args.num_prompts),
        "--concurrency",
        str(concurrency),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--seed",
        str(args.seed),
        "--no-server-metrics",  # vllm bench serve does not scrape /metrics (the stub has none)
        "--quiet",
        "--name",
        f"client-capacity {tag}",
        "--db",
        str(db),
        "--summary-csv",
        str(work / f"ours-{tag}.csv"),
    ]
    if workers != 1:
        argv += ["--workers", str(workers)]
    if ray:
        argv += ["--ray-address", ray]
    cpu0 = _children_cpu_s()
    error = _run(argv, f"moe-bench-{tag}", work / f"ours-{tag}.log", args.timeout)
    out: dict[str, Any] = {"error": error, "client_cpu_s": _children_cpu_s() - cpu0}
    if not db.exists():
        out["error"] = error or f"no results file {db}"
        return out
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT id, status, summary_json, error FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None or row[2] is None:
            out["error"] = error or f"no summary in {db}"
            return out
        s = json.loads(row[2])
        lags = [r[0] for r in con.execute("SELECT send_lag_ms FROM samples WHERE run_id=?", (row[0],))]
        errors = [
            r[0] for r in con.execute("SELECT error FROM samples WHERE run_id=? AND error != '' LIMIT 3", (row[0],))
        ]
    finally:
        con.close()
    lags = [v for v in lags if v is not None]
    out.update(
        completed=s["completed"],
        failed=s["failed"],
        duration_s=s["duration_s"],
        rps=s["request_throughput_rps"],
        ttft_p50=s["ttft_ms"]["p50"],
        ttft_p99=s["ttft_ms"]["p99"],
        itl_p50=s["itl_ms"]["p50"],
        lag_p50=_pct(lags, 0.50),
        lag_p99=_pct(lags, 0.99),
        usage_mismatches=s.get("usage_mismatches"),
        sample_errors=errors,
    )
    if row[1] != "completed" and not out["error"]:
        out["error"] = f"run {row[1]}: {row[3]}"
    return out


def run_theirs(args: argparse.Namespace, url: str, concurrency: int, model_dir: str, work: Path, tag: str) -> dict:
    """One ``vllm bench serve`` run; its figures from its ``--save-result`` JSON."""
    result = work / f"vllm-{tag}.json"
    argv = vllm_bench_argv(
        url, MODEL, model_dir, args.input_len, args.output_len, args.num_prompts, concurrency, args.seed, result
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    cpu0 = _children_cpu_s()
    error = _run(argv, f"vllm-bench-{tag}", work / f"vllm-{tag}.log", args.timeout, env=env)
    out: dict[str, Any] = {"error": error, "client_cpu_s": _children_cpu_s() - cpu0}
    if not result.exists():
        out["error"] = error or f"no result file {result}"
        return out
    data = json.loads(result.read_text())
    completed = int(data.get("completed") or 0)
    out.update(
        completed=completed,
        failed=int(data.get("failed", args.num_prompts - completed) or 0),
        duration_s=data.get("duration"),
        rps=data.get("request_throughput"),
        ttft_p50=data.get("median_ttft_ms"),
        ttft_p99=data.get("p99_ttft_ms"),
        itl_p50=data.get("median_itl_ms"),
    )
    return out


def start_local_ray(work: Path) -> tuple[str, str]:
    """A one-node Ray cluster on this machine (as the tests start one): (ray executable, address)."""
    from engines.launch import free_port

    ray = str(Path(our_python()).with_name("ray"))
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    argv = [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=8",
            "--include-dashboard=false", "--object-store-memory=200000000", "--disable-usage-stats",
            f"--temp-dir={temp}"]  # fmt: skip
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    )
    if out.returncode != 0:
        raise RuntimeError(f"ray start failed: {out.stderr[-500:]}")
    print(f"local Ray cluster at 127.0.0.1:{port} (temp {temp}, work {work})", file=sys.stderr)
    return ray, f"127.0.0.1:{port}"


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None and not r.get("error")]
    return statistics.fmean(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.client_capacity", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--num-prompts", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs every client once)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="MoE Bench --workers values to run")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stub-processes", type=int, default=1, help="stub server processes (SO_REUSEPORT)")
    p.add_argument("--itl-ms", type=float, default=0.0, help="the stub's delay between events, ms")
    p.add_argument(
        "--ttft-ms",
        type=float,
        default=0.0,
        help="the stub's delay before the first event, ms (with --itl-ms: a deterministic server, so both "
        "clients should read the same TTFT and ITL)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="limit for each client run, s")
    p.add_argument("--json", help="also write every run's figures to this JSON file")
    p.add_argument("--ray-address", help="also run each --workers value as Ray actors on this cluster")
    p.add_argument("--local-ray", action="store_true", help="start a one-node Ray cluster for --ray-address")
    args = p.parse_args(argv)

    from engines.models import resolve_model

    _, model_dir = resolve_model(MODEL)  # builds the tiny model's folder (its tokenizer) when missing
    workers = list(dict.fromkeys(args.workers))
    if any(w != 1 for w in workers) and not has_workers_flag():
        dropped = [w for w in workers if w != 1]
        print(f"note: `python -m bench run` has no --workers yet; skipping workers {dropped}", file=sys.stderr)
        workers = [w for w in workers if w == 1] or [1]
    clients = [f"ours W={w}" for w in workers] + ["vllm bench"]
    work = Path(tempfile.mkdtemp(prefix="client-capacity-"))
    ray_head = None
    if args.local_ray and not args.ray_address:
        ray_head, args.ray_address = start_local_ray(work)
    if args.ray_address:
        clients = [f"ours W={w} ray" for w in workers] + clients

    url, server = start_stub_server(
        model=MODEL, processes=args.stub_processes, itl_ms=args.itl_ms, ttft_ms=args.ttft_ms, log_path=work / "stub.log"
    )
    print(f"stub server {url} ({args.stub_processes} process(es)); work folder {work}", file=sys.stderr)
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    try:
        for c in args.concurrency:
            results[c] = {name: [] for name in clients}
            for r in range(args.rounds):
                order = clients if r % 2 == 0 else clients[::-1]
                for name in order:
                    tag = f"c{c}-r{r + 1}-{name.replace(' ', '').replace('=', '')}"
                    print(f"concurrency {c}, round {r + 1}: {name}", file=sys.stderr, flush=True)
                    stub0, t0 = _tree_cpu_s(server.pid), time.monotonic()
                    if name == "vllm bench":
                        res = run_theirs(args, url, c, str(model_dir), work, tag)
                    else:
                        w = int(name.split("=")[1].split()[0])
                        res = run_ours(args, url, c, w, work, tag, args.ray_address if "ray" in name else None)
                    res["stub_cpu_s"] = _tree_cpu_s(server.pid) - stub0
                    res["wall_s"] = time.monotonic() - t0
                    if res.get("duration_s"):
                        # The stub idles while a client starts up, so its CPU over the run's own
                        # duration is about how busy it was while the load lasted.
                        res["stub_busy"] = 100.0 * res["stub_cpu_s"] / res["duration_s"]
                    if res.get("error"):
                        print(f"  error: {res['error']}", file=sys.stderr)
                    results[c][name].append(res)
    finally:
        server.stop()
        if ray_head is not None:
            subprocess.run([ray_head, "stop", "--force"], capture_output=True, timeout=120)

    print(
        f"\nworkload: {args.num_prompts} requests, {args.input_len} in / {args.output_len} out, ignore_eos, "
        f"closed loop; {args.rounds} ABBA round(s); stub server: {args.stub_processes} process(es), "
        f"itl {args.itl_ms} ms; machine: {os.cpu_count()} cores"
    )
    stub_cpu, stub_done = 0.0, 0
    for c, by_client in results.items():
        theirs = by_client["vllm bench"]
        print(f"\nconcurrency {c}")
        print(
            f"{'client':<16}{'req/s':>9}{'ratio':>8}{'ratio spread':>14}{'per-round ratios':>20}"
            f"{'send lag p50/p99 ms':>21}{'TTFT p50/p99, ITL p50 ms':>26}"
            f"{'failed':>8}{'client CPU s':>14}{'stub busy':>11}"
        )
        for name in clients:
            rows = by_client[name]
            for row in rows:
                if not row.get("error"):
                    stub_cpu += row["stub_cpu_s"]
                    stub_done += row.get("completed") or 0
            if name == "vllm bench":
                ratio_s, spread, per_round, lag = "", "", "", "-"
            else:
                pairs = [
                    o["rps"] / t["rps"] if o.get("rps") and t.get("rps") else None
                    for o, t in zip(rows, theirs, strict=True)
                ]
                ratios = [x for x in pairs if x]
                ratio_s = _f(_geomean(ratios), 2)
                spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
                per_round = " ".join(_f(x, 2) for x in pairs)
                lag = f"{_f(_mean(rows, 'lag_p50'), 2)} / {_f(_mean(rows, 'lag_p99'), 1)}"
            ttft = f"{_f(_mean(rows, 'ttft_p50'))} / {_f(_mean(rows, 'ttft_p99'))} / {_f(_mean(rows, 'itl_p50'), 2)}"
            failed = sum(int(r.get("failed") or 0) for r in rows) + sum(1 for r in rows if r.get("error"))
            busy = _f(_mean(rows, "stub_busy"), 0) + " %"
            print(
                f"{name:<16}{_f(_mean(rows, 'rps'), 0):>9}{ratio_s:>8}{spread:>14}{per_round:>20}"
                f"{lag:>21}{ttft:>26}{failed:>8}{_f(_mean(rows, 'client_cpu_s')):>14}{busy:>11}"
            )
        for name in clients:
            for i, row in enumerate(by_client[name]):
                if row.get("error"):
                    print(f"  {name} round {i + 1}: {row['error']}")
                elif row.get("sample_errors"):
                    print(f"  {name} round {i + 1}: request errors, e.g. {row['sample_errors'][0]}")
    if stub_done:
        per_req_us = stub_cpu / stub_done * 1e6
        print(
            f"\nstub CPU: {per_req_us:.0f} us per request ({args.output_len} output tokens) over all runs, so one stub "
            f"process saturates one core at about {1e6 / per_req_us:,.0f} req/s; a client rate well below that "
            "is the client's limit, not the server's"
        )
    print(
        "ratio: ours / vllm bench req/s, geometric mean over the rounds of each round's runs; "
        "TTFT here is client-side delay (the server computes nothing)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - figures, not a test: report and exit 0
        print(f"client_capacity: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(0)

"""Parity check: MoE Bench's client against vLLM's own ``vllm bench serve`` on one vLLM server.

Both clients send the same random workload shape (input/output lengths, number of prompts,
concurrency, seed, ``ignore_eos``) to the same server, in ABBA order over ``--rounds`` rounds
(ours, theirs, theirs, ours, ...) so drift on a shared machine hits both alike. Prints the
TTFT / TPOT / ITL / E2E medians and P99s and the throughputs of each, with the ratio
ours / theirs of each round's two back-to-back runs (geometric mean over the rounds), their
spread, and how much vllm bench's own figures move between rounds (the machine's noise
floor). The first wave of requests leaves together in both clients. An idle watchdog
process watches for system-wide stalls (CPU steal on a shared VM); rounds in which one hit
either run are left out and named. Exit status 0 when every median is within
``--tolerance`` (default 5 %).

    python -m studies.parity_vllm                # launches a vLLM server (tiny model, CPU)
    python -m studies.parity_vllm --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine
from engines.launch import ManagedProcess
from engines.settings import get_settings
from engines.vllm import vllm_python

# (label, MoE Bench summary path, vllm bench serve result key)
ROWS: list[tuple[str, str, str]] = [
    ("TTFT median ms", "ttft_ms.p50", "median_ttft_ms"),
    ("TTFT p90 ms", "ttft_ms.p90", "p90_ttft_ms"),
    ("TTFT p99 ms", "ttft_ms.p99", "p99_ttft_ms"),
    ("TPOT median ms", "tpot_ms.p50", "median_tpot_ms"),
    ("TPOT p90 ms", "tpot_ms.p90", "p90_tpot_ms"),
    ("TPOT p99 ms", "tpot_ms.p99", "p99_tpot_ms"),
    ("ITL median ms", "itl_ms.p50", "median_itl_ms"),
    ("ITL p90 ms", "itl_ms.p90", "p90_itl_ms"),
    ("ITL p99 ms", "itl_ms.p99", "p99_itl_ms"),
    ("E2E median ms", "e2e_ms.p50", "median_e2el_ms"),
    ("E2E p90 ms", "e2e_ms.p90", "p90_e2el_ms"),
    ("E2E p99 ms", "e2e_ms.p99", "p99_e2el_ms"),
    ("requests/s", "request_throughput_rps", "request_throughput"),
    ("output tok/s", "output_throughput_tok_s", "output_throughput"),
    ("total tok/s", "total_throughput_tok_s", "total_token_throughput"),
]

_VLLM_SERVE = (
    "import os, sys\n"
    "if os.environ.get('MOEBENCH_PARITY_REALTIME') == '1':\n"  # as MoE Bench's senders: bench.send.cpu_wait
    "    try:\n"
    "        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))\n"
    "    except OSError:\n"
    "        pass\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def vllm_bench_argv(
    base_url: str,
    served_name: str,
    model_dir: str,
    input_len: int,
    output_len: int,
    num_prompts: int,
    concurrency: int,
    seed: int,
    result: Path,
    request_rate: str = "inf",
    detailed: bool = False,
) -> list[str]:
    """``vllm bench serve`` (from the vLLM environment) on the random dataset, exact output
    lengths, saving its result JSON to ``result``: the reference client of the benchmarks."""
    argv = [
        vllm_python(), "-c", _VLLM_SERVE,
        "--backend", "openai", "--base-url", base_url.rstrip("/").removesuffix("/v1"), "--endpoint", "/v1/completions",
        "--model", model_dir, "--served-model-name", served_name, "--tokenizer", model_dir,
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--request-rate", request_rate,
        "--seed", str(seed), "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99", "--disable-tqdm",
        "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
    ]  # fmt: skip
    return [*argv, "--save-detailed"] if detailed else argv


def _get(summary: Any, path: str) -> float | None:
    obj = summary
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def run_ours(args: argparse.Namespace, base_url: str, model_name: str, store: Store, kind: str) -> dict[str, Any]:
    """One MoE Bench concurrency run against the server with the ``vllm`` or the ``openai``
    engine; the figures keyed like :data:`ROWS`."""
    if kind == "vllm":
        engine: dict[str, Any] = {"kind": "vllm", "model": args.model, "served_model_name": model_name}
    else:  # any OpenAI-compatible server: the served name, the local folder as client tokenizer
        engine = {"kind": "openai", "model": model_name, "tokenizer": args.model_dir}
    config = RunConfig.build(
        engine={**engine, "base_url": base_url, **args.engine_opt},
        mode="concurrency",
        workload={
            "source": "random",
            "input_len": args.input_len,
            "output_len": args.output_len,
            "seed": args.seed,
        },
        requests=args.num_prompts,
        concurrency=args.concurrency,
        warmup=1,  # vllm bench serve sends one test request first
        server_metrics=args.server_metrics,  # vllm bench serve does not scrape /metrics
        name=f"parity: moe-bench {kind}",
    )
    job = start_run(config, store)
    snap = job.wait(900)
    if snap.status != "completed" or snap.summary is None:
        raise SystemExit(f"MoE Bench run {snap.status}: {snap.error}")
    out: dict[str, Any] = {label: _get(snap.summary, path) for label, path, _ in ROWS}
    end = time.time()
    out["_window"] = (end - snap.summary.duration_s - 0.5, end)
    recs = sorted(store.records(snap.run_id), key=lambda r: r.start_s)  # type: ignore[arg-type]
    out["_detail"] = {
        "start_s": [r.start_s for r in recs],
        "ttft_ms": [r.ttft_ms for r in recs],
        "send_lag_ms": [r.send_lag_ms for r in recs],
        "prompt_tokens": [r.prompt_tokens for r in recs],
    }
    return out


def run_theirs(
    args: argparse.Namespace, base_url: str, model_name: str, model_dir: str, work: Path, n: int
) -> dict[str, Any]:
    """One ``vllm bench serve`` run in the vLLM environment; the figures keyed like :data:`ROWS`."""
    result = work / f"vllm-serve-{n}.json"
    argv = vllm_bench_argv(
        base_url, model_name, model_dir, args.input_len, args.output_len, args.num_prompts, args.concurrency,
        args.seed, result, detailed=True,
    )  # fmt: skip
    # Both clients read chunks under the same CPU priority: MoE Bench's senders ask for real time
    # where allowed (MOEBENCH_SENDER_PRIORITY), so vllm bench serve does too, or neither does.
    realtime = "1" if get_settings().sender_priority == "realtime" else "0"
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", MOEBENCH_PARITY_REALTIME=realtime)
    proc = ManagedProcess(argv, name="vllm-bench-serve", env=env, log_path=work / f"vllm-serve-{n}.log").start()
    code = proc.wait(900)
    if code != 0 or not result.exists():
        raise SystemExit(f"vllm bench serve failed ({proc.exit_reason()}): {proc.tail_one_line(6)}")
    data = json.loads(result.read_text())
    out: dict[str, Any] = {label: data.get(key) for label, _, key in ROWS}
    end = time.time()
    out["_window"] = (end - float(data.get("duration") or 0.0) - 1.0, end)
    starts = data.get("start_times") or []
    t0 = min(starts) if starts else 0.0
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    out["_detail"] = {
        "start_s": [starts[i] - t0 for i in order],
        "ttft_ms": [data["ttfts"][i] * 1000 for i in order] if data.get("ttfts") else [],
        "prompt_tokens": [data["input_lens"][i] for i in order] if data.get("input_lens") else [],
    }
    return out


# An idle process that sleeps 5 ms at a time and prints every oversleep longer than the
# threshold: a system-wide stall (CPU steal, a starved scheduler) shows up here whichever
# client happens to be running, and a round it lands in measures the machine, not the client.
_WATCHDOG = (
    "import sys, time\n"
    "limit = float(sys.argv[1])\n"
    "last = time.time()\n"
    "while True:\n"
    "    time.sleep(0.005)\n"
    "    now = time.time()\n"
    "    if now - last > limit:\n"
    "        print(f'{now:.3f} {(now - last) * 1000:.0f}', flush=True)\n"
    "    last = now\n"
)


def read_stalls(path: Path) -> list[tuple[float, float]]:
    """(end time, stall ms) for every stall the watchdog saw."""
    out = []
    for line in path.read_text().splitlines():
        t, _, ms = line.partition(" ")
        out.append((float(t), float(ms)))
    return out


def worst_stall(stalls: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """The longest stall (ms) that overlaps any of the windows."""
    worst = 0.0
    for t_end, ms in stalls:
        t_start = t_end - ms / 1000
        if any(t_start < w1 and t_end > w0 for w0, w1 in windows):
            worst = max(worst, ms)
    return worst


def engine_opt(item: str, parser: argparse.ArgumentParser) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        parser.error(f"--engine-opt wants KEY=VALUE, got '{item}'")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a bare string


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b  # type: ignore[operator]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.parity_vllm", description=__doc__.split("\n")[0])
    p.add_argument("--base-url", help="a running vLLM server (default: launch one)")
    p.add_argument("--model", default="tiny-deepseek-v3", help="preset or checkpoint folder")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs both clients once)")
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed relative gap of the medians")
    p.add_argument("--p90-tolerance", type=float, default=0.10, help="allowed relative gap of the p90s")
    p.add_argument(
        "--engines", nargs="+", default=["vllm", "openai"], choices=("vllm", "openai"), help="MoE Bench engine kinds"
    )
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument(
        "--server-metrics",
        action="store_true",
        help="let MoE Bench scrape /metrics during its runs, as it does by default (vllm bench serve never does)",
    )
    p.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of MoE Bench's vllm engine for its runs (JSON value), e.g. async_client=false",
    )
    p.add_argument(
        "--stall-ms",
        type=float,
        default=200.0,
        help="leave out rounds in which an idle watchdog process overslept this long (the machine stalled)",
    )
    args = p.parse_args(argv)
    args.engine_opt = dict(engine_opt(item, p) for item in args.engine_opt)

    from engines.models import resolve_model

    name, path = resolve_model(args.model)
    engine_opts: dict[str, Any] = {"kind": "vllm", "model": args.model, "cpu_kvcache_space_gib": 1}
    if args.base_url:
        engine_opts["base_url"] = args.base_url
    engine = create_engine(engine_opts)
    print("starting vLLM server..." if not args.base_url else f"using {args.base_url}", file=sys.stderr)
    engine.start()
    work = Path(tempfile.mkdtemp(prefix="parity-vllm-"))
    args.model_dir = str(path)
    store = Store(work / "parity.sqlite")
    ours: dict[str, list[dict[str, Any]]] = {k: [] for k in args.engines}
    theirs: list[dict[str, Any]] = []
    stall_log = work / "stalls.txt"
    with stall_log.open("w") as fh:
        watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(args.stall_ms / 1000)], stdout=fh)
    try:
        base_url, served = engine.base_url, engine.served_name  # type: ignore[attr-defined]
        for r in range(args.rounds):
            clients = [*args.engines, "theirs"]
            order = clients if r % 2 == 0 else clients[::-1]
            for who in order:
                print(f"round {r + 1}: {who}", file=sys.stderr, flush=True)
                if who == "theirs":
                    theirs.append(run_theirs(args, base_url, served, str(path), work, r))
                else:
                    ours[who].append(run_ours(args, base_url, served, store, who))
    finally:
        watchdog.kill()
        watchdog.wait()
        engine.stop()

    stalls = read_stalls(stall_log)
    windows = [[t["_window"], *(ours[k][i]["_window"] for k in args.engines)] for i, t in enumerate(theirs)]
    worst = [worst_stall(stalls, w) for w in windows]
    clean = [i for i, w in enumerate(worst) if w == 0.0]
    used = clean if len(clean) >= 2 else list(range(len(theirs)))
    left_out = [i for i in range(len(theirs)) if i not in used]

    print(
        f"\nworkload: {args.num_prompts} prompts, {args.input_len} in / {args.output_len} out, "
        f"concurrency {args.concurrency}, seed {args.seed}, model {name}; {args.rounds} ABBA rounds"
    )
    if args.engine_opt:
        print(f"MoE Bench engine options: {json.dumps(args.engine_opt)}")
    if left_out:
        what = ", ".join(f"{i + 1} ({worst[i]:.0f} ms)" for i in left_out)
        print(f"left out: rounds {what}, where the machine stalled over {args.stall_ms:.0f} ms (idle watchdog)")
    elif len(clean) < 2 and any(worst):
        print(f"note: fewer than 2 rounds ran without a machine stall over {args.stall_ms:.0f} ms; all rounds used")
    used_theirs = [theirs[i] for i in used]
    out: dict[str, Any] = {}
    verdicts = []
    for kind in args.engines:
        rows, ok = _report(kind, [ours[kind][i] for i in used], used_theirs, args)
        out[kind] = rows
        verdicts.append(ok)
    print(
        "\nratio: geometric mean over the rounds of ours / theirs (each round's runs back to back); "
        "vllm vs itself: the coefficient of variation of vllm bench's own figure across rounds."
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": out,
                    "rounds": {"ours": ours, "theirs": theirs},
                    "stalls": stalls,
                    "round_worst_stall_ms": worst,
                    "rounds_used": [i + 1 for i in used],
                },
                indent=2,
            )
        )
    return 0 if all(verdicts) else 1


def _report(
    kind: str, ours: list[dict[str, Any]], theirs: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[dict[str, Any], bool]:
    """Print one engine kind's table against vllm bench; (figures, verdict)."""

    def mean(rows: list[dict[str, Any]], label: str) -> float | None:
        vals = [row[label] for row in rows if row[label] is not None]
        return sum(vals) / len(vals) if vals else None

    print(f"\nMoE Bench '{kind}' engine against vllm bench serve")
    print(
        f"{'metric':<16}{'MoE Bench':>11}{'vllm bench':>11}{'ratio':>8}{'per-round ratios':>20}{'vllm vs itself':>16}"
    )
    out: dict[str, Any] = {}
    gap_median = gap_p90 = 0.0
    noise = 0.0
    for label, _, _ in ROWS:
        a, b = mean(ours, label), mean(theirs, label)
        pairs = [_ratio(o[label], t[label]) for o, t in zip(ours, theirs, strict=True)]
        ratios = [r for r in pairs if r is not None and r > 0]
        # Each round pairs runs made back to back; the geometric mean of the pair ratios
        # cancels the drift that moves both runs of a round alike.
        ratio = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
        mine = [t[label] for t in theirs if t[label] is not None]
        cv = statistics.pstdev(mine) / statistics.fmean(mine) if len(mine) > 1 and statistics.fmean(mine) else None
        out[label] = {"moe_bench": a, "vllm_bench": b, "ratio": ratio, "round_ratios": pairs, "vllm_cv": cv}
        if ratio is not None and "median" in label:
            gap_median = max(gap_median, abs(ratio - 1.0))
            noise = max(noise, cv or 0.0)
        if ratio is not None and "p90" in label:
            gap_p90 = max(gap_p90, abs(ratio - 1.0))

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        own = "-" if cv is None else f"{cv * 100:.0f} %"
        print(f"{label:<16}{f(a):>11}{f(b):>11}{f(ratio):>8}{spread:>20}{own:>16}")
    ok = gap_median <= args.tolerance and gap_p90 <= args.p90_tolerance
    print(
        f"largest median gap {gap_median * 100:.1f} % (tolerance {args.tolerance * 100:.0f} %), "
        f"largest p90 gap {gap_p90 * 100:.1f} % (tolerance {args.p90_tolerance * 100:.0f} %): "
        f"{'PASS' if ok else 'FAIL'}"
    )
    if noise > args.tolerance:
        print(
            f"note: vllm bench's own medians moved up to {noise * 100:.0f} % between rounds on this machine, "
            "more than the tolerance; more --rounds narrow the ratio"
        )
    return out, ok


if __name__ == "__main__":
    sys.exit(main())

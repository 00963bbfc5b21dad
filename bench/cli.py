"""``python -m bench``: the headless face of MoE Bench, over the same API as the dashboard.

Commands: ``run`` (a benchmark with a progress bar, then a summary), ``runs`` (list),
``sweep``, ``capacity``, ``report`` and ``sweeps`` (:mod:`bench.cli_sweep`),
``export`` (CSV), ``model tiny`` (build the tiny checkpoint), ``engines`` and
``accelerators`` (what is usable here, and why not). Every user error prints one
line ``error: <reason>`` on stderr and exits with status 2 (1 for a failed run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.config import MODES, RunConfig
from bench.gc_watch import note as gc_note
from bench.metrics import RunSummary, Spread
from bench.run_limits import RunLimits
from bench.runner import (
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_GC,
    ARTIFACT_LIMITS,
    ARTIFACT_LOAD_GENERATORS,
    Job,
    start_run,
)
from bench.store import Store
from bench.workload_args import add_workload_arguments, workload_overrides
from bench.workloads import WORKLOAD_SOURCES, WorkloadSpec
from engines.errors import MoEBenchError

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_USAGE, f"error: {message} (see --help)\n")


def _positive(name: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be an integer, got '{text}'") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be at least 1, got {value}")
        return value

    return parse


def _rate(text: str) -> float | None:
    """``--request-rate``: requests per second; 0 or inf for a closed loop (None)."""
    if text.strip().lower() in ("inf", "infinity"):
        return None
    try:
        value = float(text)
    except ValueError:
        msg = f"--request-rate must be a number of requests per second, got '{text}'"
        raise argparse.ArgumentTypeError(msg) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--request-rate must be 0 or above (0 or inf: closed loop), got {text}")
    return value or None


def _default(name: str, model: type[BaseModel] = RunConfig) -> Any:
    return model.model_fields[name].default


def _help(name: str, model: type[BaseModel] = RunConfig, extra: str = "") -> str:
    """A run flag's help: the field's own description (argparse's % escaped), then ``extra``."""
    text = (model.model_fields[name].description or "").replace("%", "%%")
    return f"{text}{extra}"


def run_arguments(sweep: bool = False) -> argparse.ArgumentParser:
    """The flags that define a run (a parent parser). With ``sweep``, ``--concurrency``,
    ``--request-rate``, ``--input-len`` and ``--output-len`` take lists (see :func:`number_list`)."""
    r = argparse.ArgumentParser(add_help=False)
    r.add_argument("--engine", default="native", help="engine kind (see `engines`)")
    r.add_argument("--model", default="tiny-deepseek-v3", help="preset name or local checkpoint folder")
    r.add_argument("--accelerator", default="cpu", help="cpu | cuda | npu | mlu")
    r.add_argument("--dtype", default="auto", help="auto | float16 | bfloat16 | float32")
    r.add_argument(
        "--base-url", help="reach a running server (vllm, openai, triton, lmdeploy) instead of launching one"
    )
    r.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine option (repeatable), e.g. max_num_seqs=64 or enable_prefix_caching=true; see `engines`",
    )
    r.add_argument("--mode", default="concurrency", choices=MODES)
    r.add_argument(
        "--requests",
        type=_positive("requests"),
        default=None,
        help=_help("requests", extra=f" (default {_default('requests')}; with --duration: a cap)"),
    )
    if sweep:
        r.add_argument(
            "--concurrency",
            type=number_list(int, "concurrency"),
            default=None,
            help="concurrency values to sweep: 1,2,4 or 1..32 (doubling) or 8..64+8 (step 8)",
        )
        r.add_argument(
            "--request-rate",
            type=number_list(float, "request-rate"),
            default=None,
            help="request rates (req/s) to sweep, open loop: 1,2,4 or 1..64 or 2..20+2",
        )
    else:
        r.add_argument(
            "--concurrency", type=_positive("concurrency"), default=_default("concurrency"), help=_help("concurrency")
        )
        r.add_argument(
            "--request-rate", type=_rate, default=None, help=_help("request_rate", extra="; inf is a closed loop too")
        )
    r.add_argument(
        "--workers",
        type=_positive("workers"),
        default=_default("workers"),
        help=_help("workers", extra="; at most --concurrency (default %(default)s)"),
    )
    r.add_argument(
        "--ray-address",
        default=None,
        metavar="auto|HOST:PORT|ray://HOST:PORT",
        help=_help("ray_address", extra="; needs requirements-ray.txt"),
    )
    r.add_argument("--burstiness", type=float, default=_default("burstiness"), help=_help("burstiness"))
    r.add_argument("--duration", type=_seconds, default=None, help=_help("duration_s", extra="; 60, 60s, 5m or 1h"))
    r.add_argument("--ramp-up", type=_seconds, default=None, help=_help("ramp_up_s", extra="; 30, 30s or 2m"))
    r.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC:STAT<=MS",
        help="a service-level objective (repeatable), e.g. ttft_ms:p99<=2000, or a preset: mlperf-server "
        "(TTFT p99 2000 ms, TPOT p99 80 ms) or interactive (1500 ms, 15 ms); the run reports goodput",
    )
    r.add_argument(
        "--no-server-metrics",
        action="store_true",
        help="do not scrape the server's /metrics during the run (each scrape costs the server CPU)",
    )
    r.add_argument(
        "--telemetry-url",
        action="append",
        default=[],
        metavar="URL",
        help="a Prometheus exporter to read device telemetry from once a second (repeatable): NVIDIA DCGM "
        "exporter, Ascend npu-exporter or Cambricon mlu-exporter, e.g. http://gpu-host:9400/metrics",
    )
    r.add_argument(
        "--no-device-telemetry",
        action="store_true",
        help="do not read this host's accelerator telemetry (NVML on cuda, npu-smi on npu, cnmon on mlu)",
    )
    r.add_argument(
        "--warmup", type=int, default=None, help=_help("warmup", extra=f"; default {_default('warmup')} in every mode")
    )
    r.add_argument("--prompts", default="random", choices=WORKLOAD_SOURCES, help="prompt source")
    r.add_argument(
        "--prompt-file",
        help="JSONL file for --prompts jsonl ({'prompt': ..., 'output_len': ...}), "
        "ShareGPT JSON file for --prompts sharegpt",
    )
    for flag, field in (("--input-len", "input_len"), ("--output-len", "output_len")):
        r.add_argument(
            flag,
            type=_positive(flag[2:]),
            default=_default(field, WorkloadSpec),
            help=_help(field, WorkloadSpec),
        )
    if sweep:
        r.add_argument(
            "--lengths",
            type=length_pairs,
            default=None,
            metavar="IN:OUT,...",
            help="(input_len, output_len) pairs to sweep, e.g. 128:128,512:128,2048:256",
        )
    add_workload_arguments(r)
    r.add_argument("--temperature", type=float, default=_default("temperature"), help=_help("temperature"))
    r.add_argument("--top-p", type=float, default=_default("top_p"), help=_help("top_p"))
    r.add_argument("--no-ignore-eos", action="store_true", help="allow stopping at EOS (outputs may be shorter)")
    r.add_argument("--seed", type=int, default=_default("seed", WorkloadSpec), help=_help("seed", WorkloadSpec))
    r.add_argument("--name", default=_default("name"), help=_help("name"))
    return r


def run_config_data(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RunConfig` fields the run flags give (unset ones keep RunConfig's defaults)."""
    workload: dict[str, Any] = {
        "source": args.prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "path": args.prompt_file,
        "seed": args.seed,
    }
    workload.update(workload_overrides(args))
    data: dict[str, Any] = {
        "engine": _engine_opts(args),
        "mode": args.mode,
        "workload": workload,
        "workers": args.workers,
        "ray_address": args.ray_address,
        "burstiness": args.burstiness,
        "server_metrics": not args.no_server_metrics,
        "device_telemetry": not args.no_device_telemetry,
        "telemetry_urls": list(args.telemetry_url),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "ignore_eos": not args.no_ignore_eos,
        "name": args.name,
        "slos": list(args.slo),
    }
    optional = {
        "warmup": args.warmup,
        "requests": args.requests,
        "duration_s": args.duration,
        "ramp_up_s": args.ramp_up,
        "concurrency": args.concurrency if not isinstance(args.concurrency, list) else None,
        "request_rate": args.request_rate if not isinstance(args.request_rate, list) else None,
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    return data


def _seconds(text: str) -> float:
    """``60``, ``60s``, ``5m``, ``1h`` -> seconds."""
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds like 60, 60s, 5m or 1h, got '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got '{text}'")
    return value


def number_list(kind: type, name: str) -> Any:
    """A list flag: ``1,2,4``; ``1..32`` (doubling: 1,2,4,...,32); ``8..64+8`` (8,16,...,64)."""

    def parse(text: str) -> list[Any]:
        out: list[Any] = []
        try:
            for part in text.split(","):
                part = part.strip()
                if ".." in part:
                    lo_s, _, rest = part.partition("..")
                    hi_s, plus, step_s = rest.partition("+")
                    lo, hi = kind(lo_s), kind(hi_s)
                    if not 0 < lo <= hi:
                        raise ValueError
                    x = lo
                    while x <= hi * (1 + 1e-9):
                        out.append(x)
                        x = x + kind(step_s) if plus else x * 2
                        if plus and kind(step_s) <= 0:
                            raise ValueError
                    if len(out) > 1000:
                        raise ValueError
                else:
                    out.append(kind(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--{name} takes numbers above 0 like 1,2,4 or 1..32 or 8..64+8, got '{text}'"
            ) from None
        if not out or any(x <= 0 for x in out):
            raise argparse.ArgumentTypeError(f"--{name} takes numbers above 0, got '{text}'")
        return sorted(set(out))

    return parse


def length_pairs(text: str) -> list[tuple[int, int]]:
    """``128:64,512:128`` -> [(128, 64), (512, 128)] (``--lengths``)."""
    out = []
    for part in text.split(","):
        a, sep, b = part.strip().partition(":")
        try:
            pair = (int(a), int(b))
        except ValueError:
            pair = (0, 0)
        if not sep or min(pair) < 1:
            raise argparse.ArgumentTypeError(f"--lengths takes IN:OUT token pairs like 128:64,512:128, got '{text}'")
        out.append(pair)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m bench", description="MoE Bench: benchmark DeepSeek MoE models on real engines.")
    p.add_argument("--db", help="SQLite results file (default: $MOEBENCH_DB_PATH or data/moebench.sqlite)")
    # --db is accepted before or after the command (`run ... --db PATH`, as in the README)
    db_parent = argparse.ArgumentParser(add_help=False)
    db_parent.add_argument("--db", default=argparse.SUPPRESS, help="SQLite results file")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add = sub.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return _add(name, parents=[db_parent, *kw.pop("parents", [])], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]

    r = sub.add_parser("run", help="run a benchmark", parents=[run_arguments()])
    r.add_argument("--csv", help="write the per-request CSV here")
    r.add_argument("--summary-csv", help="write the one-row summary CSV here")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--allow-failures",
        action="store_true",
        help="exit 0 when the run completed but some requests failed (default: exit 1, the failures are kept)",
    )
    r.add_argument(
        "--repeat",
        type=_positive("repeat"),
        default=1,
        metavar="N",
        help="run it N times (each with its own prompt seed, stored as one sweep) and print the spread of each "
        "headline figure: min / median / max and the coefficient of variation",
    )

    from bench.cli_sweep import add_sweep_commands

    add_sweep_commands(sub)

    sub.add_parser("runs", help="list stored runs")

    e = sub.add_parser("export", help="export a run as CSV")
    e.add_argument("run_id", type=int)
    e.add_argument("--csv", "--out", dest="csv", required=True, help="output file")
    e.add_argument("--summary", action="store_true", help="the one-row summary instead of per-request rows")
    e.add_argument("--operators", action="store_true", help="a profile run's operator table")
    e.add_argument("--bundle", action="store_true", help="the whole run as JSON (for `import`)")

    i = sub.add_parser("import", help="import a run bundle (e.g. examples/*.json)")
    i.add_argument("path")

    m = sub.add_parser("model", help="model utilities")
    m.add_argument("action", choices=("tiny",), help="tiny: build the tiny DeepSeek-V3 and print its folder")

    from bench.compare import add_compare_arguments, add_offline_arguments

    add_compare_arguments(sub.add_parser("compare-engines", help="the same workload on native and vLLM, with ratios"))
    add_offline_arguments(sub.add_parser("offline", help="vLLM offline throughput (LLM.generate in a worker process)"))

    sub.add_parser("engines", help="list engines and whether they can run here")
    sub.add_parser("accelerators", help="list accelerators and whether they are available")
    return p


def _store(args: argparse.Namespace) -> Store:
    from engines.settings import get_settings

    if args.db and "MOEBENCH_LOGS_DIR" not in os.environ:
        # The servers this command starts log beside its store, as its traces are kept there.
        os.environ["MOEBENCH_LOGS_DIR"] = str(Path(args.db).resolve().parent / "logs")
    return Store(args.db or get_settings().db_path)


def _bar(snap: Any, width: int = 30) -> str:
    frac = snap.fraction
    filled = int(width * frac)
    s = snap.summary
    extra = ""
    if s is not None and s.completed:
        extra = f"  {s.output_throughput_tok_s:7.1f} tok/s  TTFT p50 {_ms(s.ttft_ms.p50)}"
    if snap.status == "loading":
        return f"\r{snap.phase[:70]:<70}"
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {snap.done}/{snap.total}  failed {snap.failed}{extra}   "


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def format_summary(summary: RunSummary) -> str:
    """A plain-text table of a run summary."""
    lines = [
        f"requests      {summary.completed} completed, {summary.failed} failed"
        + (f", {summary.cancelled} cancelled (in flight when the run was stopped)" if summary.cancelled else ""),
        f"duration      {summary.duration_s:.3f} s",
        f"throughput    {summary.request_throughput_rps:.3f} req/s   {summary.output_throughput_tok_s:.2f} output tok/s"
        f"   {summary.total_throughput_tok_s:.2f} total tok/s",
        f"tokens        {summary.prompt_tokens} prompt, {summary.output_tokens} output",
        "",
        f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}{'max':>10}",
    ]
    rows = [
        ("TTFT ms", summary.ttft_ms),
        ("TPOT ms", summary.tpot_ms),
        ("ITL ms", summary.itl_ms),
        ("E2E ms", summary.e2e_ms),
    ]
    if summary.send_lag_ms is not None:
        rows.append(("send lag", summary.send_lag_ms))
    for label, st in rows:
        vals = [st.mean, st.p50, st.p90, st.p95, st.p99, st.max]
        lines.append(f"{label:<10}" + "".join(f"{'-' if v is None else f'{v:.2f}':>10}" for v in vals))
    if summary.peak_memory_gib is not None:
        lines.append(f"\npeak memory   {summary.peak_memory_gib:.3f} GiB")
    if summary.request_rate is not None:
        lines.append(f"load          open loop, {summary.request_rate:g} req/s, burstiness {summary.burstiness:g}")
    if summary.slos:
        met = "met" if summary.slo_met else "NOT met"
        lines.append(f"SLOs          {' '.join(summary.slos)}: {met}")
        lines.append(
            f"goodput       {summary.goodput_rps or 0:.3f} req/s ({summary.good_requests} of {summary.completed} "
            "completed requests met every SLO)"
        )
    if summary.prefix_cache_hit_rate is not None:
        lines.append(f"prefix cache  {summary.prefix_cache_hit_rate:.1%} of the prompt tokens served from the cache")
    if summary.tokens_per_chunk is not None:
        share = f"{summary.single_chunk_share:.0%}" if summary.single_chunk_share is not None else "-"
        lines.append(f"chunks        {summary.tokens_per_chunk:.2f} tokens per chunk, {share} of outputs in one chunk")
    if summary.other_cpu_cores is not None:
        lines.append(
            f"host CPU      MoE Bench {summary.client_cpu_cores or 0:.2f} cores, other processes "
            f"{summary.other_cpu_cores:.2f} cores, steal {summary.steal_pct or 0:.1f}%"
        )
    if summary.device_util_pct is not None or summary.device_mem_used_gib is not None:
        parts = []
        if summary.device_util_pct is not None:
            parts.append(f"utilisation {summary.device_util_pct:.0f}% (mean)")
        if summary.device_power_w is not None:
            parts.append(f"power {summary.device_power_w:.0f} W (mean)")
        if summary.device_mem_used_gib is not None:
            parts.append(f"memory in use {summary.device_mem_used_gib:.2f} GiB (peak)")
        lines.append(f"device        {', '.join(parts)}")
    if summary.disturbance:
        lines.append(f"DISTURBED     {summary.disturbance}")
    load = None if summary.disturbance else summary.load_warning  # already part of the disturbance
    for warning in (load, summary.cache_warning, summary.burst_warning):
        if warning:
            lines.append(f"warning       {warning}")
    return "\n".join(lines)


def format_profile(store: Store, run_id: int, top: int = 12) -> str:
    """The bottleneck breakdown and the top operators of a profile run, as text."""
    from bench.runner import ARTIFACT_BREAKDOWN, ARTIFACT_OPERATORS, ARTIFACT_TRACE

    lines = []
    bd = store.artifact(run_id, ARTIFACT_BREAKDOWN)
    if bd:
        lines.append(f"\nbottleneck breakdown (share of {bd['basis']} time, total {bd['total_ms']:.1f} ms)")
        lines.append(f"  {'category':<16}{'cpu ms':>10}{'device ms':>11}{'share':>9}")
        for row in bd["rows"]:
            dev = "-" if row.get("device_ms") is None else f"{row['device_ms']:.2f}"
            lines.append(f"  {row['category']:<16}{row['cpu_ms']:>10.2f}{dev:>11}{row['share_pct']:>8.1f}%")
    ops = store.artifact(run_id, ARTIFACT_OPERATORS) or []
    if ops:
        key = "self_device_ms" if any(o["self_device_ms"] for o in ops) else "self_cpu_ms"
        lines.append(f"\ntop operators by {key}")
        lines.append(f"  {'operator':<40}{'calls':>8}{'self cpu ms':>13}{'self dev ms':>13}  input shapes")
        for o in sorted(ops, key=lambda o: o[key], reverse=True)[:top]:
            lines.append(
                f"  {o['operator'][:40]:<40}{o['calls']:>8}{o['self_cpu_ms']:>13.2f}{o['self_device_ms']:>13.2f}"
                f"  {o['input_shapes'][:60]}"
            )
    trace = store.artifact(run_id, ARTIFACT_TRACE)
    if trace:
        lines.append(f"\ntrace         {trace['path']}  (open in Perfetto or chrome://tracing)")
    return "\n".join(lines)


def _engine_opts(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "kind": args.engine,
        "model": args.model,
        "accelerator": args.accelerator,
        "dtype": args.dtype,
    }
    if args.base_url:
        opts["base_url"] = args.base_url
    for item in args.engine_opt:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise MoEBenchError(f"--engine-opt takes KEY=VALUE, got '{item}'")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        opts[key.strip()] = value
    return opts


def format_spread(rows: Sequence[Spread]) -> str:
    """The spread table of repeated runs, one line per headline figure."""
    lines = [f"{'figure':<16}{'runs':>5}{'min':>11}{'median':>11}{'max':>11}{'CV':>8}"]
    for r in rows:
        vals = "".join(f"{'-' if v is None else f'{v:.2f}':>11}" for v in (r.min, r.median, r.max))
        cv = "-" if r.cv is None else f"{r.cv:.1%}"
        lines.append(f"{r.label:<16}{r.n:>5}{vals}{cv:>8}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    if args.repeat > 1:
        from bench.cli_sweep import repeat_run

        return repeat_run(args)
    config = RunConfig.build(**run_config_data(args))
    store = _store(args)
    job: Job = start_run(config, store)
    tty = sys.stderr.isatty() and not args.quiet
    try:
        while not job.wait(0.25 if tty else 1.0).status not in ("pending", "loading", "running"):
            if tty:
                sys.stderr.write(_bar(job.snapshot()))
                sys.stderr.flush()
            elif not args.quiet:
                snap = job.snapshot()
                if snap.status == "running":
                    sys.stderr.write(f"progress {snap.done}/{snap.total} failed {snap.failed}\n")
    except KeyboardInterrupt:
        job.cancel()
        snap = job.wait(10)
        if snap.active and snap.run_id is not None:
            # Still busy in a phase that does not look at the cancel flag (building a million
            # prompts): record the run as cancelled now; what was stored stays.
            store.finish_run(snap.run_id, "cancelled", error=f"cancelled (Ctrl-C) during: {snap.phase}")
        sys.stderr.write("\ncancelled; what was measured is kept\n")
        return EXIT_INTERRUPTED
    snap = job.snapshot()
    if tty:
        sys.stderr.write(_bar(snap) + "\n")
    run_id = snap.run_id
    assert run_id is not None
    if snap.summary is not None:
        print(format_summary(snap.summary))
    telemetry = store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY)
    if isinstance(telemetry, dict):
        for reason in telemetry.get("missing") or []:
            print(f"note          device telemetry: {reason}")
    gc_found = store.artifact(run_id, ARTIFACT_GC)
    if isinstance(gc_found, dict) and (line := gc_note(gc_found)):
        print(f"note          {line}")
    senders = store.artifact(run_id, ARTIFACT_LOAD_GENERATORS)
    if isinstance(senders, dict):
        from bench.ray_sender import placement_line

        print(f"senders       {placement_line(senders)}")
    limits = store.artifact(run_id, ARTIFACT_LIMITS)
    if isinstance(limits, dict):
        if "reason" in limits:
            print(f"note          no hardware limit: {limits['reason']}")
        else:
            print(f"limit         {RunLimits.from_dict(limits).line()}")
    if args.mode == "profile" and snap.status == "completed":
        print(format_profile(store, run_id))
    if args.csv:
        Path(args.csv).write_bytes(store.requests_csv(run_id))
    if args.summary_csv:
        Path(args.summary_csv).write_bytes(store.summary_csv([run_id]))
    failed = snap.summary.failed if snap.summary is not None else 0
    total = snap.summary.requests if snap.summary is not None else 0
    failures = f", {failed} of {total} requests failed" if failed else ""
    print(f"run id        {run_id}  ({snap.status}{failures})")
    if snap.status != "completed":
        print(f"error: run {run_id} {snap.status}: {snap.error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if failed and not args.allow_failures:
        first = next((r.error for r in store.records(run_id) if r.error), "")
        print(
            f"error: run {run_id}: {failed} of {total} requests failed (first: {first}); --allow-failures accepts that",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    runs = _store(args).list_runs()
    if not runs:
        print("no runs yet")
        return EXIT_OK
    print(
        f"{'id':>4}  {'status':<11} {'mode':<11} {'engine':<8} {'model':<20} {'acc':<5} {'req':>5}"
        f" {'tok/s':>9} {'ttft p50':>9}  created"
    )
    for r in runs:
        s = r.summary
        print(
            f"{r.id:>4}  {r.status:<11} {r.mode:<11} {r.engine:<8} {r.model[:20]:<20} {r.accelerator:<5} "
            f"{(s.completed if s else 0):>5} {(f'{s.output_throughput_tok_s:.1f}' if s else '-'):>9} "
            f"{(f'{s.ttft_ms.p50:.1f}' if s and s.ttft_ms.p50 is not None else '-'):>9}  "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.created_at))}"
        )
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    store = _store(args)
    if store.get_run(args.run_id) is None:
        raise MoEBenchError(f"no run with id {args.run_id} in {store.path}")
    if args.bundle:
        data = json.dumps(store.export_bundle(args.run_id)).encode()
        Path(args.csv).write_bytes(data)
        print(f"wrote {args.csv} (run {args.run_id} bundle)")
        return EXIT_OK
    if args.operators:
        data = store.operators_csv(args.run_id)
    elif args.summary:
        data = store.summary_csv([args.run_id])
    else:
        data = store.requests_csv(args.run_id)
    Path(args.csv).write_bytes(data)
    rows = data.count(b"\n") - 1
    print(f"wrote {args.csv} ({rows} rows)")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from bench.store import import_bundle_file

    run_id = import_bundle_file(_store(args), args.path)
    print(f"imported {args.path} as run {run_id}")
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    from engines.models import tiny_path

    print(tiny_path())
    return EXIT_OK


def cmd_engines(args: argparse.Namespace) -> int:
    from engines.base import list_engines

    for kind, label, avail in list_engines():
        print(
            f"{kind:<10} {'available' if avail.ok else 'unavailable':<12} {label}"
            + (f": {avail.reason}" if not avail.ok else "")
        )
    return EXIT_OK


def cmd_accelerators(args: argparse.Namespace) -> int:
    from engines.accelerators import list_accelerators

    for name, label, avail in list_accelerators():
        print(
            f"{name:<5} {'available' if avail.ok else 'unavailable':<12} {label}"
            + (f": {avail.reason}" if not avail.ok else "")
        )
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.compare import cmd_compare_engines

    return cmd_compare_engines(args, _store(args))


def cmd_offline(args: argparse.Namespace) -> int:
    from bench.compare import cmd_offline as run_offline

    return run_offline(args)


COMMANDS = {
    "run": cmd_run,
    "runs": cmd_runs,
    "export": cmd_export,
    "model": cmd_model,
    "import": cmd_import,
    "engines": cmd_engines,
    "accelerators": cmd_accelerators,
    "compare-engines": cmd_compare,
    "offline": cmd_offline,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        handler = getattr(args, "func", None) or COMMANDS[args.command]
        return int(handler(args))
    except MoEBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USAGE

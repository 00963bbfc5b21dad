"""Native vs vLLM on the same workload (the book's 8.2.4 table), and vLLM's offline throughput.

:func:`compare_engines` runs one :class:`~bench.runner.RunConfig` twice through
:func:`bench.runner.start_run`, changing only the engine (``native`` first, then ``vllm``,
one after the other so they never compete for the machine), and returns both run ids with
the measured ratios:

- ``throughput_speedup`` = vLLM output tok/s / native output tok/s (the book's 吞吐量 提升);
- ``p99_latency_speedup`` = native P99 E2E latency / vLLM P99 E2E latency (P99延迟 提升;
  above 1 means vLLM is faster). TTFT and TPOT P99 ratios are given too.
- memory efficiency (显存效率), see :data:`MEMORY_EFFICIENCY_DEFINITION`: measured for vLLM
  from its own metrics; ``None`` for native, which has no reserved KV-cache pool to measure
  against (its KV cache is allocated per request by transformers).

:func:`run_offline_workload` runs vLLM's in-process ``LLM.generate`` on the same random
prompts as an online run (see :func:`engines.vllm.run_offline`).

CLI: ``python -m bench compare-engines ...`` and ``python -m bench offline ...``;
:func:`add_compare_arguments` / :func:`cmd_compare_engines` and :func:`add_offline_arguments` /
:func:`cmd_offline` plug into ``bench.cli``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.config import RunConfig
from bench.metrics import RunSummary
from bench.runner import start_run
from bench.store import Store
from engines.errors import ConfigError, MoEBenchError

KV_USAGE_SERIES = "server_kv_cache_usage_pct"

MEMORY_EFFICIENCY_DEFINITION = (
    "KV-cache utilisation at peak: the largest fraction of the KV cache the engine reserved "
    "that the run's requests actually held at one time, in percent. For vLLM it is the maximum "
    "of vllm:kv_cache_usage_perc (allocated KV blocks / blocks reserved at start-up) over the "
    "run, sampled about once a second. It depends on the workload (more, longer requests fill "
    "more of the pool). The native engine reserves no KV pool (transformers grows a cache per "
    "request), so it has no such figure: None, not an estimate."
)


@dataclass(frozen=True)
class EngineFigures:
    """One engine's row of the comparison table."""

    engine: str
    run_id: int
    status: str
    error: str | None
    output_throughput_tok_s: float | None
    request_throughput_rps: float | None
    e2e_p99_ms: float | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    peak_memory_gib: float | None
    memory_efficiency_pct: float | None
    kv_cache_reserved_gib: float | None = None


@dataclass(frozen=True)
class CompareResult:
    """Both runs and the ratios of the book's native-vs-vLLM table (see the module docstring)."""

    native_run_id: int
    vllm_run_id: int
    native: EngineFigures
    vllm: EngineFigures
    throughput_speedup: float | None
    p99_latency_speedup: float | None
    ttft_p99_speedup: float | None
    tpot_p99_speedup: float | None
    memory_efficiency_native_pct: float | None
    memory_efficiency_vllm_pct: float | None
    memory_efficiency_definition: str = MEMORY_EFFICIENCY_DEFINITION
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> list[dict[str, Any]]:
        """Rows like the book's table: metric, native, vLLM, speedup."""
        n, v = self.native, self.vllm
        return [
            {
                "metric": "output throughput (tok/s)",
                "native": n.output_throughput_tok_s,
                "vllm": v.output_throughput_tok_s,
                "speedup": self.throughput_speedup,
            },
            {
                "metric": "P99 E2E latency (ms)",
                "native": n.e2e_p99_ms,
                "vllm": v.e2e_p99_ms,
                "speedup": self.p99_latency_speedup,
            },
            {
                "metric": "memory efficiency (% of reserved KV cache used at peak)",
                "native": self.memory_efficiency_native_pct,
                "vllm": self.memory_efficiency_vllm_pct,
                "speedup": None,
            },
        ]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def peak_kv_usage_pct(store: Store, run_id: int) -> float | None:
    """The highest sampled ``server_kv_cache_usage_pct`` of a run, or None when not recorded."""
    values = [v for _, _, v in store.timeseries(run_id, [KV_USAGE_SERIES]) if v is not None]
    return max(values) if values else None


def engine_figures(store: Store, run_id: int) -> EngineFigures:
    """One run's row from the store."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"no run with id {run_id}")
    s: RunSummary | None = run.summary
    mem_eff = peak_kv_usage_pct(store, run_id) if run.engine != "native" else None
    reserved = None
    kv = (run.engine_info or {}).get("kv_cache")
    if isinstance(kv, dict) and kv.get("kv_cache_memory_bytes", "None") not in ("None", ""):
        reserved = float(kv["kv_cache_memory_bytes"]) / 1024**3
    return EngineFigures(
        engine=run.engine,
        run_id=run_id,
        status=run.status,
        error=run.error,
        output_throughput_tok_s=s.output_throughput_tok_s if s else None,
        request_throughput_rps=s.request_throughput_rps if s else None,
        e2e_p99_ms=s.e2e_ms.p99 if s else None,
        ttft_p99_ms=s.ttft_ms.p99 if s else None,
        tpot_p99_ms=s.tpot_ms.p99 if s else None,
        peak_memory_gib=s.peak_memory_gib if s else None,
        memory_efficiency_pct=mem_eff,
        kv_cache_reserved_gib=reserved,
    )


def compare_engines(
    config: RunConfig,
    store: Store,
    vllm_engine: dict[str, Any] | None = None,
    *,
    progress: Callable[[str, float], None] | None = None,
    cancel: threading.Event | None = None,
) -> CompareResult:
    """Run ``config`` on ``native`` and on ``vllm`` (same workload, model, accelerator, dtype).

    ``vllm_engine`` adds vLLM options (e.g. ``{"base_url": ...}`` or ``{"cpu_kvcache_space_gib": 1}``).
    Blocks until both runs end; ``cancel`` stops the current run and skips the next.
    """
    base = dict(config.engine)
    common = {k: base[k] for k in ("model", "accelerator", "dtype", "trust_remote_code") if k in base}
    native_cfg = config.model_copy(update={"engine": {"kind": "native", **common}})
    vllm_cfg = config.model_copy(update={"engine": {"kind": "vllm", **common, **(vllm_engine or {})}})
    # Re-validate the engine dicts (model_copy does not run validators).
    native_cfg = RunConfig.build(**{**native_cfg.model_dump(), "name": config.name or "compare: native"})
    vllm_cfg = RunConfig.build(**{**vllm_cfg.model_dump(), "name": config.name or "compare: vllm"})
    report = progress or (lambda msg, frac: None)
    run_ids: list[int] = []
    for i, (label, cfg) in enumerate((("native", native_cfg), ("vllm", vllm_cfg))):
        if cancel is not None and cancel.is_set():
            raise MoEBenchError(f"comparison cancelled before the {label} run")
        report(f"{label} run", i / 2)
        job = start_run(cfg, store)
        while not job.wait(0.5).status not in ("pending", "loading", "running"):
            if cancel is not None and cancel.is_set():
                job.cancel()
            snap = job.snapshot()
            report(f"{label}: {snap.phase} {snap.done}/{snap.total}", (i + snap.fraction) / 2)
        assert job.run_id is not None
        run_ids.append(job.run_id)
    report("done", 1.0)
    native, vllm = engine_figures(store, run_ids[0]), engine_figures(store, run_ids[1])
    notes = [f"{f.engine} run {f.run_id} {f.status}: {f.error}" for f in (native, vllm) if f.status != "completed"]
    return CompareResult(
        native_run_id=run_ids[0],
        vllm_run_id=run_ids[1],
        native=native,
        vllm=vllm,
        throughput_speedup=_ratio(vllm.output_throughput_tok_s, native.output_throughput_tok_s),
        p99_latency_speedup=_ratio(native.e2e_p99_ms, vllm.e2e_p99_ms),
        ttft_p99_speedup=_ratio(native.ttft_p99_ms, vllm.ttft_p99_ms),
        tpot_p99_speedup=_ratio(native.tpot_p99_ms, vllm.tpot_p99_ms),
        memory_efficiency_native_pct=None,
        memory_efficiency_vllm_pct=vllm.memory_efficiency_pct,
        notes=notes,
    )


def format_compare(result: CompareResult) -> str:
    """The comparison as a plain-text table."""

    def f(v: float | None, fmt: str = ".2f") -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = [f"{'metric':<58}{'native':>12}{'vLLM':>12}{'speedup':>10}"]
    for row in result.table():
        speedup = "" if row["speedup"] is None else f(row["speedup"]) + "x"
        lines.append(f"{row['metric']:<58}{f(row['native']):>12}{f(row['vllm']):>12}{speedup:>10}")
    lines.append(f"runs: native {result.native_run_id}, vllm {result.vllm_run_id}")
    lines.append(f"memory efficiency: {result.memory_efficiency_definition}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def run_offline_workload(
    engine: dict[str, Any],
    requests: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    progress: Callable[[str, float], None] | None = None,
) -> Any:
    """vLLM offline throughput (``LLM.generate``) on ``requests`` random prompts of ``input_len`` tokens.

    Prompts are built by :mod:`bench.workloads` exactly as for an online run with the same seed.
    """
    from bench.workloads import WorkloadSpec, build_requests
    from engines.base import SamplingParams
    from engines.models import resolve_model
    from engines.vllm import run_offline

    _, path = resolve_model(str(engine.get("model", "tiny-deepseek-v3")))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(engine.get("trust_remote_code", False)))
    spec = WorkloadSpec(source="random", input_len=input_len, output_len=output_len, seed=seed)
    reqs = build_requests(spec, requests, SamplingParams(max_tokens=output_len), tok)
    prompts = [list(r.prompt_token_ids or ()) for r in reqs]
    return run_offline(engine, prompts, output_len, seed=seed, progress=progress)


# --- CLI ----------------------------------------------------------------------------------


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``compare-engines`` (same names as ``run``)."""
    p.add_argument("--model", default="tiny-deepseek-v3")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mode", default="concurrency", choices=("latency", "concurrency"))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=RunConfig.model_fields["warmup"].default)
    p.add_argument("--base-url", help="use a running vLLM server instead of launching one")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE (cpu)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def cmd_compare_engines(args: argparse.Namespace, store: Store) -> int:
    config = RunConfig.build(
        engine={"kind": "native", "model": args.model, "accelerator": args.accelerator, "dtype": args.dtype},
        mode=args.mode,
        workload={"source": "random", "input_len": args.input_len, "output_len": args.output_len, "seed": args.seed},
        requests=args.requests,
        concurrency=args.concurrency,
        warmup=args.warmup,
        sample_interval_s=0.25,  # finer KV-cache sampling: short runs would miss their peak
    )
    vopts: dict[str, Any] = {"cpu_kvcache_space_gib": args.kv_cache_gib}
    if args.base_url:
        vopts["base_url"] = args.base_url

    def progress(msg: str, frac: float) -> None:
        print(f"[{frac * 100:5.1f}%] {msg}", file=sys.stderr, flush=True)

    result = compare_engines(config, store, vopts, progress=progress)
    print(json.dumps(result.as_dict(), indent=2) if args.json else format_compare(result))
    return 0 if not result.notes else 1


def add_offline_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``offline``."""
    p.add_argument("--model", default="tiny-deepseek-v3")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE (cpu)")
    p.add_argument("--json", action="store_true")


def cmd_offline(args: argparse.Namespace) -> int:
    engine = {
        "model": args.model,
        "accelerator": args.accelerator,
        "dtype": args.dtype,
        "cpu_kvcache_space_gib": args.kv_cache_gib,
    }
    res = run_offline_workload(engine, args.requests, args.input_len, args.output_len, args.seed)
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
    else:
        print(
            f"Throughput: {res.requests_per_s:.2f} requests/s, {res.total_tok_s:.2f} total tokens/s, "
            f"{res.output_tok_s:.2f} output tokens/s  ({res.requests} requests, {res.elapsed_s:.3f} s; "
            f"load {res.load_seconds:.1f} s; vLLM {res.vllm_version})"
        )
    return 0

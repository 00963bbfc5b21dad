"""Native vs vLLM on the same workload (the book's 8.2.4 table), and vLLM's offline throughput.

:func:`compare_engines` runs one :class:`~bench.config.RunConfig` twice through
:func:`bench.run.manager.start_run`, changing only the engine (``native`` first, then ``vllm``,
one after the other so they never compete for the machine), and returns both run ids with
the measured ratios (a ratio means something only between two runs of the same workload:
:func:`workload_key`, :func:`mismatch` and :func:`default_pair` say which stored runs are alike):

- ``throughput_speedup`` = vLLM output tok/s / native output tok/s (the book's 吞吐量 提升);
- ``p99_latency_speedup`` = native P99 E2E latency / vLLM P99 E2E latency (P99延迟 提升;
  above 1 means vLLM is faster). TTFT and TPOT P99 ratios are given too.
- memory efficiency (显存效率), see :func:`memory_efficiency`: for vLLM its KV-cache use
  (:data:`MEMORY_EFFICIENCY_DEFINITION`); for the native engine, which reserves no KV-cache
  pool, the share of the device memory in use that its tensors held at peak, from device
  telemetry (:data:`MEMORY_EFFICIENCY_TELEMETRY_DEFINITION`); ``None`` when neither was
  measured (a CPU run has no device telemetry).

Memory of one run, as the accelerator table (8.3.3) shows it: :func:`run_memory` (the
engine's own peak, and the peak device memory in use from telemetry,
:func:`peak_device_memory_gib`) and :func:`common_memory` (two runs' figures from one source).

:func:`run_offline_workload` runs vLLM's in-process ``LLM.generate`` on the same random
prompts as an online run (see :func:`engines.vllm.run_offline`). The CLI commands are in
:mod:`bench.cli.compare`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.config import RunConfig
from bench.metrics.summary import RunSummary
from bench.run.manager import start_run
from bench.run.recorder import SERIES_SERVER_DEVICE_MEM
from bench.store import Store
from bench.store.rows import RunRow
from bench.workloads import TOKENIZED_SOURCES, WorkloadSpec
from engines.errors import ConfigError, MoEBenchError
from engines.models import random_weights

KV_USAGE_SERIES = "server_kv_cache_usage_pct"

MEMORY_EFFICIENCY_DEFINITION = (
    "KV-cache utilisation at peak: the largest fraction of the KV cache the engine reserved "
    "that the run's requests actually held at one time, in percent. For vLLM it is the maximum "
    "of vllm:kv_cache_usage_perc (allocated KV blocks / blocks reserved at start-up) over the "
    "run, sampled about once a second. It depends on the workload (more, longer requests fill "
    "more of the pool). The native engine reserves no KV pool (transformers grows a cache per "
    "request), so it has no such figure; its memory efficiency comes from device telemetry instead "
    "(defined below), or is not measured: never an estimate."
)

MEMORY_EFFICIENCY_TELEMETRY_DEFINITION = (
    "Where the engine reports no KV-cache use (the native engine) but the run has device telemetry: the engine's "
    "peak tensor memory (the device allocator's peak, torch max_memory_allocated on CUDA, NPU or MLU) / the peak "
    "device memory in use (the highest one-second sample of dev*_mem_used_gib summed over the devices read: every "
    "process on them counts, the framework's cached blocks and context included) x 100, i.e. the share of the "
    "device memory in use that the engine's tensors held at peak. Telemetry is sampled about once a second, so a "
    "short spike between samples is missed. A CPU run has no device telemetry and no such figure: None."
)

# Which definition a measured memory efficiency used (shown beside the figure).
EFFICIENCY_KV_CACHE = "KV cache"
EFFICIENCY_DEVICE_TELEMETRY = "device telemetry"

# Where a run's memory figure comes from (shown beside it).
MEMORY_TORCH_PEAK = "torch peak"  # the native engine's device allocator (max_memory_allocated) on CUDA/NPU/MLU
MEMORY_PROCESS_RSS = "process RSS peak"  # the native engine on the CPU
MEMORY_SERVER_RSS = "server RSS peak"  # a server MoE Bench launched: its process tree's RSS (no device memory)
MEMORY_SERVER_DEVICE = "server device memory"  # a launched server's own device memory (telemetry seeing processes)
MEMORY_DEVICE_TELEMETRY = "device telemetry"  # peak device memory in use (NVML, npu-smi, cnmon, exporters)

# dev{i}_mem_used_gib, and h{host}_dev{i}_mem_used_gib from an exporter (engines.telemetry.series_points).
DEVICE_MEM_USED_SERIES = re.compile(r"^(?:h[a-z0-9_]+_)?dev\d+_mem_used_gib$")


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
    memory_efficiency_source: str | None = None  # EFFICIENCY_KV_CACHE | EFFICIENCY_DEVICE_TELEMETRY | None
    device_memory_gib: float | None = None  # peak device memory in use (telemetry), see peak_device_memory_gib


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
    memory_efficiency_native_source: str | None = None  # which definition measured it (EFFICIENCY_*)
    memory_efficiency_vllm_source: str | None = None
    memory_efficiency_telemetry_definition: str = MEMORY_EFFICIENCY_TELEMETRY_DEFINITION

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
                "metric": "memory efficiency (%, see the definitions)",
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


def device_memory_series_peak_gib(store: Store, run_id: int) -> float | None:
    """The highest device memory in use at one moment, from the run's telemetry series: at each
    sample time the ``dev*_mem_used_gib`` series (this host's and exporters') are summed over the
    devices, and the largest sum is returned (GiB); None when the run has no such series."""
    names = [n for n in store.series_names(run_id) if DEVICE_MEM_USED_SERIES.match(n)]
    per_t: dict[float, float] = {}
    for t, _, value in store.timeseries(run_id, names) if names else ():
        if value is not None:
            per_t[t] = per_t.get(t, 0.0) + value
    return max(per_t.values()) if per_t else None


def peak_device_memory_gib(store: Store, run: RunRow) -> float | None:
    """A run's peak device memory in use (GiB) from device telemetry: the series'
    (:func:`device_memory_series_peak_gib`), else the summary's ``device_mem_used_gib``; None
    when the run read no device telemetry (a CPU run, or no tool to read)."""
    peak = device_memory_series_peak_gib(store, run.id)
    if peak is None and run.summary is not None:
        peak = run.summary.device_mem_used_gib
    return peak


def engine_memory_source(run: RunRow) -> str:
    """What a run's ``summary.peak_memory_gib`` measured: the native engine's device allocator
    peak on an accelerator, its process's peak RSS on the CPU, or a launched server's RSS."""
    if run.engine == "native":
        return MEMORY_TORCH_PEAK if run.accelerator in ("cuda", "npu", "mlu") else MEMORY_PROCESS_RSS
    return MEMORY_SERVER_RSS


@dataclass(frozen=True)
class RunMemory:
    """One run's memory figures (GiB), each with where it comes from; None: not measured."""

    engine_peak_gib: float | None  # summary.peak_memory_gib
    engine_source: str  # MEMORY_TORCH_PEAK | MEMORY_PROCESS_RSS | MEMORY_SERVER_RSS
    device_peak_gib: float | None  # peak device memory in use, device telemetry

    @property
    def shown(self) -> tuple[float | None, str | None]:
        """The figure the accelerator table shows: the engine's own peak when it has one, else
        the device telemetry's; ``(None, None)`` when neither was measured."""
        if self.engine_peak_gib is not None:
            return self.engine_peak_gib, self.engine_source
        if self.device_peak_gib is not None:
            return self.device_peak_gib, MEMORY_DEVICE_TELEMETRY
        return None, None


def run_memory(store: Store, run: RunRow) -> RunMemory:
    """A run's memory: the engine's own peak and the peak device memory in use."""
    s = run.summary
    source = engine_memory_source(run)
    if source == MEMORY_SERVER_RSS and store.timeseries(run.id, [SERIES_SERVER_DEVICE_MEM]):
        source = MEMORY_SERVER_DEVICE  # the runner made the server's own device memory the run's peak
    return RunMemory(
        engine_peak_gib=s.peak_memory_gib if s is not None else None,
        engine_source=source,
        device_peak_gib=peak_device_memory_gib(store, run),
    )


def common_memory(base: RunMemory, other: RunMemory) -> tuple[float, float, str] | None:
    """Two runs' memory from one source both have, for a percentage of one by the other:
    ``(base GiB, other GiB, source)`` with the engines' own peaks when both measured the same
    kind (two torch peaks), else device telemetry when both have it; None when they share no
    source (a torch peak against a CPU process's RSS is no ratio)."""
    if base.engine_peak_gib is not None and other.engine_peak_gib is not None:
        if base.engine_source == other.engine_source:
            return base.engine_peak_gib, other.engine_peak_gib, base.engine_source
    if base.device_peak_gib is not None and other.device_peak_gib is not None:
        return base.device_peak_gib, other.device_peak_gib, MEMORY_DEVICE_TELEMETRY
    return None


def memory_efficiency(store: Store, run: RunRow, memory: RunMemory | None = None) -> tuple[float | None, str | None]:
    """A run's memory efficiency (%) and the definition that measured it: the engine's KV-cache
    use at peak (:data:`MEMORY_EFFICIENCY_DEFINITION`, :data:`EFFICIENCY_KV_CACHE`) when the engine
    reports one, else its peak tensor memory / the peak device memory in use
    (:data:`MEMORY_EFFICIENCY_TELEMETRY_DEFINITION`, :data:`EFFICIENCY_DEVICE_TELEMETRY`) when the
    run has both; ``(None, None)`` otherwise, never an estimate. ``memory``: the run's
    :func:`run_memory`, when the caller has it already."""
    if run.engine != "native":
        kv = peak_kv_usage_pct(store, run.id)
        if kv is not None:
            return kv, EFFICIENCY_KV_CACHE
    mem = memory if memory is not None else run_memory(store, run)
    # Only a device allocator's peak is tensor memory on the devices that telemetry reads.
    if mem.engine_source == MEMORY_TORCH_PEAK and mem.engine_peak_gib is not None and mem.device_peak_gib:
        return mem.engine_peak_gib / mem.device_peak_gib * 100.0, EFFICIENCY_DEVICE_TELEMETRY
    return None, None


def _params_text(run: RunRow) -> str:
    n = run.engine_info.get("parameters")
    if not isinstance(n, int | float) or n <= 0:
        return ""
    return f"{n / 1e9:.1f} B parameters" if n >= 1e8 else f"{n / 1e6:.1f} M parameters"


def gain_context(native: RunRow, vllm: RunRow, vllm_kv_pct: float | None = None) -> str:
    """Why a measured native-vs-vLLM gain can differ from the book's 8.2.4 table, in the words of the
    two runs' own conditions (model, its size, device, requests in flight, lengths). The book names no
    setting for its table; vLLM's gain comes from continuous batching, a paged KV cache and GPU kernels,
    and it shrinks with few requests in flight, a model whose compute is small next to each step's
    overhead, and a CPU, where both engines run the same arithmetic."""
    w = (vllm.config.get("workload") or {}) if isinstance(vllm.config, dict) else {}
    device = vllm.engine_info.get("device") or native.engine_info.get("device") or vllm.accelerator
    size = _params_text(native) or _params_text(vllm)
    model = f"{native.model}" + (f" ({size})" if size else "")
    parts = [
        f"These runs: {model}{', random weights' if random_weights(native.model) else ''}, on {device}, "
        f"{vllm.concurrency or 1} request(s) in flight, {w.get('input_len', '?')} tokens in and "
        f"{w.get('output_len', '?')} out.",
        "The book gives no setting for its 10x (model, GPU, load); vLLM's advantage over transformers comes from "
        "continuous batching, its paged KV cache and GPU kernels, so it grows with requests in flight, model size "
        "and a GPU, and shrinks",
    ]
    shrink = []
    if (vllm.concurrency or 1) < 16:
        shrink.append(f"with {vllm.concurrency or 1} in flight (little to batch)")
    if str(vllm.accelerator) == "cpu":
        shrink.append("on a CPU, where both engines run the same arithmetic")
    n = native.engine_info.get("parameters")
    if isinstance(n, int | float) and n < 1e9:
        shrink.append("with a model this small (each step is mostly overhead, not compute)")
    parts[-1] += (" here: " + "; ".join(shrink) + ".") if shrink else " in other settings."
    if vllm_kv_pct is not None and vllm_kv_pct < 5:
        parts.append(
            f"vLLM's memory efficiency ({vllm_kv_pct:.3g} %) is the largest share of its KV-cache pool these requests "
            "held at once: the pool is sized for far more tokens than this run needed, so it reads near 0 %."
        )
    return " ".join(parts)


def engine_figures(store: Store, run_id: int) -> EngineFigures:
    """One run's row from the store."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"no run with id {run_id}")
    s: RunSummary | None = run.summary
    memory = run_memory(store, run)
    mem_eff, mem_eff_source = memory_efficiency(store, run, memory)
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
        memory_efficiency_source=mem_eff_source,
        device_memory_gib=memory.device_peak_gib,
    )


# --- which runs are alike --------------------------------------------------------------------

_WORKLOAD_DEFAULTS: dict[str, Any] = {name: f.default for name, f in WorkloadSpec.model_fields.items()}
_RUN_DEFAULTS: dict[str, Any] = {
    name: RunConfig.model_fields[name].default for name in ("ignore_eos", "ramp_up_s", "burstiness", "concurrency")
}


def _length_fields(w: dict[str, Any], side: str) -> dict[str, Any]:
    """``{side}_len`` and, for a drawn length, the distribution that draws it."""
    dist = w.get(f"{side}_dist") or "fixed"
    out: dict[str, Any] = {f"{side}_len": w.get(f"{side}_len"), f"{side}_dist": dist}
    if dist != "fixed":
        out[f"{side}_min"] = w.get(f"{side}_min")
        out[f"{side}_max"] = w.get(f"{side}_max")
    if dist == "normal":
        out[f"{side}_std"] = w.get(f"{side}_std")
    return out


def workload_key(run: RunRow) -> dict[str, Any]:
    """What a run asked of the engine, as a dict: two runs are comparable when their keys are equal.

    Mode, prompt source and the lengths that source reads (input/output lengths and their
    distributions, the prompt file, shared-prefix and multi-turn shapes), whether outputs
    are exact (``ignore_eos``), the concurrency, the arrival rate (None: closed loop; with
    its burstiness when open) and the ramp-up. Not in it: the number of requests or the
    duration (how long the same load is held), the seed of random prompts (other tokens,
    same lengths) and the engine, model or accelerator (what is being compared). Fields a
    stored config lacks take :class:`~bench.config.RunConfig`'s defaults, so older runs
    still match newer ones.
    """
    c = run.config or {}
    w = {**_WORKLOAD_DEFAULTS, **(c.get("workload") or {})}
    mode = c.get("mode") or run.mode
    source = w["source"]
    key: dict[str, Any] = {"mode": mode, "source": source}
    if source in ("jsonl", "sharegpt"):
        key["path"] = w.get("path")
    if source in TOKENIZED_SOURCES:
        key.update(_length_fields(w, "input"))
    if source == "shared_prefix":
        key.update(prefix_len=w["prefix_len"], prefix_groups=w["prefix_groups"])
    if source == "multi_turn":
        key.update(sessions=w["sessions"], turns=w["turns"])
    if source == "sharegpt":
        key.update(sharegpt_output_len=w["sharegpt_output_len"], sharegpt_max_len=w["sharegpt_max_len"])
    if not (source == "sharegpt" and w["sharegpt_output_len"] == "dataset"):
        key.update(_length_fields(w, "output") if source in TOKENIZED_SOURCES else {"output_len": w["output_len"]})
    key["ignore_eos"] = c.get("ignore_eos", _RUN_DEFAULTS["ignore_eos"])
    concurrency = c.get("concurrency", run.concurrency)
    key["concurrency"] = 1 if mode == "latency" else (concurrency or _RUN_DEFAULTS["concurrency"])
    rate = c.get("request_rate") or None  # 0 was stored by older forms for a closed loop
    key["request_rate"] = rate
    if rate is not None:
        key["burstiness"] = c.get("burstiness", _RUN_DEFAULTS["burstiness"])
    key["ramp_up_s"] = c.get("ramp_up_s") or _RUN_DEFAULTS["ramp_up_s"]
    return key


def _show(field_name: str, value: Any) -> str:
    if value is None:
        return "closed loop" if field_name == "request_rate" else "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def mismatch(run_a: RunRow, run_b: RunRow) -> list[str]:
    """One phrase per workload field in which the two runs differ (``"concurrency: 1 vs 8"``); [] when alike.

    A field only one of the two has (``input_len`` of a random run against a ShareGPT one) is
    not listed on its own: the field that decides it (``source``) already is.
    """
    a, b = workload_key(run_a), workload_key(run_b)
    return [f"{k}: {_show(k, a[k])} vs {_show(k, b[k])}" for k in a if k in b and a[k] != b[k]]


def is_vllm(run: RunRow) -> bool:
    """A vLLM run (launched by us or at a server URL)."""
    return "vllm" in run.engine.lower()


def _frozen(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def default_pair(runs: Iterable[RunRow]) -> tuple[RunRow, RunRow] | None:
    """The most recent completed native run and vLLM run with equal :func:`workload_key`; None when no such pair.

    Pairs are ranked by their newer run, then their older one (ties by id), so the pair a
    "Run native vs vLLM" just made wins, and otherwise the latest vLLM run that has a native
    twin is shown beside the latest such twin.
    """
    latest: dict[str, dict[str, RunRow]] = {}
    for run in runs:
        if run.status != "completed":
            continue
        side = "native" if run.engine == "native" else "vllm" if is_vllm(run) else None
        if side is None:
            continue
        group = latest.setdefault(_frozen(workload_key(run)), {})
        held = group.get(side)
        if held is None or (run.created_at, run.id) > (held.created_at, held.id):
            group[side] = run
    best: tuple[RunRow, RunRow] | None = None
    best_rank: tuple[tuple[float, int], tuple[float, int]] | None = None
    for group in latest.values():
        if "native" not in group or "vllm" not in group:
            continue
        stamps = sorted(((r.created_at, r.id) for r in group.values()), reverse=True)
        rank = (stamps[0], stamps[1])
        if best_rank is None or rank > best_rank:
            best, best_rank = (group["native"], group["vllm"]), rank
    return best


def compare_engines(
    config: RunConfig,
    store: Store,
    vllm_engine: dict[str, Any] | None = None,
    *,
    progress: Callable[[str, float], None] | None = None,
    cancel: threading.Event | None = None,
    native_engine: dict[str, Any] | None = None,
    name: str | None = None,
) -> CompareResult:
    """Run ``config`` on ``native`` and on ``vllm`` (same workload, model, accelerator, dtype).

    ``native_engine`` adds native options (e.g. the fast CUDA path); ``name`` names the runs
    ``NAME-native`` and ``NAME-vllm``.

    ``vllm_engine`` adds vLLM options (e.g. ``{"base_url": ...}`` or ``{"cpu_kvcache_space_gib": 1}``).
    Blocks until both runs end; ``cancel`` stops the current run and skips the next.
    """
    base = dict(config.engine)
    common = {k: base[k] for k in ("model", "accelerator", "dtype", "trust_remote_code") if k in base}
    native_cfg = config.model_copy(update={"engine": {"kind": "native", **common, **(native_engine or {})}})
    vllm_cfg = config.model_copy(update={"engine": {"kind": "vllm", **common, **(vllm_engine or {})}})
    # Re-validate the engine dicts (model_copy does not run validators).
    native_cfg = RunConfig.build(
        **{**native_cfg.model_dump(), "name": f"{name}-native" if name else config.name or "compare: native"}
    )
    vllm_cfg = RunConfig.build(
        **{**vllm_cfg.model_dump(), "name": f"{name}-vllm" if name else config.name or "compare: vllm"}
    )
    report = progress or (lambda msg, frac: None)
    run_ids: list[int] = []
    for i, (label, cfg) in enumerate((("native", native_cfg), ("vllm", vllm_cfg))):
        if cancel is not None and cancel.is_set():
            raise MoEBenchError(f"comparison cancelled before the {label} run")
        report(f"run {i + 1} of 2, {'vLLM' if label == 'vllm' else 'native'}: starting", i / 2)
        job = start_run(cfg, store)
        while not job.wait(0.5).status not in ("pending", "loading", "running"):
            if cancel is not None and cancel.is_set():
                job.cancel()
            snap = job.snapshot()
            name = "vLLM" if label == "vllm" else "native"
            doing = (
                f"{snap.done}/{snap.total} requests"
                if snap.status == "running"
                else ("starting the server" if label == "vllm" else "loading the model")
            )
            report(f"run {i + 1} of 2, {name}: {doing}", (i + snap.fraction) / 2)
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
        memory_efficiency_native_pct=native.memory_efficiency_pct,
        memory_efficiency_vllm_pct=vllm.memory_efficiency_pct,
        notes=notes,
        memory_efficiency_native_source=native.memory_efficiency_source,
        memory_efficiency_vllm_source=vllm.memory_efficiency_source,
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
    sources = f"native: {result.memory_efficiency_native_source or 'not measured'}, "
    sources += f"vLLM: {result.memory_efficiency_vllm_source or 'not measured'}"
    lines.append(f"memory efficiency ({sources}): {result.memory_efficiency_definition}")
    lines.append(f"memory efficiency (device telemetry): {result.memory_efficiency_telemetry_definition}")
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

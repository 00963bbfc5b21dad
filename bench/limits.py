"""Physical limits: how fast a DeepSeek MoE model could decode on an accelerator, at best.

Two ceilings bound a decode step (a roofline):

* **memory**: every weight the step touches, and the KV cache it reads, must cross the
  memory bus once, so ``step time >= bytes per step / memory bandwidth``;
* **compute**: ``step time >= batch x FLOPs per token / peak FLOP/s``.

Measured TPOT divided into the limit (:func:`pct_of_limit`) says how much of the hardware
an engine uses: FACTS.md's eager transformers at 83 ms per step against a ~1 ms HBM limit
is about 1.3 %.

What is counted, from a DeepSeek-V2/V3 Hugging Face config (:class:`ModelShape`):

* **parameters**: MLA attention (q, or q_a + q_b with LoRA; kv_a with the rope key; kv_b;
  o; their norms), the first ``first_k_dense_replace`` dense MLPs, and per MoE layer the
  shared experts, the routed experts and the gate; the input embedding and ``lm_head``
  (once when tied). Buffers (e.g. ``e_score_correction_bias``) are not parameters.
* **active parameters per token**: everything except the routed experts, plus ``top_k``
  routed experts per MoE layer; ``lm_head`` in full (it is read every step) and one row of
  the input embedding (a lookup reads one row).
* **bytes per decode step at batch B**: the non-routed weights once, the routed experts
  *touched by the batch* (the expected number of distinct experts, :func:`expected_distinct_experts`),
  B embedding rows, all at ``dtype`` bytes; plus the MLA KV cache read at context length L:
  ``(kv_lora_rank + qk_rope_head_dim)`` values per token per layer, for each of the B sequences.
* **FLOPs per token**: ``2 x active parameters`` for the matmuls plus attention over L
  cached tokens in MLA's absorbed form (the form that reads only the compressed cache):
  per layer and head ``2 L (kv_lora_rank + qk_rope_head_dim)`` for the scores and
  ``2 L kv_lora_rank`` for the weighted sum.

Not counted: activations, norms' and softmax's FLOPs, communication between devices,
kernel launch gaps: these only make a real step slower, so the figures stay lower bounds
on time (upper bounds on tokens/s).

Accelerator figures (:data:`SPECS`) are data with their source, like :mod:`bench.reference`:
each figure says where it comes from and how sure it is. NVIDIA's are datasheet figures;
Huawei and Cambricon publish no per-chip datasheet we could find, so theirs come from
secondary sources and say so. ``cpu`` is not a spec: it is measured on this machine
(:func:`measure_cpu`, cached), and any figure can be replaced by a measured one
(:func:`get_spec` with ``bandwidth_gb_s=`` / ``peak_tflops=``).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

Confidence = Literal["high", "medium", "low", "unverified", "measured"]

DTYPE_BYTES: dict[str, float] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per value: bf16/fp16 2, fp32 4, fp8 1 (also accepts torch-style names)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype '{dtype}'; use one of bf16, fp16, fp32, fp8")
    return DTYPE_BYTES[key]


# ---------------------------------------------------------------------------------------
# Accelerator figures, with their sources
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One number and where it comes from.

    ``source`` names the document (URL or title) and what it states; ``confidence``:
    ``high`` a vendor datasheet, ``medium`` several secondary sources agree, ``low`` one
    secondary source or sources disagree, ``unverified`` no source found for the exact
    value, ``measured`` measured on this machine.
    """

    value: float
    unit: str
    source: str
    confidence: Confidence
    note: str = ""

    def __str__(self) -> str:
        return f"{self.value:g} {self.unit}"


@dataclass(frozen=True)
class AcceleratorSpec:
    """Memory size, memory bandwidth and dense 16-bit peak of one accelerator (one chip/die)."""

    key: str
    name: str
    accelerator: str  # this project's accelerator kind: cuda | npu | mlu | cpu
    memory_gb: Figure | None
    bandwidth_gb_s: Figure  # decimal GB/s (1e9 bytes/s)
    peak_tflops_16: Figure  # dense (not 2:4 sparse) BF16/FP16 matrix FLOP/s, in 1e12
    peak_tflops_8: Figure | None = None  # dense FP8, where the chip has it
    memory_type: str = ""
    note: str = ""

    def figures(self) -> dict[str, Figure]:
        """Every figure this entry gives, by field name."""
        out = {"bandwidth_gb_s": self.bandwidth_gb_s, "peak_tflops_16": self.peak_tflops_16}
        if self.memory_gb is not None:
            out["memory_gb"] = self.memory_gb
        if self.peak_tflops_8 is not None:
            out["peak_tflops_8"] = self.peak_tflops_8
        return out

    @property
    def confidence(self) -> Confidence:
        """The weakest confidence of the figures a roofline uses (bandwidth and peak)."""
        order: list[Confidence] = ["unverified", "low", "medium", "high", "measured"]
        return min((self.bandwidth_gb_s.confidence, self.peak_tflops_16.confidence), key=order.index)

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s for ``dtype``: the FP8 figure for fp8 where there is one, else the 16-bit one."""
        if dtype_bytes(dtype) == 1 and self.peak_tflops_8 is not None:
            return self.peak_tflops_8.value * 1e12
        return self.peak_tflops_16.value * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s.value * 1e9

    def with_measured(
        self, bandwidth_gb_s: float | None = None, peak_tflops: float | None = None, source: str = "measured"
    ) -> AcceleratorSpec:
        """A copy with measured figures in place of the spec's (e.g. a STREAM-like HBM read test)."""
        spec = self
        if bandwidth_gb_s is not None:
            _positive("bandwidth_gb_s", bandwidth_gb_s)
            spec = replace(spec, bandwidth_gb_s=Figure(bandwidth_gb_s, "GB/s", source, "measured"))
        if peak_tflops is not None:
            _positive("peak_tflops", peak_tflops)
            spec = replace(spec, peak_tflops_16=Figure(peak_tflops, "TFLOP/s", source, "measured"), peak_tflops_8=None)
        return spec


_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_HOPPER_DENSE = (
    "dense = half the datasheet's 'with sparsity' figure; the dense 989.4 TFLOPS BF16 for H100 SXM5 is in "
    "NVIDIA's H100 Tensor Core GPU Architecture whitepaper (GTC22), table of H100 SXM5 peak figures; "
    "H200 uses the same GH100 compute at the same clocks"
)
_ASCEND_MODEL_CONFIG = (
    "secondary: a public Ascend performance-model config (HWConf, DeviceType.ASCEND910B2/ASCEND910B3, seen "
    "through code search; its repository was not identified), consistent with 24 (910B2) / 20 (910B3) AI "
    "cores x 16x16x16 FP16 cube MACs x 2 FLOP x 1.8 GHz"
)
_ASCEND_OTHER = (
    "Huawei publishes no per-chip 910B datasheet that we found. Other secondary FP16 figures for '910B' "
    "(variant often unstated): 256 TFLOPS (https://jishuzhan.net/article/1872432607539499010), 280 TFLOPS "
    "(Gitee AI compute docs, https://ai.gitee.com/docs/compute/clusters_gpu/ascend_gpu), ~320 TFLOPS "
    "(several blogs), 313 (910B3) and 376 (910B2) in widely repeated tables; measured BF16 matmul 328 TFLOPS "
    "on a '910B' (limulidae benchmark README). Bandwidth figures seen: 1.6 TB/s (the model config), "
    "1.2 TB/s and lower in blogs."
)
_ASCEND_MEMORY = (
    "secondary: Gitee AI compute docs (https://ai.gitee.com/docs/compute/clusters_gpu/ascend_gpu) and the "
    "performance-model config: 64 GB HBM2e"
)

SPECS: dict[str, AcceleratorSpec] = {
    s.key: s
    for s in [
        AcceleratorSpec(
            key="h100-sxm",
            name="NVIDIA H100 SXM",
            accelerator="cuda",
            memory_gb=Figure(80, "GB", f"{_H100_DATASHEET}: GPU memory 80 GB (HBM3)", "high"),
            bandwidth_gb_s=Figure(3350, "GB/s", f"{_H100_DATASHEET}: GPU memory bandwidth 3.35 TB/s", "high"),
            peak_tflops_16=Figure(
                989.4,
                "TFLOP/s",
                f"{_H100_DATASHEET}: BF16 Tensor Core 1,979 TFLOPS with sparsity; {_HOPPER_DENSE}",
                "high",
            ),
            peak_tflops_8=Figure(
                1978.9,
                "TFLOP/s",
                f"{_H100_DATASHEET}: FP8 Tensor Core 3,958 TFLOPS with sparsity; dense is half",
                "high",
            ),
            memory_type="HBM3",
        ),
        AcceleratorSpec(
            key="h200",
            name="NVIDIA H200 (SXM)",
            accelerator="cuda",
            memory_gb=Figure(141, "GB", f"{_H200_DATASHEET}: GPU memory 141 GB (HBM3e)", "high"),
            bandwidth_gb_s=Figure(4800, "GB/s", f"{_H200_DATASHEET}: GPU memory bandwidth 4.8 TB/s", "high"),
            peak_tflops_16=Figure(
                989.4,
                "TFLOP/s",
                f"{_H200_DATASHEET}: BF16 Tensor Core 1,979 TFLOPS with sparsity; {_HOPPER_DENSE}",
                "high",
            ),
            peak_tflops_8=Figure(
                1978.9,
                "TFLOP/s",
                f"{_H200_DATASHEET}: FP8 Tensor Core 3,958 TFLOPS with sparsity; dense is half",
                "high",
            ),
            memory_type="HBM3e",
            note="the H200 this project measures on (FACTS.md)",
        ),
        AcceleratorSpec(
            key="ascend-910b3",
            name="Huawei Ascend 910B3",
            accelerator="npu",
            memory_gb=Figure(64, "GB", _ASCEND_MEMORY, "medium"),
            bandwidth_gb_s=Figure(1600, "GB/s", f"{_ASCEND_MODEL_CONFIG}: 1.6 TB/s HBM", "low", _ASCEND_OTHER),
            peak_tflops_16=Figure(
                294.9, "TFLOP/s", f"{_ASCEND_MODEL_CONFIG}: 294.9 TFLOPS FP16 cube", "low", _ASCEND_OTHER
            ),
            memory_type="HBM2e",
            note="variant 910B3 (20 AI cores); figures from secondary sources only",
        ),
        AcceleratorSpec(
            key="ascend-910b2",
            name="Huawei Ascend 910B2",
            accelerator="npu",
            memory_gb=Figure(64, "GB", _ASCEND_MEMORY, "medium"),
            bandwidth_gb_s=Figure(1600, "GB/s", f"{_ASCEND_MODEL_CONFIG}: 1.6 TB/s HBM", "low", _ASCEND_OTHER),
            peak_tflops_16=Figure(
                353.8, "TFLOP/s", f"{_ASCEND_MODEL_CONFIG}: 353.8 TFLOPS FP16 cube", "low", _ASCEND_OTHER
            ),
            memory_type="HBM2e",
            note="variant 910B2 (24 AI cores); figures from secondary sources only",
        ),
        AcceleratorSpec(
            key="mlu590",
            name="Cambricon MLU590",
            accelerator="mlu",
            memory_gb=Figure(
                80,
                "GB",
                "secondary: third-party chip listings name the part 'MLU590 80GB'; Cambricon publishes no MLU590 "
                "datasheet that we found",
                "low",
            ),
            bandwidth_gb_s=Figure(
                2700,
                "GB/s",
                "unverified: the figure given in issue 15's brief; no source found for it",
                "unverified",
                "secondary figures seen: ~2,048 GB/s (a third-party comparison table), 1,024 GB/s (a device "
                "profile); a public spec-card collection lists MLU590 bandwidth as not published",
            ),
            peak_tflops_16=Figure(
                314,
                "TFLOP/s",
                "unverified: the figure given in issue 15's brief; no source found for it",
                "unverified",
                "secondary figures seen disagree: ~128 TFLOPS FP16 (a device profile citing 'vendor-public "
                "approximate'), 512 TFLOPS (a news list); pass a measured figure where you have the chip",
            ),
            memory_type="HBM2e (reported)",
            note="no vendor-published figures; treat this roofline as indicative only",
        ),
    ]
}

# This project's accelerator kinds -> the spec a limit uses by default.
DEFAULT_SPEC_FOR: dict[str, str] = {"cuda": "h200", "npu": "ascend-910b3", "mlu": "mlu590", "cpu": "cpu"}


# ---------------------------------------------------------------------------------------
# The CPU, measured
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """Median, min and max of a few rounds."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class CpuMeasurement:
    """This machine's memory bandwidth and float32 matmul throughput, measured with numpy.

    ``copy_gb_s`` counts bytes read plus bytes written (STREAM's convention; write-allocate
    traffic is not counted); ``read_gb_s`` is a sum over the array (bytes read). Weights
    are read, so the roofline uses ``read_gb_s``'s median.
    """

    copy_gb_s: Stat
    read_gb_s: Stat
    matmul_gflops: Stat
    array_mib: int
    matmul_n: int
    rounds: int
    threads_note: str
    seconds: float

    def describe(self) -> str:
        return (
            f"CPU (measured, numpy, {self.rounds} rounds): read {self.read_gb_s.median:.1f} GB/s "
            f"(min {self.read_gb_s.min:.1f}, max {self.read_gb_s.max:.1f}), copy {self.copy_gb_s.median:.1f} GB/s, "
            f"float32 matmul {self.matmul_gflops.median:.0f} GFLOP/s (n={self.matmul_n})"
        )


def _bandwidth_rounds(array_mib: int, rounds: int) -> tuple[list[float], list[float]]:
    import numpy as np

    n = max(1, array_mib * 2**20 // 4)
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    float(src.sum())
    copy, read = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        copy.append(2 * src.nbytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        float(src.sum())
        read.append(src.nbytes / (time.perf_counter() - t) / 1e9)
    return copy, read


def _matmul_rounds(n: int, rounds: int) -> list[float]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS threads start
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        a @ b
        out.append(2 * n**3 / (time.perf_counter() - t) / 1e9)
    return out


def measure_cpu_uncached(rounds: int = 5, array_mib: int = 128, matmul_n: int = 1536) -> CpuMeasurement:
    """Measure now (about 1 s with the defaults): large-array copy and read, and a float32 matmul."""
    import os

    if rounds < 1 or array_mib < 1 or matmul_n < 16:
        raise ValueError("rounds >= 1, array_mib >= 1 and matmul_n >= 16 please")
    start = time.perf_counter()
    copy, read = _bandwidth_rounds(array_mib, rounds)
    gflops = _matmul_rounds(matmul_n, rounds)
    return CpuMeasurement(
        copy_gb_s=Stat.of(copy),
        read_gb_s=Stat.of(read),
        matmul_gflops=Stat.of(gflops),
        array_mib=array_mib,
        matmul_n=matmul_n,
        rounds=rounds,
        threads_note=f"{os.cpu_count()} logical CPUs; numpy's BLAS picks its own thread count",
        seconds=time.perf_counter() - start,
    )


_cpu_lock = threading.Lock()
_cpu_cached: CpuMeasurement | None = None


CPU_CACHE_FILE = "cpu_limits.json"  # in the data folder (MOEBENCH_DATA_DIR)
CPU_CACHE_MAX_AGE_S = 7 * 24 * 3600


def _cpu_fingerprint() -> str:
    """This host as the cache knows it: host name, logical CPUs and the CPU's model name."""
    import os
    import platform
    import socket

    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{socket.gethostname()}|{os.cpu_count()}|{model}"


def _cpu_cache_path() -> Path:
    from engines.settings import get_settings

    return get_settings().data_dir / CPU_CACHE_FILE


def _read_cpu_cache() -> CpuMeasurement | None:
    """The measurement saved for this host within :data:`CPU_CACHE_MAX_AGE_S`, else None."""
    try:
        saved = json.loads(_cpu_cache_path().read_text(encoding="utf-8"))
        if saved.get("host") != _cpu_fingerprint() or time.time() - float(saved["measured_at"]) > CPU_CACHE_MAX_AGE_S:
            return None
        m = dict(saved["measurement"])
        for k in ("copy_gb_s", "read_gb_s", "matmul_gflops"):
            m[k] = Stat(**m[k])
        return CpuMeasurement(**m)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cpu_cache(m: CpuMeasurement) -> None:
    path = _cpu_cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"host": _cpu_fingerprint(), "measured_at": time.time(), "measurement": asdict(m)}),
            encoding="utf-8",
        )
        tmp.replace(path)


def cpu_measured() -> CpuMeasurement | None:
    """This machine's CPU figures if already measured (in this process or kept in the data
    folder), without measuring: for callers that must not load the CPU (a page during a run)."""
    global _cpu_cached
    with _cpu_lock:
        if _cpu_cached is None:
            _cpu_cached = _read_cpu_cache()
        return _cpu_cached


def measure_cpu(refresh: bool = False) -> CpuMeasurement:
    """This machine's CPU figures: measured once (about 1 s) and kept for a week in the data
    folder (``cpu_limits.json``, for this host only), so runs do not each measure again.
    ``refresh=True`` measures now and replaces what was kept."""
    global _cpu_cached
    with _cpu_lock:
        if _cpu_cached is None or refresh:
            cached = None if refresh else _read_cpu_cache()
            if cached is None:
                cached = measure_cpu_uncached()
                _write_cpu_cache(cached)
            _cpu_cached = cached
        return _cpu_cached


def cpu_spec(
    measurement: CpuMeasurement | None = None, bandwidth_gb_s: float | None = None, peak_gflops: float | None = None
) -> AcceleratorSpec:
    """The ``cpu`` entry: figures passed in, else from ``measurement``, else measured now (cached)."""
    if bandwidth_gb_s is None or peak_gflops is None:
        measurement = measurement or measure_cpu()
    src = (
        f"measured on this machine by bench.limits.measure_cpu (numpy; {measurement.describe()})"
        if measurement is not None
        else ""
    )
    if bandwidth_gb_s is not None:
        _positive("bandwidth_gb_s", bandwidth_gb_s)
        bw = Figure(bandwidth_gb_s, "GB/s", "passed in by the caller", "measured")
    else:
        assert measurement is not None
        bw = Figure(measurement.read_gb_s.median, "GB/s", f"read median, {src}", "measured")
    if peak_gflops is not None:
        _positive("peak_gflops", peak_gflops)
        pk = Figure(peak_gflops / 1000, "TFLOP/s", "passed in by the caller", "measured")
    else:
        assert measurement is not None
        pk = Figure(measurement.matmul_gflops.median / 1000, "TFLOP/s", f"float32 matmul median, {src}", "measured")
    return AcceleratorSpec(
        key="cpu",
        name="this machine's CPU",
        accelerator="cpu",
        memory_gb=None,
        bandwidth_gb_s=bw,
        peak_tflops_16=pk,
        note="measured, not a spec; the peak is float32 matmul whatever the model's dtype",
    )


def get_spec(key: str, bandwidth_gb_s: float | None = None, peak_tflops: float | None = None) -> AcceleratorSpec:
    """A spec by key (``h200``, ``h100-sxm``, ``ascend-910b3``, ``ascend-910b2``, ``mlu590``, ``cpu``) or by
    accelerator kind (``cuda``, ``npu``, ``mlu``), with measured figures in place of the spec's when given."""
    key = DEFAULT_SPEC_FOR.get(key.strip().lower(), key.strip().lower())
    if key == "cpu":
        return cpu_spec(
            bandwidth_gb_s=bandwidth_gb_s, peak_gflops=peak_tflops * 1000 if peak_tflops is not None else None
        )
    if key not in SPECS:
        raise ValueError(f"unknown accelerator '{key}'; known: {', '.join([*SPECS, *DEFAULT_SPEC_FOR])}")
    return SPECS[key].with_measured(bandwidth_gb_s, peak_tflops)


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


# ---------------------------------------------------------------------------------------
# The model, from its config
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The fields of a DeepSeek-V2/V3 config that set its parameter count and KV cache."""

    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    intermediate_size: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    moe_layer_freq: int = 1
    tie_word_embeddings: bool = False
    name: str = "model"

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, name: str | None = None) -> ModelShape:
        """From a config dict (config.json's content), a transformers config object, or a path to
        a checkpoint folder or its config.json."""
        if isinstance(config, str | Path):
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            config = json.loads(path.read_text(encoding="utf-8"))
            name = name or path.parent.name
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        missing = [
            k
            for k in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "kv_lora_rank",
                      "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
            if get(k) is None
        ]  # fmt: skip
        if missing:
            raise ValueError(f"not a DeepSeek-V2/V3 (MLA) config: missing {', '.join(missing)}")
        n_routed = int(get("n_routed_experts") or 0)
        return cls(
            hidden_size=int(get("hidden_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            vocab_size=int(get("vocab_size")),
            intermediate_size=int(get("intermediate_size") or 0),
            num_attention_heads=int(get("num_attention_heads")),
            kv_lora_rank=int(get("kv_lora_rank")),
            qk_rope_head_dim=int(get("qk_rope_head_dim")),
            qk_nope_head_dim=int(get("qk_nope_head_dim")),
            v_head_dim=int(get("v_head_dim")),
            q_lora_rank=int(get("q_lora_rank")) if get("q_lora_rank") else None,
            n_routed_experts=n_routed,
            num_experts_per_tok=int(get("num_experts_per_tok") or 0) if n_routed else 0,
            n_shared_experts=int(get("n_shared_experts") or 0),
            moe_intermediate_size=int(get("moe_intermediate_size") or 0),
            first_k_dense_replace=int(get("first_k_dense_replace") or 0),
            moe_layer_freq=int(get("moe_layer_freq") or 1),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            name=name or str(get("name_or_path") or get("_name_or_path") or "model"),
        )

    def is_moe_layer(self, i: int) -> bool:
        """DeepSeek's rule: MoE from layer ``first_k_dense_replace`` on, every ``moe_layer_freq``-th layer."""
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @property
    def dense_layers(self) -> int:
        return self.num_hidden_layers - self.moe_layers

    @property
    def kv_values_per_token_layer(self) -> int:
        """MLA caches the compressed latent and the rope key: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts by part; ``total`` and ``active`` (per token) as defined in the module docstring."""

    attention_per_layer: int
    dense_mlp_per_layer: int
    expert: int  # one routed (or shared) expert: gate, up and down projections
    gate_per_moe_layer: int
    embedding: int
    lm_head: int  # 0 when tied to the embedding
    norms: int  # final norm + 2 per layer (the attention's q_a/kv_a norms are in attention_per_layer)
    total: int
    active: int
    always_read: int  # weights a decode step reads whatever the routing: active minus routed experts and embedding


def count_params(shape: ModelShape) -> ParamCount:
    """Total and per-token active parameters of a DeepSeek-V2/V3 shape."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    qk_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    if shape.q_lora_rank:
        q = h * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * heads * qk_head
    else:
        q = h * heads * qk_head
    kv_a = h * (shape.kv_lora_rank + shape.qk_rope_head_dim) + shape.kv_lora_rank
    kv_b = shape.kv_lora_rank * heads * (shape.qk_nope_head_dim + shape.v_head_dim)
    o = heads * shape.v_head_dim * h
    attention = q + kv_a + kv_b + o
    dense_mlp = 3 * h * shape.intermediate_size
    expert = 3 * h * shape.moe_intermediate_size
    gate = shape.n_routed_experts * h
    embedding = shape.vocab_size * h
    lm_head = 0 if shape.tie_word_embeddings else shape.vocab_size * h
    norms = h + 2 * h * shape.num_hidden_layers
    moe, dense = shape.moe_layers, shape.dense_layers
    shared = shape.n_shared_experts * expert + gate
    total = (
        attention * shape.num_hidden_layers
        + dense_mlp * dense
        + moe * (shared + shape.n_routed_experts * expert)
        + embedding
        + lm_head
        + norms
    )
    always_read = attention * shape.num_hidden_layers + dense_mlp * dense + moe * shared + norms + shape.vocab_size * h
    active = always_read + moe * shape.num_experts_per_tok * expert + h  # + one embedding row
    return ParamCount(attention, dense_mlp, expert, gate, embedding, lm_head, norms, total, active, always_read)


def expected_distinct_experts(n_routed: int, top_k: int, batch: int) -> float:
    """Expected number of distinct routed experts a batch of ``batch`` tokens touches in one MoE layer.

    Each token picks ``top_k`` *distinct* experts, taken as uniform: an expert escapes one
    token with probability ``1 - k/n``, so ``n (1 - (1 - k/n)^B)``. This is exactly ``k`` at
    B = 1 and tends to ``n``. (The with-replacement form ``n (1 - (1 - 1/n)^(B k))`` gives
    5.77 rather than 6 for 64 experts top-6 at B = 1; the two agree for large B.) Real
    routers are not uniform, so real batches touch somewhat fewer experts than this.
    """
    if n_routed <= 0 or top_k <= 0:
        return 0.0
    if top_k > n_routed:
        raise ValueError(f"top_k {top_k} > n_routed {n_routed}")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    return n_routed * (1.0 - (1.0 - top_k / n_routed) ** batch)


def kv_cache_bytes_per_seq(shape: ModelShape, context_len: int, kv_dtype: str = "bf16") -> float:
    """Bytes of MLA KV cache one sequence holds (and a decode step reads) at ``context_len`` tokens."""
    return context_len * shape.num_hidden_layers * shape.kv_values_per_token_layer * dtype_bytes(kv_dtype)


def bytes_per_step(
    shape: ModelShape, batch: int = 1, context_len: int = 0, dtype: str = "bf16", kv_dtype: str | None = None
) -> float:
    """Bytes one decode step at ``batch`` must read: weights touched (routed experts as the expected
    distinct count per MoE layer) plus each sequence's KV cache at ``context_len``."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    if context_len < 0:
        raise ValueError("context_len must be >= 0")
    p = count_params(shape)
    experts = expected_distinct_experts(shape.n_routed_experts, shape.num_experts_per_tok, batch)
    weights = p.always_read + shape.moe_layers * experts * p.expert + batch * shape.hidden_size
    return weights * dtype_bytes(dtype) + batch * kv_cache_bytes_per_seq(shape, context_len, kv_dtype or dtype)


def attention_flops_per_token(shape: ModelShape, context_len: int) -> float:
    """MLA attention over ``context_len`` cached tokens, absorbed form: scores over
    ``kv_lora_rank + qk_rope_head_dim`` and the weighted sum over ``kv_lora_rank``, per head and layer."""
    per_head = 2 * context_len * (shape.kv_values_per_token_layer + shape.kv_lora_rank)
    return float(per_head * shape.num_attention_heads * shape.num_hidden_layers)


def flops_per_token(shape: ModelShape, context_len: int = 0) -> float:
    """``2 x active parameters`` plus attention at ``context_len`` (see the module docstring)."""
    return 2.0 * count_params(shape).active + attention_flops_per_token(shape, context_len)


# ---------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RooflinePoint:
    """One batch size: the step's memory and compute times, the larger of them, and tokens/s."""

    batch: int
    memory_ms: float
    compute_ms: float
    step_ms: float
    tok_s: float
    bound: Literal["memory", "compute"]


def roofline(
    shape: ModelShape,
    spec: AcceleratorSpec,
    batch: int = 1,
    context_len: int = 0,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
) -> RooflinePoint:
    """Per-step time ``max(bytes/bandwidth, batch x FLOPs/peak)`` and the tokens/s it allows."""
    memory_s = bytes_per_step(shape, batch, context_len, dtype, kv_dtype) / spec.bandwidth_bytes_s
    compute_s = batch * flops_per_token(shape, context_len) / spec.peak_flops(dtype)
    step_s = max(memory_s, compute_s)
    return RooflinePoint(
        batch=batch,
        memory_ms=memory_s * 1e3,
        compute_ms=compute_s * 1e3,
        step_ms=step_s * 1e3,
        tok_s=batch / step_s,
        bound="memory" if memory_s >= compute_s else "compute",
    )


def min_tpot_ms(
    shape: ModelShape, spec: AcceleratorSpec, batch: int = 1, context_len: int = 0, dtype: str = "bf16"
) -> float:
    """The shortest possible time per output token (one decode step) at ``batch``, in ms."""
    return roofline(shape, spec, batch, context_len, dtype).step_ms


def compute_bound_tok_s(shape: ModelShape, spec: AcceleratorSpec, context_len: int = 0, dtype: str = "bf16") -> float:
    """The throughput ceiling at large batch, where compute binds: peak FLOP/s / FLOPs per token."""
    return spec.peak_flops(dtype) / flops_per_token(shape, context_len)


def pct_of_limit(measured_tpot_ms: float, limit_ms: float) -> float:
    """How much of the limit a measurement reaches, in %: ``limit / measured x 100`` (100 = at the limit)."""
    _positive("measured_tpot_ms", measured_tpot_ms)
    _positive("limit_ms", limit_ms)
    return limit_ms / measured_tpot_ms * 100.0


@dataclass(frozen=True)
class Limits:
    """A model's limits on one accelerator, in one dtype, at one context length."""

    model: str
    accelerator: str
    dtype: str
    context_len: int
    total_params: int
    active_params: int
    bytes_per_step: float  # batch 1
    flops_per_token: float
    min_tpot_ms: float  # batch 1
    compute_bound_tok_s: float
    spec: AcceleratorSpec = field(repr=False)
    shape: ModelShape = field(repr=False)

    def roofline(self, batch: int) -> RooflinePoint:
        return roofline(self.shape, self.spec, batch, self.context_len, self.dtype)

    def step_ms_at(self, batch: int) -> float:
        return self.roofline(batch).step_ms

    def max_tok_s_at(self, batch: int) -> float:
        """The most output tokens/s a batch of ``batch`` sequences could reach."""
        return self.roofline(batch).tok_s

    def pct(self, measured_tpot_ms: float, batch: int = 1) -> float:
        """A measured TPOT at ``batch`` as % of this limit."""
        return pct_of_limit(measured_tpot_ms, self.step_ms_at(batch))

    def describe(self) -> str:
        """One line: ``model on accelerator (dtype, context L): ... ms/step at batch 1 ...``."""
        conf = self.spec.confidence
        caveat = "" if conf in ("high", "measured") else f" [spec figures: {conf} confidence]"
        return (
            f"{self.model} on {self.spec.name} ({self.dtype}, context {self.context_len}): "
            f"{_count(self.active_params)} of {_count(self.total_params)} parameters active, "
            f"{_bytes(self.bytes_per_step)} per step at batch 1 -> at least {self.min_tpot_ms:.3g} ms/step "
            f"({1000 / self.min_tpot_ms:,.0f} tok/s) at {self.spec.bandwidth_gb_s.value:,.4g} GB/s; "
            f"compute ceiling {self.compute_bound_tok_s:,.0f} tok/s at "
            f"{self.spec.peak_flops(self.dtype) / 1e12:,.4g} TFLOP/s{caveat}"
        )


def _count(n: float) -> str:
    """Parameter counts as the presets write them: ``2.45 B``, ``1.54 M``."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.3g}"


def _bytes(n: float) -> str:
    """Decimal bytes: ``4.9 GB``, ``3.09 MB``."""
    for div, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.3g} B"


def limits(
    config: Mapping[str, Any] | Any,
    accelerator: str | AcceleratorSpec = "h200",
    dtype: str = "bf16",
    context_len: int = 0,
    bandwidth_gb_s: float | None = None,
    peak_tflops: float | None = None,
    name: str | None = None,
) -> Limits:
    """Limits of the model ``config`` (dict, transformers config, :class:`ModelShape` or checkpoint
    path) on ``accelerator`` (a spec key, kind, or :class:`AcceleratorSpec`); measured
    ``bandwidth_gb_s`` / ``peak_tflops`` replace the spec's figures when given."""
    shape = config if isinstance(config, ModelShape) else ModelShape.from_config(config, name=name)
    if name:
        shape = replace(shape, name=name)
    if isinstance(accelerator, AcceleratorSpec):
        spec = accelerator.with_measured(bandwidth_gb_s, peak_tflops)
    else:
        spec = get_spec(accelerator, bandwidth_gb_s, peak_tflops)
    dtype_bytes(dtype)  # validate early, with the readable error
    p = count_params(shape)
    return Limits(
        model=shape.name,
        accelerator=spec.key,
        dtype=dtype,
        context_len=context_len,
        total_params=p.total,
        active_params=p.active,
        bytes_per_step=bytes_per_step(shape, 1, context_len, dtype),
        flops_per_token=flops_per_token(shape, context_len),
        min_tpot_ms=min_tpot_ms(shape, spec, 1, context_len, dtype),
        compute_bound_tok_s=compute_bound_tok_s(shape, spec, context_len, dtype),
        spec=spec,
        shape=shape,
    )


def preset_config(preset: str) -> dict[str, Any]:
    """The config dict of a preset built from config in memory (``tiny-deepseek-v3``,
    ``random-v2-lite-shape``); other presets need their checkpoint's config.json."""
    from engines.models import PRESETS, TINY, TINY_CONFIG

    key = preset.strip().lower()
    if key == TINY:
        return dict(TINY_CONFIG)
    p = PRESETS.get(key)
    if p is not None and p.random_config is not None:
        return dict(p.random_config)
    raise ValueError(f"preset '{preset}' has no config in memory; pass its checkpoint folder or config.json instead")

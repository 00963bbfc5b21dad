"""The accelerator catalogue: memory bandwidth and peak FLOP/s of each chip, each figure with its source.

NVIDIA figures are datasheet figures; Huawei and Cambricon publish no per-chip datasheet we could
find, so theirs come from secondary sources and say so (:class:`Figure` carries the confidence).
The CPU is not in the catalogue: it is measured (:mod:`bench.metrics.cpu_limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

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
    # The chip's link to its peers, both directions summed as the datasheets give it (NVLink, or
    # PCIe where the GPUs have no NVLink between them): what an expert all-to-all can reach at most.
    link_gb_s: Figure | None = None
    memory_type: str = ""
    note: str = ""

    def figures(self) -> dict[str, Figure]:
        """Every figure this entry gives, by field name."""
        out = {"bandwidth_gb_s": self.bandwidth_gb_s, "peak_tflops_16": self.peak_tflops_16}
        if self.memory_gb is not None:
            out["memory_gb"] = self.memory_gb
        if self.peak_tflops_8 is not None:
            out["peak_tflops_8"] = self.peak_tflops_8
        if self.link_gb_s is not None:
            out["link_gb_s"] = self.link_gb_s
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
            require_positive("bandwidth_gb_s", bandwidth_gb_s)
            spec = replace(spec, bandwidth_gb_s=Figure(bandwidth_gb_s, "GB/s", source, "measured"))
        if peak_tflops is not None:
            require_positive("peak_tflops", peak_tflops)
            spec = replace(spec, peak_tflops_16=Figure(peak_tflops, "TFLOP/s", source, "measured"), peak_tflops_8=None)
        return spec


_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H100_PCIE_DATASHEET = "NVIDIA H100 PCIe datasheet (H100 Tensor Core GPU, PCIe form factor column)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_HOPPER_DENSE = (
    "dense = half the datasheet's 'with sparsity' figure; the dense 989.4 TFLOPS BF16 for H100 SXM5 is in "
    "NVIDIA's H100 Tensor Core GPU Architecture whitepaper (GTC22), table of H100 SXM5 peak figures; "
    "H200 uses the same GH100 compute at the same clocks"
)
_ASCEND_A2_WHITEPAPER = (
    "Huawei Atlas 800T A2 training server technical white paper (https://e.huawei.com/cn/documents/products/"
    "computing/b0b253c4d5da4e05ba80a39e3dc65fd2): per NPU 313 or 376 TFLOPS FP16, by option; Huawei's "
    "msmodeling device list names the A2 part ATLAS_800_A2_376T_64G (376 TFLOPS BF16, 64 GB)"
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
            link_gb_s=Figure(
                900, "GB/s", f"{_H100_DATASHEET}: Interconnect NVLink 900 GB/s, PCIe Gen5 128 GB/s", "high"
            ),
            memory_type="HBM3",
        ),
        AcceleratorSpec(
            key="h100-pcie",
            name="NVIDIA H100 PCIe",
            accelerator="cuda",
            memory_gb=Figure(80, "GB", f"{_H100_PCIE_DATASHEET}: GPU memory 80 GB (HBM2e)", "high"),
            bandwidth_gb_s=Figure(2000, "GB/s", f"{_H100_PCIE_DATASHEET}: GPU memory bandwidth 2 TB/s", "high"),
            peak_tflops_16=Figure(
                756.5,
                "TFLOP/s",
                f"{_H100_PCIE_DATASHEET}: BF16 Tensor Core 1,513 TFLOPS with sparsity; dense is half",
                "high",
            ),
            peak_tflops_8=Figure(
                1513,
                "TFLOP/s",
                f"{_H100_PCIE_DATASHEET}: FP8 Tensor Core 3,026 TFLOPS with sparsity; dense is half",
                "high",
            ),
            link_gb_s=Figure(
                128,
                "GB/s",
                f"{_H100_PCIE_DATASHEET}: Interconnect PCIe Gen5 128 GB/s (NVLink 600 GB/s only with the 2- or "
                "4-way bridge)",
                "high",
            ),
            memory_type="HBM2e",
        ),
        AcceleratorSpec(
            key="h100-nvl",
            name="NVIDIA H100 NVL",
            accelerator="cuda",
            memory_gb=Figure(94, "GB", f"{_H100_DATASHEET}: H100 NVL GPU memory 94 GB", "high"),
            bandwidth_gb_s=Figure(3900, "GB/s", f"{_H100_DATASHEET}: H100 NVL GPU memory bandwidth 3.9 TB/s", "high"),
            peak_tflops_16=Figure(
                835.5,
                "TFLOP/s",
                f"{_H100_DATASHEET}: H100 NVL BF16 Tensor Core 1,671 TFLOPS with sparsity; dense is half",
                "high",
            ),
            peak_tflops_8=Figure(
                1670.5,
                "TFLOP/s",
                f"{_H100_DATASHEET}: H100 NVL FP8 Tensor Core 3,341 TFLOPS with sparsity; dense is half",
                "high",
            ),
            link_gb_s=Figure(
                600, "GB/s", f"{_H100_DATASHEET}: H100 NVL interconnect NVLink 600 GB/s, PCIe Gen5 128 GB/s", "high"
            ),
            memory_type="HBM3",
        ),
        AcceleratorSpec(
            key="h200-nvl",
            name="NVIDIA H200 NVL",
            accelerator="cuda",
            memory_gb=Figure(141, "GB", f"{_H200_DATASHEET}: H200 NVL GPU memory 141 GB", "high"),
            bandwidth_gb_s=Figure(4800, "GB/s", f"{_H200_DATASHEET}: H200 NVL GPU memory bandwidth 4.8 TB/s", "high"),
            peak_tflops_16=Figure(
                835.5,
                "TFLOP/s",
                f"{_H200_DATASHEET}: H200 NVL BF16 Tensor Core 1,671 TFLOPS with sparsity; dense is half",
                "high",
            ),
            peak_tflops_8=Figure(
                1670.5,
                "TFLOP/s",
                f"{_H200_DATASHEET}: H200 NVL FP8 Tensor Core 3,341 TFLOPS with sparsity; dense is half",
                "high",
            ),
            link_gb_s=Figure(
                900,
                "GB/s",
                f"{_H200_DATASHEET}: H200 NVL interconnect 2- or 4-way NVIDIA NVLink bridge 900 GB/s per GPU, "
                "PCIe Gen5 128 GB/s",
                "high",
            ),
            memory_type="HBM3e",
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
            link_gb_s=Figure(
                900, "GB/s", f"{_H200_DATASHEET}: Interconnect NVIDIA NVLink 900 GB/s, PCIe Gen5 128 GB/s", "high"
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
                313,
                "TFLOP/s",
                f"{_ASCEND_A2_WHITEPAPER}; 313 is the lower option, the 910B3 (20 AI cores x 4,096 FP16 MACs x "
                "2 FLOP at about 1.9 GHz)",
                "medium",
                f"{_ASCEND_MODEL_CONFIG} gave 294.9 (1.8 GHz), which a measured 328 TFLOPS BF16 matmul on a 910B "
                f"(limulidae benchmark README) rules out as a peak. {_ASCEND_OTHER}",
            ),
            memory_type="HBM2e",
            note="variant 910B3 (20 AI cores); peak from Huawei's Atlas 800T A2 white paper, the rest secondary",
        ),
        AcceleratorSpec(
            key="ascend-910b2",
            name="Huawei Ascend 910B2",
            accelerator="npu",
            memory_gb=Figure(64, "GB", _ASCEND_MEMORY, "medium"),
            bandwidth_gb_s=Figure(1600, "GB/s", f"{_ASCEND_MODEL_CONFIG}: 1.6 TB/s HBM", "low", _ASCEND_OTHER),
            peak_tflops_16=Figure(
                376,
                "TFLOP/s",
                f"{_ASCEND_A2_WHITEPAPER}; 376 is the higher option, the 910B2 (24 AI cores, about 1.9 GHz)",
                "medium",
                f"{_ASCEND_MODEL_CONFIG} gave 353.8 (1.8 GHz). {_ASCEND_OTHER}",
            ),
            memory_type="HBM2e",
            note="variant 910B2 (24 AI cores); peak from Huawei's Atlas 800T A2 white paper, the rest secondary",
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


def require_positive(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a finite number above zero."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")

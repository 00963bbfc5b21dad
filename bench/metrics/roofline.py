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

Accelerator figures (:data:`SPECS`) are data with their source, like :mod:`bench.analysis.reference`:
each figure says where it comes from and how sure it is. NVIDIA's are datasheet figures;
Huawei and Cambricon publish no per-chip datasheet we could find, so theirs come from
secondary sources and say so. ``cpu`` is not a spec: it is measured on this machine
(:func:`measure_cpu`, cached), and any figure can be replaced by a measured one
(:func:`get_spec` with ``bandwidth_gb_s=`` / ``peak_tflops=``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from bench.metrics.accelerator_specs import DEFAULT_SPEC_FOR, SPECS, AcceleratorSpec, dtype_bytes, require_positive
from bench.metrics.cpu_limits import cpu_spec
from bench.metrics.model_shape import ModelShape, bytes_per_step, count_params, flops_per_token


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
    require_positive("measured_tpot_ms", measured_tpot_ms)
    require_positive("limit_ms", limit_ms)
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

"""A DeepSeek-V2/V3 config as numbers: parameter counts, active parameters, KV cache bytes,
bytes and FLOPs per decode step (what :mod:`bench.metrics.roofline` divides by an accelerator spec)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.metrics.accelerator_specs import dtype_bytes

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

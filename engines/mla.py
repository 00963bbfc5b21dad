"""Absorbed multi-head latent attention for the decode step (the native engine's ``mla=absorbed``).

transformers' DeepSeek-V3 attention caches the compressed latent (``kv_lora_rank`` values after
``kv_a_layernorm``, plus the rotary key part) and, every step, expands the whole cache back into
per-head keys and values through ``kv_b_proj`` and concatenates the rotary part onto each head's
key: B x L tokens through a matmul and a copy per layer per step. On the H200 at batch 128 that
was ~10 ms of a 23 ms step (``examples/tuning/h200-profile-summary.json``).

Absorbed, the same function is computed without expanding the cache (DeepSeek-V2 paper, 2.1.2;
what vLLM and SGLang do): ``kv_b_proj``'s weight splits per head into W_UK [d_nope x r] and
W_UV [d_v x r]; the query's non-rotary part is moved into the latent space once
(``q_lat = q_nope W_UK``), scores are ``q_lat . c + q_rope . k_rope`` over the cached latents
``c``, the weighted sum of the latents ``o_lat = softmax(scores) c`` is moved out per head
(``o = o_lat W_UV^T``) and ``o_proj`` follows. Only the single-token decode step is absorbed; a
prompt (more than one token) runs transformers' own forward, which writes the same cache.

Numerics: the same sums in another order; in float32 the logits agree with transformers' to
~1e-5 (tests/engines/test_mla.py). The two parts of the scores are matmuls in the model dtype,
summed, scaled and soft-maxed in float32.

Refused (one line, :func:`unsupported`) for attention that is not transformers' DeepSeek-V3 class
(``trust_remote_code``'s caches expanded keys), a ``kv_b_proj`` that is not a plain float
``Linear`` (quantised weights), and a forward already wrapped on the module (offloading hooks).
"""

from __future__ import annotations

import sys
from typing import Any

from engines import forward_patch

_PATCHED = "_moebench_absorbed_mla"


def _attention_modules(model: Any) -> list[Any]:
    return [m for m in model.modules() if type(m).__name__ == "DeepseekV3Attention"]


def unsupported(model: Any) -> str | None:
    """Why this model's attention cannot be absorbed here (one line), or None."""
    import torch

    mods = _attention_modules(model)
    if not mods:
        return f"mla=absorbed is written for DeepSeek-V3 attention (MLA); this model is {type(model).__name__}"
    m = mods[0]
    if not type(m).__module__.startswith("transformers.models.deepseek_v3."):
        # e.g. trust_remote_code's own class: another forward signature, and it caches expanded keys
        return f"mla=absorbed needs transformers' DeepseekV3Attention, not {type(m).__module__}'s"
    for attr in ("kv_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "o_proj", "kv_lora_rank", "qk_nope_head_dim"):
        if not hasattr(m, attr):
            return f"mla=absorbed: this transformers' DeepseekV3Attention has no {attr}"
    if type(m.kv_b_proj) is not torch.nn.Linear or m.kv_b_proj.weight.dtype not in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ):
        return (
            f"mla=absorbed needs kv_b_proj as a plain float Linear (it reads the weight per head), not "
            f"{type(m.kv_b_proj).__name__} of {m.kv_b_proj.weight.dtype}"
        )
    if m.kv_b_proj.bias is not None:
        return "mla=absorbed: kv_b_proj has a bias, which absorption does not carry"
    if forward_patch.wrapped_by_others(m, _PATCHED):
        return "mla=absorbed: the attention's forward is wrapped (e.g. accelerate's offloading hooks); it would skip it"
    return None


def set_absorbed(model: Any, on: bool) -> int:
    """Turn the absorbed decode step on or off on every MLA module; how many were changed."""
    return forward_patch.set_forward(_attention_modules(model), _absorbed_forward, _PATCHED, on)


def is_absorbed(model: Any) -> bool:
    return forward_patch.is_set(_attention_modules(model), _PATCHED)


def _absorbed_forward(
    self: Any,
    hidden_states: Any,
    position_embeddings: Any,
    attention_mask: Any,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    import torch

    batch, seq = hidden_states.shape[:-1]
    if seq != 1 or past_key_values is None:
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    heads, d_nope, d_rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
    rank, d_v = self.kv_lora_rank, self.v_head_dim
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(batch, 1, heads, d_nope + d_rope).transpose(1, 2)  # [B, H, 1, d]
    q_nope, q_rope = torch.split(q, [d_nope, d_rope], dim=-1)
    kv_nope, k_rope = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, d_rope], dim=-1)
    kv_nope = self.kv_a_layernorm(kv_nope).view(batch, 1, 1, rank)
    k_rope = k_rope.view(batch, 1, 1, d_rope)
    cos, sin = position_embeddings
    rope = sys.modules[type(self).__module__]
    if getattr(self.config, "rope_interleave", False):
        q_rope, k_rope = rope.apply_rotary_pos_emb_interleave(q_rope, k_rope, cos, sin)
    else:
        q_rope, k_rope = rope.apply_rotary_pos_emb(q_rope, k_rope, cos, sin)
    latents, rope_keys = past_key_values.update(kv_nope, k_rope, self.layer_idx)  # [B, 1, L, r], [B, 1, L, d_rope]
    length = latents.shape[2]
    latents, rope_keys = latents[:, 0], rope_keys[:, 0]  # [B, L, r], [B, L, d_rope]
    w = self.kv_b_proj.weight.view(heads, d_nope + d_v, rank)
    w_uk, w_uv = w[:, :d_nope, :], w[:, d_nope:, :]  # [H, d_nope, r], [H, d_v, r]
    # the query's non-rotary part into the latent space, per head: [H, B, d_nope] @ [H, d_nope, r]
    q_lat = torch.bmm(q_nope[:, :, 0].transpose(0, 1), w_uk).transpose(0, 1)  # [B, H, r]
    # [B, H, L]: the heads share one latent cache (MQA-like); the two parts summed in float32
    scores = torch.bmm(q_lat, latents.transpose(1, 2)).float()
    scores = (scores + torch.bmm(q_rope[:, :, 0], rope_keys.transpose(1, 2)).float()) * self.scaling
    if attention_mask is not None:
        mask = attention_mask
        if mask.dim() == 4:  # [B, 1, 1, >=L]: this step's row of the mask over the cache
            mask = mask[:, 0, -1:, :length]  # [B, 1, L]
        else:  # [B, width] (1 = attend; FlashAttention's, as wide as the tokens so far, not the static cache)
            mask = mask[:, :length].bool()
            if mask.shape[-1] < length:  # the cache's unwritten slots: never attended
                mask = torch.nn.functional.pad(mask, (0, length - mask.shape[-1]), value=False)
            mask = mask[:, None, :]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        else:  # an additive mask (eager attention's)
            scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(latents.dtype)
    out_lat = torch.bmm(probs, latents)  # [B, H, r]
    out = torch.bmm(out_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [B, H, d_v]
    return self.o_proj(out.reshape(batch, 1, heads * d_v)), None

"""A leaner MoE gate for the decode step (the native engine's ``router=lean``).

transformers' DeepSeek-V3 gate (``DeepseekV3TopkRouter``) always runs the group-limited stage of
DeepSeek-V3's routing: each expert group's score is the sum of its best two experts (a
``topk(2)`` per group), the best ``topk_group`` groups are picked (a second ``topk``), and the
experts of the other groups are masked out before the final ``topk`` over the experts. Where
``topk_group >= n_group`` every group is picked and the mask keeps every expert: the stage
changes nothing, yet it costs two ``topk`` kernels and a few small ones per layer. The
V2-Lite shape (``random-v2-lite-shape``: one group of 64 experts) is such a model: profiled on
the H100, compiled and captured at batch 1 (``examples/tuning/h100-step-mla-profile-summary.json``),
the gate's 78 ``topk`` kernels per step took 0.33 ms of the 4.5 ms of GPU time, at about
4 us each whatever their size.

This forward skips the stage where it selects every group, and is the class's own forward
otherwise (never for such a model: :func:`unsupported` refuses it). The expert choice and the
weights are the same tensors computed by the same kernels (masking with an all-false mask
copies the scores unchanged), so routing, tokens and logits are bit-identical to
transformers' (``tests/engines/test_router.py``).
"""

from __future__ import annotations

from typing import Any

from engines import forward_patch

_PATCHED = "_moebench_lean_router"


def _gates(model: Any) -> list[Any]:
    return [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]


def unsupported(model: Any) -> str | None:
    """Why ``router=lean`` has nothing to do on this model (one line), or None."""
    gates = _gates(model)
    if not gates:
        name = type(model).__name__
        return f"router=lean is written for DeepSeek-V3's gate (DeepseekV3TopkRouter); this model is {name}"
    g = gates[0]
    for attr in ("num_group", "topk_group", "top_k", "e_score_correction_bias", "norm_topk_prob"):
        if not hasattr(g, attr):
            return f"router=lean: this transformers' DeepseekV3TopkRouter has no {attr}"
    if g.topk_group < g.num_group:
        return (
            f"router=lean: this model's gate keeps {g.topk_group} of {g.num_group} expert groups, a stage lean "
            "would run as transformers does (it skips it only where every group is kept, e.g. n_group=1): "
            "nothing to save"
        )
    if g.topk_group != g.num_group or g.num_experts // g.num_group < 2:
        return (  # transformers' own gate fails there (its top-k over groups or top-2 per group): nothing to match
            f"router=lean: topk_group={g.topk_group} with n_group={g.num_group} over {g.num_experts} experts is not "
            "a gate transformers runs"
        )
    if forward_patch.wrapped_by_others(g, _PATCHED):
        return "router=lean: the gate's forward is wrapped (e.g. accelerate's offloading hooks); it would skip it"
    return None


def set_lean(model: Any, on: bool) -> int:
    """Turn the lean gate on or off on every DeepSeek-V3 gate; how many were changed."""
    return forward_patch.set_forward(_gates(model), _lean_forward, _PATCHED, on)


def is_lean(model: Any) -> bool:
    return forward_patch.is_set(_gates(model), _PATCHED)


def _lean_forward(self: Any, hidden_states: Any) -> tuple[Any, Any, Any]:
    """transformers' gate without its group stage where that stage keeps every group: the same
    (router logits, top-k weights, top-k expert ids), by the same kernels."""
    import torch
    import torch.nn.functional as F

    if self.topk_group != self.num_group:  # unsupported() refuses such a model; never taken there
        return type(self).forward(self, hidden_states)
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices

"""MoE Bench's own grouped-GEMM routed experts (the native engine's ``experts_impl=lean_grouped_mm``).

transformers' ``grouped_mm`` experts sort the (token, expert) pairs by expert, gather the hidden
states, run two grouped GEMMs and scatter back. Around them, transformers 5.17 masks every pair's
rows for expert parallelism (three ``masked_fill`` over [pairs x width] per layer, even on one
GPU; 5.19 masks only under expert parallelism) and weights the down projection's output
[pairs x hidden] in float32 before summing. Profiled on the H100
(``examples/tuning/h100-prefill-profile.json``), a batch of 128 128-token prompts spent 66 ms
of its 336 ms prefill in the grouped GEMMs and about 120 ms in that bookkeeping.

This forward computes the same function with less memory traffic:

- no masking (one GPU: no sentinel experts to mask);
- the routing weight multiplies the gated intermediate [pairs x intermediate] in the model dtype,
  before the down projection (a linear map, so the same product), instead of the wider
  [pairs x hidden] output in float32;
- the pairs go back to token order with one gather and are summed over the top-k (``sum``
  accumulates in float32).

Numerics: the same sums in another order, the routing weight rounded to the model dtype first;
in float32 the output agrees with transformers' ``grouped_mm`` to rounding
(``tests/engines/test_experts.py``). Everything stays on the device (sort, histc, cumsum): the
step can be captured in a CUDA graph as transformers' ``grouped_mm`` can.

Layouts other than transformers' default (a bias, no gate, interleaved or expert-parallel
weights, or any run under torch.distributed) fall back to transformers' own ``grouped_mm`` forward.
"""

from __future__ import annotations

import functools
from typing import Any

NAME = "lean_grouped_mm"


@functools.cache
def _dispatch() -> Any:
    """The grouped GEMM to call, resolved once (the forward runs it twice per layer per step):
    transformers' dispatcher (torch's kernel, or its fallback where torch has none), else torch's."""
    import torch

    try:
        from transformers.integrations.moe import _grouped_mm as dispatch
    except ImportError:
        dispatch = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    return dispatch


def _grouped_mm(x: Any, w: Any, offs: Any) -> Any:
    """x [S, k] @ per-group w [E, k, n] -> [S, n], rows split by the cumulative ``offs``."""
    return _dispatch()(x, w, offs=offs)


def _distributed() -> bool:
    """Under torch.distributed the experts may be split across ranks (expert parallelism marks a
    rank's foreign experts with sentinel ids; transformers 5.17 has no flag for it): not ours."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except ImportError:
        return False


def _simple(module: Any) -> bool:
    """transformers' default experts layout: concatenated [gate; up], no bias, one process."""
    return (
        getattr(module, "has_gate", True)
        and not getattr(module, "has_bias", False)
        and getattr(module, "is_concatenated", True)
        and not getattr(module, "_is_expert_parallel", False)
        and hasattr(module, "gate_up_proj")
        and hasattr(module, "down_proj")
        and not _distributed()
    )


def lean_forward(module: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The routed experts' output [tokens, hidden] for ``hidden_states`` [tokens, hidden] and each
    token's top-k experts and weights [tokens, k]."""
    import torch

    if not _simple(module):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    experts = int(module.num_experts)
    expert_ids, perm = torch.sort(top_k_index.reshape(-1))
    x = hidden_states.index_select(0, perm // k)  # each pair's token, grouped by expert
    # histc, not bincount: no host sync, so a CUDA graph can hold it (CPU histc wants floats)
    counted = expert_ids.float() if expert_ids.device.type in ("cpu", "mps") else expert_ids.int()
    offs = torch.cumsum(torch.histc(counted, bins=experts, min=0, max=experts - 1), 0, dtype=torch.int32)
    transposed = getattr(module, "is_transposed", False)
    up = module.gate_up_proj if transposed else module.gate_up_proj.transpose(-2, -1)
    h = _grouped_mm(x, up, offs)
    if hasattr(module, "_apply_gate"):
        h = module._apply_gate(h)
    else:
        gate, lin = h.chunk(2, dim=-1)
        h = module.act_fn(gate) * lin
    h = h * top_k_weights.reshape(-1)[perm].to(h.dtype).unsqueeze(-1)  # the routing weight, on the narrow side
    down = module.down_proj if transposed else module.down_proj.transpose(-2, -1)
    y = _grouped_mm(h, down, offs)
    back = torch.empty_like(perm)
    back[perm] = torch.arange(perm.numel(), device=perm.device)
    return y.index_select(0, back).view(tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> str | None:
    """Make ``lean_grouped_mm`` a transformers experts implementation; None, or why it cannot be (one line)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as exc:
        return f"experts_impl={NAME}: this transformers has no experts interface to register it with ({exc})"
    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, lean_forward)
    return None

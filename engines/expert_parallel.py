"""Expert parallelism for the native engine's DeepSeek MoE layers: each rank holds 1/N of the routed
experts, tokens go to the rank of their expert and come back by all-to-all (torch.distributed:
NCCL on GPUs, gloo on CPU).

Layout (expert parallel + data parallel, as vLLM's and SGLang's wide-EP deployments): every rank
holds the dense weights (attention, dense MLPs, shared experts, the router, the head) and the
experts ``[r*E/N, (r+1)*E/N)`` of each MoE layer; rank ``r`` runs its own rows of the batch. In
each MoE layer the router runs on the rank's own tokens; the (token, expert) pairs, sorted by
expert (so by owner), go to the owners with ``all_to_all_single`` (the counts first, then the
hidden rows); each owner runs its experts on what it received; a second ``all_to_all_single``
returns the outputs, which the sender weighs by its routing weights and sums over top-k (the
weights never travel), then adds the shared experts.

Why our own dispatch, not transformers' (5.19: ``DistributedConfig(tp_size=N, ep_size=N)`` with
DeepseekV3's ``base_model_ep_plan``), tried first on this CPU with gloo and 2 ranks: it gives the
single process's logits (within 3e-7) but needs the ``accelerate`` package, and accepts only
``ep_size == tp_size``: it also tensor-slices the dense layers and shared experts and wraps the
model in FSDP2, adding an all-reduce per dense layer, an all-gather per MoE layer and one of the
logits (12 collectives per forward on the tiny model, against 6 all-to-alls here), and ran the
tiny model's forward 3-4x slower than this dispatch. Pure expert parallelism with data parallel
ranks (``tp_size=1, ep_size=2``) it refuses ("All-reduce expert parallelism requires ep_size=tp_size").

Each all-to-all is counted (:data:`STATS`: calls, bytes sent and received, seconds inside), so a
run can say how many bytes a step moved and at what rate.

    python -m torch.distributed.run --nproc-per-node 2 -m engines.expert_parallel --check MODEL_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """What the expert all-to-alls of this rank moved so far."""

    calls: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    seconds: float = 0.0

    def add(self, sent: torch.Tensor, recv: torch.Tensor, seconds: float) -> None:
        self.calls += 1
        self.sent_bytes += sent.numel() * sent.element_size()
        self.recv_bytes += recv.numel() * recv.element_size()
        self.seconds += seconds


STATS = CommStats()


def _a2a(
    out: torch.Tensor, inp: torch.Tensor, out_sizes: list[int] | None = None, in_sizes: list[int] | None = None
) -> None:
    t0 = time.perf_counter()
    dist.all_to_all_single(out, inp, out_sizes, in_sizes)
    STATS.add(inp, out, time.perf_counter() - t0)


def shard_experts(model: Any, rank: int, world: int) -> list[int]:
    """Keep this rank's routed experts of every MoE layer and route its MoE forwards through
    :func:`ep_moe_forward`; returns the layers sharded. Experts must divide by the ranks."""
    done = []
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        experts = getattr(mlp, "experts", None)
        if experts is None:
            continue  # a dense layer (first_k_dense_replace)
        total = int(experts.num_experts)
        if total % world:
            raise ValueError(f"{total} routed experts do not split over {world} ranks")
        per = total // world
        lo = rank * per
        experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.data[lo : lo + per].clone(), requires_grad=False)
        experts.down_proj = torch.nn.Parameter(experts.down_proj.data[lo : lo + per].clone(), requires_grad=False)
        experts.num_local, experts.num_global = per, total
        mlp.forward = types.MethodType(ep_moe_forward, mlp)
        done.append(i)
    return done


def _local_experts(experts: Any, x: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
    """Rows ``x`` through this rank's experts (``local_ids`` in [0, per)), unweighted."""
    out = torch.empty_like(x)
    for e in range(experts.num_local):
        rows = (local_ids == e).nonzero(as_tuple=True)[0]
        if rows.numel():
            gate, up = torch.nn.functional.linear(x[rows], experts.gate_up_proj[e]).chunk(2, dim=-1)
            out[rows] = torch.nn.functional.linear(experts.act_fn(gate) * up, experts.down_proj[e])
    return out


def ep_moe_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """A DeepseekV3MoE forward with its routed experts spread over the ranks (see the module docstring)."""
    world = dist.get_world_size()
    experts = self.experts
    shape = hidden_states.shape
    hidden = shape[-1]
    _, weights, ids = self.gate(hidden_states)  # [T, k]: this rank's tokens
    x = hidden_states.reshape(-1, hidden)
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs by expert, so by owner
    send = x.index_select(0, order // k).contiguous()
    counts = torch.bincount(flat, minlength=experts.num_global).view(world, experts.num_local)
    recv_counts = torch.empty_like(counts)
    _a2a(recv_counts, counts)
    send_sizes, recv_sizes = counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    recv = x.new_empty(sum(recv_sizes), hidden)
    _a2a(recv, send, recv_sizes, send_sizes)
    local_ids = torch.arange(experts.num_local).repeat(world).repeat_interleave(recv_counts.reshape(-1))
    done = _local_experts(experts, recv, local_ids)
    back = x.new_empty(tokens * k, hidden)
    _a2a(back, done, send_sizes, recv_sizes)
    pairs = torch.empty_like(back)
    pairs[order] = back
    routed = (pairs.view(tokens, k, hidden) * weights.unsqueeze(-1).to(pairs.dtype)).sum(1)
    return routed.view(shape) + self.shared_experts(hidden_states)


def _greedy(model: Any, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` greedy tokens (no cache: every rank runs the same number of forwards) and the
    first step's logits."""
    first = None
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids).logits
            first = logits if first is None else first
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert first is not None
    return ids, first


def check(model_dir: str, batch: int, seq: int, steps: int, seed: int) -> dict[str, Any] | None:
    """Under torchrun: the EP model's greedy tokens and logits against one process's (rank 0 returns
    the comparison, the others None)."""
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo")  # the check runs on the CPU (float32): exact within rounding
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        vocab = int(model.config.vocab_size)
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
        if batch % world:
            raise ValueError(f"batch {batch} does not split over {world} ranks")
        layers = shard_experts(model, rank, world)
        local = [int(model.model.layers[i].mlp.experts.gate_up_proj.shape[0]) for i in layers]
        t0 = time.perf_counter()
        tokens, logits = _greedy(model, ids[rank::world], steps)
        seconds = time.perf_counter() - t0
        parts = [torch.empty_like(logits) for _ in range(world)]
        dist.all_gather(parts, logits.contiguous())
        token_parts = [torch.empty_like(tokens) for _ in range(world)]
        dist.all_gather(token_parts, tokens.contiguous())
        stats = [None] * world
        dist.all_gather_object(stats, asdict(STATS))
        if rank != 0:
            return None
        full = torch.empty(batch, seq, vocab)
        full_tokens = torch.empty(batch, seq + steps, dtype=tokens.dtype)
        for r in range(world):
            full[r::world] = parts[r]
            full_tokens[r::world] = token_parts[r]
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        ref_tokens, ref_logits = _greedy(ref, ids, steps)
        return {
            "world": world,
            "batch": [batch, seq],
            "steps": steps,
            "moe_layers": layers,
            "experts_per_rank": local,
            "max_abs_diff": float((full - ref_logits).abs().max()),
            "max_abs_logit": float(ref_logits.abs().max()),
            "same_greedy_tokens": bool(torch.equal(full_tokens, ref_tokens)),
            "seconds": seconds,
            "comm": stats,
        }
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--check", required=True, metavar="MODEL_DIR", help="compare EP with one process on this checkpoint"
    )
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = check(args.check, args.batch, args.seq, args.steps, args.seed)
    if out is not None:
        print("EP-CHECK " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

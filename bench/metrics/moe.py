"""What a run's expert routing means for a deployment: imbalance, hot and cold experts, entropy,
the load per expert-parallel rank, and the EPLB what-if.

Input: the per-run routing record every engine that reports routing stores (the
``expert_routing`` artifact: ``counts[layer][expert]`` tokens routed, ``layers`` labels,
``num_experts``, ``top_k``, ``n_group``). Everything here is arithmetic on those counts; nothing
is measured again.

**Expert parallelism (EP).** With EP size ``ep`` the experts of a layer are spread over ``ep``
ranks. MoE Bench's default placement is vLLM's and SGLang's without EPLB: contiguous blocks,
rank ``r`` holds experts ``r*E/ep .. (r+1)*E/ep - 1``. A rank's load is the tokens routed to
the experts it holds. *Rank imbalance* of a layer is max / mean load across ranks;
*balancedness* is vLLM's figure (``vllm/distributed/eplb/eplb_state.py``): over all MoE layers,
the sum of the mean rank loads divided by the sum of the max rank loads (1 = even; 1/ep = one
rank does everything).

**The EPLB what-if.** DeepSeek's expert-parallel load balancer (EPLB; vLLM's
``DefaultEplbPolicy``) places ``E + R`` physical experts (``R`` redundant replicas of the busiest
ones) on the ranks: first the expert groups are packed onto nodes (balanced greedy packing: the
heaviest item goes to the lightest pack that still has room), then within each node the
heaviest expert per replica gets one more replica until the node's slots are filled, then the
replicas are packed onto the node's ranks the same way. A replicated expert's tokens are split
evenly over its replicas (the policy's own assumption). :func:`eplb_placement` implements that
algorithm; ``tests/bench/test_moe.py`` checks it against vLLM's policy on the same loads, in the
vLLM environment, placement for placement. With one group or a group count the nodes do not
divide, vLLM uses the global policy (one group, one node): so does :func:`eplb_whatif`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.errors import ConfigError

EP_SIZES = (2, 4, 8, 16, 32, 64)
# The most redundant replicas the EPLB what-if places: DeepSeek-V3's own deployment adds 32 to its
# 256 experts; the policy's cost grows with them (8,000,000 took 123 s and 1 GB).
EPLB_MAX_REDUNDANT = 1024


def counts_array(routing: dict[str, Any]) -> np.ndarray:
    """The routing record's counts as a float array [layers, experts] (a one-line reason if bad)."""
    counts = routing.get("counts") if isinstance(routing, dict) else None
    try:
        arr = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"routing record: counts are not numbers ({exc})") from exc
    if arr.ndim != 2 or arr.size == 0:
        raise ConfigError(f"routing record: counts must be [layers][experts], got shape {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ConfigError("routing record: counts must be finite and not negative")
    return arr


# --- per layer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer's routing over a run."""

    layer: str
    # routed tokens: tokens through the layer's gate (the record's ``tokens``, as the dashboard's
    # "tokens per layer"; else selections / top-k); None when the record says neither
    tokens: float | None
    imbalance: float | None  # busiest expert / mean expert load
    entropy: float | None  # of the expert-load distribution, over log(experts): 1 = uniform
    hot: tuple[int, ...]  # the three busiest experts
    cold: int  # experts that got no token
    selections: float = 0.0  # token-expert selections (each routed token counts once per expert of its top-k)


def layer_labels(routing: dict[str, Any], layers: int) -> list[str]:
    """The record's layer labels, or ``layer i`` for each when it has none; a one-line reason
    (:class:`ConfigError`) when ``layers`` is not a list of ``layers`` labels."""
    labels = routing.get("layers")
    if labels is None:
        return [f"layer {i}" for i in range(layers)]
    if not isinstance(labels, list) or len(labels) != layers or not all(isinstance(x, str | int) for x in labels):
        raise ConfigError(f"routing record: layers must be a list of {layers} labels, got {str(labels)[:60]}")
    return [str(x) for x in labels]


def expert_groups(routing: dict[str, Any]) -> int:
    """The record's ``n_group`` (1 when absent); a one-line reason when it is not a whole number >= 1."""
    groups = routing.get("n_group")
    if groups is None:
        return 1
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"routing record: n_group must be a whole number of groups, got {str(groups)[:40]!r}")
    return groups


# The one word and definition of a layer's token count, for the CLI and the dashboard alike.
ROUTED_TOKENS = "routed tokens per layer"
ROUTED_TOKENS_MEANING = "through its gate, prompt and generated; each selects top-k experts"


def routed_tokens_figure(routing: dict[str, Any]) -> str:
    """The run's routed tokens per layer as one figure (``78``; ``70-78`` where layers differ; ``-``
    where the record says neither): the number both the CLI and the Profiling page print."""
    counts = counts_array(routing)
    known = [t for t in routed_tokens(routing, counts) if t is not None]
    if not known:
        return "-"
    low, high = min(known), max(known)
    return f"{low:,.0f}" if round(low) == round(high) else f"{low:,.0f}-{high:,.0f}"


def routed_tokens(routing: dict[str, Any], counts: np.ndarray) -> list[float | None]:
    """Routed tokens per layer: tokens through its gate, one definition for the CLI and the
    dashboard. The record's ``tokens`` where it is one whole count a layer, else each layer's
    selections / ``top_k``; None for a layer whose record says neither."""
    given = routing.get("tokens")
    if isinstance(given, list) and len(given) == len(counts):
        ok = all(not isinstance(t, bool) and isinstance(t, int | float) and 0 <= t < math.inf for t in given)
        if ok:
            return [float(t) for t in given]
    top_k = routing.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:
        return [float(row.sum()) / top_k for row in counts]
    return [None] * len(counts)


def layer_routing(routing: dict[str, Any]) -> list[LayerRouting]:
    counts = counts_array(routing)
    labels = layer_labels(routing, len(counts))
    tokens = routed_tokens(routing, counts)
    out = []
    for label, row, routed in zip(labels, counts, tokens, strict=False):
        total = float(row.sum())
        mean = total / len(row)
        p = row / total if total else row
        nz = p[p > 0]
        entropy = float(-(nz * np.log(nz)).sum() / math.log(len(row))) if total and len(row) > 1 else None
        out.append(
            LayerRouting(
                layer=str(label),
                tokens=routed,
                imbalance=float(row.max() / mean) if mean else None,
                entropy=entropy,
                hot=tuple(int(i) for i in np.argsort(-row, kind="stable")[:3]),
                cold=int((row == 0).sum()),
                selections=total,
            )
        )
    return out


# --- expert parallelism ---------------------------------------------------------------------------


def contiguous_rank_loads(counts: np.ndarray, ep: int) -> np.ndarray:
    """[layers, ep] tokens per rank when rank r holds the r-th contiguous block of experts."""
    layers, experts = counts.shape
    if ep < 1 or experts % ep:
        raise ConfigError(f"EP size {ep} does not divide the {experts} experts of a layer")
    return counts.reshape(layers, ep, experts // ep).sum(axis=-1)


def balancedness(rank_loads: np.ndarray) -> float | None:
    """vLLM's balancedness: sum over layers of the mean rank load / sum of the max rank load."""
    top = float(rank_loads.max(axis=1).sum())
    return float(rank_loads.mean(axis=1).sum()) / top if top > 0 else None


def _pack(weight: np.ndarray, packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Balanced greedy packing of each row's items into ``packs`` packs of equal count: items by
    descending weight, each into the lightest pack with room. (pack of each item, its slot)."""
    rows, items = weight.shape
    per_pack = items // packs
    if per_pack == 1:
        return np.tile(np.arange(items, dtype=np.int64), (rows, 1)), np.zeros((rows, items), dtype=np.int64)
    pack_of = np.empty((rows, items), dtype=np.int64)
    slot_of = np.empty((rows, items), dtype=np.int64)
    order = np.argsort(-weight, axis=-1)  # the same sort call as the reference policy (ties alike)
    for r in range(rows):
        load = np.zeros(packs, dtype=np.float64)
        filled = np.zeros(packs, dtype=np.int64)
        for item in order[r]:
            p = int(np.argmin(load))
            pack_of[r, item], slot_of[r, item] = p, filled[p]
            load[p] += weight[r, item]
            filled[p] += 1
            if filled[p] == per_pack:
                load[p] = np.inf  # full
    return pack_of, slot_of


def _replicate(weight: np.ndarray, physical: int) -> tuple[np.ndarray, np.ndarray]:
    """Give each row ``physical - experts`` extra replicas, one at a time to the expert with the
    most tokens per replica. (logical expert of each physical slot, replicas per expert)."""
    rows, logical = weight.shape
    phys_to_log = np.zeros((rows, physical), dtype=np.int64)
    phys_to_log[:, :logical] = np.arange(logical)
    replicas = np.ones((rows, logical), dtype=np.int64)
    every = np.arange(rows)
    for slot in range(logical, physical):
        busiest = np.argmax(weight / replicas, axis=-1)
        phys_to_log[:, slot] = busiest
        replicas[every, busiest] += 1
    return phys_to_log, replicas


def _invert(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def eplb_placement(weight: np.ndarray, physical: int, groups: int, nodes: int, ranks: int) -> np.ndarray:
    """DeepSeek's EPLB placement: [layers, physical] logical expert of each physical slot, slots
    ``r*physical/ranks ..`` on rank r (groups packed onto nodes, replicas within each node, then
    onto the node's ranks)."""
    weight = np.asarray(weight, dtype=np.float32)  # the reference policy works on float32 loads
    layers, logical = weight.shape
    if logical % groups or groups % nodes or ranks % nodes or physical % ranks or physical < logical:
        raise ConfigError(
            f"EPLB: {logical} experts in {groups} groups on {nodes} node(s) and {ranks} ranks with {physical} "
            "physical experts do not divide evenly"
        )
    group_size = logical // groups
    per_node_groups = groups // nodes
    group_load = weight.reshape(layers, groups, group_size).sum(axis=-1)
    g_pack, g_slot = _pack(group_load, nodes)
    # each logical expert's position once its group sits on its node ("node-major" order)
    node_major = ((g_pack * per_node_groups + g_slot)[..., None] * group_size + np.arange(group_size)).reshape(
        layers, logical
    )
    from_node_major = _invert(node_major)
    per_node = logical // nodes
    node_weight = np.take_along_axis(weight, from_node_major, axis=1).reshape(-1, per_node)
    phys_to_nm, replicas = _replicate(node_weight, physical // nodes)
    phys_load = np.take_along_axis(node_weight / replicas, phys_to_nm, axis=1)
    r_pack, r_slot = _pack(phys_load, ranks // nodes)
    placed = r_pack * (physical // ranks) + r_slot
    slot_to_phys = _invert(placed)
    slot_nm = np.take_along_axis(phys_to_nm, slot_to_phys, axis=1)
    slot_nm = (slot_nm.reshape(layers, nodes, -1) + np.arange(0, logical, per_node)[None, :, None]).reshape(layers, -1)
    return np.take_along_axis(from_node_major, slot_nm, axis=1)


def placement_rank_loads(weight: np.ndarray, placement: np.ndarray, ranks: int) -> np.ndarray:
    """[layers, ranks] tokens per rank for a placement, a replicated expert's tokens split evenly."""
    layers, logical = weight.shape
    replicas = np.zeros((layers, logical))
    np.add.at(replicas, (np.arange(layers)[:, None], placement), 1)
    per_slot = np.take_along_axis(weight / np.maximum(replicas, 1), placement, axis=1)
    return per_slot.reshape(layers, ranks, -1).sum(axis=-1)


@dataclass(frozen=True)
class EpWhatIf:
    """One run's routing on an EP deployment of ``ep`` ranks, as placed now and as EPLB would."""

    ep: int
    redundant: int
    rank_loads: np.ndarray  # [layers, ep], contiguous placement
    balancedness: float | None
    worst_layer_imbalance: float | None  # max over layers of max / mean rank load
    eplb_rank_loads: np.ndarray  # [layers, ep]
    eplb_balancedness: float | None
    eplb_worst_layer_imbalance: float | None
    placement: np.ndarray  # [layers, experts + redundant]

    def rows(self, labels: Sequence[str]) -> list[dict[str, Any]]:
        """Per layer: max / mean rank load now and with EPLB."""
        return [
            {
                "layer": label,
                "ranks_max_over_mean": max_over_mean(now),
                "eplb_max_over_mean": max_over_mean(then),
            }
            for label, now, then in zip(labels, self.rank_loads, self.eplb_rank_loads, strict=False)
        ]


def max_over_mean(row: np.ndarray) -> float | None:
    """max / mean of one layer's loads (None when it has none)."""
    mean = float(row.mean())
    return float(row.max()) / mean if mean > 0 else None


def _worst(loads: np.ndarray) -> float | None:
    ratios = [r for r in (max_over_mean(row) for row in loads) if r is not None]
    return max(ratios) if ratios else None


def eplb_whatif(routing: dict[str, Any], ep: int, redundant: int = 0, nodes: int = 1) -> EpWhatIf:
    """The run's loads on ``ep`` ranks: contiguous now, and placed by EPLB with ``redundant``
    extra replicas (a multiple that keeps every rank's slot count equal)."""
    counts = counts_array(routing)
    experts = counts.shape[1]
    if ep < 1 or experts % ep:
        raise ConfigError(f"EP size {ep} does not divide the {experts} experts of a layer (try {_divisors(experts)})")
    if not 0 <= redundant <= EPLB_MAX_REDUNDANT:
        raise ConfigError(f"--redundant {redundant}: the EPLB what-if takes 0 to {EPLB_MAX_REDUNDANT} replicas")
    if (experts + redundant) % ep:
        raise ConfigError(
            f"--redundant {redundant}: experts + redundant ({experts + redundant}) must divide by EP {ep}"
        )
    if not 1 <= nodes <= ep:
        raise ConfigError(f"--nodes {nodes}: the EP {ep} ranks are on 1 to {ep} nodes")
    groups = expert_groups(routing)
    if experts % groups or groups % nodes:
        groups = nodes = 1  # as vLLM: the global policy when groups and nodes do not fit
    if ep % nodes:
        raise ConfigError(f"EP {ep} ranks do not split over {nodes} nodes")
    now = contiguous_rank_loads(counts, ep)
    placement = eplb_placement(counts, experts + redundant, groups, nodes, ep)
    then = placement_rank_loads(counts, placement, ep)
    return EpWhatIf(
        ep, redundant, now, balancedness(now), _worst(now), then, balancedness(then), _worst(then), placement
    )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in EP_SIZES if n % d == 0) or "1"


def routing_overlap(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """How alike two runs' routing is: per MoE layer the overlap of their expert-load
    distributions (sum over experts of the smaller share; 1 = the same shares, 0 = disjoint
    experts), averaged over the layers; None when their layers or experts differ."""
    x, y = counts_array(a), counts_array(b)
    if x.shape != y.shape:
        return None
    px = x / np.maximum(x.sum(axis=1, keepdims=True), 1e-12)
    py = y / np.maximum(y.sum(axis=1, keepdims=True), 1e-12)
    return float(np.minimum(px, py).sum(axis=1).mean())


RUN_EP = 8  # the EP size of the per-run figures (and one redundant expert per rank)


def run_figures(routing: dict[str, Any] | None, ep: int = RUN_EP, redundant: int = RUN_EP) -> dict[str, float | None]:
    """The per-run MoE numbers for tables and CSV: ``moe_imbalance_max`` (the worst layer's busiest
    expert / mean), ``ep_rank_imbalance`` (the worst layer's busiest rank / mean at ``ep``,
    contiguous placement) and ``eplb_balancedness_whatif`` (vLLM's balancedness EPLB would reach
    there with ``redundant`` replicas); all None without routing or when ``ep`` does not fit."""
    empty: dict[str, float | None] = dict.fromkeys(MOE_RUN_COLUMNS)
    if not routing:
        return empty
    try:
        layers = layer_routing(routing)
        w = eplb_whatif(routing, ep, redundant)
    except ConfigError:
        return empty
    imb = [x.imbalance for x in layers if x.imbalance is not None]
    return {
        "moe_imbalance_max": max(imb) if imb else None,
        "ep_rank_imbalance": w.worst_layer_imbalance,
        "eplb_balancedness_whatif": w.eplb_balancedness,
    }


MOE_RUN_COLUMNS = ("moe_imbalance_max", "ep_rank_imbalance", "eplb_balancedness_whatif")

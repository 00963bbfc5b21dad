"""``python -m bench routing RUN_ID [--ep 8] [--redundant 32]``: what a run's expert routing means
for an expert-parallel deployment (:mod:`bench.metrics.moe`), as text: per layer the expert
imbalance, entropy, hot and cold experts and the rank imbalance at ``--ep`` now and with EPLB;
then the run's balancedness both ways."""

from __future__ import annotations

import argparse

from bench.cli.common import EXIT_OK, open_store
from bench.metrics import moe
from bench.run.artifacts import ARTIFACT_ROUTING, ARTIFACT_ROUTING_ERROR
from engines.errors import ConfigError


def add_routing_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", type=int)
    p.add_argument("--ep", type=int, default=8, help="expert-parallel size: ranks the experts are spread over")
    p.add_argument(
        "--redundant", type=int, default=0, help="EPLB what-if: extra replicas (experts + redundant divide by EP)"
    )
    p.add_argument("--nodes", type=int, default=1, help="EPLB what-if: nodes the ranks are on (groups packed per node)")
    p.set_defaults(func=cmd_routing)


def _f(x: float | None, fmt: str = ".2f") -> str:
    """``x`` formatted, or "-" when there is none."""
    return "-" if x is None else format(x, fmt)


def cmd_routing(args: argparse.Namespace) -> int:
    store = open_store(args)
    run = store.get_run(args.run_id)
    if run is None:
        raise ConfigError(f"no run with id {args.run_id} in {store.path}")
    routing = store.artifact(args.run_id, ARTIFACT_ROUTING)
    if not routing:
        failed = store.artifact(args.run_id, ARTIFACT_ROUTING_ERROR)
        if failed and failed.get("error"):
            raise ConfigError(f"run {args.run_id} has no routing record: {failed['error']}")
        raise ConfigError(
            f"run {args.run_id} has no routing record (the {run.engine} engine did not report routing for it; "
            "a native run records it unless its step is a captured CUDA graph)"
        )
    layers = moe.layer_routing(routing)
    what = moe.eplb_whatif(routing, args.ep, args.redundant, args.nodes)
    experts = len(routing["counts"][0])
    print(
        f"run {run.id} · {run.engine} · {run.model} · {len(layers)} MoE layers x {experts} experts, "
        f"top-{routing.get('top_k', '?')}"
    )
    if routing.get("source"):
        print(f"source: {routing['source']}")
    if routing.get("error"):
        print(f"note: {routing['error']}")
    print(f"tokens: {moe.ROUTED_TOKENS} ({moe.ROUTED_TOKENS_MEANING}): {moe.routed_tokens_figure(routing)}")
    print(
        f"\n{'layer':<12}{'tokens':>10}{'max/mean':>10}{'entropy':>9}  {'hot experts':<14}{'cold':>5}"
        f"{f'EP{args.ep} max/mean':>15}{'with EPLB':>11}"
    )
    for row, now, then in zip(layers, what.rank_loads, what.eplb_rank_loads, strict=False):
        hot = ",".join(str(e) for e in row.hot)
        print(
            f"{row.layer[:12]:<12}{_f(row.tokens, ',.0f'):>10}{_f(row.imbalance):>10}{_f(row.entropy):>9}  {hot:<14}"
            f"{row.cold:>5}{_f(moe.max_over_mean(now)):>15}{_f(moe.max_over_mean(then)):>11}"
        )
    print(
        f"\nEP {args.ep}, contiguous placement: balancedness {_f(what.balancedness, '.3f')} (vLLM's: mean / max rank "
        f"load over the layers; 1 = even), worst layer max/mean {_f(what.worst_layer_imbalance)}"
    )
    print(
        f"EPLB what-if, {args.redundant} redundant replica(s) on {args.nodes} node(s): balancedness "
        f"{_f(what.eplb_balancedness, '.3f')}, worst layer max/mean {_f(what.eplb_worst_layer_imbalance)}"
    )
    return EXIT_OK

"""How exact can a float32 reference be for a random-weight MoE? Routing near-ties, measured.

The tuning ablation compares each configuration's logits with the baseline's prompts run alone;
in float32 on the H200 the baseline's own batched ``generate`` (dynamic cache) differed from the
prompts alone by 2.9 while the static cache's agreed within 3.4e-5. This study measures the one
mechanism that turns rounding into such a jump: an expert choice decided by a score gap smaller
than the rounding. On ``random-v2-lite-shape``'s widths (DeepSeek-V2-Lite: 64 routed experts,
6 per token) with ``--layers`` decoder layers, random weights as the engine builds them:

1. **The margins.** Every (token, MoE layer) routing decision of ``--prompts`` prompts of
   ``--input-len`` tokens, each run alone: the weakest chosen expert's score (sigmoid plus
   bias: what ``topk`` picks from) minus the best unchosen one's, its median and lower tail.
2. **The rounding.** The same prompts as one batch: how far batching moves each decision's
   margin (the same two experts' scores; a different GEMM shape rounds differently), and the
   expert choices that flipped.
3. **The cascade.** The closest decision in the first MoE layer, in the first half of prompt 0,
   flipped by hand (its weakest expert replaced by the runner-up: what a rounding difference
   larger than its margin does): how far that moves the logits at the prompt's last position,
   and how many later decisions flip with it.

From 1 and 2 the expected number of flips per forward pass is printed beside what was seen:
the margins' density near zero (the fraction under 1e-4, per unit: the tail is close to
uniform there) times each decision's shrink (only a margin that shrinks can flip), summed;
and for the 27-layer model, with each layer's mean shrink extrapolated linearly in depth
from the measured layers (it grows with depth). Figures, not a test: the exit status is 0
whatever they are. Usage (float32: 6 layers take about 14 GiB, 8 with ``--vocab 16384``
about 17 GiB, all 27 about 59 GiB)::

    python studies/routing_near_ties.py [--layers 6] [--vocab N] [--device cpu] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.analysis.tuning_ablation import LOGIT_STEPS, random_prompts  # noqa: E402
from engines.models import V2_LITE_SHAPE, build_random, tiny_path  # noqa: E402


def near_tie_margin(choice: Any, idx: Any, groups: int = 1) -> tuple[Any, Any, Any]:
    """Per token: how close the decision was (the weakest chosen expert's score minus the best
    unchosen one's among the expert groups it picked from; with one group, V2-Lite's, the gap
    between the k-th and (k+1)-th scores), the weakest chosen expert, and that runner-up."""
    import torch

    chosen = torch.zeros_like(choice, dtype=torch.bool).scatter_(-1, idx, True)
    tokens, experts = choice.shape
    picked = chosen.view(tokens, groups, experts // groups).any(-1, keepdim=True)  # the groups it chose from
    allowed = picked.expand(tokens, groups, experts // groups).reshape(tokens, experts)
    weakest = choice.masked_fill(~chosen, float("inf")).argmin(-1)
    runner_up = choice.masked_fill(chosen | ~allowed, float("-inf")).argmax(-1)
    gap = choice.gather(-1, weakest[:, None])[:, 0] - choice.gather(-1, runner_up[:, None])[:, 0]
    return gap, weakest, runner_up


def routing_of(
    model: Any, ids: Any, forced: tuple[int, int] | None = None, static_steps: int = 0
) -> tuple[Any, dict[int, Any]]:
    """The last position's logits of each row and every MoE layer's routing: {layer: (scores for
    choice [tokens, experts], chosen experts [tokens, k])}. ``forced`` = (layer, token): that
    decision's weakest chosen expert replaced by the best unchosen one (:func:`near_tie_margin`).

    ``static_steps`` > 0: the prompts go through ``generate`` with a static cache for that many
    greedy steps, as ``native_tuning.py``'s logits check runs its ``cache=static`` rows (the
    prompt attends under a mask over the cache's prompt + steps positions); the routing and the
    logits are the prompt's (the first forward), not the decode steps'."""
    import torch

    seen: dict[int, Any] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue

        def hook(mod: Any, args: Any, out: Any, i: int = i) -> Any:
            logits, weights, idx = out
            scores = logits.sigmoid()
            choice = scores + mod.e_score_correction_bias
            if i in seen:  # a decode step of ``generate``: the prompt's routing is kept
                return out
            seen[i] = (choice.detach().float().cpu(), idx.detach().cpu())  # as the model decided
            if forced is not None and forced[0] == i:  # the weakest chosen expert out, the runner-up in
                tok = forced[1]
                _, weakest, runner_up = near_tie_margin(choice[tok : tok + 1], idx[tok : tok + 1], mod.num_group)
                idx, weights = idx.clone(), weights.clone()
                idx[tok] = idx[tok].masked_fill(idx[tok] == weakest[0], int(runner_up[0]))
                w = scores[tok].gather(0, idx[tok])
                if mod.norm_topk_prob:  # as the router weighs its choice
                    w = w / (w.sum() + 1e-20)
                weights[tok] = w * mod.routed_scaling_factor
                seen[i] = (seen[i][0], idx.detach().cpu())
            return logits, weights, idx

        hooks.append(gate.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            if static_steps:
                out = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=static_steps,
                    min_new_tokens=static_steps, do_sample=False, temperature=None, top_p=None, top_k=None,
                    cache_implementation="static", output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                    disable_compile=True,  # as the engine's cache=static rows run (generate would compile on CUDA)
                )  # fmt: skip
                last = out.logits[0].float().cpu()
            else:
                last = model(ids, use_cache=False).logits[:, -1].float().cpu()
    finally:
        for h in hooks:
            h.remove()
    return last, seen


def flip_mask(a: Any, b: Any) -> Any:
    """Per decision (row): whether its chosen experts differ as sets."""
    return (a.sort(-1).values != b.sort(-1).values).any(-1)


def count_flips(a: Any, b: Any) -> int:
    """Decisions (rows) whose chosen experts differ as sets."""
    return int(flip_mask(a, b).sum())


def compare_paths(
    alone: list[tuple[Any, dict[int, Any]]], other: dict[int, Any], n: int, groups: int
) -> dict[str, Any]:
    """Every decision of the prompts run alone against the same decision in ``other`` (the
    prompts as one batch, row j's tokens at j*n..): the alone margin, how far ``other`` moved it
    (signed: the same two experts' scores; negative = the margin shrank), and which choices
    flipped, in (layer, prompt, token) order."""
    import torch

    gaps, moved, shrinks, flipped = [], [], {}, []
    for i in sorted(other):
        for j, (_, seen) in enumerate(alone):
            choice, idx = seen[i]
            gap, weakest, runner_up = near_tie_margin(choice, idx, groups)
            o_choice, o_idx = other[i][0][j * n : (j + 1) * n], other[i][1][j * n : (j + 1) * n]
            o_gap = o_choice.gather(-1, weakest[:, None])[:, 0] - o_choice.gather(-1, runner_up[:, None])[:, 0]
            gaps.append(gap)
            moved.append(o_gap - gap)
            shrinks.setdefault(i, []).append((gap - o_gap).clamp(min=0))  # only a shrinking margin can flip
            flipped += [
                (i, j, int(t), float(gap[t]), float(o_gap[t] - gap[t])) for t in flip_mask(idx, o_idx).nonzero()[:, 0]
            ]
    return {"gap": torch.cat(gaps), "moved": torch.cat(moved), "shrinks": shrinks, "flipped": flipped}


def path_figures(cmp: dict[str, Any], last: Any, alone: list[Any], closest: list[int]) -> dict[str, Any]:
    """One path's figures against the prompts alone: its flips; the first ones (the earliest
    layer's, where a cascade begins) with their alone margin and signed move; its signed move at
    each of the ``closest`` decisions (indices into :func:`compare_paths`'s order, the same for every
    path: whether a near-tie flips is the sign and size of this move); the last logits' |d|."""
    flipped = cmp["flipped"]
    first_layer = flipped[0][0] if flipped else None
    return {
        "flips": len(flipped),
        "first_flips": [
            {"layer": i, "prompt": j, "token": t, "alone_margin": g, "margin_move": m}
            for i, j, t, g, m in flipped
            if i == first_layer
        ][:5],
        "margin_move_median_abs": float(cmp["moved"].abs().median()),
        "closest_decisions_margin_move": [float(cmp["moved"][k]) for k in closest],
        "last_logits_max_abs_diff": float(max((last[j] - a[0][0]).abs().max() for j, a in enumerate(alone))),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6, help="decoder layers (the first dense, the rest MoE)")
    ap.add_argument("--vocab", type=int, default=V2_LITE_SHAPE["vocab_size"], help="smaller: less memory, same routing")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument(
        "--static-steps", type=int, default=LOGIT_STEPS,
        help="also batch the prompts through generate with a static cache for this many steps, as the tuning "
        "check's cache=static rows do (0: skip)",
    )  # fmt: skip
    ap.add_argument("--out", default="", help="write the figures as JSON here too")
    args = ap.parse_args(argv)
    import torch

    torch.manual_seed(0)
    cfg = {**V2_LITE_SHAPE, "num_hidden_layers": args.layers, "vocab_size": args.vocab}
    t = time.perf_counter()
    model, _ = build_random(cfg, tiny_path(), args.device, torch.float32)
    params = sum(p.numel() for p in model.parameters())
    print(f"built V2-Lite widths, {args.layers} layers, {params / 1e9:.2f} B parameters, float32 on "
          f"{args.device} in {time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    prompts = random_prompts(args.prompts, args.input_len, cfg["vocab_size"])  # native_tuning.py's (at V2-Lite's vocab)
    n = args.input_len
    alone = [routing_of(model, torch.tensor([p], device=args.device)) for p in prompts]
    batched_last, batched = routing_of(model, torch.tensor(prompts, device=args.device))
    layers = sorted(batched)
    groups = int(cfg["n_group"])

    # 1-2: the margins, and how far batching moves them
    cmp = compare_paths(alone, batched, n, groups)
    gap, move, shrinks, flips = cmp["gap"], cmp["moved"].abs(), cmp["shrinks"], len(cmp["flipped"])
    typical = float(move.median())
    # A decision flips when batching shrinks its margin by more than the margin itself. So few
    # margins are that small that their density near zero is read off the lower tail (close to
    # uniform there: the fraction under 1e-4, per unit; a few dozen margins, so about +-20 %),
    # times each layer's mean shrink. The shrink grows with depth, so for the 27-layer model it
    # is extrapolated from a straight line through the measured layers' means.
    density = float((gap < 1e-4).float().mean()) / 1e-4
    shrink = {i: float(torch.cat(v).mean()) for i, v in shrinks.items()}
    tokens = len(prompts) * n
    expected = density * tokens * sum(shrink.values())
    per_decision = expected / gap.numel()
    xs, ys = list(shrink), list(shrink.values())
    slope, intercept = statistics.linear_regression(xs, ys) if len(xs) > 1 else (0.0, ys[0])
    first_moe = int(V2_LITE_SHAPE["first_k_dense_replace"])
    full_layers = range(first_moe, int(V2_LITE_SHAPE["num_hidden_layers"]))
    full_expected = density * tokens * sum(max(0.0, intercept + slope * x) for x in full_layers)
    full = len(full_layers) * tokens
    logits_d = float(max((batched_last[j] - alone[j][0][0]).abs().max() for j in range(len(prompts))))
    res: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"
        if str(args.device) == "cpu"
        else torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "layers": args.layers,
        "vocab": args.vocab,
        "moe_layers": len(layers),
        "device": str(args.device),
        "decisions": int(gap.numel()),
        "gap_median": float(gap.median()),
        "gap_min": float(gap.min()),
        "gap_fraction_below": {f"{thr:g}": float((gap < thr).float().mean()) for thr in (1e-6, 1e-5, 1e-4, 1e-3)},
        "batching_margin_move_median": typical,
        "batching_margin_move_max": float(move.max()),
        "batching_flips": flips,
        "batching_margin_shrink_mean_by_layer": shrink,
        "margin_density_near_zero_per_unit": density,
        "batching_flips_expected": expected,
        "flip_probability_per_decision": per_decision,
        "full_model_decisions": full,
        "full_model_flips_expected_extrapolated": full_expected,
        "batching_last_logits_max_abs_diff": logits_d,
    }
    print(
        f"{res['decisions']} routing decisions ({len(layers)} MoE layers x {len(prompts)} x {n} tokens): "
        f"margin (weakest chosen expert minus best unchosen) median {res['gap_median']:.3g}, "
        f"smallest {res['gap_min']:.3g}; "
        + ", ".join(f"under {t}: {v:.2e}" for t, v in res["gap_fraction_below"].items())
    )
    print(
        f"batched vs alone: each decision's margin moved by {typical:.2g} (median), "
        f"{res['batching_margin_move_max']:.2g} (max); "
        f"{flips} expert choice(s) flipped ({expected:.2f} expected); last-position logits |d| {logits_d:.3g}"
    )
    print(
        f"so a decision here flips with probability ~{per_decision:.0e} (margin shrink by layer "
        + ", ".join(f"{i}: {v:.1g}" for i, v in shrink.items())
        + f"); the 27-layer model makes {full} decisions for these prompts: ~{full_expected:.1g} flips expected "
        "per batched-vs-alone comparison (the shrink extrapolated linearly in depth)"
        + (
            ". These estimates hold only where no choice flipped: after a flip the later margins move by its "
            "cascade (the layer whose shrink jumps is where it began), so here read the flips counted, not them"
            if flips
            else ""
        )
    )

    # 2b: the same batch through the static cache, as the tuning check's cache=static rows run it,
    # and, for both paths, the first flips and the signed move at the closest decisions: a
    # near-tie flips on one path and not on another when their rounding moves it differently
    closest = [int(k) for k in gap.argsort()[:8]]
    per = len(prompts) * n
    res["closest_decisions"] = [
        {"layer": layers[k // per], "prompt": (k // n) % len(prompts), "token": k % n, "alone_margin": float(gap[k])}
        for k in closest
    ]
    paths = {"batched": path_figures(cmp, batched_last, alone, closest)}
    if args.static_steps > 0:
        batch = torch.tensor(prompts, device=args.device)
        static_last, static = routing_of(model, batch, static_steps=args.static_steps)
        paths[f"static_cache_generate_{args.static_steps}"] = path_figures(
            compare_paths(alone, static, n, groups), static_last, alone, closest
        )
    res["paths"] = paths
    for name, f in paths.items():
        first = ", ".join(
            f"layer {x['layer']} prompt {x['prompt']} token {x['token']} (margin {x['alone_margin']:.2g}, "
            f"moved {x['margin_move']:+.2g})"
            for x in f["first_flips"]
        )
        print(
            f"{name}: {f['flips']} flip(s), last logits |d| {f['last_logits_max_abs_diff']:.3g}"
            + (f"; first: {first}" if first else "")
            + "; at the closest decisions (margin: move) "
            + ", ".join(
                f"{d['alone_margin']:.2g}: {m:+.2g}"
                for d, m in zip(res["closest_decisions"], f["closest_decisions_margin_move"], strict=True)
            )
        )

    # 3: one flip by hand, early in prompt 0, and what follows from it
    first = layers[0]
    gap0 = near_tie_margin(alone[0][1][first][0][: n // 2], alone[0][1][first][1][: n // 2], groups)[0]
    tok = int(gap0.argmin())
    ref_last, ref_seen = alone[0]
    got_last, got_seen = routing_of(model, torch.tensor(prompts[:1], device=args.device), forced=(first, tok))
    later = {i: count_flips(ref_seen[i][1], got_seen[i][1]) for i in layers}
    later[first] -= 1  # the forced one
    res["forced_flip"] = {
        "layer": first,
        "token": tok,
        "gap": float(gap0[tok]),
        "last_logits_max_abs_diff": float((got_last[0] - ref_last[0]).abs().max()),
        "last_logits_abs_max": float(ref_last[0].abs().max()),
        "last_token_same": bool(got_last[0].argmax() == ref_last[0].argmax()),
        "flips_that_followed_by_layer": later,
        "flips_that_followed_at_last_token": sum(
            count_flips(ref_seen[i][1][n - 1 :], got_seen[i][1][n - 1 :]) for i in layers
        ),
    }
    f = res["forced_flip"]
    print(
        f"one flip by hand (layer {first}, token {tok} of {n}, gap {f['gap']:.2g}): the last position's logits move "
        f"by {f['last_logits_max_abs_diff']:.3g} (scale {f['last_logits_abs_max']:.3g}), greedy token "
        f"{'kept' if f['last_token_same'] else 'changed'}; {sum(later.values())} later decision(s) flipped with it "
        f"({f['flips_that_followed_at_last_token']} at the last token), by layer {later}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

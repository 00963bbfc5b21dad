"""Do MoE Bench's lean experts, lean gate and absorbed MLA compute what transformers computes,
at DeepSeek-V2-Lite's dimensions?

The headline configuration of the native engine (``experts_impl=lean_grouped_mm router=lean
mla=absorbed``, captured and compiled) can only be checked in bf16 on random weights by
running the same step eagerly: any kernel change flips bf16 tokens. This study checks the three
replacements themselves in float32, uncaptured, on ``random-v2-lite-shape``'s widths (64 routed
experts, 6 per token, hidden 2048, MLA rank 512) with ``--layers`` decoder layers, against the
engine's baseline (transformers' ``grouped_mm`` experts, its gate, its MLA):

- ``lean_experts``, ``lean_router``, ``absorbed_mla`` one at a time, and ``headline`` (all three);
- ``transformers_eager_experts`` (transformers' own per-expert loop): the noise floor, two of
  transformers' implementations of the same function.

For each: the prompts' logits at every position (one forward, no cache, each prompt alone) and
the logits of every decode step whose inputs are the same on both sides (absorbed MLA changes
only the single-token decode step), the largest |difference| against the baseline beside the
logits' scale, the routing decisions
whose chosen experts differ (with the baseline's margin at each: a flip can only happen where
the score gap is within rounding, see ``routing_near_ties.py``), and ``--steps`` greedy tokens
from ``generate`` (dynamic cache), equal or not, with the first step that differs.

The verdict per variant: **pass** when the logits agree within ``--rtol`` of the logits' scale
at every position whose routing agrees (a flipped near-tie moves its token's logits by design of
the model, not of the kernel) and every flip sits at a margin below ``--flip-margin``.
Exit status 0 whatever the figures (a study), 1 only if the model cannot be built. Usage
(float32: 6 layers take about 14 GiB on the GPU)::

    python studies/lean_float32_check.py --device cuda [--layers 6] [--out FILE.json]
    python studies/lean_float32_check.py --tiny          # the tiny model on the CPU (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines import experts, mla, router  # noqa: E402
from engines.models import TINY_CONFIG, V2_LITE_SHAPE, build_random, tiny_path  # noqa: E402
from studies.routing_near_ties import near_tie_margin  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "transformers_eager_experts": {"experts": "eager"},
    "lean_experts": {"experts": experts.NAME},
    "lean_router": {"router": True},
    "absorbed_mla": {"mla": True},
    "headline": {"experts": experts.NAME, "router": True, "mla": True},
}
BASELINE = {"experts": "grouped_mm", "router": False, "mla": False}


def configure(model: Any, setting: dict[str, Any]) -> None:
    """Put the model in one variant's configuration (the rest as the baseline)."""
    s = {**BASELINE, **setting}
    model.set_experts_implementation(s["experts"])
    router.set_lean(model, bool(s["router"]))
    mla.set_absorbed(model, bool(s["mla"]))


def forward_with_routing(model: Any, ids: Any) -> tuple[Any, dict[int, tuple[Any, Any]]]:
    """Logits [positions, vocab] of one prompt (no cache) and every MoE layer's routing:
    {layer: (scores for choice [tokens, experts], chosen experts [tokens, k])}."""
    import torch

    seen: dict[int, tuple[Any, Any]] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue

        def hook(mod: Any, args: Any, out: Any, i: int = i) -> None:
            logits, _, idx = out
            seen[i] = ((logits.sigmoid() + mod.e_score_correction_bias).float().cpu(), idx.cpu())

        hooks.append(gate.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            logits = model(ids, use_cache=False).logits[0].float().cpu()
    finally:
        for h in hooks:
            h.remove()
    return logits, seen


def greedy(model: Any, ids: Any, steps: int) -> tuple[list[int], Any]:
    """``steps`` greedy tokens (dynamic cache: every step after the first is a single-token decode,
    the path absorbed MLA replaces) and each step's logits [steps, vocab]."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
            do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0, disable_compile=True,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    return out.sequences[0, ids.shape[1] :].tolist(), torch.stack(out.logits, 1)[0].float().cpu()


def compare(ref: list[Any], got: list[Any], groups: int, rtol: float, flip_margin: float) -> dict[str, Any]:
    """One variant against the baseline over every prompt: logits, routing, greedy tokens."""
    import torch

    scale = max(float(r[0].abs().max()) for r in ref)
    worst_kept, worst_all, worst_decode, flips, tokens_equal, first_diff = 0.0, 0.0, 0.0, [], True, None
    for (r_logits, r_seen, (r_toks, r_dec)), (g_logits, g_seen, (g_toks, g_dec)) in zip(ref, got, strict=True):
        flipped_pos = torch.zeros(r_logits.shape[0], dtype=torch.bool)
        for layer, (choice, idx) in r_seen.items():
            moved = (idx.sort(-1).values != g_seen[layer][1].sort(-1).values).any(-1)
            if moved.any():
                gap, _, _ = near_tie_margin(choice, idx, groups)
                flips += [{"layer": layer, "token": int(t), "margin": float(gap[t])} for t in moved.nonzero()[:, 0]]
                # a flip changes that token's hidden state and, through attention, every later one
                flipped_pos[int(moved.nonzero()[0, 0]) :] = True
        diff = (g_logits - r_logits).abs().amax(-1)
        worst_all = max(worst_all, float(diff.max()))
        if (~flipped_pos).any():
            worst_kept = max(worst_kept, float(diff[~flipped_pos].max()))
        same = len(r_toks)  # decode steps with the same inputs: up to and including the first that differs
        if g_toks != r_toks:
            tokens_equal = False
            k = next(i for i, (a, b) in enumerate(zip(g_toks, r_toks, strict=True)) if a != b)
            first_diff = k if first_diff is None else min(first_diff, k)
            same = k + 1
        worst_decode = max(worst_decode, float((g_dec[:same] - r_dec[:same]).abs().max()))
    ok = max(worst_kept, worst_decode) <= rtol * scale and all(f["margin"] < flip_margin for f in flips)
    return {
        "verdict": "pass" if ok else "FAIL",
        "logits_max_abs_diff_where_routing_agrees": worst_kept,
        "logits_max_abs_diff_all_positions": worst_all,
        "decode_logits_max_abs_diff_same_inputs": worst_decode,
        "logit_scale": scale,
        "relative": max(worst_kept, worst_decode) / scale if scale else None,
        "routing_flips": len(flips),
        "flips": flips[:10],
        "greedy_tokens_equal": tokens_equal,
        "greedy_first_difference": first_diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=6, help="decoder layers (V2-Lite has 27)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model's widths (one expert group kept), CPU")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--rtol", type=float, default=1e-4, help="bound on |d logits| / the logits' scale")
    ap.add_argument("--flip-margin", type=float, default=1e-4, help="a routing flip is rounding below this margin")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (torch's default, stated)
    torch.backends.cudnn.allow_tf32 = False
    shape = dict(TINY_CONFIG) if a.tiny else dict(V2_LITE_SHAPE)
    if a.tiny:
        shape.update(n_group=1, topk_group=1)  # the lean gate's case: every group kept (V2-Lite has one)
    shape["num_hidden_layers"] = a.layers if not a.tiny else shape["num_hidden_layers"]
    t0 = time.perf_counter()
    reason = experts.register()
    if reason:
        print(reason)
        return 1
    model, _ = build_random(shape, tiny_path(), a.device, torch.float32)
    for why in (router.unsupported(model), mla.unsupported(model)):
        if why:
            print(why)
            return 1
    print(f"built {shape['num_hidden_layers']} layers in {time.perf_counter() - t0:.1f} s on {a.device}", flush=True)
    gen = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    prompts = [torch.randint(100, vocab, (1, a.input_len), generator=gen).to(a.device) for _ in range(a.prompts)]

    def run(setting: dict[str, Any]) -> list[Any]:
        configure(model, setting)
        return [(*forward_with_routing(model, ids), greedy(model, ids, a.steps)) for ids in prompts]

    ref = run(BASELINE)
    groups = int(shape.get("n_group") or 1)
    result: dict[str, Any] = {
        "question": "lean experts, lean gate and absorbed MLA against transformers, float32, uncaptured",
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        "shape": {k: shape[k] for k in ("hidden_size", "n_routed_experts", "num_experts_per_tok", "num_hidden_layers")},
        "prompts": a.prompts,
        "input_len": a.input_len,
        "steps": a.steps,
        "tolerance": {"rtol_of_logit_scale": a.rtol, "flip_margin": a.flip_margin},
        "variants": {},
    }
    for name, setting in VARIANTS.items():
        t = time.perf_counter()
        res = compare(ref, run(setting), groups, a.rtol, a.flip_margin)
        res["seconds"] = round(time.perf_counter() - t, 1)
        result["variants"][name] = res
        margins = ", ".join(f"{f['margin']:.1e}" for f in res["flips"][:3])
        tokens = "equal" if res["greedy_tokens_equal"] else f"differ from step {res['greedy_first_difference']}"
        print(
            f"{name:28s} {res['verdict']:4s} |d logits| prompt {res['logits_max_abs_diff_where_routing_agrees']:.2e}, "
            f"decode {res['decode_logits_max_abs_diff_same_inputs']:.2e} "
            f"(scale {res['logit_scale']:.2f}, rel {res['relative']:.1e}); routing flips {res['routing_flips']}"
            f"{' at margins ' + margins if margins else ''}; "
            f"greedy {tokens}",
            flush=True,
        )
    configure(model, BASELINE)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

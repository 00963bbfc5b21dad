"""The decode step with transformers' MLA (the cached latents expanded into every head's keys and
values each step) against absorbed MLA (``engines.mla``: attention over the latents themselves),
side by side on one model, in ABBA order over several rounds.

The model is DeepSeek-V3 with DeepSeek-V2-Lite's attention (16 heads, kv_lora_rank 512, nope 128,
rope 64, v 128, hidden 2048) and few layers and experts, random weights, so that it fits this
CPU; ``--layers``/``--experts`` grow it. Each step is the static-cache decode step the
``cuda_graphs`` option captures, run eagerly (no graph), timed as the gap between two steps'
tokens reaching the host. Reports per (batch, context) ms per step p50/p90/p99 of each mode over
all rounds, the ratio of the medians with its spread over rounds (min-max of the per-round
ratios), and the largest |logit difference| between the modes over the first steps (float32:
the same function summed in another order).

Usage::

    python studies/mla_absorb.py --batches 1,8 --contexts 256,1024 --rounds 3
    python studies/mla_absorb.py --device cuda --dtype bfloat16 --layers 27 --experts 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metrics.records import percentile
from engines import mla
from engines.models import V2_LITE_SHAPE
from studies.cuda_graphs_check import eager_decoder, eos_ids, random_prompts, step_times


def _model(layers: int, experts: int, dtype: str, device: str) -> Any:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = {**V2_LITE_SHAPE, "num_hidden_layers": layers, "n_routed_experts": experts,
           "num_experts_per_tok": min(6, experts), "vocab_size": 4096, "intermediate_size": 2048}  # fmt: skip
    torch.manual_seed(0)
    config = DeepseekV3Config(**cfg)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = DeepseekV3ForCausalLM(config)
    model = model.to(getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--contexts", default="256,1024", help="prompt lengths (the cache the step attends over)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each: expand, absorbed, absorbed, expand)")
    ap.add_argument("--json", default="", help="write the rows here too")
    args = ap.parse_args()
    import torch

    torch.set_grad_enabled(False)
    model = _model(args.layers, args.experts, args.dtype, args.device)
    eos = eos_ids(model)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.0f} M parameters, {args.layers} layers, {args.dtype} on {args.device}", flush=True)
    rows = []
    for length in [int(x) for x in args.contexts.split(",") if x]:
        for batch in [int(x) for x in args.batches.split(",") if x]:
            prompts = random_prompts(batch, length, int(model.config.vocab_size), seed=length + batch)
            logits = {}
            for mode in ("expand", "absorbed"):
                mla.set_absorbed(model, mode == "absorbed")
                toks: list[list[int]] = []
                with torch.inference_mode():
                    kept = eager_decoder(model).decode(prompts, 0, 4, toks.append, suppress=eos, keep_logits=True)
                logits[mode] = torch.stack(kept, 1).float()
            diff = float((logits["absorbed"] - logits["expand"]).abs().max())
            gaps: dict[str, list[float]] = {"expand": [], "absorbed": []}
            ratios = []
            for _ in range(args.rounds):
                per_round: dict[str, list[float]] = {"expand": [], "absorbed": []}
                for mode in ("expand", "absorbed", "absorbed", "expand"):
                    mla.set_absorbed(model, mode == "absorbed")
                    dec = eager_decoder(model)
                    per_round[mode] += step_times(dec, prompts, 0, args.steps + 1, eos)[1:]  # the first gap: warm-up
                for mode, xs in per_round.items():
                    gaps[mode] += xs
                ratios.append(statistics.median(per_round["expand"]) / statistics.median(per_round["absorbed"]))
            row: dict[str, Any] = {"batch": batch, "context": length, "logits_max_abs_diff": diff,
                                   "logit_abs_max": float(logits["expand"].abs().max())}  # fmt: skip
            for mode, xs in gaps.items():
                row[mode] = {
                    "p50": statistics.median(xs),
                    "p90": percentile(xs, 90),
                    "p99": percentile(xs, 99),
                    "n": len(xs),
                }
            row["speedup_p50"] = row["expand"]["p50"] / row["absorbed"]["p50"]
            row["speedup_rounds"] = [min(ratios), max(ratios)]
            rows.append(row)
            e, a = row["expand"], row["absorbed"]
            print(
                f"batch {batch:4d} context {length:5d}: expand {e['p50']:8.1f} ms (p90 {e['p90']:.1f}, p99 "
                f"{e['p99']:.1f})  absorbed {a['p50']:7.1f} ms (p90 {a['p90']:.1f}, p99 {a['p99']:.1f})  "
                f"x{row['speedup_p50']:.1f} (rounds {min(ratios):.1f}-{max(ratios):.1f})  "
                f"logits max |diff| {diff:.2g} (scale {row['logit_abs_max']:.2g})",
                flush=True,
            )
    mla.set_absorbed(model, False)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

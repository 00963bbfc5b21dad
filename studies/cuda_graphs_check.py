"""The native engine's ``cuda_graphs`` option on a GPU: is the captured step right, how fast is it,
and where does a decode step's time go.

Three parts, each optional, on one loaded model (``random-v2-lite-shape`` by default):

``--check``: each of four prompts decoded alone, greedy, by the engine with ``cuda_graphs``
(one graph, captured on the first prompt and replayed for the others: a replay that did not
follow its new inputs would repeat the first prompt's tokens), then the four together as one
left-padded batch of different lengths; against eager ``generate`` (dynamic cache) and against
the same step run eagerly. Reports per case whether the greedy tokens are equal and the
largest |logit difference| over the steps where they agree and over those with the same
inputs (those and the first step that differs), beside the logits' scale, and the noise floor:
the same prompt decoded eagerly alone and beside three others (``eager_batch_variance``). In
float32 (``--experts-impl batched_mm``: float32 grouped_mm cannot be captured) all agree within
float32 rounding; in bf16 only the same-step comparison is meaningful (random weights in bf16
turn any kernel change into different logits). ``--check-variants graphs,graphs_compile`` adds
the compiled-then-captured step.

``--mla absorbed`` runs all of it with absorbed latent attention (``engines.mla``); ``--check``
then also compares ``generate`` absorbed against ``generate`` expanded (transformers' MLA), the
one comparison of the two that float32 makes meaningful. ``--time-mla expand,absorbed`` times
each decoder with each.

``--time`` (bf16): ms per decode step through :class:`engines.graphs.GraphedDecoder` at each
batch: the same step eager (the static cache and mask, no graph), replayed from its graph,
and compiled then captured (``--compile``). A step's time is the gap between two steps'
tokens reaching the host (each step's tokens are copied to the CPU, as the engine streams
them), median over ``--steps`` steps after a first pass that captures. The decoders are
pipelined (step k+1 launched before step k's tokens are read, as the engine does);
``graphs_sync`` (in ``--time-configs``) is the graph read step by step, the loop before
pipelining.

``--profile``: torch.profiler over ten decode steps at the given batches, eager and graphed,
read step by step (``pipeline=False``, so that the window holds exactly ten steps):
the top operators by CUDA time and by CPU time, kernels per step, and the fraction of the
wall time the GPU was busy (sum of kernel times / wall time), the profiler's own overhead included.

Writes ``cuda-graphs-<part>.json`` files into ``--out``. Usage (on the GPU)::

    python studies/cuda_graphs_check.py --out DIR --check --dtype float32
    python studies/cuda_graphs_check.py --out DIR --time --profile --batches 1,8,32,128
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines import mla
from engines.base import create_engine
from engines.batching import left_pad
from engines.graphs import GraphedDecoder


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


def _generate(model: Any, prompts: list[list[int]], pad: int, steps: int) -> tuple[list[list[int]], Any]:
    """Eager ``generate`` (dynamic cache), greedy, exactly ``steps`` tokens: tokens and logits [B, steps, V]."""
    import torch

    dev = next(model.parameters()).device
    rows, masks = left_pad(prompts, pad)
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor(rows, device=dev), attention_mask=torch.tensor(masks, device=dev),
            max_new_tokens=steps, min_new_tokens=steps, do_sample=False, temperature=None, top_p=None, top_k=None,
            output_logits=True, return_dict_in_generate=True, pad_token_id=pad, disable_compile=True,
        )  # fmt: skip
    return out.sequences[:, len(rows[0]) :].tolist(), torch.stack(out.logits, 1).float().cpu()


def _graphed(dec: GraphedDecoder, prompts: list[list[int]], pad: int, steps: int, eos: list[int]) -> tuple[Any, Any]:
    import torch

    toks: list[list[int]] = []
    with torch.inference_mode():
        kept = dec.decode(prompts, pad, steps, toks.append, suppress=eos, keep_logits=True)
    return [list(r) for r in zip(*toks, strict=True)], torch.stack(kept, 1).float()


def result_rows(got: tuple[Any, Any], rows: list[int]) -> tuple[Any, Any]:
    """Those rows of a batch's (tokens, logits)."""
    toks, lg = got
    return [toks[i] for i in rows], lg[rows]


def compare(got: tuple[Any, Any], ref: tuple[Any, Any]) -> dict[str, Any]:
    toks, lg = got
    rtoks, rlg = ref
    agree = [
        next((k for k, (a, b) in enumerate(zip(g, r, strict=True)) if a != b), len(r))
        for g, r in zip(toks, rtoks, strict=True)
    ]
    upto = max(1, min(agree))
    same = min(min(agree) + 1, rlg.shape[1])  # the first differing step still had the same inputs
    top2 = rlg[:, 0].topk(2, dim=-1).values
    return {
        "tokens_equal": toks == rtoks,
        "first_difference": None if toks == rtoks else min(agree),
        "logits_max_abs_diff": float((lg[:, :upto] - rlg[:, :upto]).abs().max()),
        "logits_max_abs_diff_step0": float((lg[:, 0] - rlg[:, 0]).abs().max()),
        # over every step whose inputs were the same on both sides: the agreeing steps and the
        # first one that differs (its logits are the ones that flipped the token)
        "logits_max_abs_diff_same_inputs": float((lg[:, :same] - rlg[:, :same]).abs().max()),
        "ref_logit_abs_max": float(rlg.abs().max()),
        "ref_top2_gap_min": float((top2[:, 0] - top2[:, 1]).min()),
    }


def check(engine: Any, steps: int, variants: list[str], length: int = 128) -> dict[str, Any]:
    """Graphed vs eager, alone (one graph for four prompts) and as a padded batch. Two references:
    ``generate`` (dynamic cache), and the very step the graph holds run eagerly (same static
    cache, mask and kernels: a graph that replays it right gives the same numbers, in bf16 too)."""
    model = engine.model
    pad = engine._tokenizer.pad_token_id or 0
    eos = eos_ids(model)
    vocab = int(model.config.vocab_size)
    prompts = random_prompts(4, length, vocab)
    batch = [prompts[0], prompts[1][: length * 3 // 4], prompts[2][: length * 3 // 5], prompts[3]]
    cases = {**{f"alone/prompt{i}": [p] for i, p in enumerate(prompts)}, "batch4_padded": batch}
    gen = {k: _generate(model, ps, pad, steps) for k, ps in cases.items()}
    eager = eager_decoder(model)
    step = {k: _graphed(eager, ps, pad, steps, eos) for k, ps in cases.items()}
    out: dict[str, Any] = {"steps": steps, "prompt_len": length, "dtype": str(model.dtype),
                           "experts": engine.tuning()["experts_impl"]}  # fmt: skip
    out["eager_step_vs_generate"] = {k: compare(step[k], gen[k]) for k in cases}
    out["eager_generate_repeat"] = compare(_generate(model, cases["alone/prompt0"], pad, steps), gen["alone/prompt0"])
    # The noise floor of a bf16 check on this model: the same prompt, eager, decoded alone and as
    # row 0 / row 3 of the batch of 4 (both unpadded: only their batch-mates differ). Any kernel
    # that changes with the batch moves the logits; a flipped expert choice moves them a lot.
    out["eager_batch_variance"] = {
        f"{how}/prompt{i}": compare(result_rows(ref["batch4_padded"], [i]), ref[f"alone/prompt{i}"])
        for how, ref in (("generate", gen), ("step", step))
        for i in (0, 3)
    }
    print("eager_batch_variance", out["eager_batch_variance"], flush=True)
    out["mla"] = engine.tuning().get("mla", "expand")
    if out["mla"] == "absorbed":  # gen above is absorbed: the same generate with transformers' own MLA
        mla.set_absorbed(model, False)
        expanded = {k: _generate(model, ps, pad, steps) for k, ps in cases.items()}
        mla.set_absorbed(model, True)
        out["absorbed_vs_expand_generate"] = {k: compare(gen[k], expanded[k]) for k in cases}
        print("absorbed_vs_expand_generate", out["absorbed_vs_expand_generate"], flush=True)
    for name in variants:
        mode = "default" if name == "graphs_compile" else "off"
        t = time.perf_counter()
        try:
            engine.retune(cache="static", cuda_graphs=True, compile=mode)
            dec = engine._graphed
            res: dict[str, Any] = {}
            for k, ps in cases.items():  # the four prompts alone go through one graph, captured on the first
                got = _graphed(dec, ps, pad, steps, eos)
                res[k] = {"vs_eager_step": compare(got, step[k]), "vs_generate": compare(got, gen[k])}
                print(name, k, res[k], flush=True)
            out[name] = {"cases": res, "captures": dec.captures, "shapes": [list(s) for s in dec._shapes]}
        except Exception as exc:  # noqa: BLE001 - the variant's reason
            out[name] = {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}
            print(name, out[name], flush=True)
        out[name]["seconds"] = time.perf_counter() - t
    engine.retune(cache="dynamic", cuda_graphs=False, compile="off")
    return out


def eager_decoder(model: Any) -> GraphedDecoder:
    """The same decoder with no graph: each "replay" runs the step eagerly (the comparison's baseline)."""
    dec = GraphedDecoder(model)

    def capture(c: Any) -> None:
        c.graph = types.SimpleNamespace(replay=lambda: dec._step(c))

    dec._capture = capture  # type: ignore[method-assign]
    return dec


def step_times(dec: GraphedDecoder, prompts: list[list[int]], pad: int, steps: int, eos: list[int]) -> list[float]:
    import torch

    stamps: list[float] = []
    with torch.inference_mode():
        dec.decode(prompts, pad, steps, lambda t: stamps.append(time.perf_counter()), suppress=eos)
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


def timing(
    model: Any, pad: int, batches: list[int], steps: int, compile_modes: list[str], configs: list[str],
    keep: dict[str, GraphedDecoder], mla_modes: list[str], compile_mla: list[str] | None = None,
    compile_batches: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """ms per step of each decoder at each batch, with each MLA mode (absorbed ones are named ``+mla``);
    the compiled decoders only with the MLA modes of ``compile_mla`` (all when None: each compile
    takes about a minute per batch on the H200), at the batches of ``compile_batches`` (all when None)."""
    eos = eos_ids(model)
    prompts = random_prompts(max(batches), 128, int(model.config.vocab_size), seed=1)
    decoders = {
        "eager_static_step": lambda: eager_decoder(model),
        "graphs": lambda: GraphedDecoder(model),
        "graphs_sync": lambda: GraphedDecoder(model, pipeline=False),
    }
    for mode in compile_modes:
        decoders[f"graphs_compile_{mode}"] = lambda mode=mode: GraphedDecoder(model, mode)
    decoders = {k: v for k, v in decoders.items() if k in configs or k.startswith("graphs_compile_")}
    rows = []
    for (base, make), mla_mode in itertools.product(decoders.items(), mla_modes):
        compiled = base.startswith("graphs_compile_")
        if compiled and compile_mla is not None and mla_mode not in compile_mla:
            continue
        mla.set_absorbed(model, mla_mode == "absorbed")
        name = base + ("+mla" if mla_mode == "absorbed" else "")
        dec = keep[name] = make()
        for b in batches:
            if compiled and compile_batches is not None and b not in compile_batches:
                continue
            row: dict[str, Any] = {"config": name, "batch": b, "mla": mla_mode}
            try:
                t = time.perf_counter()
                step_times(dec, prompts[:b], pad, 4, eos)  # capture (and compile) here
                row["capture_s"] = time.perf_counter() - t
                gaps = step_times(dec, prompts[:b], pad, steps, eos)
                gaps.sort()
                row.update(
                    ms_per_step_p50=statistics.median(gaps),
                    ms_per_step_p90=gaps[int(0.9 * (len(gaps) - 1))],
                    ms_per_step_min=gaps[0],
                    tok_s=b * 1000 / statistics.median(gaps),
                )
            except Exception as exc:  # noqa: BLE001 - the row's reason
                row["error"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            print(row, flush=True)
            rows.append(row)
    return {"dtype": str(model.dtype), "steps": steps, "rows": rows}


def profile(
    model: Any, pad: int, batches: list[int], configs: list[str], made: dict[str, GraphedDecoder]
) -> dict[str, Any]:
    """Where a decode step's time goes, eager and graphed (the timing's decoders reused: no second compile)."""
    import torch
    from torch.profiler import ProfilerActivity

    eos = eos_ids(model)
    prompts = random_prompts(max(batches), 128, int(model.config.vocab_size), seed=2)
    out: dict[str, Any] = {}
    for name in configs:
        if name in made:
            dec = made[name]
        elif name == "eager_static_step":
            dec = eager_decoder(model)
        elif name.startswith("graphs_compile_"):
            dec = GraphedDecoder(model, name.removeprefix("graphs_compile_"))
        else:
            dec = GraphedDecoder(model)
        steps = 10
        for b in batches:
            step_times(dec, prompts[:b], pad, 4, eos)  # capture outside the profile
            prof = torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            marks: dict[str, float] = {}

            def on_step(
                tokens: list[int], prof: Any = prof, marks: dict[str, float] = marks, steps: int = steps
            ) -> None:
                n = marks["n"] = marks.get("n", 0) + 1
                if n == 2:  # after the prefill's token and one decode step: `steps` steps profiled
                    torch.cuda.synchronize()
                    prof.start()
                    marks["t0"] = time.perf_counter()
                elif n == 2 + steps:
                    torch.cuda.synchronize()
                    marks["wall"] = time.perf_counter() - marks["t0"]
                    prof.stop()

            # Step by step while profiled: pipelined, the step after the window's first one is
            # already queued when the profiler starts, and the window would hold steps - 1 steps.
            pipelined, dec.pipeline = dec.pipeline, False
            try:
                with torch.inference_mode():
                    dec.decode(prompts[:b], pad, steps + 2, on_step, suppress=eos)
            finally:
                dec.pipeline = pipelined
            wall = marks["wall"]
            events = prof.events()
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            busy_us = sum(e.time_range.elapsed_us() for e in kernels)
            launches = sum(1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
            graph_launches = sum(1 for e in events if e.name in ("cudaGraphLaunch", "cuGraphLaunch"))
            avg = prof.key_averages()

            def top(attr: str, n: int = 12, avg: Any = avg) -> list[dict[str, Any]]:
                items = sorted(avg, key=lambda a: getattr(a, attr), reverse=True)[:n]
                return [
                    {"name": a.key[:90], "ms": round(getattr(a, attr) / 1000, 3), "calls": a.count}
                    for a in items
                    if getattr(a, attr) > 0
                ]

            out[f"{name}/b{b}"] = {
                "steps": steps,
                "wall_ms_per_step": round(wall * 1000 / steps, 3),
                "gpu_kernel_ms_per_step": round(busy_us / 1000 / steps, 3),
                "gpu_busy_fraction": round(busy_us / 1e6 / wall, 4) if wall else None,
                "kernels_per_step": round(len(kernels) / steps, 1),
                "host_kernel_launches_per_step": round(launches / steps, 1),
                "graph_launches_per_step": round(graph_launches / steps, 2),
                "top_cuda": top("self_device_time_total"),
                "top_cpu": top("self_cpu_time_total"),
            }
            print(name, b, {k: v for k, v in out[f"{name}/b{b}"].items() if not k.startswith("top")}, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="cuda-graphs")
    ap.add_argument("--model", default="random-v2-lite-shape")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-variants", default="graphs", help="graphs and/or graphs_compile, comma-separated")
    ap.add_argument("--experts-impl", default=None, help="the engine's experts_impl (float32 needs batched_mm)")
    ap.add_argument("--time-configs", default="eager_static_step,graphs")
    ap.add_argument("--check-steps", type=int, default=16)
    ap.add_argument("--check-prompt-len", type=int, default=128, help="shorter in float32 with batched_mm (memory)")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--compile", default="", help="compile modes to time with graphs, comma-separated (default)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-batches", default="1,128")
    ap.add_argument("--profile-configs", default="eager_static_step,graphs")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--mla", default="expand", choices=["expand", "absorbed"], help="the engine's mla option")
    ap.add_argument("--time-mla", default="", help="MLA modes to time, comma-separated (default: --mla)")
    ap.add_argument("--compile-mla", default="", help="MLA modes to time compiled (default: those of --time-mla)")
    ap.add_argument("--compile-batches", default="", help="batches to time compiled (default: those of --batches)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    engine = create_engine(
        {"kind": "native", "model": args.model, "accelerator": "cuda", "dtype": args.dtype, "record_routing": False,
         "experts_impl": args.experts_impl, "mla": args.mla}
    )  # fmt: skip
    engine.start()
    info = engine.describe()
    print(
        f"loaded {info['model']} ({info['dtype']}) on {info['device']} in {time.perf_counter() - t:.1f} s", flush=True
    )
    meta = {"model": info["model"], "device": info["device"], "versions": info["versions"], "tuning": info["tuning"]}
    tag = args.dtype.replace("bfloat16", "bf16").replace("float32", "fp32")
    if args.check:
        res = check(engine, args.check_steps, [v for v in args.check_variants.split(",") if v], args.check_prompt_len)
        (out / f"cuda-graphs-check-{tag}.json").write_text(json.dumps({**meta, **res}, indent=1))
    batches = [int(b) for b in args.batches.split(",") if b]
    pad = engine._tokenizer.pad_token_id or 0
    decoders: dict[str, GraphedDecoder] = {}
    if args.time:
        modes = [m for m in args.compile.split(",") if m]
        mla_modes = [m for m in (args.time_mla or args.mla).split(",") if m]
        compile_mla = [m for m in args.compile_mla.split(",") if m] or None
        configs = args.time_configs.split(",")
        compile_batches = [int(b) for b in args.compile_batches.split(",") if b] or None
        res = timing(
            engine.model, pad, batches, args.steps, modes, configs, decoders, mla_modes, compile_mla, compile_batches
        )
        mla.set_absorbed(engine.model, args.mla == "absorbed")
        (out / f"cuda-graphs-time-{tag}.json").write_text(json.dumps({**meta, **res}, indent=1))
    if args.profile:  # the decoders timed last are reused: their MLA mode is the last of --time-mla
        pb = [int(b) for b in args.profile_batches.split(",") if b]
        res = profile(engine.model, pad, pb, [c for c in args.profile_configs.split(",") if c], decoders)
        (out / f"cuda-graphs-profile-{tag}.json").write_text(json.dumps({**meta, **res}, indent=1))
    engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The book's tuning advice (8.4.2-8.4.3) measured: an ablation of the native engine's options.

Loads the model once (``random-v2-lite-shape`` on CUDA by default: DeepSeek-V2-Lite's shape,
random bf16 weights) and, for each configuration and each batch size, retunes the loaded
engine (:meth:`engines.native.NativeEngine.retune`), warms it up with one batch of the same
shapes (compile and capture happen there: timed as ``warm-up s``), then measures one run of
``batch`` requests in flight with the native engine's static batching (``batch_size`` =
``batch``; batch 1 is the unbatched engine) through the CLI's own runner: 128 tokens in, 64
out, greedy, exact lengths.

Per row: ms per decode step (the gaps between a sequence's tokens, ITL, p50 with p90/p99;
TPOT p50 beside it), output tokens/s, TTFT p50/p99, torch's
peak memory, the warm-up time, the memory-bound limit at that batch (:mod:`bench.metrics.run_limits`) and
whether the greedy tokens of four fixed prompts equal the baseline's generated alone (the
first position where they differ otherwise: batched bf16 kernels may round differently).

Prints a markdown table, writes ``results.json`` and the runs as bundles in one
``bundles.tar.gz`` (``python -m bench import`` each). Usage (on the GPU)::

    python -m bench tune --out DIR [--configs baseline,static_cache] [--batches 1,8,32,128]

A configuration that cannot apply or fails (out of memory, say) is a row with its one-line
reason; ``--budget-s`` stops before a row that would start past the budget. Under
``MOEBENCH_GRAPH_PIPELINE=off`` the CUDA-graph rows are named ``NAME_sync`` (the step-by-step
graph loop), so they stand beside the pipelined rows rather than replace them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.analysis.tuning import ARTIFACT_TUNING_CHECK, CHECK_FIELDS, CONFIGS, run_name
from bench.config import RunConfig
from bench.metrics.records import RequestRecord
from bench.metrics.run_limits import for_run_or_reason
from bench.run.artifacts import ARTIFACT_GC
from bench.run.manager import start_run
from bench.store import Store
from engines.base import GenerationRequest, SamplingParams, create_engine
from engines.batching import left_pad

CHECK_PROMPTS = 4  # prompts whose greedy tokens are compared with the baseline's
LOGIT_STEPS = 8  # greedy steps whose logits are compared with the baseline's alone


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def _generate_all(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Every prompt at once (one batch when batching), greedy: each one's token ids."""
    out: list[list[int]] = [[] for _ in prompts]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        req = GenerationRequest(
            f"w{i}", "", SamplingParams(max_tokens=max_tokens, temperature=0.0), prompt_token_ids=tuple(prompts[i])
        )
        try:
            for chunk in engine.stream(req):
                out[i].extend(chunk.token_ids or ())
        except BaseException as exc:  # noqa: BLE001 - reported as the row's reason
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def _step_logits(engine: Any, prompts: list[list[int]], steps: int) -> Any:
    """Greedy logits of ``prompts`` decoded together (left-padded), through ``generate`` with the
    engine's tuning (kernels, cache, compile), or through its captured CUDA graphs with
    ``cuda_graphs``: a float32 tensor [prompts, steps, vocab]."""
    import torch

    model, tok = engine.model, engine._tokenizer
    dev = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if getattr(engine, "_graphed", None) is not None:
        eos = model.generation_config.eos_token_id
        eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        with torch.inference_mode():  # min_new_tokens = steps, as below: EOS suppressed
            kept = engine._graphed.decode(prompts, pad, steps, lambda t: None, suppress=eos_ids, keep_logits=True)
        return torch.stack(kept, 1).float()
    rows, masks = left_pad(prompts, pad)  # as the engine pads a batch
    ids, mask = torch.tensor(rows, device=dev), torch.tensor(masks, device=dev)
    kwargs: dict[str, Any] = {
        "max_new_tokens": steps, "min_new_tokens": steps, "do_sample": False, "temperature": None, "top_p": None,
        "top_k": None, "output_logits": True, "return_dict_in_generate": True, "pad_token_id": pad,
    }  # fmt: skip
    if engine.options.cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    return torch.stack(out.logits, 1).float().cpu()


def _logits_check(got: Any, ref: Any) -> dict[str, Any]:
    """How far a configuration's logits are from the baseline's alone: the largest |difference| at
    the first step (the prompt's), and over the decode steps up to the first one whose greedy
    token differs (after it the two continue from different tokens); with the median gap
    between the top two logits of the reference at step 0 (random weights leave near ties, so
    a small numeric difference can flip a greedy token)."""
    step0 = float((got[:, 0] - ref[:, 0]).abs().max())
    agree = got.argmax(-1) == ref.argmax(-1)  # [prompts, steps]
    same_steps = int(agree.all(0).long().cumprod(0).sum())  # leading steps where every prompt agrees
    upto = max(1, same_steps)
    decode = float((got[:, :upto] - ref[:, :upto]).abs().max())
    top2 = ref[:, 0].topk(2, dim=-1).values
    return {
        "logits_max_abs_diff_step0": step0,
        "logits_max_abs_diff_agreeing_steps": decode,
        "steps_all_tokens_agree": same_steps,
        "ref_top2_gap_median": float((top2[:, 0] - top2[:, 1]).median()),
        "ref_logit_abs_max": float(ref.abs().max()),
    }


def _match(got: list[list[int]], ref: list[list[int]]) -> str:
    """ "4/4" or "2/4 (first difference at token 17)"."""
    same = sum(g == r for g, r in zip(got, ref, strict=False))
    text = f"{same}/{len(ref)}"
    firsts = [
        next((k for k, (a, b) in enumerate(zip(g, r, strict=False)) if a != b), min(len(g), len(r)))
        for g, r in zip(got, ref, strict=False)
        if g != r
    ]
    return text + (f" (first difference at token {min(firsts)})" if firsts else "")


def find_stalls(records: list[RequestRecord], step_p50: float | None, floor_ms: float = 100.0) -> list[dict[str, Any]]:
    """The run's stalls: token gaps over ``floor_ms`` and 4x the median step, overlapping gaps
    merged into one stall, with when it began, how long the longest gap was and how many
    sequences waited in it: a stall every sequence shares is the engine's or the measuring
    process's (a capture, a GC pause), not one request's."""
    limit = max(floor_ms, 4 * (step_p50 or 0.0))
    gaps = sorted(
        (a, b, i + 1, r.request_id)
        for r in records
        for i, (a, b) in enumerate(itertools.pairwise(r.chunk_times_s))
        if (b - a) * 1000.0 > limit
    )
    found: list[dict[str, Any]] = []
    end = float("-inf")
    for a, b, step, rid in gaps:
        if a > end:  # a new stall: this gap began after every gap so far had ended
            found.append({"t_s": round(a, 3), "step": step, "ms_max": 0.0, "sequences": set()})
        hit = found[-1]
        hit["sequences"].add(rid)
        hit["ms_max"] = round(max(hit["ms_max"], (b - a) * 1000.0), 1)
        end = max(end, b)
    return [{**h, "sequences": len(h["sequences"])} for h in found[:20]]


def _parser() -> argparse.ArgumentParser:
    """``python -m bench tune``'s flags."""
    ap = argparse.ArgumentParser(
        prog="python -m bench tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="native-tuning")
    ap.add_argument("--model", default="random-v2-lite-shape")
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument(
        "--configs",
        default="baseline,experts_eager,experts_batched_mm,attn_eager,static_cache",
        help="comma-separated; NAME@1+128 runs that one at those batches only",
    )
    ap.add_argument("--best", default="", help="one more row: options KEY=VALUE,KEY=VALUE (the best combination)")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat every row this many times, the order reversed every other round (ABBA: an even number "
        "balances the order), runs named -r<k>",
    )
    ap.add_argument(
        "--table", nargs="*", metavar="RESULTS", help="print the table of results.json files (later rows win) and stop"
    )
    return ap


def _print_tables(paths: list[str]) -> None:
    """The table of results.json files (later rows win; each round a row of its own)."""
    merged: dict[tuple[str, int, int | None], dict[str, Any]] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text())["rows"]:
            key = (r["config"], r["batch"], r.get("round"))
            if "error" not in r or key not in merged:
                merged[key] = r
    print(table(list(merged.values())))
    if any("round" in r for r in merged.values()):
        print("\n" + rounds_table(list(merged.values())))


def _measure_row(
    engine: Any,
    store: Store,
    args: argparse.Namespace,
    engine_opts: dict[str, Any],
    name: str,
    batch: int,
    changes: dict[str, Any],
    tag: dict[str, Any],
    prompts: list[list[int]],
    ref: list[list[int]],
    ref_logits: Any,
) -> dict[str, Any]:
    """One row of the ablation: the engine retuned to ``changes`` at ``batch``, warmed up, checked
    against the baseline's greedy tokens and logits, then one measured run; a failure is the row's
    one-line ``error`` (the ablation goes on)."""
    row: dict[str, Any] = {"config": name, "batch": batch, **tag, "options": changes}
    try:
        engine.retune(
            **{
                **{k: None for k in ("experts_impl", "attn_impl")},
                "cache": "dynamic",
                "compile": "off",
                "inference_mode": True,
                "cudnn_benchmark": False,
                "cuda_graphs": False,
                "mla": "expand",
                "router": "transformers",
                **changes,
                "batch_size": batch,
                "batch_wait_ms": 200.0,
                "capture_sizes": str(batch),
            }
        )  # fmt: skip  (the row's own batch shape only)
        row["tuning"] = engine.tuning()
        if row["tuning"].get("cuda_graphs_pipelined") is False:  # MOEBENCH_GRAPH_PIPELINE=off
            row["config"] = f"{name}_sync"  # the step-by-step graph loop: rows of its own
        t = time.perf_counter()
        warm = _generate_all(engine, prompts[:batch], args.output_len)  # compile/capture happen here
        row["warmup_s"] = time.perf_counter() - t
        row["greedy_match"] = _match(warm[:CHECK_PROMPTS], ref[: min(batch, CHECK_PROMPTS)])
        n = min(batch, CHECK_PROMPTS)
        row.update(_logits_check(_step_logits(engine, prompts[:n], LOGIT_STEPS), ref_logits[:n]))
        cfg = RunConfig.build(
            engine={
                **engine_opts,
                "record_routing": False,
                **changes,
                "batch_size": batch,
                "capture_sizes": str(batch),
            },
            mode="concurrency",
            workload={"source": "random", "input_len": args.input_len, "output_len": args.output_len},
            requests=batch if batch > 1 else 3,  # batch 1: three requests one after another
            concurrency=batch,
            warmup=0,
            name=run_name(row["config"], batch, tag.get("round")),
        )
        formed = len(engine._batcher.batches) if engine._batcher is not None else 0
        captured = engine.tuning().get("cuda_graphs_captured")
        snap = start_run(cfg, store, engine=engine).wait(600)
        if engine._batcher is not None:  # how the run's requests were batched (a stall's suspects)
            row["run_batches"] = list(engine._batcher.batches[formed:])
        if captured is not None:  # graphs captured during the measured run (each one a stall)
            row["run_captures"] = engine.tuning()["cuda_graphs_captured"] - captured
        if getattr(engine._graphed, "compile_mode", "off") != "off":  # a "compiled" row that is not, wholly
            sizes = set(row.get("run_batches") or [batch])  # the measured run's batch shapes
            row["uncompiled_shapes"] = sum(b in sizes for b, _ in engine._graphed.uncompiled)
        s = snap.summary
        if snap.status != "completed" or s is None:
            raise RuntimeError(snap.error or snap.status)
        run = store.get_run(snap.run_id)  # type: ignore[arg-type]
        lim = for_run_or_reason(run.config, run.engine_info, s, run.accelerator) if run else "no run"
        row.update(
            run_id=snap.run_id,
            tpot_ms_p50=s.tpot_ms.p50,
            step_ms_p50=s.itl_ms.p50,  # the gaps between a sequence's tokens: one decode step each
            step_ms_p90=s.itl_ms.p90,
            step_ms_p99=s.itl_ms.p99,
            output_tok_s=s.output_throughput_tok_s,
            ttft_ms_p50=s.ttft_ms.p50,
            ttft_ms_p99=s.ttft_ms.p99,
            peak_memory_gib=s.peak_memory_gib,
            device_util_pct=s.device_util_pct,
            hbm_limit_ms=None if isinstance(lim, str) else lim.tpot_limit_ms,
            limit_pct=None if isinstance(lim, str) else lim.tpot_pct,
        )
        row["stalls"] = find_stalls(store.records(snap.run_id), s.itl_ms.p50)
        gc_found = store.artifact(snap.run_id, ARTIFACT_GC) or {}
        row["gc"] = {k: gc_found.get(k) for k in ("collections", "max_ms", "max_generation", "frozen_objects")}
        store.put_artifact(snap.run_id, ARTIFACT_TUNING_CHECK, {k: row.get(k) for k in CHECK_FIELDS})
    except BaseException as exc:  # one row's reason; the ablation goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        row["error"] = f"{type(exc).__name__}: {first}"
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    return row


def _export_bundles(store: Store, out: Path, run_ids: list[int]) -> None:
    """The measured runs as bundles, in OUT/bundles.tar.gz."""
    with tarfile.open(out / "bundles.tar.gz", "w:gz") as tar:
        for run_id in run_ids:
            run = store.get_run(run_id)
            path = out / f"{run.name if run else run_id}.json"
            path.write_text(json.dumps(store.export_bundle(run_id)))
            tar.add(path, arcname=path.name)
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {args.rounds})")
    if args.table:
        _print_tables(args.table)
        return 0
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(out / "tuning.sqlite")
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    configs: dict[str, dict[str, Any]] = {}
    only: dict[str, list[int]] = {}  # NAME@1+128: that configuration at those batches only
    for item in (c.strip() for c in args.configs.split(",") if c.strip()):
        name, _, at = item.partition("@")
        configs[name] = CONFIGS[name]
        if at:
            only[name] = [int(b) for b in at.split("+")]
    if args.best:
        configs["best"] = {k: json.loads(v) if v[:1] in "0123456789tf" else v
                           for k, _, v in (kv.partition("=") for kv in args.best.split(","))}  # fmt: skip
    engine_opts = {"kind": "native", "model": args.model, "accelerator": args.accelerator, "dtype": args.dtype}
    t = time.perf_counter()
    engine = create_engine({**engine_opts, "record_routing": False})
    engine.start()
    info = engine.describe()
    took = time.perf_counter() - t
    print(f"loaded {info['model']} on {info['device']} in {took:.1f} s; {info['tuning']}", flush=True)
    vocab = int(info["model_config"]["vocab_size"])
    most = max([*batches, *(b for bs in only.values() for b in bs), CHECK_PROMPTS])
    prompts = random_prompts(most, args.input_len, vocab)
    ref = [_generate_all(engine, [p], args.output_len)[0] for p in prompts[:CHECK_PROMPTS]]
    import torch

    ref_logits = torch.cat([_step_logits(engine, [p], LOGIT_STEPS) for p in prompts[:CHECK_PROMPTS]])
    rows: list[dict[str, Any]] = []
    run_ids: list[int] = []
    plan = [(name, batch) for name in configs for batch in only.get(name, batches)]
    for round_ in range(1, args.rounds + 1):
        for name, batch in plan if round_ % 2 else plan[::-1]:  # ABBA: every other round reversed
            tag = {"round": round_} if args.rounds > 1 else {}
            if time.monotonic() - started > args.budget_s:
                rows.append({"config": name, "batch": batch, **tag, "error": "not run: past the time budget"})
                continue
            row = _measure_row(
                engine, store, args, engine_opts, name, batch, configs[name], tag, prompts, ref, ref_logits
            )
            if "run_id" in row:
                run_ids.append(row["run_id"])
            rows.append(row)
            print(row_line(row), flush=True)
            # written after every row: a run killed by its time limit keeps what it measured (runs: tuning.sqlite)
            (out / "results.json").write_text(json.dumps({"engine": info, "rows": rows}, indent=1, default=str))
    engine.stop()
    _export_bundles(store, out, run_ids)
    print("\n" + table(rows))
    if args.rounds > 1:
        print("\n" + rounds_table(rows))
    return 0


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def row_line(row: dict[str, Any]) -> str:
    where = f"{row['config']:<24} b={row['batch']:<4}" + (f" r{row['round']}" if "round" in row else "")
    if "error" in row:
        return f"{where} {row['error']}"
    return (
        f"{where} step {_fmt(row['step_ms_p50'])} ms "
        f"(p99 {_fmt(row['step_ms_p99'])}), {_fmt(row['output_tok_s'])} tok/s, TTFT {_fmt(row['ttft_ms_p50'])} ms, "
        f"peak {_fmt(row['peak_memory_gib'])} GiB, warm-up {_fmt(row['warmup_s'])} s, greedy {row['greedy_match']}, "
        f"logits |d| {_fmt(row.get('logits_max_abs_diff_step0'), '.3g')} (top-2 gap "
        f"{_fmt(row.get('ref_top2_gap_median'), '.3g')}), {row.get('steps_all_tokens_agree')} steps agree"
        + stall_text(row)
    )


def stall_text(row: dict[str, Any]) -> str:
    """The row's stalls, GC and mid-run captures in a few words (what a p99 far above p50 was)."""
    parts = []
    stalls = row.get("stalls") or []
    if stalls:
        worst = max(stalls, key=lambda h: h["ms_max"])
        parts.append(
            f"{len(stalls)} stall(s), worst {worst['ms_max']:.0f} ms at {worst['t_s']:.2f} s "
            f"(step {worst['step']}, {worst['sequences']} sequences)"
        )
    gc_max = (row.get("gc") or {}).get("max_ms")
    if gc_max is not None:
        parts.append(f"GC max {gc_max:.0f} ms")
    if row.get("run_captures") is not None:
        parts.append(f"{row['run_captures']} capture(s) during the run")
    if row.get("uncompiled_shapes"):
        parts.append(f"{row['uncompiled_shapes']} shape(s) captured uncompiled (torch's recompile limit)")
    return "; " + ", ".join(parts) if parts else ""


def table(rows: list[dict[str, Any]]) -> str:
    """The study's table (studies/native-tuning.md): one row per configuration and batch."""
    head = (
        "| config | batch | ms/step p50 (p99) | output tok/s | TTFT p50 ms | peak GiB | warm-up s | memory limit ms "
        "| greedy = baseline | logits max abs diff (step 0 / agreeing steps) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in rows:
        r = {**r, "config": r["config"] + (f" (round {r['round']})" if "round" in r else "")}
        if r.get("uncompiled_shapes"):  # its compile label overstates: say so in the row itself
            r["config"] += f" ({r['uncompiled_shapes']} shape(s) uncompiled)"
        if "error" in r:
            reason = r["error"] if len(r["error"]) <= 90 else r["error"][:88] + "…"
            lines.append(f"| {r['config']} | {r['batch']} | {reason} | | | | | | | |")
            continue
        lines.append(
            f"| {r['config']} | {r['batch']} | {_fmt(r['step_ms_p50'])} ({_fmt(r['step_ms_p99'])}) "
            f"| {_fmt(r['output_tok_s'], ',.0f')} | {_fmt(r['ttft_ms_p50'], ',.0f')} | {_fmt(r['peak_memory_gib'])} "
            f"| {_fmt(r['warmup_s'])} | {_fmt(r['hbm_limit_ms'], '.2f')} | {r['greedy_match']} "
            f"| {_fmt(r.get('logits_max_abs_diff_step0'), '.3g')} / "
            f"{_fmt(r.get('logits_max_abs_diff_agreeing_steps'), '.3g')} "
            f"({r.get('steps_all_tokens_agree', '-')} steps) |"
        )
    return "\n".join(lines)


def _spread(values: list[float], spec: str = ",.0f") -> str:
    """'median (min-max)' of a few rounds; of an even count the lower middle one (as the Tuning page shows)."""
    return f"{format(statistics.median_low(values), spec)} ({format(min(values), spec)}-{format(max(values), spec)})"


def rounds_table(rows: list[dict[str, Any]]) -> str:
    """A repeated ablation (``--rounds``, ABBA order) in one table: per configuration and batch the
    median over the rounds with the lowest and highest beside it, and each configuration's output
    tokens/s against the first configuration's at that batch in the same round (the side-by-side
    ratio, which the machine's drift between rounds moves less than the absolute figures)."""
    done = [r for r in rows if "error" not in r and "round" in r]
    firsts: dict[int, str] = {}  # per batch: the configuration that ran first in round 1
    for r in done:
        if r["round"] == 1:
            firsts.setdefault(r["batch"], r["config"])
    by_round = {(r["config"], r["batch"], r["round"]): r for r in done}
    lines = [
        "| config | batch | rounds | output tok/s median (min-max) | ms/step p50 | ms/step p99 | TTFT p50 ms "
        "| tok/s vs first config, same round |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config, batch in dict.fromkeys((r["config"], r["batch"]) for r in done):
        mine = [r for r in done if (r["config"], r["batch"]) == (config, batch)]
        ratios = [
            r["output_tok_s"] / base["output_tok_s"]
            for r in mine
            if batch in firsts and (base := by_round.get((firsts[batch], batch, r["round"]))) and base["output_tok_s"]
        ]
        p50, p99 = _spread([r["step_ms_p50"] for r in mine], ".1f"), _spread([r["step_ms_p99"] for r in mine], ".1f")
        lines.append(
            f"| {config} | {batch} | {len(mine)} | {_spread([r['output_tok_s'] for r in mine])} | {p50} | {p99} "
            f"| {_spread([r['ttft_ms_p50'] for r in mine])} "
            f"| {_spread(ratios, '.3f') if ratios and config != firsts.get(batch) else '-'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

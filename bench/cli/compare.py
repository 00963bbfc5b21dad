"""``python -m bench compare-engines ...`` and ``python -m bench offline ...``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.analysis.compare import compare_engines, format_compare, run_offline_workload
from bench.cli.common import open_store
from bench.config import RunConfig
from bench.store import Store


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``compare-engines`` (same names as ``run``)."""
    p.add_argument("--model", default="tiny-deepseek-v3")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mode", default="concurrency", choices=("latency", "concurrency"))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=RunConfig.model_fields["warmup"].default)
    p.add_argument("--base-url", help="use a running vLLM server instead of launching one")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE (cpu)")
    p.add_argument(
        "--native-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a native engine option (repeatable), e.g. cuda_graphs=true",
    )
    p.add_argument(
        "--vllm-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a vLLM engine option (repeatable), e.g. enforce_eager=false",
    )
    p.add_argument("--name", help="name prefix of the two runs (NAME-native, NAME-vllm)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_opts(items: list[str], flag: str) -> dict[str, Any]:
    """KEY=VALUE items as a dict (values read as JSON where they parse)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{flag} takes KEY=VALUE, got '{item}'")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def cmd_compare_engines(args: argparse.Namespace, store: Store) -> int:
    config = RunConfig.build(
        engine={"kind": "native", "model": args.model, "accelerator": args.accelerator, "dtype": args.dtype},
        mode=args.mode,
        workload={"source": "random", "input_len": args.input_len, "output_len": args.output_len, "seed": args.seed},
        requests=args.requests,
        concurrency=args.concurrency,
        warmup=args.warmup,
        sample_interval_s=0.25,  # finer KV-cache sampling: short runs would miss their peak
    )
    vopts: dict[str, Any] = {"cpu_kvcache_space_gib": args.kv_cache_gib, **parse_opts(args.vllm_opt, "--vllm-opt")}
    if args.base_url:
        vopts["base_url"] = args.base_url

    def progress(msg: str, frac: float) -> None:
        print(f"[{frac * 100:5.1f}%] {msg}", file=sys.stderr, flush=True)

    native = parse_opts(args.native_opt, "--native-opt")
    result = compare_engines(config, store, vopts, progress=progress, native_engine=native, name=args.name)
    print(json.dumps(result.as_dict(), indent=2) if args.json else format_compare(result))
    return 0 if not result.notes else 1


def add_offline_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``offline``."""
    p.add_argument("--model", default="tiny-deepseek-v3")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE (cpu)")
    p.add_argument("--json", action="store_true")


def cmd_offline(args: argparse.Namespace) -> int:
    engine = {
        "model": args.model,
        "accelerator": args.accelerator,
        "dtype": args.dtype,
        "cpu_kvcache_space_gib": args.kv_cache_gib,
    }
    res = run_offline_workload(engine, args.requests, args.input_len, args.output_len, args.seed)
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
    else:
        print(
            f"Throughput: {res.requests_per_s:.2f} requests/s, {res.total_tok_s:.2f} total tokens/s, "
            f"{res.output_tok_s:.2f} output tokens/s  ({res.requests} requests, {res.elapsed_s:.3f} s; "
            f"load {res.load_seconds:.1f} s; vLLM {res.vllm_version})"
        )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    return cmd_compare_engines(args, open_store(args))

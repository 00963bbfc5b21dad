"""``python -m bench run | runs | export | import | model | engines | accelerators``: one run with a
progress bar and its summary, the stored runs, their CSVs and bundles, and what can run here."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    fmt_ms,
    format_summary,
    open_store,
    run_config_data,
)
from bench.config import RunConfig
from bench.metrics.run_limits import RunLimits
from bench.report.csv_export import operators_csv, requests_csv, summary_csv
from bench.run.artifacts import (
    ARTIFACT_COMMUNICATION,
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_GC,
    ARTIFACT_LIMITS,
    ARTIFACT_LOAD_GENERATORS,
    ARTIFACT_PREPARE,
)
from bench.run.gc_watch import note as gc_note
from bench.run.job import Job
from bench.run.manager import start_run
from bench.store import Store
from engines.errors import ConfigError, MoEBenchError


def _bar(snap: Any, width: int = 30) -> str:
    frac = snap.fraction
    filled = int(width * frac)
    s = snap.summary
    extra = ""
    if s is not None and s.completed:
        extra = f"  {s.output_throughput_tok_s:7.1f} tok/s  TTFT p50 {fmt_ms(s.ttft_ms.p50)}"
    if snap.status == "loading":
        return f"\r{snap.phase[:70]:<70}"
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {snap.done}/{snap.total}  failed {snap.failed}{extra}   "


def format_profile(store: Store, run_id: int, top: int = 12) -> str:
    """The bottleneck breakdown and the top operators of a profile run, as text."""
    from bench.run.artifacts import ARTIFACT_BREAKDOWN, ARTIFACT_OPERATORS

    lines = []
    bd = store.artifact(run_id, ARTIFACT_BREAKDOWN)
    if bd and bd.get("note") and not bd.get("rows"):
        lines.append(f"\nbreakdown     {bd['note']}")
    elif bd:
        lines.append(f"\nbottleneck breakdown (share of {bd['basis']} time, total {bd['total_ms']:.1f} ms)")
        lines.append(f"  {'category':<16}{'cpu ms':>10}{'device ms':>11}{'share':>9}")
        for row in bd["rows"]:
            dev = "-" if row.get("device_ms") is None else f"{row['device_ms']:.2f}"
            lines.append(f"  {row['category']:<16}{row['cpu_ms']:>10.2f}{dev:>11}{row['share_pct']:>8.1f}%")
    ops = store.artifact(run_id, ARTIFACT_OPERATORS) or []
    if ops:
        key = "self_device_ms" if any(o["self_device_ms"] for o in ops) else "self_cpu_ms"
        lines.append(f"\ntop operators by {key}")
        lines.append(f"  {'operator':<40}{'calls':>8}{'self cpu ms':>13}{'self dev ms':>13}  input shapes")
        for o in sorted(ops, key=lambda o: o[key], reverse=True)[:top]:
            lines.append(
                f"  {o['operator'][:40]:<40}{o['calls']:>8}{o['self_cpu_ms']:>13.2f}{o['self_device_ms']:>13.2f}"
                f"  {o['input_shapes'][:60]}"
            )
    trace = store.trace_path(run_id)
    if trace is not None:
        lines.append(f"\ntrace         {trace}  (open in Perfetto or chrome://tracing)")
    return "\n".join(lines)


def link_limit(store: Store, run_id: int) -> float | None:
    """The datasheet link bandwidth of the run's accelerator (GB/s, both ways), where the catalogue has one."""
    from bench.metrics.run_limits import link_figure

    run = store.get_run(run_id)
    info = run.engine_info if run is not None else {}
    link = link_figure(str(info.get("accelerator") or "cpu"), info)
    return link[1] if link is not None else None


def format_communication(comm: dict[str, Any], link_gb_s: float | None = None) -> str:
    """The expert all-to-alls of an expert-parallel run (the ``communication`` artifact), as text."""
    n = comm.get("moe_layer_exchanges") or 0
    per = comm.get("bytes_per_exchange")
    head = (
        f"communication expert parallel over {comm['world']} ranks ({comm['backend']}): {n:,} MoE layer exchanges, "
        f"{comm['bytes'] / 1e6:,.3f} MB sent in all" + (f", {per / 1e3:,.1f} kB per exchange" if per else "")
    )
    limit = f" (link {link_gb_s:g} GB/s both ways)" if link_gb_s else ""
    lines = [head, f"  {'rank':<6}{'sent MB':>10}{'recv MB':>10}{'a2a ms':>10}{'experts ms':>12}{'GB/s' + limit:>10}"]
    for r in comm.get("ranks", []):
        rate = "-" if r.get("a2a_gbps") is None else f"{r['a2a_gbps']:.4g}"
        lines.append(
            f"  {r['rank']:<6}{r['sent_bytes'] / 1e6:>10.3f}{r['recv_bytes'] / 1e6:>10.3f}{r['seconds'] * 1e3:>10.2f}"
            f"{r['expert_seconds'] * 1e3:>12.2f}{rate:>10}"
        )
    lines.append("  GB/s: bytes sent and received / time inside the all-to-alls (waiting for the peers included)")
    return "\n".join(lines)


ENGINE_STOP_WAIT_S = 120.0  # how long a finished run's worker may take to stop its engine before the CLI exits


def cmd_run(args: argparse.Namespace) -> int:
    if args.repeat > 1:
        from bench.cli.sweep import repeat_run

        return repeat_run(args)
    config = RunConfig.build(**run_config_data(args))
    store = open_store(args)
    job: Job = start_run(config, store)
    tty = sys.stderr.isatty() and not args.quiet
    try:
        while not job.wait(0.25 if tty else 1.0).status not in ("pending", "loading", "running"):
            if tty:
                sys.stderr.write(_bar(job.snapshot()))
                sys.stderr.flush()
            elif not args.quiet:
                snap = job.snapshot()
                if snap.status == "running":
                    sys.stderr.write(f"progress {snap.done}/{snap.total} failed {snap.failed}\n")
        # The run is final; its worker may still be stopping the engine it started. Wait for it: a
        # thread still inside CUDA when the interpreter exits aborts the process ("terminate called
        # without an active exception", exit 134, seen on an H100 with the thread "run-1" alive).
        if not job.join(ENGINE_STOP_WAIT_S):
            sys.stderr.write(f"note: the engine was still stopping after {ENGINE_STOP_WAIT_S:.0f} s\n")
    except KeyboardInterrupt:
        job.cancel()
        snap = job.wait(10)
        if snap.active and snap.run_id is not None:
            # Still busy in a phase that does not look at the cancel flag (building a million
            # prompts): record the run as cancelled now; what was stored stays.
            store.finish_run(snap.run_id, "cancelled", error=f"cancelled (Ctrl-C) during: {snap.phase}")
        sys.stderr.write("\ncancelled; what was measured is kept\n")
        return EXIT_INTERRUPTED
    snap = job.snapshot()
    if tty:
        sys.stderr.write(_bar(snap) + "\n")
    run_id = snap.run_id
    assert run_id is not None
    if snap.summary is not None:
        print(format_summary(snap.summary))
    prepared = store.artifact(run_id, ARTIFACT_PREPARE)
    if isinstance(prepared, dict) and prepared.get("text"):
        print(f"prepared      {prepared['text']}")
    telemetry = store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY)
    if isinstance(telemetry, dict):
        for reason in telemetry.get("missing") or []:
            print(f"note          device telemetry: {reason}")
    gc_found = store.artifact(run_id, ARTIFACT_GC)
    if isinstance(gc_found, dict) and (line := gc_note(gc_found)):
        print(f"note          {line}")
    senders = store.artifact(run_id, ARTIFACT_LOAD_GENERATORS)
    if isinstance(senders, dict):
        from bench.send.ray import placement_line

        print(f"senders       {placement_line(senders)}")
    limits = store.artifact(run_id, ARTIFACT_LIMITS)
    if isinstance(limits, dict):
        if "reason" in limits:
            print(f"note          no hardware limit: {limits['reason']}")
        else:
            print(f"limit         {RunLimits.from_dict(limits).line()}")
    comm = store.artifact(run_id, ARTIFACT_COMMUNICATION)
    if isinstance(comm, dict) and comm.get("ranks"):
        print(format_communication(comm, link_limit(store, run_id)))
    if args.mode == "profile" and snap.status == "completed":
        print(format_profile(store, run_id))
    if args.csv:
        Path(args.csv).write_bytes(requests_csv(store, run_id))
    if args.summary_csv:
        Path(args.summary_csv).write_bytes(summary_csv(store, [run_id]))
    failed = snap.summary.failed if snap.summary is not None else 0
    total = snap.summary.requests if snap.summary is not None else 0
    failures = f", {failed} of {total} requests failed" if failed else ""
    print(f"run id        {run_id}  ({snap.status}{failures})")
    if snap.status != "completed":
        print(f"error: run {run_id} {snap.status}: {snap.error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if failed and not args.allow_failures:
        first = next((r.error for r in store.records(run_id) if r.error), "")
        print(
            f"error: run {run_id}: {failed} of {total} requests failed (first: {first}); --allow-failures accepts that",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED
    return EXIT_OK


MISSING = "\u2013"  # a figure a run does not have (an imported file without it), in listings


def _figure(v: object, spec: str) -> str:
    """``v`` formatted with ``spec``, or :data:`MISSING` when the run has no such figure."""
    return MISSING if not isinstance(v, int | float) else format(v, spec)


def cmd_runs(args: argparse.Namespace) -> int:
    runs = open_store(args).list_runs()
    if not runs:
        print("no runs yet")
        return EXIT_OK
    print(
        f"{'id':>4}  {'status':<11} {'mode':<11} {'engine':<8} {'model':<20} {'acc':<5} {'req':>5}"
        f" {'tok/s':>9} {'ttft p50':>9}  created"
    )
    for r in runs:
        s = r.summary
        print(
            f"{r.id:>4}  {r.status:<11} {r.mode:<11} {r.engine:<8} {r.model[:20]:<20} {r.accelerator:<5} "
            f"{_figure(s.completed if s else None, 'd'):>5} "
            f"{_figure(s.output_throughput_tok_s if s else None, '.1f'):>9} "
            f"{_figure(s.ttft_ms.p50 if s else None, '.1f'):>9}  "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.created_at))}"
        )
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    store = open_store(args)
    fmt = args.format
    if fmt is not None:  # --format chooses how a run's requests are written
        if bundle := next((f"--{n}" for n in ("sweep", "bundle") if getattr(args, n)), None):
            raise ConfigError(f"--format {fmt} does not fit {bundle}: a bundle is JSON of its own; leave --format out")
        table = next((f"--{n}" for n in ("summary", "operators") if getattr(args, n)), None)
        if table and fmt != "csv":
            raise ConfigError(f"--format {fmt} does not fit {table}: that table is CSV only; leave --format out")
    if args.sweep:
        if not args.bundle:
            raise ConfigError("--sweep exports a sweep's bundle: add --bundle (its CSV is `sweep --csv`)")
        data = json.dumps(store.export_sweep_bundle(args.run_id)).encode()
        Path(args.csv).write_bytes(data)
        print(f"wrote {args.csv} (sweep {args.run_id} bundle)")
        return EXIT_OK
    if store.get_run(args.run_id) is None:
        raise MoEBenchError(f"no run with id {args.run_id} in {store.path}")
    if args.bundle:
        data = json.dumps(store.export_bundle(args.run_id)).encode()
        Path(args.csv).write_bytes(data)
        print(f"wrote {args.csv} (run {args.run_id} bundle)")
        return EXIT_OK
    if fmt not in (None, "csv"):
        from bench.report.formats import export_run

        Path(args.csv).write_bytes(export_run(store, args.run_id, fmt))
        print(f"wrote {args.csv} ({fmt}, run {args.run_id}, {store.sample_count(args.run_id)} requests)")
        return EXIT_OK
    if args.operators:
        data = operators_csv(store, args.run_id)
    elif args.summary:
        data = summary_csv(store, [args.run_id])
    else:
        data = requests_csv(store, args.run_id)
    Path(args.csv).write_bytes(data)
    rows = data.count(b"\n") - 1
    print(f"wrote {args.csv} ({rows} rows)")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from bench.bundle import import_path

    done = import_path(open_store(args), args.path)
    if not done.new:
        print(f"{args.path} is already imported as {done.kind} {done.id} (the same content): nothing added")
    else:
        print(f"imported {args.path} as {done.kind} {done.id}")
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    from engines.models import tiny_path

    print(tiny_path())
    return EXIT_OK


def cmd_engines(args: argparse.Namespace) -> int:
    from engines.base import list_engines

    for kind, label, avail in list_engines():
        print(
            f"{kind:<10} {'available' if avail.ok else 'unavailable':<12} {label}"
            + (f": {avail.reason}" if not avail.ok else "")
        )
    return EXIT_OK


def cmd_accelerators(args: argparse.Namespace) -> int:
    from engines.accelerators import list_accelerators

    for name, label, avail in list_accelerators():
        print(
            f"{name:<5} {'available' if avail.ok else 'unavailable':<12} {label}"
            + (f": {avail.reason}" if not avail.ok else "")
        )
    return EXIT_OK

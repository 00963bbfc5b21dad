"""``python -m bench sweep | capacity | report | sweeps``: many runs, a verdict, a report.

- ``sweep``: the run flags, with ``--concurrency``, ``--request-rate`` taking lists
  (``1,2,4``, ``1..32`` doubling, ``8..64+8`` stepping), ``--lengths IN:OUT,...`` and
  ``--engine-axis KEY=V1,V2``; ``--repeats``, the early stops, ``--resume ID``.
- ``capacity``: the highest rate or concurrency within ``--slo`` (bracket, then bisect).
- ``report``: a self-contained HTML report of a run or a sweep.
- ``sweeps``: list stored sweeps and capacity searches.

A sweep or search interrupted by Ctrl-C exits 130 and says how to resume it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    open_store,
    positive,
    run_arguments,
    run_config_data,
)
from bench.report.csv_export import requests_csv, summary_csv
from bench.run.job import Job
from bench.store import Store
from bench.store.rows import RunRow
from bench.sweep.spec import CapacitySpec, SweepSpec, sweep_points
from bench.sweep.task import SweepTask
from engines.errors import ConfigError


def add_sweep_commands(sub: Any) -> None:
    sw = sub.add_parser(
        "sweep",
        help="a sweep: one run per point of a concurrency/rate/lengths grid",
        parents=[run_arguments(sweep=True)],
    )
    sw.add_argument(
        "--engine-axis",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="an engine option to sweep (repeatable), e.g. max_num_seqs=8,32,128 (vLLM's batch size); "
        "the engine restarts for each value",
    )
    sw.add_argument("--repeats", type=positive("repeats"), default=1, help="runs per point (the spread is shown)")
    sw.add_argument(
        "--stop-on-saturation", type=float, metavar="GAIN", help=_field("stop_on_saturation") + " (e.g. 0.05)"
    )
    sw.add_argument("--stop-on-errors", type=float, metavar="FRACTION", help=_field("stop_on_errors") + " (e.g. 0.1)")
    sw.add_argument(
        "--stop-on-slo-margin", type=float, metavar="MARGIN", help=_field("stop_on_slo_margin") + " (e.g. 0.5)"
    )
    sw.add_argument("--resume", type=int, metavar="SWEEP_ID", help="resume a stopped sweep (its own flags are kept)")
    _outputs(sw)
    sw.set_defaults(func=cmd_sweep)

    cap = sub.add_parser(
        "capacity", help="the highest request rate or concurrency within the SLOs", parents=[run_arguments()]
    )
    cap.add_argument(
        "--axis",
        choices=("rate", "concurrency", "speedup"),
        default=None,
        help="what to search: rate (Poisson arrivals; the default), concurrency, or speedup (a trace replayed "
        "N times faster; the default for --prompts trace)",
    )
    for flag, field in (("--start", "start"), ("--max", "maximum"), ("--step", "step")):
        cap.add_argument(
            flag,
            type=float,
            default=CapacitySpec.model_fields[field].default,
            help=_field(field, CapacitySpec) + " (default %(default)s)",
        )
    cap.add_argument(
        "--budget",
        type=positive("budget"),
        default=CapacitySpec.model_fields["budget"].default,
        help=_field("budget", CapacitySpec) + " (default %(default)s)",
    )
    cap.add_argument(
        "--max-error-rate",
        type=float,
        default=0.0,
        help=_field("max_error_rate", CapacitySpec) + " (default %(default)s)",
    )
    cap.add_argument(
        "--resume", type=int, metavar="SWEEP_ID", help="resume a stopped search from scratch under the same id"
    )
    _outputs(cap)
    cap.set_defaults(func=cmd_capacity)

    rep = sub.add_parser("report", help="a self-contained HTML report of a run or a sweep")
    rep.add_argument("target", help="a run id (12 or run:12) or a sweep id (sweep:3 or s3)")
    rep.add_argument("--html", required=True, help="write the report here")
    rep.set_defaults(func=cmd_report)

    ls = sub.add_parser("sweeps", help="list stored sweeps and capacity searches")
    ls.set_defaults(func=cmd_sweeps)


def _field(name: str, model: Any = SweepSpec) -> str:
    return (model.model_fields[name].description or "").replace("%", "%%")


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", help="write the sweep CSV (one row per run, with the swept values) here")
    p.add_argument("--html", help="write the HTML report here")
    p.add_argument("--quiet", action="store_true", help="no line per finished run")


def _engine_axis(items: list[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ConfigError(f"--engine-axis takes KEY=V1,V2,..., got '{item}'")
        values = []
        for v in raw.split(","):
            try:
                values.append(json.loads(v))
            except ValueError:
                values.append(v.strip())
        out[key.strip()] = values
    return out


def _run_line(run: RunRow) -> str:
    """One finished run of a sweep, in one line."""
    s = run.summary
    head = f"run {run.id} {run.status:<9} {run.name}"
    if s is None or not s.completed:
        return f"{head}  {run.error or ''}".rstrip()
    parts = [
        f"{s.output_throughput_tok_s:.1f} out tok/s",
        f"TTFT p50/p99 {_num(s.ttft_ms.p50)}/{_num(s.ttft_ms.p99)} ms",
        f"TPOT p50/p99 {_num(s.tpot_ms.p50)}/{_num(s.tpot_ms.p99)} ms",
    ]
    if s.slos:
        parts.append(f"goodput {s.goodput_rps or 0:.2f} req/s, SLOs {'met' if s.slo_met else 'NOT met'}")
    if s.failed:
        parts.append(f"{s.failed} failed")
    return f"{head}: " + ", ".join(parts)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _drive(task: SweepTask, args: argparse.Namespace, store: Store, outputs: bool = True) -> int:
    """Run the task to its end, a line per finished run; Ctrl-C cancels it (resumable)."""
    printed: set[int] = set()

    def on_run(job: Job) -> None:
        if not args.quiet:
            print(f"... {job.config.name}", file=sys.stderr, flush=True)

    task.on_run = on_run
    task.begin()
    try:
        while not task.join(0.5):
            _print_done(task, printed, args.quiet)
    except KeyboardInterrupt:
        task.cancel()
        task.join(30)
        print(
            f"\ninterrupted; finished runs are kept. Resume: python -m bench {task.kind} --resume {task.sweep_id}"
            + (f" --db {store.path}" if getattr(args, "db", None) else ""),
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    _print_done(task, printed, args.quiet)
    snap = task.snapshot()
    assert snap.sweep_id is not None
    if outputs:
        _write_outputs(store, snap.sweep_id, args)
    print(f"{task.kind} id      {snap.sweep_id}  ({snap.status})")
    if snap.status != "completed":
        print(f"error: {task.kind} {snap.sweep_id} {snap.status}: {snap.error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    return EXIT_OK


def _print_done(task: SweepTask, printed: set[int], quiet: bool) -> None:
    if quiet or task.sweep_id is None:
        return
    for run in task.store.sweep_runs(task.sweep_id):
        if run.id not in printed and run.status != "running":
            printed.add(run.id)
            print(_run_line(run), flush=True)


def _write_outputs(store: Store, sweep_id: int, args: argparse.Namespace) -> None:
    from bench.analysis.sweep_analysis import recommendations
    from bench.report.csv_export import sweep_csv

    row = store.get_sweep(sweep_id)
    assert row is not None
    if row.kind == "capacity":
        print(f"\ncapacity      {row.result.get('verdict', '-')}")
    else:
        points = sweep_points(store, sweep_id)
        slos = row.config.get("base", {}).get("slos") or []
        for stop in row.result.get("stopped", []):
            print(f"stopped       after {stop['after']}: {stop['reason']}")
        rec = recommendations(points, slos)
        for key in ("best", "lowest_latency", "knee"):
            item = rec.get(key)
            if isinstance(item, dict) and item.get("text"):
                print(f"{key.replace('_', ' '):<13} {item['text']}")
    if args.csv:
        Path(args.csv).write_bytes(sweep_csv(store, sweep_id))
    if args.html:
        from bench.report.html import html_report  # plotly: only when a report is asked for

        Path(args.html).write_bytes(html_report(store, f"sweep:{sweep_id}"))
        print(f"report        {args.html}")


def _resume(args: argparse.Namespace, store: Store, kind: str, spec_type: Any, what: str) -> int:
    """Run the stored sweep or search ``args.resume`` of ``kind`` again from its own config."""
    row = store.get_sweep(args.resume)
    if row is None or row.kind != kind:
        raise ConfigError(f"no {what} {args.resume} in {store.path}")
    return _drive(SweepTask(spec_type.build(**row.config), store, resume_id=row.id), args, store)


def cmd_sweep(args: argparse.Namespace) -> int:
    store = open_store(args)
    if args.resume is not None:
        return _resume(args, store, "sweep", SweepSpec, "sweep")
    base = run_config_data(args)
    data: dict[str, Any] = {
        "base": base,
        "concurrency": args.concurrency or [],
        "request_rate": args.request_rate or [],
        "lengths": args.lengths or [],
        "engine_axis": _engine_axis(args.engine_axis),
        "repeats": args.repeats,
        "stop_on_saturation": args.stop_on_saturation,
        "stop_on_errors": args.stop_on_errors,
        "stop_on_slo_margin": args.stop_on_slo_margin,
        "name": args.name,
    }
    spec = SweepSpec.build(**data)
    print(f"sweep of {len(spec.points())} point(s) x {spec.repeats} run(s)", file=sys.stderr)
    return _drive(SweepTask(spec, store), args, store)


def repeat_run(args: argparse.Namespace) -> int:
    """``run --repeat N``: the run N times as a one-point sweep (each with its own prompt seed,
    so a server's prefix cache cannot serve a repeat), then the spread of each headline figure."""
    from bench.cli.common import format_spread
    from bench.metrics.summary import spread

    store = open_store(args)
    spec = SweepSpec.repeat(run_config_data(args), args.repeat, args.name)
    print(f"{args.repeat} repeats of one run (sweep)", file=sys.stderr)
    task = SweepTask(spec, store)
    code = _drive(task, args, store, outputs=False)
    sweep_id = task.sweep_id
    runs = store.sweep_runs(sweep_id) if sweep_id is not None else []
    done = [r for r in runs if r.status == "completed" and r.summary is not None]
    if done:
        print(f"\nspread over {len(done)} completed run(s) (runs {', '.join(str(r.id) for r in done)})")
        print(format_spread(spread([r.summary for r in done if r.summary is not None])))
    ids = [r.id for r in runs]
    if args.csv and ids:
        Path(args.csv).write_bytes(requests_csv(store, ids))
    if args.summary_csv and ids:
        Path(args.summary_csv).write_bytes(summary_csv(store, ids))
    failed = sum(r.summary.failed for r in done if r.summary is not None)
    if code == EXIT_OK and failed and not args.allow_failures:
        print(f"error: {failed} requests failed over the repeats; --allow-failures accepts that", file=sys.stderr)
        return EXIT_RUN_FAILED
    return code


def cmd_capacity(args: argparse.Namespace) -> int:
    store = open_store(args)
    if args.resume is not None:
        return _resume(args, store, "capacity", CapacitySpec, "capacity search")
    spec = CapacitySpec.build(
        base=run_config_data(args),
        axis=args.axis or ("speedup" if args.prompts == "trace" else "rate"),
        start=args.start,
        maximum=args.max,
        step=args.step,
        budget=args.budget,
        max_error_rate=args.max_error_rate,
        name=args.name,
    )
    return _drive(SweepTask(spec, store), args, store)


def cmd_report(args: argparse.Namespace) -> int:
    from bench.report.html import html_report

    store = open_store(args)
    Path(args.html).write_bytes(html_report(store, args.target))
    print(f"report        {args.html}")
    return EXIT_OK


def cmd_sweeps(args: argparse.Namespace) -> int:
    store = open_store(args)
    rows = store.list_sweeps()
    if not rows:
        print("no sweeps yet")
        return EXIT_OK
    print(f"{'id':>4}  {'kind':<9} {'status':<11} {'runs':>5}  name / result")
    for r in rows:
        n = len(store.sweep_runs(r.id))
        what = r.result.get("verdict") if r.kind == "capacity" else r.name
        print(f"{r.id:>4}  {r.kind:<9} {r.status:<11} {n:>5}  {what or ''}")
    return EXIT_OK

"""``python -m bench`` (or ``moebench``): the headless face of MoE Bench, over the same API as the dashboard.

Commands: ``run`` (a benchmark with a progress bar, then a summary), ``runs`` (list),
``sweep``, ``capacity``, ``report`` and ``sweeps`` (:mod:`bench.cli.sweep`),
``export`` (CSV), ``import`` (a run bundle), ``routing`` (a run's routing on an EP deployment,
:mod:`bench.cli.routing`), ``model tiny`` (build the tiny checkpoint), ``engines`` and
``accelerators`` (what is usable here, and why not), ``compare-engines`` and ``offline``
(:mod:`bench.cli.compare`), ``stub`` (a zero-compute OpenAI server, :mod:`bench.stub_server`) and
``tune`` (the native engine's tuning ablation, :mod:`bench.analysis.tuning_ablation`). Every user error
prints one line ``error: <reason>`` on stderr and exits with status 2 (1 for a failed run)."""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from bench.cli.common import EXIT_USAGE, Parser, positive, run_arguments
from bench.cli.compare import cmd_compare, cmd_offline
from bench.cli.run import cmd_accelerators, cmd_engines, cmd_export, cmd_import, cmd_model, cmd_run, cmd_runs
from engines.errors import MoEBenchError
from engines.settings import get_settings

# Commands with their own parser: everything after the name is theirs.
PASSTHROUGH = {
    "stub": "a zero-compute streaming OpenAI server (tests, client benchmarks): --port, --itl-ms, --processes",
    "tune": "the native engine's tuning ablation (a GPU; what the Tuning page launches): --configs, --batches",
    "trace": "timestamped traces: synth (write a Mooncake-format trace), info (what a trace holds)",
}


def run_tool(name: str, argv: list[str]) -> int:
    """Run a command that parses its own arguments (``stub``, ``tune``)."""
    if name == "stub":
        from bench.stub_server import main as stub_main

        return stub_main(argv)
    if name == "trace":
        from bench.trace import main as trace_main

        return trace_main(argv)
    from bench.analysis.tuning_ablation import main as tune_main

    return tune_main(argv)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench", description="MoE Bench: benchmark DeepSeek MoE models on real engines.")
    p.add_argument("--db", help="SQLite results file (default: $MOEBENCH_DB_PATH or data/moebench.sqlite)")
    # --db is accepted before or after the command (`run ... --db PATH`, as in docs/cli.md)
    db_parent = argparse.ArgumentParser(add_help=False)
    db_parent.add_argument("--db", default=argparse.SUPPRESS, help="SQLite results file")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add = sub.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return _add(name, parents=[db_parent, *kw.pop("parents", [])], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]

    r = sub.add_parser("run", help="run a benchmark", parents=[run_arguments()])
    r.add_argument("--csv", help="write the per-request CSV here")
    r.add_argument("--summary-csv", help="write the one-row summary CSV here")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--allow-failures",
        action="store_true",
        help="exit 0 when the run completed but some requests failed (default: exit 1, the failures are kept)",
    )
    r.add_argument(
        "--repeat",
        type=positive("repeat"),
        default=1,
        metavar="N",
        help="run it N times (each with its own prompt seed, stored as one sweep) and print the spread of each "
        "headline figure: min / median / max and the coefficient of variation",
    )

    from bench.cli.sweep import add_sweep_commands

    add_sweep_commands(sub)

    sub.add_parser("runs", help="list stored runs")

    e = sub.add_parser(
        "export", help="export a run as CSV, vLLM JSON, Parquet or JSON Lines, or a run or a sweep as a bundle"
    )
    e.add_argument("run_id", type=int, help="the run's id (the sweep's with --sweep)")
    e.add_argument("--csv", "--out", dest="csv", required=True, help="output file")
    e.add_argument("--summary", action="store_true", help="the one-row summary instead of per-request rows")
    e.add_argument("--operators", action="store_true", help="a profile run's operator table")
    e.add_argument("--bundle", action="store_true", help="the whole run as JSON (for `import`)")
    e.add_argument("--sweep", action="store_true", help="with --bundle: the sweep with this id and all its runs")
    from bench.report.formats import EXPORT_FORMATS

    e.add_argument(
        "--format",
        choices=("csv", *EXPORT_FORMATS),
        help="how the run's requests are written (default csv): "
        + "; ".join(f"{f.name}: {f.help}" for f in EXPORT_FORMATS.values()),
    )

    i = sub.add_parser("import", help="import a run or sweep bundle (e.g. examples/*.json)")
    i.add_argument("path")

    m = sub.add_parser("model", help="model utilities")
    m.add_argument("action", choices=("tiny",), help="tiny: build the tiny DeepSeek-V3 and print its folder")

    from bench.cli.compare import add_compare_arguments, add_offline_arguments

    add_compare_arguments(sub.add_parser("compare-engines", help="the same workload on native and vLLM, with ratios"))
    add_offline_arguments(sub.add_parser("offline", help="vLLM offline throughput (LLM.generate in a worker process)"))

    from bench.cli.routing import add_routing_arguments

    add_routing_arguments(
        sub.add_parser("routing", help="a run's expert routing on an expert-parallel deployment, with the EPLB what-if")
    )

    from bench.cli.parallel import add_a2a_arguments

    add_a2a_arguments(
        sub.add_parser("a2a", help="all-to-all bandwidth between N ranks: the link expert parallelism sends over")
    )

    for name, text in PASSTHROUGH.items():
        tool = sub.add_parser(name, help=text, add_help=False)
        tool.add_argument("args", nargs=argparse.REMAINDER, help=f"see python -m bench {name} --help")

    sub.add_parser("engines", help="list engines and whether they can run here")
    sub.add_parser("accelerators", help="list accelerators and whether they are available")
    return p


COMMANDS = {
    "run": cmd_run,
    "runs": cmd_runs,
    "export": cmd_export,
    "model": cmd_model,
    "import": cmd_import,
    "engines": cmd_engines,
    "accelerators": cmd_accelerators,
    "compare-engines": cmd_compare,
    "offline": cmd_offline,
}


# C0 controls but tab, newline and carriage return (the progress line uses it), DEL and C1
# controls: a name or a server's message holding an escape sequence must not recolour the
# terminal, set its title or move its cursor
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class _PlainText:
    """A text stream that writes control characters as ``?`` (see :data:`_CONTROL`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        return self._inner.write(_CONTROL.sub("?", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(argv: Sequence[str] | None = None) -> int:
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):  # kill -USR1 PID: every thread's stack to stderr (a run that will not end)
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (AttributeError, OSError, ValueError):  # a stderr without a file descriptor (main() called in-process)
            pass
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PlainText(out), _PlainText(err)  # type: ignore[assignment]
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err
        if get_settings().exit_threads not in ("off", "0", ""):  # which threads are alive at exit
            import threading

            alive = [f"{t.name} (daemon={t.daemon})" for t in threading.enumerate() if t is not threading.main_thread()]
            print(f"threads alive at exit: {', '.join(alive) or 'none'}", file=sys.stderr, flush=True)


def _reader_gone() -> int:
    """stdout's reader left (``bench runs | head``): stop quietly, as Unix tools do. stdout is pointed
    at /dev/null so the interpreter's last flush does not raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
    except (AttributeError, OSError, ValueError):  # no file descriptor (main() called in-process)
        pass
    return 0


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        try:
            return run_tool(argv[0], argv[1:])
        except MoEBenchError as exc:  # `tune` without CUDA: the one line, not the traceback
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:
            return _reader_gone()
    args = build_parser().parse_args(argv)
    try:
        handler = getattr(args, "func", None) or COMMANDS[args.command]
        code = int(handler(args))
        sys.stdout.flush()  # a reader that left shows here, not as the interpreter's last flush
        return code
    except MoEBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return _reader_gone()
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USAGE
    except sqlite3.DatabaseError as exc:  # a damaged results file (flipped bytes, a zeroed page)
        db = getattr(args, "db", None) or "the results file"
        print(f"error: {db} is damaged or not a MoE Bench database (SQLite: {exc})", file=sys.stderr)
        return EXIT_USAGE

"""The same run from the CLI and from the dashboard watched in Chromium: how far apart are their figures?

Issue 14 saw dashboard runs slower than the same runs from the CLI (86-167 against 236-246
output tok/s). This benchmark measures that gap today, side by side on one machine, in ABBA
order over ``--rounds`` rounds (A = CLI, B = dashboard; the order flips every round so a
drift of the machine falls on both): the native engine on the tiny model (the embedded
default, which runs in the dashboard's own process) and, with ``--engine openai``, the
zero-compute stub server (:mod:`bench.stub_server`), whose requests go out from a
sender process.

The dashboard run is started from its page and watched live to the end (the live fragment
redraws its charts once a second), as a user at a demo would. The CLI run is
``python -m bench run`` with the same workload. Both write to their own SQLite file; the
figures are read back from there. Prints each run's output tok/s, TTFT and TPOT p50/p99 and
the disturbance flag, then the dashboard/CLI ratio of each figure: median and range over the
rounds. Figures, not a test.

    python -m studies.cli_vs_dashboard [--rounds 2] [--requests 40] [--engine native|openai]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.store import Store
from bench.stub_server import start_stub_server
from tests.dashboard.browser import CHROMIUM, ROOT, goto_page, set_number, start_dashboard, wait_idle

FIGURES: tuple[tuple[str, str], ...] = (
    ("output_throughput_tok_s", "output tok/s"),
    ("ttft_ms_p50", "TTFT p50 ms"),
    ("ttft_ms_p99", "TTFT p99 ms"),
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("tpot_ms_p99", "TPOT p99 ms"),
)


def _cli_run(args: argparse.Namespace, db: Path, stub_url: str | None, name: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench", "run", "--db", str(db), "--mode", args.mode, "--quiet", "--name", name]
    argv += ["--requests", str(args.requests), "--output-len", str(args.output_len), "--input-len", "32"]
    if args.mode == "concurrency":
        argv += ["--concurrency", str(args.concurrency)]
    if stub_url:
        argv += ["--engine", "openai", "--base-url", stub_url, "--engine-opt", "check_model=false"]
    else:
        argv += ["--engine", "native", "--model", "tiny-deepseek-v3", "--accelerator", "cpu"]
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return _newest(db)


def _newest(db: Path) -> dict[str, Any]:
    store = Store(db)
    run = store.list_runs(limit=1)[0]
    store.close()
    flat = run.summary.flat() if run.summary is not None else {}
    return {"id": run.id, "status": run.status, **{k: flat.get(k) for k, _ in FIGURES},
            "disturbance": flat.get("disturbance") or ""}  # fmt: skip


def _dashboard_run(page: Any, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    main = page.locator('[data-testid="stMain"]')
    page_name = "Concurrency" if args.mode == "concurrency" else "Latency"
    goto_page(page, page_name)
    set_number(page, "Requests", args.requests)
    set_number(page, "Output length (tokens)", args.output_len)
    set_number(page, "Input length (tokens)", 32)
    if args.mode == "concurrency":
        set_number(page, "Concurrency", args.concurrency)
    before = Store(db).list_runs(limit=1)
    main.get_by_role("button", name="Start run").click()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:  # watched live to the end, as at a demo
        runs = Store(db).list_runs(limit=1)
        if runs and (not before or runs[0].id != before[0].id) and runs[0].status != "running":
            break
        page.wait_for_timeout(500)
    wait_idle(page)
    return _newest(db)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.cli_vs_dashboard", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each: one CLI run and one dashboard run)")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--mode", choices=["latency", "concurrency"], default="latency")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--engine", choices=["native", "openai"], default="native")
    p.add_argument("--itl-ms", type=float, default=5.0, help="the stub's gap between events (--engine openai)")
    p.add_argument("--out", default="tests/artifacts/cli-vs-dashboard")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="cli-vs-dashboard-"))
    os.environ.setdefault("MOEBENCH_MODEL_CACHE_DIR", str(data / "models"))
    cli_db, dash_db = data / "cli.sqlite", data / "moebench.sqlite"
    stub_url, stub = start_stub_server(itl_ms=args.itl_ms) if args.engine == "openai" else (None, None)
    url, dash = start_dashboard(data, out / "streamlit.log")
    rows: list[tuple[str, int, dict[str, Any]]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(180_000)
            page.goto(url)
            main_area = page.locator('[data-testid="stMain"]')
            main_area.get_by_role("heading", name="Engine & Model").wait_for()
            wait_idle(page)
            if stub_url:
                main_area.get_by_label("Engine kind").click()
                page.get_by_role("option", name="OpenAI-compatible HTTP server").click()
                wait_idle(page)
                box = main_area.get_by_role("textbox", name="Server URL (empty: MoE Bench starts one)")
                box.fill(stub_url)
                box.press("Enter")
                wait_idle(page)
            main_area.get_by_role("button", name="Load", exact=True).click()
            page.locator('[data-testid="stSidebar"]').get_by_text("ready").first.wait_for()
            for r in range(args.rounds):
                order = ("cli", "dashboard") if r % 2 == 0 else ("dashboard", "cli")
                for side in order:
                    if side == "cli":
                        goto_page(page, "Results")  # the browser stays open, on a page that does not refresh
                        res = _cli_run(args, cli_db, stub_url, f"cli r{r}")
                    else:
                        res = _dashboard_run(page, args, dash_db)
                    rows.append((side, r, res))
                    print(f"round {r} {side:9}: run {res['id']} {res['status']}, "
                          + ", ".join(f"{lab} {res[k]:.2f}" for k, lab in FIGURES if res[k] is not None)
                          + (f" [disturbed: {res['disturbance']}]" if res["disturbance"] else ""),
                          flush=True)  # fmt: skip
            page.screenshot(path=str(out / "dashboard.png"), full_page=True)
            browser.close()
    finally:
        if dash.poll() is None:
            os.killpg(dash.pid, signal.SIGTERM)
            dash.wait(15)
        if stub is not None:
            stub.stop()
    what = f"{args.engine}, {args.mode}, {args.requests} requests x {args.output_len} tokens"
    print(f"\n{what}, {args.rounds} ABBA rounds")
    print(f"{'figure':<14}{'CLI median':>12}{'dash median':>13}{'dash/CLI median':>17}{'range':>18}")
    for key, label in FIGURES:
        cli = {r: res[key] for side, r, res in rows if side == "cli" and res[key] is not None}
        dsh = {r: res[key] for side, r, res in rows if side == "dashboard" and res[key] is not None}
        ratios = [dsh[r] / cli[r] for r in cli if r in dsh and cli[r]]
        if not ratios:
            continue
        print(f"{label:<14}{statistics.median(cli.values()):>12.2f}{statistics.median(dsh.values()):>13.2f}"
              f"{statistics.median(ratios):>17.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>18}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

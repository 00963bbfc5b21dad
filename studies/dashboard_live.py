"""A large run started from the real dashboard, watched in Chromium: is the page still responsive?

Starts the zero-compute stub server (:mod:`bench.stub_server`, events ``--itl-ms``
apart) and the dashboard (``streamlit run dashboard/serve.py``, as ``make run`` starts it; a temporary data folder),
then drives the page with Playwright: loads the ``openai`` engine on the stub's URL, starts
a concurrency run of ``--requests`` requests, and while it runs records

- how often the live progress line changes (the live fragment redraws once a second),
- how long switching to another page and back takes (a user's click, mid-run),

then checks that the store holds every request and the summary shows. Prints the figures
and saves screenshots to ``--out``. Needs Chromium at /usr/bin/chromium (``make browser``).
Figures, not a test; exit status 1 only when the run did not store every request.

    python -m studies.dashboard_live [--requests 10000] [--concurrency 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stub_server import start_stub_server
from tests.dashboard.browser import CHROMIUM, goto_page, set_number, start_dashboard, wait_idle


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.dashboard_live", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--itl-ms", type=float, default=5.0, help="the stub's gap between events")
    p.add_argument("--out", default="tests/artifacts/dashboard-live", help="folder for screenshots and logs")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="dashboard-live-"))
    stub_url, stub = start_stub_server(itl_ms=args.itl_ms)
    url, dash = start_dashboard(data, out / "streamlit.log")
    progress_times: list[float] = []
    switches: list[float] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            main = page.locator('[data-testid="stMain"]')
            main.get_by_role("heading", name="Engine & Model").wait_for()
            wait_idle(page)
            main.get_by_label("Engine kind").click()
            page.get_by_role("option", name="OpenAI-compatible HTTP server").click()
            wait_idle(page)
            box = main.get_by_role("textbox", name="Base url")
            box.fill(stub_url)
            box.press("Enter")
            wait_idle(page)
            main.get_by_role("button", name="Load", exact=True).click()
            page.locator('[data-testid="stSidebar"]').get_by_text("ready").first.wait_for()
            goto_page(page, "Concurrency")
            set_number(page, "Requests", args.requests)
            set_number(page, "Concurrency", args.concurrency)
            set_number(page, "Output length (tokens)", args.output_len)
            main.get_by_role("button", name="Start run").click()
            progress = main.get_by_text(f"/{args.requests:,} requests").first
            try:
                progress.wait_for(timeout=30_000)
            except Exception:  # noqa: BLE001 - the count may be shown without a thousands separator
                progress = main.get_by_text(f"/{args.requests} requests").first
                progress.wait_for(timeout=30_000)
            t_start = time.perf_counter()
            last, shot = "", False
            while True:
                text = main.inner_text()
                if "· completed" in text or "· failed" in text:
                    break
                try:
                    now = progress.inner_text(timeout=2_000)
                except Exception:  # noqa: BLE001 - redrawn under us; read again
                    now = last
                if now != last:
                    progress_times.append(time.perf_counter())
                    last = now
                elapsed = time.perf_counter() - t_start
                if not shot and elapsed > 5:
                    page.screenshot(path=str(out / "live.png"), full_page=True)
                    shot = True
                if elapsed > 8 and len(switches) < 2 and elapsed > 8 + 6 * len(switches):
                    switches.append(goto_page(page, "Results") + goto_page(page, "Concurrency"))
                    progress = main.get_by_text("requests").first
                page.wait_for_timeout(200)
            run_s = time.perf_counter() - t_start
            wait_idle(page)
            page.screenshot(path=str(out / "done.png"), full_page=True)
            status = "completed" if "· completed" in main.inner_text() else "failed"
            browser.close()
    finally:
        if dash.poll() is None:
            os.killpg(dash.pid, signal.SIGTERM)
            dash.wait(15)
        stub.stop()
    db = data / "moebench.sqlite"
    with sqlite3.connect(db) as conn:
        run_id, n_samples = conn.execute(
            "SELECT r.id, (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id) FROM runs r ORDER BY r.id DESC LIMIT 1"
        ).fetchone()
    gaps = [b - a for a, b in itertools.pairwise(progress_times)]
    print(f"run {run_id}: {status} in {run_s:.1f} s (seen from the browser); {n_samples}/{args.requests} rows stored")
    if gaps:
        print(
            f"live progress changed {len(progress_times)} times: gap p50 {statistics.median(gaps):.2f} s, "
            f"max {max(gaps):.2f} s"
        )
    for s in switches:
        print(f"mid-run page switch (Concurrency -> Results -> Concurrency): {s:.2f} s")
    print(f"screenshots: {out / 'live.png'}, {out / 'done.png'}")
    return 0 if n_samples == args.requests and status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

"""How long after a Stop click does the dashboard show the run as cancelled?

Drives the real dashboard (as ``make run`` starts it) in Chromium on the tiny model: loads the
native engine, then ``--rounds`` times starts a 2,000-request latency run on the Latency page,
waits until a few requests are done, clicks **Stop** and polls the page every 20 ms: when the
click returned, when "stopping" showed, when "· cancelled" showed. The first round is the first
run after the model loaded. Prints one line per round and the median; not a test (exit 0
whatever the figures). Needs ``make browser``. Usage::

    python -m studies.dashboard_stop [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
REQUESTS = 2000


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.dashboard_stop", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="", help="write the figures as JSON here")
    a = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from tests.dashboard.browser import goto_page, set_number, start_dashboard, wait_idle

    data = Path(tempfile.mkdtemp(prefix="moebench-stop-"))
    models = str(ROOT / "data" / "models")
    os.environ.update(MOEBENCH_MODEL_CACHE_DIR=models, MOEBENCH_MODELS_DIR=models)
    url, proc = start_dashboard(data, data / "streamlit.log")
    rows = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            wait_idle(page)
            main = page.locator('[data-testid="stMain"]')
            main.get_by_role("button", name="Load", exact=True).click()
            main.get_by_text("Parameters", exact=True).wait_for(timeout=120_000)
            wait_idle(page)
            goto_page(page, "Latency")
            set_number(page, "Requests", REQUESTS)
            set_number(page, "Output length (tokens)", 32)
            for rnd in range(a.rounds):
                main.get_by_role("button", name="Start run").click()
                while not re.search(rf"\b([3-9]|\d\d+)/{REQUESTS:,} requests", main.inner_text()):
                    time.sleep(0.05)
                t0 = time.monotonic()
                main.get_by_role("button", name="Stop", exact=True).click()
                row = {"round": rnd + 1, "click_returned_s": round(time.monotonic() - t0, 3)}
                while time.monotonic() - t0 < 20 and "cancelled_shown_s" not in row:
                    text = main.inner_text()
                    if "stopping" in text and "stopping_shown_s" not in row:
                        row["stopping_shown_s"] = round(time.monotonic() - t0, 3)
                    if "· cancelled" in text:
                        row["cancelled_shown_s"] = round(time.monotonic() - t0, 3)
                    time.sleep(0.02)
                rows.append(row)
                print(json.dumps(row), flush=True)
                wait_idle(page)
            browser.close()
    finally:
        proc.kill()
    shown = [r["cancelled_shown_s"] for r in rows if "cancelled_shown_s" in r]
    if shown:
        med, lo, hi = statistics.median(shown), min(shown), max(shown)
        print(f"Stop to cancelled shown: median {med:.2f} s, range {lo:.2f}-{hi:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

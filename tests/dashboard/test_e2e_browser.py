"""End to end: the real app in Chromium (Playwright), from loading the tiny model to a CSV download.

Starts the dashboard as ``make run`` does (``streamlit run dashboard/serve.py``) on a free port
with this session's data folder, loads the tiny model, runs a concurrency benchmark while watching the live chart grow,
downloads the per-request CSV from the Results page and checks its rows, imports the H200
example runs on the Profiling page, and saves a screenshot of every page under tests/artifacts/.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.store import REQUEST_CSV_COLUMNS
from tests.dashboard.browser import goto_page, set_number, wait_idle
from tests.dashboard.conftest import running_dashboard

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REQUESTS, CONCURRENCY, OUTPUT_LEN = 96, 2, 32  # a run of 10 s or so: time to watch it, leave and come back

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def server(moebench_data: Path, tiny_model: Path) -> Iterator[str]:
    """The dashboard as a real server process, started as `make run` starts it."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(moebench_data), "PYTHONUNBUFFERED": "1"}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_dashboard(env, ARTIFACTS / "streamlit-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser_page(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(60_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()


def _main(page: Any) -> Any:
    return page.locator('[data-testid="stMain"]')


def _shot(page: Any, name: str) -> Path:
    """A screenshot of the whole page (the main area scrolls inside the window, so grow the window)."""
    path = ARTIFACTS / f"{name}.png"
    size = page.viewport_size
    height = page.evaluate(
        "() => { const el = document.querySelector('[data-testid=\"stMain\"]'); return el ? el.scrollHeight : 0; }"
    )
    height = int(height or 0)
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(height + 40, 8000))})
    page.wait_for_timeout(800)  # let plotly redraw at the new size
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
    assert path.stat().st_size > 10_000
    return path


def _latency_points(page: Any) -> int:
    """Markers in the live per-request latency chart (first plotly chart on the page)."""
    return int(
        page.evaluate(
            """() => {
                const gd = document.querySelector('.js-plotly-plot');
                if (!gd || !gd.calcdata || !gd.calcdata.length) return 0;
                return gd.calcdata[0].length || 0;
            }"""
        )
    )


def test_load_run_watch_download(browser_page: Any, server: str, moebench_data: Path) -> None:
    page = browser_page
    page.goto(server)
    main = _main(page)
    main.get_by_role("heading", name="Engine & Model").wait_for()
    wait_idle(page)
    import torch

    main.get_by_role("button", name="Load", exact=True).wait_for()
    if torch.version.cuda is None:  # the unavailable accelerator says why
        main.get_by_text("was built without CUDA").first.wait_for()

    # Load the tiny model (the default preset) on the CPU.
    main.get_by_role("button", name="Load", exact=True).click()
    main.get_by_text("Parameters", exact=True).wait_for(timeout=120_000)
    wait_idle(page)
    assert "ready" in page.locator('[data-testid="stSidebar"]').inner_text()
    assert re.search(r"Parameters\s+[\d.]+ M\b", main.inner_text())  # the tiny model: about 1.5 M
    _shot(page, "engine")

    # A concurrency run, watched live.
    goto_page(page, "Concurrency")
    set_number(page, "Requests", REQUESTS)
    set_number(page, "Concurrency", CONCURRENCY)
    set_number(page, "Output length (tokens)", OUTPUT_LEN)
    time.sleep(1.0)
    wait_idle(page)
    main.get_by_role("button", name="Start run").click()
    progress = main.get_by_text(f"/{REQUESTS} requests").first
    progress.wait_for(timeout=60_000)
    seen_done: set[str] = set()
    seen_points: list[int] = []
    deadline = time.monotonic() + 180
    shot_live = detoured = False
    while time.monotonic() < deadline:
        text = main.inner_text()
        if "· completed" in text:
            break
        try:
            seen_done.add(progress.inner_text(timeout=2_000).split("/")[0])
        except Exception:  # noqa: BLE001 - the element is redrawn every second; try again
            pass
        seen_points.append(_latency_points(page))
        if not shot_live and seen_points[-1] > 2:
            _shot(page, "concurrency-live")
            shot_live = True
        if not detoured and len(seen_done) >= 2 and any(b > a for a, b in itertools.pairwise(seen_points)):
            # Leaving the page mid-run and coming back keeps the run form (the live fragment's
            # reruns while the page was away once put every field back to its default). Only
            # once the progress was seen moving and the chart growing: a run that ended during
            # the detour left the checks below with nothing but the warm-up seen (CI, once), or
            # with the chart seen only empty (CI, 2026-12-06: points [0, 0, 0]).
            detoured = True
            goto_page(page, "Results")
            page.wait_for_timeout(1500)
            goto_page(page, "Concurrency")
            form = {"Requests": REQUESTS, "Concurrency": CONCURRENCY, "Output length (tokens)": OUTPUT_LEN}
            for label, value in form.items():
                # the page just came back: the previous draw's elements may still be on it, marked
                # stale, beside the new ones (CI, 2026-12-07: two "Requests" fields at once)
                fresh = main.locator('[data-testid="stElementContainer"]:not([data-stale="true"])')
                box = fresh.get_by_role("spinbutton", name=label, exact=True)
                shown = [box.input_value()]
                # The first read showed the page's default (Requests 32) in 2 of 11 local runs on
                # 2026-12-05; not yet known whether the kept value came a moment later. Read again
                # for up to 5 s: a form that really lost its values keeps the default and fails.
                for _ in range(20):
                    if shown[-1] == str(value):
                        break
                    page.wait_for_timeout(250)
                    shown.append(box.input_value())
                assert shown[-1] == str(value), f"{label}: shown {shown}"
            progress = main.get_by_text(f"/{REQUESTS} requests").first
        page.wait_for_timeout(700)
    else:
        raise AssertionError("the run did not complete within 180 s")
    assert len(seen_done) >= 2, f"the progress never moved while running: {seen_done}"
    assert detoured, "the run ended before the page was left and opened again mid-run"
    grew = [b for a, b in itertools.pairwise(seen_points) if b > a]
    assert grew, f"the live latency chart never gained points while running: {seen_points}"
    wait_idle(page)
    final = 0
    for _ in range(40):  # the last redraw after completion may still be on its way
        final = _latency_points(page)
        if final == REQUESTS:
            break
        page.wait_for_timeout(250)
    assert final == REQUESTS
    main.get_by_text("Summary", exact=True).wait_for()
    _shot(page, "concurrency")

    # An uploaded JSONL prompt file is validated: a bad line is a clear error, a good file is saved.
    main.get_by_role("combobox", name="Prompts").click()  # the prompt-source dropdown
    page.get_by_role("option", name="Upload JSONL").click()
    wait_idle(page)
    upload = main.locator('[data-testid="stFileUploaderDropzoneInput"]')
    upload.set_input_files(
        files=[{"name": "bad.jsonl", "mimeType": "application/octet-stream", "buffer": b'{"prompt": "hi"}\n{oops\n'}]
    )
    main.get_by_text("bad.jsonl line 2: not valid JSON").wait_for()
    upload.set_input_files(
        files=[
            {
                "name": "good.jsonl",
                "mimeType": "application/octet-stream",
                "buffer": b'{"prompt": "a"}\n{"prompt": "b"}\n',
            }
        ]
    )
    main.get_by_text("2 prompts, saved as").wait_for()
    assert list((moebench_data / "uploads").glob("*-good.jsonl"))

    # Reloading the browser keeps the engine and shows the finished run again.
    page.reload()
    _main(page).get_by_role("heading", name="Concurrency").wait_for()
    wait_idle(page)
    assert "· completed" in _main(page).inner_text()
    assert "ready" in page.locator('[data-testid="stSidebar"]').inner_text()

    # Results: select the run, download its per-request CSV.
    goto_page(page, "Results")
    main = _main(page)
    picker = main.get_by_label("Select runs to compare, inspect, export or delete")
    picker.click()
    page.get_by_role("option").first.click()
    page.keyboard.press("Escape")
    wait_idle(page)
    main.get_by_role("tab", name="Export").click()
    with page.expect_download() as info:
        main.get_by_role("button", name="Per-request CSV").click()
    download = info.value
    target = ARTIFACTS / "requests.csv"
    download.save_as(str(target))
    rows = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))))
    assert len(rows) == REQUESTS
    assert list(rows[0]) == list(REQUEST_CSV_COLUMNS)
    assert {r["output_tokens"] for r in rows} == {str(OUTPUT_LEN)}
    assert all(float(r["ttft_ms"]) > 0 and float(r["e2e_ms"]) >= float(r["ttft_ms"]) for r in rows)
    main.get_by_role("tab", name="Compare").click()
    _shot(page, "results")
    main.get_by_role("tab", name="Run details").click()
    _shot(page, "results-details")

    goto_page(page, "Compare with the book")
    assert "no measured vLLM run yet" in _main(page).inner_text()
    _shot(page, "compare")
    goto_page(page, "Latency")
    _shot(page, "latency")

    # Profiling: import the GPU example runs and look at the H200 profile's device-time breakdown
    # (the page opens on the newest example profile the breakdown can split).
    goto_page(page, "Profiling")
    main = _main(page)
    main.get_by_role("button", name="Import the GPU example runs").click()
    main.get_by_text("Imported 16 example run(s)").wait_for()
    wait_idle(page)
    assert "h200-profile" in main.inner_text() and "imported example" in main.inner_text()
    main.get_by_role("tab", name="Bottlenecks").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot')].some(gd => gd.layout && gd.layout.xaxis
            && gd.layout.xaxis.title && gd.layout.xaxis.title.text === 'share of profiled device (kernel) time (%)'
            && gd.offsetParent !== null)"""
    )
    _shot(page, "profiling")

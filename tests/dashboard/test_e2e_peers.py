"""End to end: other tools' result files imported through the dashboard in Chromium.

Real files made by vllm bench serve 0.32, AIPerf 0.13 and guidellm 0.8 against the stub server
(tests/data/peers, see tests/data/README.md), plus a run of MoE Bench's own, uploaded on the
Results page of the dashboard as ``make run`` starts it; the runs appear labelled with their
tool, and two are compared on the Results page's bars. Saves ``tests/artifacts/peer-results.png``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from bench.stub_server import start_stub_server
from tests.dashboard.browser import goto_page, wait_idle
from tests.dashboard.conftest import running_dashboard
from tests.dashboard.test_e2e_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _shot

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "tests" / "data" / "peers"
FILES = ("vllm-bench-serve-detailed.json", "aiperf-concurrency.json", "aiperf-concurrency.jsonl",
         "guidellm-concurrent.json")  # fmt: skip
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_peer_result_files_import_in_the_browser(tmp_path: Path, tiny_model: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(tiny_model.parent)
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    url, stub = start_stub_server(itl_ms=5.0)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench", "run", "--quiet", "--engine", "openai", "--base-url", url, "--model",
             "tiny-deepseek-v3", "--requests", "20", "--concurrency", "4", "--name", "moe bench on the stub"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        stub.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]

    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (
        running_dashboard(env, ARTIFACTS / "streamlit-peers.log") as dash,
        sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page: Any = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(60_000)
        page.goto(dash)
        wait_idle(page)
        goto_page(page, "Results")
        main = page.locator('[data-testid="stMain"]')
        main.get_by_text("Import results: a MoE Bench bundle").click()
        # Import with nothing chosen: the one-line reason shows above the expander, which stays open
        # with its uploader (a message appearing above used to re-mount it folded, files dropped)
        main.get_by_role("button", name="Import", exact=True).click()
        wait_idle(page)
        assert "Choose a result file to import first" in main.inner_text()
        assert main.get_by_role("button", name="Import", exact=True).is_visible()
        main.locator('input[type="file"]').set_input_files([str(PEERS / name) for name in FILES])
        chips = main.locator('[data-testid="stFileChip"]')  # one per file that reached the server
        for _ in range(60):
            if chips.count() == len(FILES):
                break
            page.wait_for_timeout(500)
        assert chips.count() == len(FILES)
        wait_idle(page)
        for _ in range(10):  # the last files may still be on their way: the page says so, try again
            main.get_by_role("button", name="Import", exact=True).click()
            wait_idle(page)
            if "Imported vllm-bench-serve-detailed.json" in main.inner_text():
                break
            page.wait_for_timeout(1000)
        try:
            main.get_by_text("Imported vllm-bench-serve-detailed.json as run").wait_for(timeout=30_000)
        finally:
            _shot(page, "peer-results-import")
        text = main.inner_text()
        assert "guidellm-concurrent.json as run" in text and "aiperf-concurrency.json as run" in text, text[:2000]
        assert "Manage app" not in text  # no exception box
        # compare the vllm bench serve run with MoE Bench's own: both listed in the run picker
        picker = main.locator('[data-testid="stMultiSelect"]').filter(has_text="Select runs to compare")
        for wanted in ("#2 vllm", "#1 openai"):
            picker.click()
            page.keyboard.type(wanted)
            page.keyboard.press("Enter")
            wait_idle(page)
        page.keyboard.press("Escape")
        wait_idle(page)
        assert "Manage app" not in main.inner_text()
        _shot(page, "peer-results")
        # our own run alone: downloaded as vllm bench serve's JSON from the Export tab
        picker.locator('[aria-label*="Remove"]').first.click()  # drop #2, keep #1
        wait_idle(page)
        main.get_by_role("tab", name="Export").click()
        with page.expect_download() as info:
            main.get_by_role("button", name="vllm-json (run #1)").click()
        exported = tmp_path / "run-1.vllm.json"
        info.value.save_as(str(exported))
        browser.close()
    result = json.loads(exported.read_text())
    assert result["completed"] == 20 and len(result["ttfts"]) == 20  # vLLM's keys, per request in seconds

    store = Store(data / "moebench.sqlite")
    runs = store.list_runs()
    tools = sorted(str(r.config.get("source_tool", "moe bench")).split()[0].lower() for r in runs)
    assert tools == ["aiperf", "guidellm", "moe", "vllm"], tools
    store.close()

"""End to end: a served engine's routing, drawn by the real dashboard in Chromium.

A managed Triton run of the tiny DeepSeek-V3 (the real Triton server; MoE Bench's model counts
the routing at its gates and returns it with each request) and a run against the stub server
speaking SGLang's ``routed_experts`` encoding go into a fresh data folder through the CLI; the
dashboard, started as ``make run`` starts it, opens the Profiling page's routing tab on the Triton
run (no profile run is stored: the page shows the routing of other runs under its notice),
compares it with the SGLang-style run, and saves
``tests/artifacts/triton-routing.png``.
"""

from __future__ import annotations

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
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _cli(data: Path, *argv: str) -> None:
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(data)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--quiet", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_triton_runs_routing_in_the_browser(tmp_path: Path, tiny_model: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(tiny_model.parent)  # the session's tiny checkpoint, not a second build
    url, stub = start_stub_server(routed_experts="sglang")
    try:
        _cli(data, "--engine", "openai", "--base-url", url, "--model", "tiny-deepseek-v3", "--engine-opt",
             "routed_experts=true", "--requests", "8", "--name", "sglang-style routing")  # fmt: skip
    finally:
        stub.stop()
    _cli(data, "--engine", "triton", "--model", "tiny-deepseek-v3", "--mode", "concurrency", "--requests", "12",
         "--concurrency", "3", "--input-len", "24", "--output-len", "12", "--name", "triton routing")  # fmt: skip
    store = Store(data / "moebench.sqlite")
    runs = {r.name: r.id for r in store.list_runs()}
    triton = store.artifact(runs["triton routing"], "expert_routing")
    assert triton and triton["requests"] == 12 and "Triton server's model" in triton["source"]
    sglang = store.artifact(runs["sglang-style routing"], "expert_routing")
    assert sglang and sglang["imbalance"] == [4.0, 4.0]  # the stub's planted hot expert
    store.close()

    from playwright.sync_api import sync_playwright

    env = {**os.environ, "MOEBENCH_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (
        running_dashboard(env, ARTIFACTS / "streamlit-routing.log") as dash,
        sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page: Any = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(60_000)
        page.goto(dash)
        wait_idle(page)
        goto_page(page, "Profiling")
        main = page.locator('[data-testid="stMain"]')
        # no profile run in this folder: the page shows the other runs' routing under its notice
        main.get_by_text("Expert routing of other runs").wait_for()
        box = main.locator('[data-testid="stSelectbox"]').filter(has_text="Run (").first
        assert "triton routing" in box.get_by_role("combobox").input_value()  # the newest run with routing
        main.get_by_text("counted at the gates of the Triton server's model", exact=False).first.wait_for()
        heat = main.locator(".js-plotly-plot").first
        heat.wait_for()
        # the figure's text is drawn a moment after its node exists: wait for it, do not read it once
        from playwright.sync_api import expect

        expect(heat).to_contain_text("Tokens routed to each expert", timeout=60_000)
        compare = main.locator('[data-testid="stSelectbox"]').filter(has_text="Compare with another run").first
        combo = compare.get_by_role("combobox")
        combo.click()
        combo.fill("sglang-style")  # the select box filters its options as one types
        page.get_by_role("option").filter(has_text="sglang-style routing").first.click()
        wait_idle(page)
        main.get_by_text("Routing overlap", exact=False).first.wait_for()
        shot = _shot(page, "triton-routing")
        browser.close()
    assert shot.exists()

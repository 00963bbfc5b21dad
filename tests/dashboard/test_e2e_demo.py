"""End to end, for a demo (issue 14): the real app in Chromium, driving each point a stakeholder sees.

- Run state: after Start, the sidebar, the Start and Stop buttons and the progress line show
  the run, on the run's page and on another page; how long each took is saved to
  tests/artifacts/demo-state-times.json (figures, not assertions: the brief keeps timing out of tests).
- Stop lands: the run ends "cancelled", its cut-short requests are counted as cancelled, never failed.
- The book page pairs runs of one workload by default and refuses a gain between different ones.
- Viewer mode (a second dashboard on the same store, as `make demo` starts it) refuses every action.
- Replay opens on the H100 example of the fastest configuration (its conditions on the page) and plays it
  on the live charts, labelled as a replay.
Screenshots of each step are saved under tests/artifacts/demo-*.png.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from tests.dashboard.browser import goto_page, set_number, wait_idle
from tests.dashboard.conftest import running_dashboard
from tests.dashboard.synthetic import add_synthetic_run

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip
REQUESTS = 2000  # long enough to be stopped by hand

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory, moebench_data: Path, tiny_model: Path) -> Path:
    """A store of its own (other browser tests count runs in theirs), with the session's tiny model."""
    return tmp_path_factory.mktemp("demo-data")


def _env(data_dir: Path, moebench_data: Path, **extra: str) -> dict[str, str]:
    models = str(moebench_data / "models")
    return {
        **os.environ, "MOEBENCH_DATA_DIR": str(data_dir), "MOEBENCH_MODEL_CACHE_DIR": models,
        "MOEBENCH_MODELS_DIR": models, "PYTHONUNBUFFERED": "1", **extra,
    }  # fmt: skip


@pytest.fixture(scope="module")
def operator(demo_data: Path, moebench_data: Path) -> Iterator[str]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_dashboard(_env(demo_data, moebench_data), ARTIFACTS / "demo-operator.log") as url:
        yield url


@pytest.fixture(scope="module")
def viewer(demo_data: Path, moebench_data: Path, operator: str) -> Iterator[str]:
    env = _env(demo_data, moebench_data, MOEBENCH_MODE="viewer")
    with running_dashboard(env, ARTIFACTS / "demo-viewer.log") as url:
        yield url


@pytest.fixture(scope="module")
def page(operator: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        pg = context.new_page()
        pg.set_default_timeout(60_000)
        try:
            yield pg
        finally:
            context.close()
            browser.close()


def _main(page: Any) -> Any:
    return page.locator('[data-testid="stMain"]')


def _sidebar(page: Any) -> Any:
    return page.locator('[data-testid="stSidebar"]')


def _inputs(page: Any) -> list[str]:
    return list(page.evaluate("() => [...document.querySelectorAll('[data-testid=stMain] input')].map(i => i.value)"))


def _shot(page: Any, name: str) -> None:
    """The whole page (the main area scrolls inside the window, so the window grows for the shot)."""
    path = ARTIFACTS / f"demo-{name}.png"
    size = page.viewport_size
    height = int(page.evaluate("() => document.querySelector('[data-testid=stMain]')?.scrollHeight || 0"))
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(height + 40, 9000))})
    page.wait_for_timeout(800)  # let plotly redraw at the new size
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
    assert path.stat().st_size > 10_000


def _seconds_until(check: Any, limit_s: float = 20.0) -> float:
    """Seconds until ``check()`` is true (polled every 50 ms); fails past ``limit_s``."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > limit_s:
            raise AssertionError(f"not seen within {limit_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def test_run_state_stop_pairing_viewer_and_replay(page: Any, operator: str, viewer: str, demo_data: Path) -> None:
    times: dict[str, float] = {}
    page.goto(operator)
    main = _main(page)
    main.get_by_role("button", name="Load", exact=True).click()
    main.get_by_text("Parameters", exact=True).wait_for(timeout=120_000)
    wait_idle(page)

    # --- run state, on the run's page and on another one ---------------------------------
    goto_page(page, "Latency")
    set_number(page, "Requests", REQUESTS)
    set_number(page, "Output length (tokens)", 32)
    start = main.get_by_role("button", name="Start run")
    start.click()
    clicked = time.monotonic()
    times["sidebar shows the run"] = _seconds_until(lambda: "latency run #" in _sidebar(page).inner_text())
    times["Start disabled"] = _seconds_until(start.is_disabled)
    stop = main.get_by_role("button", name="Stop", exact=True)
    times["Stop shown"] = _seconds_until(stop.is_visible)
    times["progress line moves"] = _seconds_until(lambda: f"/{REQUESTS:,} requests" in main.inner_text())
    times["from the click, all shown"] = time.monotonic() - clicked
    _shot(page, "running")
    goto_page(page, "Results")
    times["sidebar on another page"] = _seconds_until(lambda: "latency run #" in _sidebar(page).inner_text())
    assert "Show live" in _sidebar(page).inner_text()
    goto_page(page, "Latency")

    # --- Stop lands; cut-short requests are cancelled, not failed --------------------------
    def done() -> int:
        found = re.search(r"([\d,]+)/" + f"{REQUESTS:,}" + r" requests", main.inner_text())
        return int(found.group(1).replace(",", "")) if found else 0

    _seconds_until(lambda: done() >= 3, 120)  # past the warm-up: some requests measured
    stop = main.get_by_role("button", name="Stop", exact=True)
    stop.click()
    stopped = time.monotonic()
    _seconds_until(lambda: "· cancelled" in main.inner_text(), 30)
    times["Stop to cancelled"] = time.monotonic() - stopped
    wait_idle(page)
    store = Store(demo_data / "moebench.sqlite")
    (run,) = [r for r in store.list_runs() if r.mode == "latency"]
    assert run.status == "cancelled" and run.summary is not None
    assert run.summary.failed == 0 and run.summary.completed < REQUESTS
    times["Stop to Start enabled again"] = time.monotonic() - stopped + _seconds_until(lambda: not start.is_disabled())
    assert "failed" not in main.get_by_text("Run #").first.inner_text()
    _shot(page, "stopped")

    # --- the book page pairs runs of one workload ------------------------------------------
    native = add_synthetic_run(store, 20, engine="native", name="native pair")
    vllm = add_synthetic_run(store, 20, engine="vllm", seed=2, name="vllm pair")
    odd = store.create_run(
        mode="latency", engine="vllm", model="tiny-deepseek-v3", accelerator="cpu", name="vllm other workload",
        config={"mode": "latency", "concurrency": 1, "workload": {"source": "random", "input_len": 64,
                                                                   "output_len": 8}},
    )  # fmt: skip
    store.finish_run(odd, "completed", summary=store.get_run(vllm).summary)  # type: ignore[union-attr]
    goto_page(page, "Compare with the book")
    _shot(page, "book-pair")
    picked = _inputs(page)  # the pickers show their run in an input box
    assert any(v.startswith(f"#{native} native") for v in picked), picked
    assert any(v.startswith(f"#{vllm} vllm") for v in picked), picked
    assert "Not comparable" not in main.inner_text()
    main.get_by_label("Measured vLLM run").click()
    page.get_by_role("option", name=f"#{odd}", exact=False).first.click()
    wait_idle(page)
    main.get_by_text("Not comparable").first.wait_for()
    assert "mode" in main.get_by_text("Not comparable").first.inner_text()
    _shot(page, "book-mismatch")

    # --- viewer mode: everything readable, every action refused ---------------------------
    page.goto(viewer)
    _main(page).get_by_role("heading", name="Engine & Model").wait_for()
    wait_idle(page)
    assert "viewer mode" in _sidebar(page).inner_text()
    assert _main(page).get_by_role("button", name="Load", exact=True).is_disabled()
    goto_page(page, "Latency")
    assert _main(page).get_by_role("button", name="Start run").is_disabled()
    assert "Viewer mode" in _main(page).inner_text()
    goto_page(page, "Results")
    n_runs = len(store.list_runs())
    assert f"{n_runs} of {n_runs} runs" in _main(page).inner_text()  # the operator's runs are there to show
    _shot(page, "viewer")

    # --- replay the GPU example, on the viewer (a replay changes nothing) -------------------
    from dashboard.profile_data import import_examples

    import_examples(store)
    goto_page(page, "Replay a run")
    main = _main(page)
    # the demo opens on the fastest configuration's batched H100 run, its conditions on the page
    assert any("h100-fast-concurrency-128" in v for v in _inputs(page)), _inputs(page)
    assert "tuned: CUDA graphs, torch.compile" in main.inner_text() and "random weights" in main.inner_text()
    main.get_by_role("button", name="Play").click()
    progress = main.locator('[data-testid="stProgress"]').first
    progress.wait_for()
    first = progress.inner_text()
    _seconds_until(lambda: progress.inner_text() != first, 15)  # it plays: the clock moves
    text = main.inner_text()
    assert "REPLAY of run #" in text and "NVIDIA H100" in text and "nothing is measured now" in text
    page.wait_for_timeout(2500)
    _shot(page, "replay")
    (ARTIFACTS / "demo-state-times.json").write_text(json.dumps(times, indent=2))
    print("run state, seconds:", json.dumps(times))

"""What a demo sees at 1,600 px, in Chromium (issue 45): the pixels AppTest cannot see."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.bundle import import_file
from bench.metrics.summary import summarize
from bench.store import Store
from dashboard import data, profile_data
from tests.dashboard.browser import goto_page
from tests.dashboard.conftest import running_dashboard
from tests.dashboard.synthetic import add_synthetic_run, synthetic_records
from tests.dashboard.test_e2e_browser import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "tests" / "data" / "peers"
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# The grid's header font and padding as Streamlit sets them (glide data grid's CSS variables), each
# header measured in it; and whether the grid scrolls sideways (a column cut at the screen's edge).
MEASURE = """(labels) => {
  const grid = document.querySelector('[data-testid="stDataFrame"]');
  let style = null;
  for (const e of grid.querySelectorAll('*')) {
    const s = getComputedStyle(e);
    if (s.getPropertyValue('--gdg-header-font-style')) { style = s; break; }
  }
  const font = style.getPropertyValue('--gdg-header-font-style') + ' ' + style.getPropertyValue('--gdg-font-family');
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = font;
  const widths = {};
  for (const l of labels) widths[l] = ctx.measureText(l).width;
  const sc = grid.querySelector('.dvn-scroller');
  return {font, pad: parseFloat(style.getPropertyValue('--gdg-cell-horizontal-padding')), widths,
          scroll: [sc.scrollWidth, sc.clientWidth]};
}"""


def _store_with_every_column(folder: Path) -> list[str]:
    """The GPU examples, two peer results, a run with an SLO (goodput) and a failed one (a note):
    the compact table with every column it can show. Returns those columns."""
    store = Store(folder / "moebench.sqlite")
    profile_data.import_examples(store)
    for name in ("vllm-bench-serve-detailed.json", "guidellm-concurrent.json"):
        import_file(store, PEERS / name)
    add_synthetic_run(store)
    records = synthetic_records(20)
    slo = store.create_run(mode="concurrency", engine="native", model="m", accelerator="cpu", config={}, concurrency=4)
    store.add_samples(slo, list(enumerate(records)))
    store.finish_run(slo, "completed", summary=summarize(records, max_concurrency=4, slos=["ttft_ms:p99<=25"]))
    failed = store.create_run(mode="latency", engine="native", model="m", accelerator="cpu", config={})
    store.finish_run(failed, "failed", error="the engine crashed while loading the model weights from disk")
    view = data.runs_frame(store.list_runs())
    store.close()
    return data.results_columns(view, full=False)


def test_the_results_table_and_its_filters_show_whole_words_at_1600_px(tmp_path: Path) -> None:
    """At 1,600 px the Results table was cut ("goodput req", "other proce") and the Status filter's
    chip read "c…"."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    folder = tmp_path / "data"
    folder.mkdir()
    columns = _store_with_every_column(folder)
    assert "goodput_rps" in columns and "note" in columns
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(folder), "PYTHONUNBUFFERED": "1"}
    from playwright.sync_api import sync_playwright

    with running_dashboard(env, tmp_path / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page: Any = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(url)
            goto_page(page, "Results")
            page.locator('[data-testid="stDataFrame"]').first.wait_for()
            page.wait_for_timeout(1000)
            page.evaluate("document.fonts.ready")
            specs = {c: data.RESULTS_COLUMNS[c] for c in columns}
            got = page.evaluate(MEASURE, [s.label for s in specs.values()])
            assert "Source Sans" in got["font"], got["font"]  # Streamlit's own font: the same on every screen
            cut = {s.label: round(got["widths"][s.label] + 2 * got["pad"]) for s in specs.values()
                   if got["widths"][s.label] + 2 * got["pad"] > s.width}  # fmt: skip
            assert not cut, f"headers wider than their columns (px needed): {cut}"
            scroll_width, client_width = got["scroll"]
            assert scroll_width <= client_width, f"the table scrolls sideways: {scroll_width} > {client_width} px"
            # The Status filter with a value chosen: its chip shows the whole word.
            status = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Status")
            status.locator("input").click()
            page.get_by_role("option", name="completed", exact=True).click()
            page.keyboard.press("Escape")
            tag = status.locator('span[data-tag] span[title="completed"]')
            tag.wait_for()
            shown, needed = tag.evaluate("e => [e.clientWidth, e.scrollWidth]")
            assert needed <= shown, f"the chip cuts 'completed' ({needed} px in {shown})"
            page.screenshot(path=str(tmp_path / "results-1600.png"))
        finally:
            browser.close()

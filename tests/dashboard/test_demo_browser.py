"""What a demo sees at 1,600 px, in Chromium (issue 45): the pixels AppTest cannot see."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _dashboard_page(folder: Path, tmp_path: Path) -> Iterator[Any]:
    """A 1,600 x 1,000 Chromium page on the dashboard as `make run` starts it, over the data ``folder``."""
    from playwright.sync_api import sync_playwright

    env = {**os.environ, "MOEBENCH_DATA_DIR": str(folder), "PYTHONUNBUFFERED": "1"}
    with running_dashboard(env, tmp_path / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page: Any = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(url)
            yield page
        finally:
            browser.close()


def test_the_results_table_and_its_filters_show_whole_words_at_1600_px(tmp_path: Path) -> None:
    """At 1,600 px the Results table was cut ("goodput req", "other proce") and the Status filter's
    chip read "c…"."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    folder = tmp_path / "data"
    folder.mkdir()
    columns = _store_with_every_column(folder)
    assert "goodput_rps" in columns and "note" in columns
    with _dashboard_page(folder, tmp_path) as page:
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


# Every annotation's box (by its index in layout.annotations) and every axis tick label's, as drawn.
BOXES = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const notes = {};
  document.querySelectorAll('g.annotation').forEach(g => { notes[g.getAttribute('data-index')] = box(g); });
  const ticks = [...document.querySelectorAll('g.xtick text, g.ytick text')].map(box);
  return {notes, ticks};
}"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _drawn(page: Any, fig: Any, width: int) -> dict[str, Any]:
    page.evaluate(
        "([spec, w]) => { const d = document.getElementById('c'); d.innerHTML = '';"
        " return Plotly.newPlot(d, spec.data, {...spec.layout, width: w}); }",
        [fig.to_plotly_json(), width],
    )
    return page.evaluate(BOXES)


def test_the_replay_badge_percentile_labels_and_limit_label_never_cover_each_other(tmp_path: Path) -> None:
    """The p99 label hid under the "replay" badge; the hardware limit's label ran over the TPOT axis's
    ticks. The Replay page's own charts of the tuned H100 run's last frame, drawn by plotly.js."""
    import json

    import plotly
    from playwright.sync_api import sync_playwright

    from bench.metrics.run_limits import RunLimits
    from dashboard import charts

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    store = Store(tmp_path / "db.sqlite")
    profile_data.import_examples(store)
    run = next(r for r in store.list_runs() if r.name == "h100-fast-concurrency-128")
    rec = data.load_recording(store, run.id)
    frame = data.replay_frame(rec, rec.duration_s)
    limits = data.run_limits(store, run, frame.summary)
    assert isinstance(limits, RunLimits)
    figs = data.live_figures(frame.live, frame.summary, None, limits.reached(frame.summary))
    for fig in figs.values():
        charts.mark_replay(fig, f"replay · run #{run.id}")
    store.close()
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page: Any = browser.new_page(viewport={"width": 1000, "height": 600})
            page.set_content('<div id="c"></div>')
            page.add_script_tag(path=str(js))
            for width in (560, 760):  # a chart of the page's two columns at 1,280 and 1,600 px
                for key, fig in figs.items():
                    got = _drawn(page, fig, width)
                    names = {str(i): a.name or a.text for i, a in enumerate(fig.layout.annotations)}
                    boxes = got["notes"]
                    badge = next(str(i) for i, a in enumerate(fig.layout.annotations) if a.text.startswith("replay ·"))
                    for i, b in boxes.items():
                        assert i == badge or not _overlap(boxes[badge], b), (key, width, names[i], "under the badge")
                    for i, n in names.items():
                        if n == "limit":
                            hit = [t for t in got["ticks"] if _overlap(boxes[i], t)]
                            assert not hit, (key, width, "the limit's label covers tick labels", json.dumps(hit))
            assert any(a.name == "limit" for a in figs["tpot"].layout.annotations)  # the case the issue saw
        finally:
            browser.close()


def test_the_live_concurrency_chart_shows_the_books_platforms(tmp_path: Path) -> None:
    """Issue 48: the Concurrency page's live charts (its latest run: the imported H100 example at 128
    in flight) carry the book's 910B and MLU590 marks, drawn by plotly.js in the browser; the
    screenshot is kept under tests/artifacts/."""
    from tests.dashboard.test_e2e_browser import ARTIFACTS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    folder = tmp_path / "data"
    folder.mkdir()
    store = Store(folder / "moebench.sqlite")
    profile_data.import_examples(store)
    store.close()
    with _dashboard_page(folder, tmp_path) as page:
        goto_page(page, "Concurrency")
        legend = page.locator(".js-plotly-plot .legendtext", has_text="book: Ascend 910B")
        legend.first.wait_for()
        assert page.locator(".js-plotly-plot .legendtext", has_text="book: Cambricon MLU590").count() >= 1
        page.get_by_text("Book marks (dash-dot").first.wait_for()
        legend.first.scroll_into_view_if_needed()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "concurrency-book-marks.png"))

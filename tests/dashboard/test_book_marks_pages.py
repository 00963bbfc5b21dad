"""The book's platforms on the Replay and Sweep pages' charts (issue 48, item 1)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.analysis.book_marks import BOOK_GROUP
from bench.store import Store
from dashboard import profile_data
from engines.settings import get_settings


def _charts(at: Any) -> list[dict[str, Any]]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _book_names(spec: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in spec["data"] if t.get("legendgroup") == BOOK_GROUP]


def test_replay_and_sweep_draw_the_book_and_the_toggle_hides_it(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    imported, _ = profile_data.import_examples(store)
    assert "h100-fast-concurrency-128" in imported
    at = app_test()
    at.switch_page("app_pages/replay.py").run()
    assert not at.exception
    run = store.get_run(at.session_state["rp.run"])
    assert run is not None and run.name == "h100-fast-concurrency-128"
    at.session_state["rp.state"] = "paused"
    at.session_state["rp.pos"] = 1e9  # the whole run
    at.run()
    assert not at.exception and at.toggle(key="rp.book").value is True
    throughput = next(s for s in _charts(at) if "Output tokens per second" in s["layout"]["title"]["text"])
    assert "book: Ascend 910B (70 %)" in _book_names(throughput)
    mark = next(t for t in throughput["data"] if t.get("name") == "book: Ascend 910B (70 %)")
    assert mark["line"]["dash"] == "dashdot"
    assert mark["y"][0] == run.summary.output_throughput_tok_s * 0.70
    assert any("Book marks" in c.value for c in at.caption)
    at.toggle(key="rp.book").set_value(False).run()
    assert not at.exception and not any(_book_names(s) for s in _charts(at))

    at.switch_page("app_pages/sweep.py").run()
    assert not at.exception
    sweeps = {s.id: s for s in store.list_sweeps()}
    h100 = next(i for i, s in sweeps.items() if s.name == "h100-fast-sweep")
    at.session_state["w.view"] = h100
    at.run()
    assert not at.exception and at.toggle(key="w.book").value is True
    ttft = next(s for s in _charts(at) if s["layout"]["title"]["text"].startswith("TTFT vs output throughput"))
    names = _book_names(ttft)
    assert "book: Ascend 910B (70 % throughput, 120 % latency)" in names
    assert "book: Cambricon MLU590 (60 % throughput, 150 % latency)" in names


def test_the_live_concurrency_charts_draw_the_book(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The Concurrency page's live panel (here: its latest stored run, the H100 example) draws the
    book's two other platforms on its throughput chart, and says what they stand on."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    at = app_test()
    at.switch_page("app_pages/concurrency.py").run()
    assert not at.exception
    names = [n for spec in _charts(at) for n in _book_names(spec)]
    assert "book: Ascend 910B (70 %)" in names and "book: Cambricon MLU590 (60 %)" in names
    assert any("Book marks" in c.value for c in at.caption)

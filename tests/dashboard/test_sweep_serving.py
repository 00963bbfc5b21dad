"""The Sweep page's serving chart through AppTest: output tok/s per accelerator against tok/s per user of
the H100 vLLM example sweep with the native one overlaid, the target caption, the price inputs and the
table of $ and J per million output tokens (figures recomputed by hand in tests/bench/test_serving.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.bundle import import_file
from bench.store import Store
from tests.dashboard.test_pages import _frame, _no_exception, _texts

SWEEP_PAGE = "app_pages/sweep.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TITLE = "Output tok/s per accelerator vs tok/s per user (interactivity)"


@pytest.fixture
def two_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("MOEBENCH_DATA_DIR", str(folder))
    monkeypatch.delenv("MOEBENCH_ACCELERATOR_PRICES", raising=False)
    store = Store(folder / "moebench.sqlite")
    _, vllm = import_file(store, EXAMPLES / "h100-vllm-sweep.sweep.json")
    _, native = import_file(store, EXAMPLES / "h100-fast-sweep.sweep.json")
    store.close()
    return vllm, native


def _serving_chart(at: Any) -> dict[str, Any]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return next(s for s in specs if s["layout"]["title"]["text"] == TITLE)


def test_the_sweep_page_overlays_two_sweeps_and_names_the_best_at_the_target(
    app_test: Callable[..., Any], two_sweeps: tuple[int, int]
) -> None:
    vllm, native = two_sweeps
    at = app_test(SWEEP_PAGE)
    at.selectbox(key="w.view").set_value(vllm).run()
    _no_exception(at)
    at.multiselect(key="w.overlay").set_value([native]).run()
    _no_exception(at)
    spec = _serving_chart(at)
    fronts = [t for t in spec["data"] if t.get("mode") == "lines+markers+text"]
    assert [t["name"] for t in fronts] == [
        f"#{vllm} h100-vllm-sweep · vllm · H100",
        f"#{native} h100-fast-sweep · native · H100",
    ]
    assert all(len(t["x"]) == 4 for t in fronts)
    text = _texts(at)
    assert "Best throughput at ≥ 20 tok/s per user" in text
    assert "11,070 output tok/s per accelerator at c=128" in text and "5,394 output tok/s per accelerator" in text
    assert "$2.00 per H100-hour (assumption" in text
    table = _frame(at, "$ per M output tokens")
    assert len(table) == 8 and table["J per M output tokens"].notna().sum() == 4  # only vLLM read power
    # The target and the price are the user's: 100 tok/s per user leaves the native sweep with c=8 (105 tok/s
    # per user), and $4 per H100-hour doubles every dollar figure.
    before = table["$ per M output tokens"].tolist()
    at.number_input(key="w.target").set_value(100.0).run()
    at.number_input(key="w.price.h100").set_value(4.0).run()
    _no_exception(at)
    text = _texts(at)
    assert "Best throughput at ≥ 100 tok/s per user" in text and "759 output tok/s per accelerator at c=8" in text
    after = _frame(at, "$ per M output tokens")["$ per M output tokens"].tolist()
    assert after == pytest.approx([2 * v for v in before])
    assert "$4.00 per H100-hour (assumption: set by the user; default $2.00)" in text
    line = next(s for s in _serving_chart(at)["layout"]["shapes"] if s.get("x0") == 100.0)
    assert line["x1"] == 100.0

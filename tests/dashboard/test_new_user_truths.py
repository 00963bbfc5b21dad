"""What a new user saw that was not true (issue 45, section 3): each page says what its data says."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.analysis import tuning
from bench.bundle import import_bundle_file
from bench.store import Store
from dashboard import data, profile_data
from engines.settings import get_settings
from tests.dashboard.test_compare_page import PAGE as COMPARE
from tests.dashboard.test_compare_page import _frame, _no_exception, _texts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_h100_column_shows_h100_runs_and_the_pickers_start_on_no_tuning_row(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """The issue's case: the GPU examples and the saved tuning runs imported; the H100 column showed
    the newest CUDA run (an H200 tuning row) and the native picker a tuning row."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    assert tuning.import_saved(store)
    runs = {r.id: r for r in store.list_runs()}
    at = app_test(COMPARE)
    _no_exception(at)
    h100 = runs[at.selectbox(key="c.acc.cuda").value]
    assert "H100" in h100.engine_info["device"] and not data.is_tuning_run(h100), h100.name
    acc = _frame(at, "measured run").set_index("column")
    assert "H200" not in acc.loc["NVIDIA H100", "measured run"]
    native = runs[at.selectbox(key="c.native").value]
    assert native.engine == "native" and not data.is_tuning_run(native), native.name
    # Picked by hand, an H200 run is said to be no H100 run.
    h200 = next(r.id for r in runs.values() if r.name == "h200-concurrency-16")
    at.selectbox(key="c.acc.cuda").set_value(h200).run()
    _no_exception(at)
    assert any(f"Run #{h200} was not measured on the column's card (NVIDIA H100)" in t for t in _texts(at, "warning"))
    store.close()


def test_a_column_without_a_run_on_its_card_says_none(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    store = Store(get_settings().db_path)
    h200 = import_bundle_file(store, EXAMPLES / "h200-concurrency-16.json")
    at = app_test(COMPARE)
    _no_exception(at)
    assert at.selectbox(key="c.acc.cuda").value is None
    assert "no NVIDIA H100 run measured yet: any other stored run can be picked above" in _texts(at, "info")
    assert any(o.startswith(f"#{h200} ") and o.endswith("· no H100") for o in at.selectbox(key="c.acc.cuda").options)
    store.close()

"""Dashboard fixtures: AppTest factory, fresh data folders, the session's store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.store import Store

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture
def fresh_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder of its own (so an empty database), for this test only."""
    folder = tmp_path / "data"
    monkeypatch.setenv("MOEBENCH_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def app_test() -> Callable[..., object]:
    """A factory for an AppTest of the real app (after a first run, so pages can be switched)."""
    from streamlit.testing.v1 import AppTest

    def make(page: str | None = None, timeout: float = 60) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=timeout)
        at.run()
        if page is not None:
            at.switch_page(page)
            at.run()
        return at

    return make


@pytest.fixture
def session_store(moebench_data: Path) -> Iterator[Store]:
    """The store the app uses in this test session (same database file)."""
    from engines.settings import get_settings

    store = Store(get_settings().db_path)
    yield store
    store.close()

"""Viewer mode (``MOEBENCH_MODE=viewer``, ``make demo``): every page readable, no action possible."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engines.errors import ConfigError
from tests.dashboard.test_pages import _texts


@pytest.fixture
def viewer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEBENCH_MODE", "viewer")


def test_every_page_reads_and_every_action_is_off(viewer: None, app_test: Callable[..., Any]) -> None:
    at = app_test()  # the Engine & Model page
    assert not at.exception
    assert "viewer mode" in _texts(at)
    assert at.button(key="e.btn.load").disabled and at.button(key="e.btn.unload").disabled
    for page, start in (("app_pages/latency.py", "latency.btn.start"), ("app_pages/concurrency.py",
                        "concurrency.btn.start"), ("app_pages/profiling.py", "p.btn.start"),
                        ("app_pages/sweep.py", "w.btn.start")):  # fmt: skip
        at.switch_page(page).run()
        assert not at.exception, page
        assert at.button(key=start).disabled, page
        assert "Viewer mode" in _texts(at), page
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception and at.button(key="c.btn.compare").disabled
    at.switch_page("app_pages/results.py").run()
    assert not at.exception


def test_actions_are_refused_behind_the_buttons_too(viewer: None) -> None:
    """A disabled button is not the only guard: the services refuse in viewer mode."""
    from dashboard import services

    with pytest.raises(ConfigError, match="viewer mode"):
        services.require_operator()
    slot = services.EngineSlot()
    with pytest.raises(ConfigError, match="viewer mode"):
        slot.load({"kind": "native"})
    with pytest.raises(ConfigError, match="viewer mode"):
        slot.unload()


def test_a_viewer_follows_a_run_another_process_is_running(
    viewer: None, app_test: Callable[..., Any], session_store: Any
) -> None:
    """The operator's run lives in another process; the viewer reads it from the store and says so."""
    run_id = session_store.create_run(
        mode="latency", engine="native", model="tiny-deepseek-v3", accelerator="cpu", config={"mode": "latency"}
    )
    try:
        at = app_test("app_pages/latency.py")
        assert not at.exception
        text = _texts(at)
        assert f"Run #{run_id} · running" in text and "running in another process" in text
    finally:
        session_store.finish_run(run_id, "cancelled", error="test over")

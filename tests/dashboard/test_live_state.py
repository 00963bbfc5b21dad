"""Issue 45 §3, live state: while a run goes, the sidebar, the progress line, the headline and the
live charts of one refresh describe the same requests (they showed 4, 13 and none at once).

A real run of the real tiny model on the loaded engine (the dashboard's engine host), refreshed
with AppTest as the browser's fragments would refresh it.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.store import Store

PROGRESS = re.compile(r"^(?:[^·]* · )?([\d,]+)/([\d,]+) requests")
BASIS = re.compile(r"Over the ([\d,]+) requests finished so far")


def _count(text: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.search(text)
    return int(m.group(1).replace(",", "")) if m else None


def _length(values: Any) -> int:
    """Points in a Plotly JSON array: a list, or a typed array ({"dtype": "f8", "bdata": base64})."""
    if isinstance(values, dict):
        return len(base64.b64decode(values["bdata"])) // np.dtype(values["dtype"]).itemsize
    return len(values or [])


def _three_counts(at: Any) -> dict[str, int | None]:
    """The run's count as the sidebar, the progress line, the headline and the charts show it."""
    side = [p.proto.text for p in at.sidebar.get("progress")]
    main = [p.proto.text for p in at.main.get("progress")]
    basis = [c.value for c in at.main.caption if BASIS.search(str(c.value))]
    points = None
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        if spec["layout"].get("title", {}).get("text", "").startswith("Per-request latency over time"):
            # E2E, failed and cancelled markers: one per finished request (TTFT repeats E2E's; the
            # book's platforms are reference lines, not requests)
            requests = [t for t in spec.get("data", []) if t.get("name") != "TTFT" and t.get("legendgroup") != "book"]
            points = sum(_length(t.get("x")) for t in requests)
    return {
        "sidebar": _count(side[0], PROGRESS) if side else None,
        "progress": _count(main[0], PROGRESS) if main else None,
        "headline": _count(basis[0], BASIS) if basis else (0 if points == 0 else None),
        "charts": points,
    }


def test_sidebar_progress_headline_and_charts_count_the_same_requests_at_every_refresh(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.button(key="e.btn.load").click().run()
        deadline = time.monotonic() + 180
        while not services.get_engine_slot().state().ready and time.monotonic() < deadline:
            time.sleep(0.3)
        assert services.get_engine_slot().state().ready, "the engine did not load"
    at.switch_page("app_pages/concurrency.py").run()
    at.number_input(key="concurrency.requests").set_value(400).run()
    at.number_input(key="concurrency.warmup").set_value(0).run()
    at.number_input(key="s.max_tokens").set_value(8).run()
    at.button(key="concurrency.btn.start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    job = services.get_job_manager().active()
    assert job is not None
    try:
        seen: list[dict[str, int | None]] = []
        deadline = time.monotonic() + 120
        # refresh while requests keep finishing: each refresh's four figures must agree
        while len(seen) < 6 and time.monotonic() < deadline and job.active:
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            counts = _three_counts(at)
            if job.active and counts["progress"] is not None and counts["progress"] > 0:
                seen.append(counts)
                assert len(set(counts.values())) == 1, f"one refresh, different counts: {counts}"
            time.sleep(0.2)
        assert len(seen) >= 3, f"too few refreshes while the run went: {seen}"
        assert len({c["progress"] for c in seen}) >= 2, f"the run did not move between refreshes: {seen}"
    finally:
        job.cancel()
        job.wait(30)
    assert services.get_engine_slot().state().ready


def _order(at: Any) -> list[str]:
    """The main area's buttons' labels and markdown texts, top to bottom."""
    out: list[str] = []

    def walk(node: Any) -> None:
        kind = getattr(node, "type", "")
        if kind == "markdown":
            out.append(str(node.value))
        elif kind == "button":
            out.append(f"button:{node.label}")
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at.main)
    return out


def test_stops_own_rerun_draws_the_cancelled_run_above_the_form(
    app_test: Callable[..., Any], tiny_model: Path, session_store: Store
) -> None:
    """Stop's click reruns the page once the run has ended: that rerun draws "cancelled" first,
    where the live panel was, not after the whole run form."""
    from dashboard import services

    at = app_test()
    if not services.get_engine_slot().state().ready:
        at.button(key="e.btn.load").click().run()
        deadline = time.monotonic() + 180
        while not services.get_engine_slot().state().ready and time.monotonic() < deadline:
            time.sleep(0.3)
    at.switch_page("app_pages/concurrency.py").run()
    at.number_input(key="concurrency.requests").set_value(400).run()
    at.number_input(key="concurrency.warmup").set_value(0).run()
    at.button(key="concurrency.btn.start").click().run()
    job = services.get_job_manager().active()
    assert job is not None
    deadline = time.monotonic() + 60
    while job.snapshot().done < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    at.run()
    at.button(key="concurrency.btn.stop").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert job.status == "cancelled"
    order = _order(at)
    header = next(i for i, text in enumerate(order) if f"Run #{job.run_id} · cancelled" in text)
    assert header < order.index("button:Start run"), order

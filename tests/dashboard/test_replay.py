"""Replay: a stored run played back on the live charts, from what it recorded (issue 14, item 9)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from dashboard import data, profile_data
from engines.settings import get_settings
from tests.dashboard.synthetic import add_synthetic_run


def test_a_replay_frame_shows_only_what_was_recorded_by_then(store: Store) -> None:
    run_id = add_synthetic_run(store, 40)
    rec = data.load_recording(store, run_id)
    ends = sorted(rec.samples["end_s"])
    mid = ends[19]
    frame = data.replay_frame(rec, mid)
    assert frame.done == 20 and frame.total == 40 and not frame.finished
    assert frame.live.samples["end_s"].max() == pytest.approx(mid)  # no request from the future
    assert (frame.live.timeseries["t_s"] <= mid).all()
    assert frame.summary is not None and frame.summary.completed + frame.summary.failed == 20
    assert frame.summary.duration_s == pytest.approx(mid)  # throughput so far: tokens / time so far
    starts, stops = rec.samples["start_s"], rec.samples["end_s"]
    assert frame.in_flight == int(((starts <= mid) & (stops > mid)).sum())

    start = data.replay_frame(rec, 0.0)
    assert start.done == 0 and start.summary is None and start.live.samples.empty
    end = data.replay_frame(rec, rec.duration_s + 100)  # past the end: the whole run, as stored
    assert end.finished and end.done == 40
    whole = store.get_run(run_id)
    assert whole is not None and whole.summary is not None
    assert end.summary is not None and end.summary.output_tokens == whole.summary.output_tokens


def test_a_run_without_requests_cannot_be_replayed(store: Store) -> None:
    empty = store.create_run(mode="latency", engine="native", model="m", accelerator="cpu", config={})
    with pytest.raises(Exception, match="no stored requests"):
        data.load_recording(store, empty)


def test_the_replay_page_opens_on_the_tuned_h100_example_with_its_conditions_on_its_face(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    store = Store(get_settings().db_path)
    imported, _ = profile_data.import_examples(store)
    assert imported
    at = app_test()
    at.switch_page("app_pages/replay.py").run()
    assert not at.exception
    run = store.get_run(at.session_state["rp.run"])
    # the demo opens on the fastest configuration's batched run, not on an eager one
    assert run is not None and run.name == "h100-fast-concurrency-128"
    info = " ".join(i.value for i in at.info)
    assert "random weights" in info and "bfloat16" in info and "NVIDIA H100 80GB HBM3" in info
    assert "tuned: CUDA graphs, torch.compile, absorbed MLA, lean experts, lean gate, batches of up to 128" in info
    at.button(key="rp.btn.play").click().run()
    assert at.session_state["rp.state"] == "playing"
    texts = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "replay" in texts and f"REPLAY of run #{run.id}" in texts and "NVIDIA H100" in texts
    # Jump to three quarters of the run (as if it had played that long; the batch-128 run ends its
    # first wave of 128 near the middle) and check what is drawn.
    rec = data.load_recording(store, run.id)
    at.session_state["rp.state"] = "paused"
    at.session_state["rp.pos"] = rec.duration_s * 0.75
    at.run()
    assert not at.exception
    expected = data.replay_frame(rec, rec.duration_s * 0.75)
    bar = at.get("progress")[0]
    assert f"{expected.done:,}/{expected.total:,} requests" in bar.proto.text
    assert 0 < expected.done < expected.total


def test_an_eager_example_says_it_is_the_baseline_and_what_its_recording_said(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """The H200 eager concurrency run: labelled the eager baseline, with its stored client-bound note."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    eager = next(r for r in store.list_runs() if r.name == "h200-concurrency-16")
    at = app_test()
    at.switch_page("app_pages/replay.py").run()
    at.selectbox(key="rp.run").set_value(eager.id).run()
    assert not at.exception
    assert "the eager baseline" in " ".join(i.value for i in at.info)
    warnings = " ".join(w.value for w in at.warning)
    assert "As recorded:" in warnings and "client-bound: p90 send lag 31.3 ms" in warnings
    assert "eager baseline" in profile_data.profile_run_label(eager)

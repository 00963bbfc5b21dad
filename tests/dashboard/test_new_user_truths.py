"""What a new user saw that was not true (issue 45, section 3): each page says what its data says."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.analysis import tuning
from bench.bundle import import_bundle_file
from bench.store import Store
from dashboard import data, profile_data
from engines.settings import get_settings
from tests.dashboard.test_compare_page import PAGE as COMPARE
from tests.dashboard.test_compare_page import _frame, _no_exception, _texts

PROFILING = "app_pages/profiling.py"
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


def test_a_profile_run_without_routing_says_so(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The H100 example profile has no routing: its Expert routing tab showed another run's heat map, silently."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    runs = {r.name: r.id for r in store.list_runs()}
    h100, h200 = runs["h100-fast-profile"], runs["h200-profile"]
    assert store.artifact(h100, "expert_routing") is None and store.artifact(h200, "expert_routing")
    at = app_test(PROFILING)
    at.selectbox(key="p.run").set_value(h100).run()
    _no_exception(at)
    assert any(t.startswith(f"Run #{h100} recorded no expert routing") for t in _texts(at, "info"))
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    heat = [t for t in titles if t.startswith("Tokens routed to each expert")]
    assert len(heat) == 1 and not heat[0].endswith(f"run #{h100}"), heat  # another run's, titled with it
    assert store.artifact(int(heat[0].rsplit("#", 1)[1]), "expert_routing")
    # The H200 profile has its own: no such line, its heat map untitled by run.
    at.selectbox(key="p.run").set_value(h200).run()
    assert not any("recorded no expert routing" in t for t in _texts(at, "info"))
    store.close()


def test_no_widget_gets_a_default_and_a_session_state_value(
    app_test: Callable[..., Any], fresh_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server log repeated Streamlit's "created with a default value but also had its value set via the
    Session State API" warning, with a stack trace, for the EP-size widget (key p.ep) on every rerun."""
    from streamlit.elements.lib import policies

    warned: list[str] = []
    monkeypatch.setattr(policies.runtime, "exists", lambda: True)  # AppTest has no runtime: the check is skipped
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    monkeypatch.setattr(policies._LOGGER, "warning", lambda msg, key, **kw: warned.append(key))
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    h200 = next(r.id for r in store.list_runs() if r.name == "h200-profile")
    at = app_test(PROFILING)
    at.selectbox(key="p.run").set_value(h200).run()
    at.run()  # a rerun: the page's choices are re-set through session_state
    _no_exception(at)
    assert at.selectbox(key="p.ep").value == 8
    assert warned == []
    store.close()


CHILD = """
import json, time
from bench.run.host_load import HostLoad
h = HostLoad()
time.sleep(1.5)
print(json.dumps({"root": h.root.pid, "others": [pid for _, pid, _ in h.busiest_others(limit=50)]}))
"""
PARENT = """
import subprocess, sys, threading, time
stop = time.monotonic() + 60
def spin():
    while time.monotonic() < stop:
        pass
threading.Thread(target=spin, daemon=True).start()  # the dashboard drawing a live page: a busy core
out = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, timeout=120)
import os
print(os.getpid())
print(out.stdout, out.stderr)
"""


def test_the_dashboard_is_not_among_the_processes_that_disturbed_its_run(tmp_path: Path) -> None:
    """Every run was marked Disturbed, naming the dashboard's own Streamlit server ("python (pid N)"):
    a run measured in the engine host (a child of the dashboard) counts its parent as its own."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    # argv as `streamlit run dashboard/serve.py` has it: the script path names the dashboard
    proc = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD, "dashboard/serve.py"],
        cwd=root, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    dashboard_pid, seen = int(lines[0]), json.loads(lines[1])
    assert seen["root"] == dashboard_pid  # the run's own tree starts at the dashboard
    assert dashboard_pid not in seen["others"], seen
    from bench.run.host_load import is_moebench_process

    assert is_moebench_process(["python", "-m", "streamlit", "run", "dashboard/serve.py"])
    assert is_moebench_process(["/usr/bin/python3", "-m", "bench", "run"])
    assert not is_moebench_process(["python", "-m", "pytest", "tests/bench"])
    assert not is_moebench_process(["bash"])


def test_the_run_form_is_true_for_a_trace(fresh_data_dir: Path) -> None:
    """Trace replay on the Concurrency page: the run's total came from the form's Requests field (20/32),
    two "Requests" inputs, the form's Concurrency (4) capped the trace silently, request rate and ramp-up
    stayed editable but were ignored, and the synthetic trace's prompts were 768 tokens whatever was set."""
    from streamlit.testing.v1 import AppTest

    from bench.config import TRACE_IN_FLIGHT, RunConfig
    from tests.dashboard.test_pages import _submit_form

    at = AppTest.from_function(_submit_form, default_timeout=60)
    at.run()
    at.number_input(key="concurrency.requests").set_value(32).run()
    at.selectbox(key="concurrency.source").set_value("trace").run()
    _no_exception(at)
    at.number_input(key="concurrency.synth_requests").set_value(20).run()
    at.number_input(key="concurrency.synth_input_len").set_value(1100).run()
    _no_exception(at)
    labels = [w.label for w in at.number_input]
    assert labels.count("Requests") + labels.count("Requests in the trace") == 1, labels
    keys = {w.key for w in at.number_input}
    assert not keys & {"concurrency.requests", "concurrency.request_rate", "concurrency.ramp_up",
                       "concurrency.burstiness", "concurrency.concurrency"}, keys  # fmt: skip
    assert any("the trace's **20** requests" in str(c.value) for c in at.caption)
    cfg = at.session_state["submitted"]
    assert cfg["requests"] == 20  # the run's total is the trace's
    assert RunConfig.build(**{**cfg, "engine": {"kind": "native"}}).concurrency == TRACE_IN_FLIGHT  # no silent cap
    lines = [json.loads(line) for line in Path(cfg["workload"]["path"]).read_text().splitlines()]
    assert {row["input_length"] for row in lines} == {1100}
    # A cap is set on purpose, under its own name.
    at.number_input(key="concurrency.trace_in_flight").set_value(4).run()
    assert at.session_state["submitted"]["concurrency"] == 4


def test_demo_labels_say_what_they_mean(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """A one-run-per-point sweep said "Means over the 1 repeats"; a limit column said "HBM" for any group."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    assert tuning.import_saved(store)
    at = app_test("app_pages/sweep.py")
    _no_exception(at)
    captions = _texts(at, "caption")
    assert not any("Means over the 1 repeats" in t for t in captions), captions
    assert any(t.startswith("One run per point") for t in captions), captions
    at = app_test("app_pages/tuning.py")
    _no_exception(at)
    columns = [c for df in at.dataframe for c in df.value.columns]
    assert any("memory-bound limit" in c for c in columns) and not any("HBM" in c for c in columns), columns
    store.close()


def test_tuning_runs_are_folded_in_results(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """120 tuning runs flooded the Results table: folded by default, one toggle shows them."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    assert tuning.import_saved(store)
    n_all = len(store.list_runs())
    n_tuning = sum(1 for r in store.list_runs() if data.is_tuning_run(r))
    at = app_test("app_pages/results.py")
    _no_exception(at)
    table = next(df.value for df in at.dataframe if "run_id" in df.value.columns)
    assert len(table) == n_all - n_tuning
    assert f"{n_all - n_tuning} of {n_all} runs · {n_tuning} tuning-ablation runs folded" in _texts(at, "caption")
    at.toggle(key="r.show-tuning").set_value(True).run()
    table = next(df.value for df in at.dataframe if "run_id" in df.value.columns)
    assert len(table) == n_all
    store.close()

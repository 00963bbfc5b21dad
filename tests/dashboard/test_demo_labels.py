"""What a demo sees, issue 45's last list: labels, placeholders and final figures that are true (AppTest)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bundle import import_file
from bench.metrics.summary import summarize
from bench.store import Store
from dashboard import data, profile_data, ui
from engines.settings import get_settings
from tests.dashboard.synthetic import synthetic_records
from tests.dashboard.test_compare_page import _no_exception, _texts

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "tests" / "data" / "peers"


def _results_table(at: Any) -> Any:
    return next(df for df in at.dataframe if "setup" in df.value.columns)


def test_a_missing_figure_in_the_results_table_is_a_dash_not_none(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """Goodput showed a literal "None" for the runs without an SLO (Streamlit's default for a missing cell)."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    records = synthetic_records(20)
    slo = store.create_run(mode="concurrency", engine="native", model="m", accelerator="cpu", config={}, concurrency=4)
    store.add_samples(slo, list(enumerate(records)))
    store.finish_run(slo, "completed", summary=summarize(records, max_concurrency=4, slos=["ttft_ms:p99<=25"]))
    at = app_test(ui.PAGE_RESULTS)
    _no_exception(at)
    table = _results_table(at)
    shown = table.value.set_index("run_id")
    assert "goodput_rps" in list(table.proto.column_order)
    assert shown.loc[slo, "goodput_rps"] > 0
    without = shown.drop(index=slo)["goodput_rps"]
    assert len(without) and without.isna().all()  # missing, not 0 and not the text "None"
    assert table.proto.placeholder == "–"  # what the grid draws for a missing cell
    store.close()


def test_a_peer_run_has_one_engine_label_everywhere(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """guidellm's file says openai_http, vllm bench serve's and AIPerf's say openai: one engine, one label."""
    store = Store(get_settings().db_path)
    ids = [import_file(store, PEERS / n)[1] for n in ("vllm-bench-serve-detailed.json", "guidellm-concurrent.json")]
    ids.append(import_file(store, PEERS / "aiperf-concurrency.json")[1])
    assert {store.get_run(i).engine for i in ids} == {"openai", "openai_http"}  # as the files name them
    at = app_test(ui.PAGE_RESULTS)
    _no_exception(at)
    assert at.multiselect(key="r.engine").options == ["openai"]
    table = _results_table(at).value
    assert set(table["engine"]) == {"openai"}
    assert not any("openai_http" in str(v) for v in table["setup"]), list(table["setup"])
    labels = at.multiselect(key="r.selected").options
    assert len(labels) == 3 and not any("openai_http" in o for o in labels), labels
    # Run details and the Replay page name it the same way.
    guidellm = ids[1]
    at.multiselect(key="r.selected").set_value([guidellm]).run()
    _no_exception(at)
    assert not any("openai_http" in t for t in _texts(at, "markdown")), _texts(at, "markdown")
    at.switch_page(ui.PAGE_REPLAY).run()
    at.selectbox(key="rp.run").set_value(guidellm).run()
    _no_exception(at)
    heads = [t for t in _texts(at, "markdown") if "replay" in t]
    assert heads and all("· openai ·" in t and "openai_http" not in t for t in heads), heads
    assert not any("openai_http" in t for t in _texts(at, "info"))
    store.close()


def _uploader_key(at: Any) -> str:
    (uploader,) = at.get("file_uploader")
    return str(uploader.proto.id).split("-", 2)[2]  # "$$ID-<hash>-<key>": the key the page gave it


def test_files_imported_through_the_uploader_leave_it(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """An imported file stayed in the uploader: a second Import would import it again."""
    from streamlit.runtime.uploaded_file_manager import UploadedFile, UploadedFileRec

    at = app_test(ui.PAGE_RESULTS)
    _no_exception(at)
    key = _uploader_key(at)
    name = "vllm-bench-serve-detailed.json"
    rec = UploadedFileRec(file_id="f1", name=name, type="application/json", data=(PEERS / name).read_bytes())
    at.session_state[key] = [UploadedFile(rec, None)]  # what a browser's upload puts there
    at.button(key="r.btn.import-files").click().run()
    _no_exception(at)
    assert any(t.startswith(f"Imported {name} as run #") for t in _texts(at, "success")), _texts(at, "success")
    store = Store(get_settings().db_path)
    assert len(store.list_runs()) == 1
    store.close()
    after = _uploader_key(at)
    assert after != key  # a new, empty uploader: the browser drops the files it showed
    assert not at.session_state[after]


def test_the_replays_last_frame_shows_the_stored_summary(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """Replay ended at 6,154 tok/s on the run stored with 6,158: the last frame summarised the records
    over the replay's clock (to the last request's end), not the run's measured duration."""
    store = Store(get_settings().db_path)
    profile_data.import_examples(store)
    at = app_test(ui.PAGE_REPLAY)
    _no_exception(at)
    run = store.get_run(at.session_state["rp.run"])
    assert run is not None and run.summary is not None and run.name == "h100-fast-concurrency-128"
    rec = data.load_recording(store, run.id)
    end = data.replay_frame(rec, rec.duration_s)
    assert end.finished and end.summary is not None
    assert end.summary.as_dict() == run.summary.as_dict()  # every figure, as stored
    at.session_state["rp.state"] = "paused"
    at.session_state["rp.pos"] = rec.duration_s
    at.run()
    _no_exception(at)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Output throughput"] == data.fmt_unit(run.summary.output_throughput_tok_s, "tok/s") == "6,158 tok/s"
    assert shown["TTFT p50"] == data.fmt_unit(run.summary.ttft_ms.p50, "ms")
    # Before the end, the figures are those of the requests finished by then, over the time so far.
    mid = data.replay_frame(rec, rec.duration_s * 0.75)
    assert mid.summary is not None and mid.summary.duration_s == rec.duration_s * 0.75
    store.close()


def test_the_greedy_check_says_what_ran_and_what_it_found(store: Store) -> None:
    """ "greedy tokens equal the baseline's on 0 of 1" read as a failed check; a check not run, or one
    on float32 (where a difference is real), said the same bf16 excuse or nothing plain."""
    from dataclasses import replace

    from bench.analysis import tuning

    assert tuning.import_saved(store)
    row = next(r for r in tuning.tuning_rows(store) if r.config != "baseline" and r.dtype == "bfloat16")

    def said(**change: Any) -> str:
        return tuning.conditions(tuning.Headline(replace(row, **change), None, None, None))

    assert "greedy tokens checked on 4 check prompts: the same as the baseline's" in said(greedy_match="4/4")
    bf16 = said(greedy_match="0/1 (first difference at token 0)")
    assert "greedy tokens checked on 1 check prompt: 1 differs from the baseline's, the first at token 0" in bf16
    assert "expected in bfloat16 on random weights" in bf16 and "0 of 1" not in bf16
    f32 = said(greedy_match="2/4 (first difference at token 17)", dtype="float32")
    assert f32.endswith("checked on 4 check prompts: 2 differ from the baseline's, the first at token 17.")
    for none in (None, "0/0", "-"):
        assert "no greedy-token check was run for this row" in said(greedy_match=none)


def test_an_sglang_result_file_imports_through_the_uploader(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """A .jsonl alone is SGLang bench_serving's result (runs appended a line each): the last run is
    imported; with a .json beside it a .jsonl is AIPerf's records and read with that JSON."""
    from streamlit.runtime.uploaded_file_manager import UploadedFile, UploadedFileRec

    at = app_test(ui.PAGE_RESULTS)
    _no_exception(at)
    name = "sglang-bench-serving-two-rates.jsonl"
    rec = UploadedFileRec(file_id="f2", name=name, type="application/jsonl", data=(PEERS / name).read_bytes())
    at.session_state[_uploader_key(at)] = [UploadedFile(rec, None)]
    at.button(key="r.btn.import-files").click().run()
    _no_exception(at)
    assert any(t.startswith(f"Imported {name} as run #") for t in _texts(at, "success")), _texts(at, "success")
    store = Store(get_settings().db_path)
    runs = store.list_runs()
    assert len(runs) == 1 and runs[0].config.get("source_tool", "").startswith("SGLang")
    store.close()

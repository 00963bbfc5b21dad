"""The Tuning page: the H200 ablation imported from examples/tuning shown as tables and bars, and
a new ablation run from the page in the background on this CPU (the tiny model), its runs
stored when it ends."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.analysis import tuning
from bench.store import Store
from engines.settings import get_settings
from tests.dashboard.test_pages import _no_exception, _texts

SAVED = Path(__file__).resolve().parents[2] / "examples" / "tuning"


def _grid(at: Any, key_column: str, first: str) -> Any:
    """The dataframe whose first column is ``key_column`` and whose first row is ``first``."""
    return next(d.value for d in at.dataframe if key_column in d.value.columns and d.value.iloc[0][key_column] == first)


def _study_grid(at: Any, source: str, column: str) -> Any:
    """The step study ``source``'s table with ``column`` (its timings: "batch 128"; its profile:
    "kernels/step"): the studies show in :func:`tuning.step_studies` order, one table of each."""
    i = [s.source for s in tuning.step_studies()].index(source)
    return [d.value for d in at.dataframe if column in d.value.columns and "step" in d.value.columns][i]


def test_the_saved_h200_ablation_imports_with_its_checks(store: Store) -> None:
    names = tuning.import_saved(store)
    ran = [r for f in sorted(SAVED.glob("*.results.json")) for r in json.loads(f.read_text())["rows"] if "run_id" in r]
    assert len(names) == len(ran) == 120
    assert tuning.import_saved(store) == []  # a second import adds nothing
    rows = tuning.tuning_rows(store)
    assert {r.group for r in rows} == {
        "NVIDIA H200 · bfloat16 · transformers 5.17.0",
        "NVIDIA H200 · float32 · transformers 5.17.0",
        "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.17.0",
        "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.19.0",  # the same configs, another version: its own rows
    }
    # the H100's ABBA rounds: each row the median round (low median of an even count), the range
    # beside it; a later ablation of the same (config, batch) replaces an earlier one's rounds:
    # the grid (lean gate) measured transformers' step at batch 1 again, the lean gate's own run
    # the lean experts at batch 1; the grid's left-out rows (past torch's recompile limit) leave
    # the earlier measurement standing; transformers' compiled step at batch 32 came in its own run;
    # last, the whole grid again with every shape compiled (the names below: oldest first)
    h100 = {(r.config, r.batch): r for r in rows if r.group == "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.17.0"}
    newest: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for name in (
        "h100-bf16-lean-abba",
        "h100-bf16-grid-lean-router",
        "h100-bf16-lean-router-b1",
        "h100-bf16-mla-b32",
        "h100-bf16-grid-compiled",
        "h100-bf16-baseline",
    ):
        saved = json.loads((SAVED / f"{name}.results.json").read_text())["rows"]
        for key in {(r["config"], r["batch"]) for r in saved}:
            newest[key] = [r for r in saved if (r["config"], r["batch"]) == key]
    assert not any(r["config"] == "cuda_graphs_compile_mla_lean" for r in json.loads(
        (SAVED / "h100-bf16-grid-lean-router.results.json").read_text())["rows"])  # fmt: skip
    for key, measured in newest.items():
        toks = sorted(r["output_tok_s"] for r in measured)
        got = h100[key]
        n = len(measured)
        spread = (toks[0], toks[-1]) if n > 1 else None  # one round (the batch-32 fill): no range to show
        assert got.rounds == n and got.tok_s_range == spread and got.output_tok_s == toks[(n - 1) // 2]
    assert newest[("cuda_graphs_compile_mla_lean", 1)][0]["options"].get("router") is None  # the lean gate's baseline
    assert (
        h100[("cuda_graphs_compile_mla_lean_router", 1)].step_ms_p50
        < h100[("cuda_graphs_compile_mla_lean", 1)].step_ms_p50
    )
    assert h100[("cuda_graphs_compile_mla_lean", 128)].rounds == 4  # from the earlier ABBA: not re-measured
    newer = [r for r in rows if r.group.endswith("5.19.0")]
    assert {(r.config, r.batch) for r in newer} == {
        (c, b) for c in ("cuda_graphs_compile_mla", "cuda_graphs_compile_mla_lean_router") for b in (1, 128)
    }
    assert all(r.rounds == 2 for r in newer)  # the later 5.19 run (ABBA) replaced the single runs
    # baseline at batch 1 was measured twice in bf16: the newer measurement wins
    newer = json.loads((SAVED / "h200-bf16-cache-compile.results.json").read_text())["rows"]
    base = next(r for r in newer if r["config"] == "baseline" and r["batch"] == 1)
    got = next(
        r
        for r in rows
        if r.group == "NVIDIA H200 · bfloat16 · transformers 5.17.0" and r.config == "baseline" and r.batch == 1
    )
    assert got.step_ms_p50 == pytest.approx(base["step_ms_p50"])
    assert got.greedy_match == base["greedy_match"] and got.warmup_s == pytest.approx(base["warmup_s"])
    compiled = next(r for r in rows if r.config == "compile_default" and r.batch == 1 and "bfloat16" in r.group)
    assert compiled.greedy_match == "0/1 (first difference at token 1)"
    assert compiled.hbm_limit_ms == pytest.approx(1.02, abs=0.01)  # the H200's limit at batch 1, context 160


def test_tuning_page_shows_the_imported_ablation(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    at = app_test("app_pages/tuning.py")
    _no_exception(at)
    assert "No tuning runs stored yet" in _texts(at)
    at.button(key="t.btn.import").click().run()
    _no_exception(at)
    assert any("Imported" in s.value for s in at.success)
    h200 = "NVIDIA H200 · bfloat16 · transformers 5.17.0"
    ranked = tuning.group_overview(tuning.tuning_rows(Store(get_settings().db_path)))
    assert ranked[0]["group"].startswith("NVIDIA H100")  # the fastest step at batch 1 ranks first
    assert at.selectbox(key="t.group").value == ranked[0]["group"]  # and the page opens on it
    at.selectbox(key="t.group").set_value(h200).run()
    rows = {(r.config, r.batch): r for r in tuning.tuning_rows(Store(get_settings().db_path)) if r.group == h200}
    step = _grid(at, "config", "baseline")
    assert list(step.columns) == ["config", "batch 1", "batch 8", "batch 32", "batch 128"]
    row = step[step["config"] == "static_cache"].iloc[0]
    assert row["batch 8"] == f"{rows[('static_cache', 8)].step_ms_p50:.1f}"
    assert step.iloc[-1]["config"] == "hardware limit"
    batched = step[step["config"] == "experts_batched_mm"].iloc[0]
    assert batched["batch 32"] == "-"  # out of memory there: no made-up figure
    assert len(at.get("plotly_chart")) == 2
    # the headline cards: the group's shortest step at batch 1 and its most tokens/s, each against
    # the baseline at the same batch; the limit beside them
    fastest = min((r for (_, b), r in rows.items() if b == 1), key=lambda r: r.step_ms_p50)
    most = max(rows.values(), key=lambda r: r.output_tok_s)
    assert (fastest.config, most.config, most.batch) == ("cuda_graphs", "cuda_graphs", 128)
    cards = {m.label: m for m in at.metric}
    card = cards["Fastest decode step · batch 1"]
    base = rows[("baseline", 1)].step_ms_p50
    assert card.value == f"{fastest.step_ms_p50:.2f} ms"
    assert card.delta == f"{base / fastest.step_ms_p50:.1f}x faster than baseline ({base:.1f} ms)"
    card = cards["Most output tokens/s · batch 128"]
    base = rows[("baseline", 128)].output_tok_s
    assert card.value == f"{most.output_tok_s:,.0f} tok/s"
    assert card.delta == f"{most.output_tok_s / base:.1f}x baseline ({base:,.0f} tok/s)"
    assert cards["Hardware limit · batch 1"].value == f"{fastest.hbm_limit_ms:.2f} ms"
    # the H100's group: its fastest step against the engine's eager baseline measured on an H100 too
    h100 = "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.17.0"
    at.selectbox(key="t.group").set_value(h100).run()
    _no_exception(at)
    cards = {m.label: m for m in at.metric}
    card = cards["Fastest decode step · batch 1"]
    stored = {(r.config, r.batch): r for r in tuning.tuning_rows(Store(get_settings().db_path)) if r.group == h100}
    lean, base = stored[("cuda_graphs_compile_mla_lean_router", 1)], stored[("baseline", 1)].step_ms_p50
    assert lean.step_ms_p50 < 4.5  # the 4.4 ms aim, to two figures
    assert card.value == f"{lean.step_ms_p50:.2f} ms"
    assert card.delta == f"{base / lean.step_ms_p50:.1f}x faster than baseline ({base:.1f} ms)"
    # the card says what the figure is: random weights, dtype, batch, card, the baseline's origin, the check
    said = _texts(at)
    assert "random-v2-lite-shape (random weights), bfloat16, batch 1, NVIDIA H100 80GB HBM3" in said
    assert "(measured in another call on the same kind of card)" in said
    assert (
        "greedy tokens checked on 1 check prompt: 1 differs from the baseline's, the first at token 0 (expected in "
        "bfloat16 on random weights"
    ) in said
    assert "equal the baseline's on 0 of" not in said  # it read as a failed check
    # a group without a baseline row (transformers 5.19's) says so instead of a ratio
    newer = "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.19.0"
    at.selectbox(key="t.group").set_value(newer).run()
    _no_exception(at)
    card = {m.label: m for m in at.metric}["Fastest decode step · batch 1"]
    assert card.value.endswith(" ms") and not card.delta
    assert "cuda_graphs_compile_mla_lean_router** · no baseline row at batch 1 in this group" in _texts(at)


def test_the_headlines_are_a_groups_best_rows(store: Store) -> None:
    tuning.import_saved(store)
    rows = tuning.tuning_rows(store)
    assert tuning.headlines([]) == {}
    for group in {r.group for r in rows}:
        mine = [r for r in rows if r.group == group]
        best = tuning.headlines(mine)
        smallest = min(r.batch for r in mine)
        assert best["fastest"].row.batch == smallest
        assert all(best["fastest"].row.step_ms_p50 <= r.step_ms_p50 for r in mine if r.batch == smallest)
        assert all(best["throughput"].row.output_tok_s >= r.output_tok_s for r in mine)
        for h in best.values():
            base = h.baseline
            assert (base is None) == (h.vs_baseline is None)
            assert base is None or (base.config, base.batch, base.group) == ("baseline", h.row.batch, group)
            assert h.limit_ms and h.limit_ms < h.row.step_ms_p50  # no measured step beats the memory's limit
    # a group that measured only the baseline has no ratio to show: the baseline is not its own reference
    only = [r for r in rows if r.config == "baseline" and r.group.startswith("NVIDIA H200 · float32")]
    assert tuning.headlines(only)["fastest"].baseline is None


def test_every_group_at_a_glance_names_each_groups_best_rows(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """The page shows one group's tables at a time, the widest ablation first (the H200's eager
    options); above them one line per group says where each got to, so the fastest step (an
    H100 group's) is on the page a demo opens on."""
    store = Store(get_settings().db_path)
    assert tuning.group_overview([]) == []
    tuning.import_saved(store)
    rows = tuning.tuning_rows(store)
    lines = tuning.group_overview(rows)
    assert lines[0]["group"] == "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.17.0"
    assert sorted(d["group"] for d in lines) == sorted({r.group for r in rows})
    for d in lines:
        mine = [r for r in rows if r.group == d["group"]]
        best = tuning.headlines(mine)
        assert (d["step_ms"], d["step_batch"], d["step_config"]) == (
            best["fastest"].row.step_ms_p50, best["fastest"].row.batch, best["fastest"].row.config
        )  # fmt: skip
        assert (d["tok_s"], d["tok_s_batch"]) == (best["throughput"].row.output_tok_s, best["throughput"].row.batch)
        assert d["rows"] == len(mine) and d["limit_ms"] == best["fastest"].limit_ms
    at_1 = [d["step_ms"] for d in lines if d["step_batch"] == 1]
    assert at_1 == sorted(at_1) and lines[0]["step_config"] == "cuda_graphs_compile_mla_lean_router"
    at = app_test("app_pages/tuning.py")
    _no_exception(at)
    shown = next(d.value for d in at.dataframe if "fastest decode step (p50)" in d.value.columns)
    assert list(shown["device · dtype · transformers"]) == [d["group"] for d in lines]
    steps = [f"{d['step_ms']:.2f} ms · batch {d['step_batch']}" for d in lines]
    assert list(shown["fastest decode step (p50)"]) == steps
    assert shown.iloc[0]["fastest decode step (p50)"] == "4.43 ms · batch 1"  # the H100 grid's median round
    most = [
        f"{d['tok_s']:,.0f} · batch {d['tok_s_batch']}"
        + (f" · {d['tok_s_config']}" if d["tok_s_config"] != d["step_config"] else "")
        for d in lines
    ]
    assert list(shown["most output tok/s"]) == most
    assert "142 · batch 8 · attn_eager" in most  # the H200's float32 ablation: another config than its fastest step
    h200 = [r for r in rows if r.group == "NVIDIA H200 · bfloat16 · transformers 5.17.0"]
    assert [d["group"] for d in tuning.group_overview(h200)] == [h200[0].group]


def test_the_saved_decode_step_study_is_shown_as_measured(app_test: Callable[..., Any], fresh_data_dir: Path) -> None:
    """The H200's decode step alone (eager / graph / compile+graph) and its profile, on a page with
    no stored runs: each cell is the saved file's figure, nothing else."""
    raw = json.loads((SAVED / "h200-profile-summary.json").read_text())
    study = next(s for s in tuning.step_studies() if s.source == "h200-profile-summary.json")
    assert study.title.startswith("NVIDIA H200 · random-v2-lite-shape · bfloat16 (torch 2.11")
    assert study.title.endswith("the graph loop read step by step (these ran before it was pipelined)")
    at = app_test("app_pages/tuning.py")
    _no_exception(at)
    steps = _study_grid(at, "h200-profile-summary.json", "batch 128")
    assert list(steps.columns) == ["step", "batch 1", "batch 8", "batch 32", "batch 128"]
    fast = next(r for r in raw["step_timing_ms"] if r["config"] == "graphs_compile_default" and r["batch"] == 128)
    row = steps[steps["step"] == "compile=default, then CUDA graph"].iloc[0]
    assert (
        row["batch 128"] == f"{fast['ms_per_step_p50']:.2f} ms · {fast['tok_s']:,.0f} tok/s" == "23.13 ms · 5,533 tok/s"
    )
    assert row["batch 8"] == "-"  # not measured: no made-up figure
    prof = _study_grid(at, "h200-profile-summary.json", "kernels/step")
    eager1 = prof[(prof["step"] == "eager (static cache, no graph)") & (prof["batch"] == 1)].iloc[0]
    saved = raw["profile"]["eager_static_step/b1"]
    assert eager1["kernels/step"] == saved["kernels_per_step"] and eager1["GPU busy %"] == 10.0
    assert len(prof) == len(raw["profile"])
    # the H100 study of the absorbed-MLA step, pipelined and step-by-step loops, beside it
    h100 = json.loads((SAVED / "h100-step-mla-profile-summary.json").read_text())
    grid = _study_grid(at, "h100-step-mla-profile-summary.json", "batch 128")
    best = next(r for r in h100["step_timing_ms"] if r["config"] == "graphs_compile_default+mla" and r["batch"] == 128)
    cell = grid[grid["step"] == "compile=default, then CUDA graph, absorbed MLA"].iloc[0]["batch 128"]
    assert cell == f"{best['ms_per_step_p50']:.2f} ms · {best['tok_s']:,.0f} tok/s" == "16.71 ms · 7,659 tok/s"
    assert {"CUDA graph, step-by-step loop", "CUDA graph, step-by-step loop, absorbed MLA"} <= set(grid["step"])


@pytest.mark.slow
def test_an_ablation_runs_from_the_page_on_this_cpu(
    app_test: Callable[..., Any], fresh_data_dir: Path, tiny_model: Path
) -> None:
    at = app_test("app_pages/tuning.py")
    assert at.selectbox(key="t.accelerator").value == "cpu" and at.selectbox(key="t.model").value == "tiny-deepseek-v3"
    at.text_input(key="t.batches").set_value("1,x").run()
    assert "batch sizes: whole numbers from 1 to 1024" in at.error[0].value and at.button(key="t.btn.start").disabled
    at.text_input(key="t.batches").set_value("1,2").run()
    at.multiselect(key="t.configs").set_value(["baseline", "static_cache"]).run()
    at.number_input(key="t.rounds").set_value(2).run()
    at.button(key="t.btn.start").click().run()
    _no_exception(at)
    store = Store(get_settings().db_path)
    deadline = time.monotonic() + 300
    while sum(tuning.RUN_NAME.match(r.name or "") is not None for r in store.list_runs()) < 8:
        assert time.monotonic() < deadline, "the ablation did not store its eight runs (2 configs x 2 batches x 2)"
        time.sleep(1)
    time.sleep(1.5)
    at.run()
    _no_exception(at)
    rows = tuning.tuning_rows(store)
    assert {(r.config, r.batch) for r in rows} == {("baseline", 1), ("baseline", 2), ("static_cache", 1),
                                                   ("static_cache", 2)}  # fmt: skip
    assert all(r.greedy_match in ("1/1", "2/2") and r.dtype == "float32" for r in rows)
    for r in rows:  # each row: its two rounds' runs, the lower one shown, both bounds from the runs themselves
        toks = sorted(
            run.summary.output_throughput_tok_s
            for run in store.list_runs()
            if run.summary and (m := tuning.RUN_NAME.match(run.name or "")) and (m["config"], int(m["batch"])) == (
                r.config, r.batch)
        )  # fmt: skip
        assert r.rounds == 2 and r.tok_s_range == (toks[0], toks[1]) and r.output_tok_s == toks[0]
    step = _grid(at, "config", "baseline")
    assert (
        step.iloc[0]["batch 2"] == f"{next(r for r in rows if r.config == 'baseline' and r.batch == 2).step_ms_p50:.1f}"
    )
    assert any("ablation · completed" in m.value for m in at.markdown)
    assert not any("fastest decode step (p50)" in d.value.columns for d in at.dataframe)  # one group: no overview
    # the headline cards on this CPU's own rows: whichever configuration was faster, said as measured
    fastest = min((r for r in rows if r.batch == 1), key=lambda r: (r.step_ms_p50, r.config))
    card = next(m for m in at.metric if m.label == "Fastest decode step · batch 1")
    assert card.value == f"{fastest.step_ms_p50:.2f} ms"
    if fastest.config == "baseline":
        assert not card.delta and "**baseline**: no configuration beat it" in _texts(at)
    else:
        base = next(r for r in rows if r.config == "baseline" and r.batch == 1).step_ms_p50
        assert card.delta == f"{base / fastest.step_ms_p50:.1f}x faster than baseline ({base:.1f} ms)"


def test_each_configuration_says_what_it_changed(store: Store) -> None:
    tuning.import_saved(store)
    texts = tuning.config_texts([r for r in tuning.tuning_rows(store) if r.group.startswith("NVIDIA H200 · bfloat16")])
    assert "best" not in texts  # the --best row is named for what it is: it was not the group's fastest
    assert texts["combined"] == "cache=static, attn_impl=eager"
    assert texts["compile_default"] == "cache=static, compile=default"
    assert texts["cuda_graphs"] == "cache=static, cuda_graphs=True"  # not the graphs it captured
    assert "experts_impl=grouped_mm" in texts["baseline"] and "attn_impl=sdpa" in texts["baseline"]


def test_a_row_whose_compiled_step_ran_shapes_uncompiled_is_flagged(
    app_test: Callable[..., Any], fresh_data_dir: Path
) -> None:
    """native_tuning.py stores each row's count of shapes captured uncompiled (past torch's
    recompile limit) with its check; the page names such a row in a warning and in its table."""
    store = Store(get_settings().db_path)
    tuning.import_saved(store)
    h100 = "NVIDIA H100 80GB HBM3 · bfloat16 · transformers 5.17.0"
    row = next(
        r
        for r in tuning.tuning_rows(store)
        if r.group == h100 and (r.config, r.batch) == ("cuda_graphs_compile_mla", 8)
    )
    assert row.uncompiled_shapes == 0  # the last grid: every shape compiled
    check = store.artifact(row.run_id, tuning.ARTIFACT_TUNING_CHECK)
    store.put_artifact(row.run_id, tuning.ARTIFACT_TUNING_CHECK, {**check, "uncompiled_shapes": 2})
    at = app_test("app_pages/tuning.py")
    at.selectbox(key="t.group").set_value(h100).run()
    _no_exception(at)
    warned = [w.value for w in at.warning if "recompile limit" in w.value]
    assert warned == [
        "Compiled in name only, in part: cuda_graphs_compile_mla at batch 8 (2 shape(s)) ran shapes uncompiled: "
        "torch stops compiling a function past its recompile limit."
    ]
    detail = next(d.value for d in at.dataframe if "shapes uncompiled" in d.value.columns)
    assert detail.set_index("run").loc[row.run_id, "shapes uncompiled"] == 2

"""``bench/analysis/tuning_ablation.py --rounds``: the ablation repeated in ABBA order on the real
tiny model (CPU, float32), its rounds stored as runs of their own and read back as one row per
configuration and batch: the median round with the rounds' spread and the worst round's check."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.analysis import tuning
from bench.store import Store

TINY_RUN = ["--accelerator", "cpu", "--dtype", "float32", "--input-len", "12", "--output-len", "6"]


def test_rounds_run_in_abba_order_and_read_back_as_the_median_round(
    tiny_model: Path, tmp_path: Path, capsys: Any
) -> None:
    from bench.analysis import tuning_ablation as native_tuning

    out = tmp_path / "nt"
    argv = ["--out", str(out), "--model", str(tiny_model), *TINY_RUN, "--configs", "baseline@2,static_cache@2"]
    assert native_tuning.main([*argv, "--rounds", "4"]) == 0
    printed = capsys.readouterr().out
    order = re.findall(r"^(\w+)\s+b=2\s+r(\d)", printed, re.M)
    a, b = "baseline", "static_cache"
    assert order == [(c, str(k)) for k, pair in enumerate([(a, b), (b, a), (a, b), (b, a)], 1) for c in pair]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["config"], r["round"]) for r in rows] == [(c, int(k)) for c, k in order]
    assert all(r["greedy_match"] == "2/2" for r in rows)  # float32: each round streams the baseline's tokens
    # the rounds table: each configuration's median (the lower middle of four) and spread, and the
    # second configuration against the first in each round
    lines = [line.split(" | ") for line in printed.splitlines() if "| 2 | 4 |" in line]
    table = {cells[0].strip("| "): cells for cells in lines}
    assert set(table) == {a, b}
    toks = {c: sorted(r["output_tok_s"] for r in rows if r["config"] == c) for c in table}
    assert table[a][3] == f"{toks[a][1]:,.0f} ({toks[a][0]:,.0f}-{toks[a][3]:,.0f})"
    ratios = sorted(
        s["output_tok_s"] / f["output_tok_s"]
        for s in rows
        for f in rows
        if s["config"] == b and f["config"] == a and s["round"] == f["round"]
    )
    assert table[b][-1].rstrip(" |") == f"{ratios[1]:.3f} ({ratios[0]:.3f}-{ratios[3]:.3f})"
    assert table[a][-1].rstrip(" |") == "-"
    # --table of the saved results prints every round and the same rounds table
    assert native_tuning.main(["--table", str(out / "results.json")]) == 0
    again = capsys.readouterr().out
    assert sum(f"(round {k}) | 2 |" in again for k in "1234") == 4
    assert [line for line in again.splitlines() if "| 2 | 4 |" in line] == [" | ".join(c) for c in lines]

    with tarfile.open(out / "bundles.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(f"{tuning.run_name(r['config'], 2, r['round'])}.json" for r in rows)
    # one round's check made to fail (as a wrong kernel would), in a round that is not the median
    results = json.loads((out / "results.json").read_text())
    median = sorted((r for r in results["rows"] if r["config"] == b), key=lambda r: r["output_tok_s"])[1]
    bad = next(r for r in results["rows"] if r["config"] == b and r["round"] != median["round"])
    bad.update(greedy_match="1/2 (first difference at token 3)", logits_max_abs_diff_step0=0.5)
    (out / "results.json").write_text(json.dumps(results))
    store = Store(tmp_path / "imported.sqlite")
    assert sorted(tuning.import_results(store, out / "bundles.tar.gz", out / "results.json")) == [
        n.removesuffix(".json") for n in names
    ]
    read = {r.config: r for r in tuning.tuning_rows(store)}
    assert set(read) == {a, b}
    for config, row in read.items():
        assert row.rounds == 4 and row.tok_s_range == (toks[config][0], toks[config][3])
        assert row.output_tok_s == toks[config][1] and row.round is not None  # the median round, not the newest
    assert read[a].greedy_match == "2/2" and read[a].logits_max_abs_diff < 1e-4
    assert read[b].round == median["round"] and read[b].greedy_match == bad["greedy_match"]  # the worst round's
    assert read[b].logits_max_abs_diff == 0.5

    # a later ablation is a new measurement: its two rounds, not six pooled with the four
    again_out = tmp_path / "nt2"
    argv2 = ["--out", str(again_out), "--model", str(tiny_model), *TINY_RUN, "--configs", "baseline@2"]
    assert native_tuning.main([*argv2, "--rounds", "2"]) == 0
    assert len(tuning.import_results(store, again_out / "bundles.tar.gz", again_out / "results.json")) == 2
    new = {r.config: r for r in tuning.tuning_rows(store)}
    fresh = sorted(r["output_tok_s"] for r in json.loads((again_out / "results.json").read_text())["rows"])
    assert new[a].rounds == 2 and new[a].tok_s_range == (fresh[0], fresh[1]) and new[a].output_tok_s == fresh[0]
    assert new[b].rounds == 4  # untouched
    # and a single run after it replaces it
    single = tmp_path / "nt3"
    assert native_tuning.main(["--out", str(single), *argv2[2:]]) == 0
    assert tuning.import_results(store, single / "bundles.tar.gz", single / "results.json") == ["tuning-baseline-b2"]
    last = {r.config: r for r in tuning.tuning_rows(store)}[a]
    assert last.rounds == 1 and last.round is None and last.tok_s_range is None


def test_rounds_below_one_are_refused_in_one_line(capsys: Any) -> None:
    from bench.analysis import tuning_ablation as native_tuning

    with pytest.raises(SystemExit) as exc:
        native_tuning.main(["--rounds", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--rounds must be at least 1 (got 0)")


def test_a_row_with_shapes_run_uncompiled_says_so_in_its_line_and_the_table() -> None:
    """A saved H100 row, as native_tuning.py would have recorded it had torch's recompile limit
    left 1 of its shapes uncompiled: the printed line and the README table both say so; a row
    without the count says nothing of it."""
    from bench.analysis import tuning_ablation as native_tuning

    saved = Path(__file__).resolve().parents[2] / "examples" / "tuning" / "h100-bf16-grid-lean-router.results.json"
    row = next(r for r in json.loads(saved.read_text())["rows"] if r["config"] == "cuda_graphs_compile_mla")
    marked = {**row, "uncompiled_shapes": 1}
    assert "1 shape(s) captured uncompiled (torch's recompile limit)" in native_tuning.row_line(marked)
    assert f"| {row['config']} (round {row['round']}) (1 shape(s) uncompiled) |" in native_tuning.table([marked])
    assert "uncompiled" not in native_tuning.row_line(row) + native_tuning.table([row])

"""``bench/benchmarks/native_tuning.py --rounds``: the ablation repeated in ABBA order on the real
tiny model (CPU, float32), its rounds stored as runs of their own and read back as one row per
configuration and batch: the median round with the rounds' spread."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

from bench import tuning
from bench.store import Store


def test_rounds_run_in_abba_order_and_read_back_as_the_median_round(
    tiny_model: Path, tmp_path: Path, capsys: Any
) -> None:
    from bench.benchmarks import native_tuning

    out = tmp_path / "nt"
    argv = ["--out", str(out), "--model", str(tiny_model), "--accelerator", "cpu", "--dtype", "float32"]
    argv += ["--configs", "baseline@2,static_cache@2", "--rounds", "3", "--input-len", "12", "--output-len", "6"]
    assert native_tuning.main(argv) == 0
    printed = capsys.readouterr().out
    order = re.findall(r"^(\w+)\s+b=2\s+r(\d)", printed, re.M)
    assert order == [("baseline", "1"), ("static_cache", "1"), ("static_cache", "2"), ("baseline", "2"),
                     ("baseline", "3"), ("static_cache", "3")]  # fmt: skip
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["config"], r["round"]) for r in rows] == [(c, int(k)) for c, k in order]
    assert all(r["greedy_match"] == "2/2" for r in rows)  # float32: each round streams the baseline's tokens
    # the rounds table: each configuration's median and spread, the second against the first in each round
    lines = [line.split(" | ") for line in printed.splitlines() if "| 2 | 3 |" in line]
    table = {cells[0].strip("| "): cells for cells in lines}
    assert set(table) == {"baseline", "static_cache"}
    toks = {c: sorted(r["output_tok_s"] for r in rows if r["config"] == c) for c in table}
    assert table["baseline"][3] == f"{toks['baseline'][1]:,.0f} ({toks['baseline'][0]:,.0f}-{toks['baseline'][2]:,.0f})"
    ratios = sorted(
        s["output_tok_s"] / b["output_tok_s"]
        for s in rows
        for b in rows
        if s["config"] == "static_cache" and b["config"] == "baseline" and s["round"] == b["round"]
    )
    assert table["static_cache"][-1].rstrip(" |") == f"{ratios[1]:.3f} ({ratios[0]:.3f}-{ratios[2]:.3f})"
    assert table["baseline"][-1].rstrip(" |") == "-"
    # --table of the saved results prints every round and the same rounds table
    assert native_tuning.main(["--table", str(out / "results.json")]) == 0
    again = capsys.readouterr().out
    assert sum(f"(round {k}) | 2 |" in again for k in "123") == 3
    assert [line for line in again.splitlines() if "| 2 | 3 |" in line] == [" | ".join(c) for c in lines]

    with tarfile.open(out / "bundles.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(f"{tuning.run_name(r['config'], 2, r['round'])}.json" for r in rows)
    store = Store(tmp_path / "imported.sqlite")
    assert sorted(tuning.import_results(store, out / "bundles.tar.gz", out / "results.json")) == [
        n.removesuffix(".json") for n in names
    ]
    read = {r.config: r for r in tuning.tuning_rows(store)}
    assert set(read) == {"baseline", "static_cache"}
    for config, row in read.items():
        assert row.rounds == 3 and row.tok_s_range == (toks[config][0], toks[config][2])
        assert row.output_tok_s == toks[config][1] and row.round is not None  # the median round, not the newest
        assert row.greedy_match == "2/2"  # its own round's check, imported with it

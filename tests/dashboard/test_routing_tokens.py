"""Issue 45 §3: ``bench routing RUN`` printed "tokens 156" where the Profiling page said 78 tokens
per layer for the same run. One definition (:func:`bench.metrics.moe.routed_tokens`), one word
("routed tokens per layer"), the same figure in both places: checked on the routing a short run
of the real tiny model stores."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from bench.config import RunConfig
from bench.metrics import moe
from bench.run.manager import start_run
from bench.store import Store
from tests.dashboard.conftest import ROOT

FIGURE = re.compile(r"([\d,]+(?:-[\d,]+)?) routed tokens per layer \(")


def test_the_cli_and_the_profiling_page_give_the_same_routed_tokens_per_layer(
    app_test: Callable[..., Any], native_engine: object, session_store: Store
) -> None:
    cfg = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"},
        mode="latency",
        requests=2,
        warmup=0,
        workload={"source": "random", "input_len": 24, "output_len": 6},
    )
    snap = start_run(cfg, session_store, engine=native_engine).wait(120)  # type: ignore[arg-type]
    assert snap.status == "completed", snap.error
    run_id = snap.run_id
    assert run_id is not None
    routing = session_store.artifact(run_id, "expert_routing")
    assert routing and routing.get("top_k"), "the native run stored no routing"
    per_layer = moe.routed_tokens(routing, moe.counts_array(routing))
    # the definition: tokens through the gate, not selections (each token picks top-k experts)
    assert all(t is not None and t > 0 for t in per_layer)
    assert sum(routing["counts"][0]) == routing["top_k"] * per_layer[0]

    # the CLI
    out = subprocess.run(
        [sys.executable, "-m", "bench", "routing", str(run_id), "--db", str(session_store.path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    legend = next(line for line in out.stdout.splitlines() if line.startswith("tokens: "))
    cli_figure = legend.rsplit(": ", 1)[1]
    rows = [line.split() for line in out.stdout.splitlines() if re.match(r"^\S.* +[\d,.]+ +[\d.]+ ", line)]
    cli_rows = [float(row[-7].replace(",", "")) for row in rows]  # the tokens column, from the right

    # the page
    at = app_test("app_pages/profiling.py")
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="p.routing-run").set_value(run_id).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = [str(c.value) for c in at.caption if FIGURE.search(str(c.value))]
    assert captions, "the Profiling page shows no routed tokens per layer"
    page_figure = FIGURE.search(captions[0]).group(1)  # type: ignore[union-attr]
    table = next(df.value for df in at.dataframe if "busiest expert" in df.value.columns)

    assert cli_figure == page_figure == f"{max(per_layer):,.0f}"
    assert cli_rows == [round(t) for t in per_layer] == [round(t) for t in table["tokens"]]
    assert "tokens: routed tokens per layer (" in legend and "routed tokens per layer (" in captions[0]

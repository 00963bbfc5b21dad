"""CSV exports, pure: stored rows in, UTF-8 CSV bytes out (the page wraps them in a download button,
the CLI writes them). Columns carry units in their names and are defined in docs/metrics.md."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.analysis.serving import run_serving
from bench.metrics.cost import Price, price_table
from bench.store import Store
from bench.store.rows import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS, RunRow
from engines.errors import MoEBenchError

SWEEP_CSV_LEAD_COLUMNS: tuple[str, ...] = (
    "sweep_id",
    "input_len",
    "output_len",
    "concurrency",
    "request_rate",
    "repeat",
)  # each swept engine option's ``engine.<option>`` column goes between request_rate and repeat


# The serving figures each row ends with (bench.analysis.serving, bench.metrics.cost; docs/reports.md).
SWEEP_CSV_SERVING_COLUMNS: tuple[str, ...] = (
    "tok_s_per_user_p50",
    "tok_s_per_user_from",
    "card",
    "price_usd_per_accelerator_hour",
    "usd_per_million_output_tokens",
    "joules_per_million_output_tokens",
)


def sweep_csv_columns(engine_options: Sequence[str] = ()) -> tuple[str, ...]:
    """The sweep CSV's columns: the lead (engine options before ``repeat``), then the summary
    CSV's (:data:`bench.store.SUMMARY_CSV_COLUMNS`) minus the two the lead already has, then
    :data:`SWEEP_CSV_SERVING_COLUMNS`."""
    lead = [*SWEEP_CSV_LEAD_COLUMNS[:-1], *(f"engine.{o.removeprefix('engine.')}" for o in engine_options), "repeat"]
    return (*lead, *(c for c in SUMMARY_CSV_COLUMNS if c not in lead), *SWEEP_CSV_SERVING_COLUMNS)


def _serving_columns(run: RunRow, prices: Mapping[str, Price]) -> dict[str, Any]:
    """The run's serving figures (:func:`bench.analysis.serving.run_serving`): tok/s per user, and the
    accelerators and output tok/s per accelerator where the summary predates them (the same count from
    the recorded deployment), $ and J per million output tokens."""
    f = run_serving(run)
    price = prices.get(f.card)
    return {
        "accelerators": f.accelerators,
        "output_tok_s_per_accelerator": f.per_accelerator_tok_s,
        "tok_s_per_user_p50": f.per_user_tok_s,
        "tok_s_per_user_from": f.per_user_from or None,
        "card": f.card,
        "price_usd_per_accelerator_hour": price.usd_per_hour if price else None,
        "usd_per_million_output_tokens": f.usd_per_million(prices),
        "joules_per_million_output_tokens": f.joules_per_million,
    }


def _sweep_csv_row(
    sweep_id: int, run: RunRow, engine_keys: Sequence[str], prices: Mapping[str, Price]
) -> dict[str, Any]:
    point = dict(run.sweep_point or {})
    if "rate" in point:  # a capacity probe on the rate axis
        point["request_rate"] = point.pop("rate")
    row = run.summary_row()
    workload = run.config.get("workload") or {}
    exact = (workload.get("source") or "random") == "random"  # other sources' lengths are not input_len
    row.update(
        sweep_id=sweep_id,
        input_len=point.get("input_len", workload.get("input_len") if exact else None),
        output_len=point.get("output_len", workload.get("output_len") if exact else None),
        concurrency=point.get("concurrency", row.get("concurrency")),
        request_rate=point.get("request_rate", row.get("request_rate") or run.config.get("request_rate")),
        repeat=point.get("repeat"),
    )
    engine = run.config.get("engine") or {}
    for key in engine_keys:
        row[key] = point.get(key, engine.get(key.removeprefix("engine.")))
    if run.status == "completed" and run.summary is not None:
        row.update(_serving_columns(run, prices))
    return row


def sweep_csv(store: Store, sweep_id: int, prices: Mapping[str, Price] | None = None) -> bytes:
    """One row per run of a sweep or capacity search, in run order (columns:
    :func:`sweep_csv_columns`): the sweep id, the point (a value not swept is the run's own;
    ``input_len``/``output_len`` only for random prompts), the repeat, then the run's summary, then
    its serving figures at ``prices`` (default: :func:`bench.metrics.cost.price_table`)."""
    if store.get_sweep(sweep_id) is None:
        raise MoEBenchError(f"no sweep {sweep_id} in {store.path}")
    runs = store.sweep_runs(sweep_id)
    engine_keys = sorted({k for r in runs for k in (r.sweep_point or {}) if k.startswith("engine.")})
    columns = sweep_csv_columns(engine_keys)
    table = price_table() if prices is None else prices
    return rows_to_csv(columns, [_sweep_csv_row(sweep_id, r, engine_keys, table) for r in runs])


# --- the HTML report ------------------------------------------------------------------------------------


# A text cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e-3 and v != 0 else f"{v:.4f}".rstrip("0").rstrip(".")
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        # Text (a run name, an error) that a spreadsheet would evaluate: a leading quote keeps
        # it text, as OWASP recommends. Numbers are not str here, so -0.5 stays a number.
        return "'" + v
    return v


OPERATOR_CSV_COLUMNS: tuple[str, ...] = (
    "operator",
    "input_shapes",
    "calls",
    "self_cpu_ms",
    "cpu_total_ms",
    "self_device_ms",
    "device_total_ms",
    "cpu_memory_mib",
    "device_memory_mib",
)


def rows_to_csv(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> bytes:
    """Pure: rows -> UTF-8 CSV bytes with exactly ``columns``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([_fmt(row.get(c)) for c in columns])
    return buf.getvalue().encode("utf-8")


def requests_csv(store: Store, run_ids: int | Sequence[int]) -> bytes:
    """Per-request CSV of one or more runs (columns: :data:`REQUEST_CSV_COLUMNS`)."""
    return rows_to_csv(REQUEST_CSV_COLUMNS, store.sample_rows(run_ids))


def operators_csv(store: Store, run_id: int) -> bytes:
    """A profile run's operator table (columns: :data:`OPERATOR_CSV_COLUMNS`)."""
    from engines.errors import MoEBenchError

    ops = store.artifact(run_id, "profile_operators")
    if ops is None:
        raise MoEBenchError(f"run {run_id} has no operator table (only profile runs have one)")
    return rows_to_csv(OPERATOR_CSV_COLUMNS, ops)


def summary_csv(store: Store, run_ids: Sequence[int] | None = None) -> bytes:
    """One row per run (columns: :data:`SUMMARY_CSV_COLUMNS`); all runs when ``run_ids`` is None."""
    runs = store.list_runs() if run_ids is None else [r for i in run_ids if (r := store.get_run(int(i)))]
    return rows_to_csv(SUMMARY_CSV_COLUMNS, [r.summary_row() for r in runs])

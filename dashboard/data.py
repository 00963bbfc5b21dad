"""Data shaping for the dashboard: store rows -> pandas frames, tables with units, labels.

No Streamlit here (pages call these, and so do tests and the render benchmark). Reads
are bounded: a live view asks for the newest ``window`` requests and the per-second
series, never for every request of a run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.metrics import METRIC_DEFINITIONS, RunSummary
from bench.runner import (
    SERIES_DONE,
    SERIES_IN_FLIGHT,
    SERIES_MEM_ALLOCATED,
    SERIES_MEM_PEAK,
    SERIES_MEM_RESERVED,
    SERIES_OUTPUT_TOK_S,
)
from bench.store import REQUEST_CSV_COLUMNS, RunRow, Store
from dashboard import charts

LIVE_WINDOW = 2000  # newest requests a live view draws
DETAIL_WINDOW = 5000  # newest requests a finished run's detail view draws

MEMORY_SERIES: tuple[tuple[str, str], ...] = (
    (SERIES_MEM_ALLOCATED, "allocated"),
    (SERIES_MEM_RESERVED, "reserved"),
    (SERIES_MEM_PEAK, "peak"),
)
LIVE_SERIES: tuple[str, ...] = (SERIES_OUTPUT_TOK_S, SERIES_IN_FLIGHT, *(n for n, _ in MEMORY_SERIES))


@dataclass(frozen=True)
class LiveData:
    """What a live (or finished) run view draws: a bounded request window and per-second series."""

    samples: pd.DataFrame  # REQUEST_CSV_COLUMNS, newest ``window`` requests, oldest first
    timeseries: pd.DataFrame  # long: t_s, name, value
    total_samples: int


def load_live(store: Store, run_id: int, window: int = LIVE_WINDOW) -> LiveData:
    """The newest ``window`` requests of a run and its per-second series."""
    rows = store.sample_rows(run_id, limit=window)
    samples = pd.DataFrame(rows, columns=list(REQUEST_CSV_COLUMNS))
    points = store.timeseries(run_id)  # per-second series: bounded by the run's duration
    ts = pd.DataFrame(points, columns=["t_s", "name", "value"])
    total = len(samples) if len(samples) < window else store.sample_count(run_id)
    return LiveData(samples, ts, total)


def live_figures(data: LiveData, summary: RunSummary | None = None) -> dict[str, Any]:
    """The live panel's charts, by a stable name (also used as the chart key suffix).

    ``summary`` (the run's, possibly partial) supplies the p50/p99 lines so they describe
    the whole run even when the histogram shows only the newest window.
    """

    def pct(stat_name: str) -> tuple[float | None, float | None]:
        if summary is None or summary.completed == 0:
            return None, None
        stat = getattr(summary, stat_name)
        return stat.p50, stat.p99

    ttft50, ttft99 = pct("ttft_ms")
    tpot50, tpot99 = pct("tpot_ms")
    note = "" if data.total_samples <= len(data.samples) else f" (newest {len(data.samples):,} requests)"
    figs = {
        "latency": charts.latency_over_time(data.samples, title=f"Per-request latency over time{note}"),
        "ttft": charts.distribution(
            data.samples, "ttft_ms", f"TTFT distribution{note}", p50=ttft50, p99=ttft99, color=charts.COLORS[1]
        ),
        "tpot": charts.distribution(
            data.samples, "tpot_ms", f"TPOT distribution{note}", p50=tpot50, p99=tpot99, color=charts.COLORS[2]
        ),
        "throughput": charts.throughput_over_time(data.timeseries, SERIES_OUTPUT_TOK_S),
        "in_flight": charts.in_flight_over_time(data.timeseries, SERIES_IN_FLIGHT),
        "memory": charts.memory_over_time(data.timeseries, MEMORY_SERIES),
    }
    extra = telemetry_series(data.timeseries)
    if extra:
        figs["telemetry"] = charts.line_chart(
            data.timeseries, [(n, n) for n in extra], "Engine telemetry", "value (unit in the series name)"
        )
    return figs


def telemetry_series(ts: pd.DataFrame) -> list[str]:
    """Series the engine reported besides the runner's own (e.g. a vLLM server's KV-cache use)."""
    if ts.empty:
        return []
    return sorted(set(ts["name"].unique()) - set(LIVE_SERIES) - {SERIES_DONE})


def last_value(ts: pd.DataFrame, name: str) -> float | None:
    s = charts.series(ts, name)
    return None if s.empty else float(s["value"].iloc[-1])


# --- runs table ------------------------------------------------------------------------------

RUN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "label",
    "name",
    "created",
    "status",
    "mode",
    "engine",
    "model",
    "accelerator",
    "device",
    "concurrency",
    "requests",
    "completed",
    "failed",
    "duration_s",
    "output_throughput_tok_s",
    "request_throughput_rps",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "e2e_ms_mean",
    "peak_memory_gib",
    "error",
)


def run_label(run: RunRow) -> str:
    """A short, unique label: ``#12 native·tiny-deepseek-v3·cpu``."""
    return f"#{run.id} {run.engine}·{run.model}·{run.accelerator}"


def runs_frame(runs: Sequence[RunRow]) -> pd.DataFrame:
    """One row per run with its key metrics (empty cells where a run has no summary)."""
    rows = []
    for run in runs:
        flat = run.summary.flat() if run.summary is not None else {}
        cfg_requests = run.config.get("requests")
        rows.append(
            {
                "run_id": run.id,
                "label": run_label(run),
                "name": run.name,
                "created": pd.Timestamp(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.created_at))),
                "status": run.status,
                "mode": run.mode,
                "engine": run.engine,
                "model": run.model,
                "accelerator": run.accelerator,
                "device": str(run.engine_info.get("device", "")),
                "concurrency": run.concurrency,
                "requests": flat.get("requests", cfg_requests),
                "completed": flat.get("completed"),
                "failed": flat.get("failed"),
                **{c: flat.get(c) for c in RUN_COLUMNS[14:-1]},
                "error": run.error or "",
            }
        )
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    for col in RUN_COLUMNS[14:-1]:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def filter_runs(
    df: pd.DataFrame,
    statuses: Sequence[str] = (),
    engines: Sequence[str] = (),
    accelerators: Sequence[str] = (),
    modes: Sequence[str] = (),
    text: str = "",
) -> pd.DataFrame:
    """Rows matching every non-empty filter; ``text`` searches name, model, label and device."""
    mask = pd.Series(True, index=df.index)
    for col, allowed in (("status", statuses), ("engine", engines), ("accelerator", accelerators), ("mode", modes)):
        if allowed:
            mask &= df[col].isin(list(allowed))
    if text.strip():
        needle = text.strip().lower()
        hay = (df["name"].astype(str) + " " + df["label"] + " " + df["device"].astype(str)).str.lower()
        mask &= hay.str.contains(needle, regex=False)
    return df[mask]


SORTS: dict[str, tuple[str, bool]] = {
    "newest first": ("run_id", False),
    "oldest first": ("run_id", True),
    "output throughput (high → low)": ("output_throughput_tok_s", False),
    "E2E p99 latency (low → high)": ("e2e_ms_p99", True),
    "TTFT p50 (low → high)": ("ttft_ms_p50", True),
    "peak memory (low → high)": ("peak_memory_gib", True),
}


def sort_runs(df: pd.DataFrame, how: str) -> pd.DataFrame:
    col, ascending = SORTS.get(how, SORTS["newest first"])
    return df.sort_values(col, ascending=ascending, na_position="last", kind="stable")


# --- summary tables ---------------------------------------------------------------------------

LATENCY_ROWS: tuple[tuple[str, str], ...] = (
    ("ttft_ms", "TTFT"),
    ("tpot_ms", "TPOT"),
    ("itl_ms", "ITL"),
    ("e2e_ms", "E2E"),
)


def latency_table(summary: RunSummary) -> pd.DataFrame:
    """Rows TTFT/TPOT/ITL/E2E; columns count, mean, p50, p90, p95, p99 (ms)."""
    rows = []
    for key, label in LATENCY_ROWS:
        st = getattr(summary, key)
        rows.append(
            {
                "metric": label,
                "count": st.count,
                "mean (ms)": st.mean,
                "p50 (ms)": st.p50,
                "p90 (ms)": st.p90,
                "p95 (ms)": st.p95,
                "p99 (ms)": st.p99,
                "definition": METRIC_DEFINITIONS[key],
            }
        )
    return pd.DataFrame(rows)


def throughput_table(summary: RunSummary) -> pd.DataFrame:
    """Run totals and throughputs, one row per figure with its unit."""
    rows = [
        ("requests", summary.requests, "", ""),
        ("completed", summary.completed, "", ""),
        ("failed", summary.failed, "", ""),
        ("duration", summary.duration_s, "s", METRIC_DEFINITIONS["duration_s"]),
        ("prompt tokens", summary.prompt_tokens, "tokens", ""),
        ("output tokens", summary.output_tokens, "tokens", ""),
        ("request throughput", summary.request_throughput_rps, "req/s", METRIC_DEFINITIONS["request_throughput_rps"]),
        (
            "output throughput",
            summary.output_throughput_tok_s,
            "tokens/s",
            METRIC_DEFINITIONS["output_throughput_tok_s"],
        ),
        ("total throughput", summary.total_throughput_tok_s, "tokens/s", METRIC_DEFINITIONS["total_throughput_tok_s"]),
        ("peak memory", summary.peak_memory_gib, "GiB", METRIC_DEFINITIONS["peak_memory_gib"]),
    ]
    return pd.DataFrame(
        [
            {
                "figure": name,
                "value": "not measured" if value is None else fmt_num(value),
                "unit": unit,
                "definition": d,
            }
            for name, value, unit, d in rows
        ]
    )


def fmt_num(value: float | int | None, digits: int = 3) -> str:
    """A readable number: ``1,234``, ``12.3``, ``0.0123``; ``-`` for None."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    v = float(value)
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}"


def fmt_unit(value: float | int | None, unit: str, digits: int = 3) -> str:
    return "-" if value is None else f"{fmt_num(value, digits)} {unit}"


def fmt_params(n: int | None) -> str:
    """Parameter count: ``1.52 M``, ``671 B``."""
    if not n:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g} {suffix}"
    return str(n)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"

"""A stored run and sweep as the store gives them back, and the columns of the CSV files
(the summary CSV's figures come from bench.metrics.catalogue)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from bench.metrics.catalogue import SUMMARY_METRIC_COLUMNS
from bench.metrics.summary import RunSummary

REQUEST_CSV_COLUMNS: tuple[str, ...] = (
    "run_id",
    "request_id",
    "start_s",
    "end_s",
    "ttft_ms",
    "tpot_ms",
    "itl_mean_ms",
    "e2e_ms",
    "prompt_tokens",
    "output_tokens",
    "usage_output_tokens",
    "ttft_any_ms",
    "send_lag_ms",
    "itl_token_mean_ms",
    "reasoning_tokens",
    "answer_tokens",
    "usage_reasoning_tokens",
    "reasoning_ms",
    "error",
)
# The run's identity, then its figures (bench.metrics.catalogue, in its order), then its error.
RUN_CSV_COLUMNS: tuple[str, ...] = (
    "run_id",
    "name",
    "status",
    "created_at",
    "engine",
    "model",
    "accelerator",
    "mode",
    "workload_source",
    "input_len",
    "output_len",
)
SUMMARY_CSV_COLUMNS: tuple[str, ...] = (*RUN_CSV_COLUMNS, *SUMMARY_METRIC_COLUMNS, "error")


@dataclass(frozen=True)
class RunRow:
    """One run as stored."""

    id: int
    name: str
    created_at: float
    finished_at: float | None
    status: str
    mode: str
    engine: str
    model: str
    accelerator: str
    concurrency: int | None
    config: dict[str, Any]
    engine_info: dict[str, Any]
    summary: RunSummary | None
    error: str | None
    sweep_id: int | None = None
    sweep_point: dict[str, Any] | None = None  # the swept values of this run (and its repeat)

    def summary_row(self) -> dict[str, Any]:
        """The summary CSV row of this run (empty metrics when it has no summary)."""
        row: dict[str, Any] = {c: None for c in SUMMARY_CSV_COLUMNS}
        if self.summary is not None:
            row.update({k: v for k, v in self.summary.flat().items() if k in row})
        row.update(
            run_id=self.id,
            name=self.name,
            status=self.status,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.created_at)),
            engine=self.engine,
            model=self.model,
            accelerator=self.accelerator,
            mode=self.mode,
            concurrency=self.concurrency,
            **workload_fields(self.config),
            error=self.error or "",
        )
        return row


def workload_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The workload a run asked for, as the summary CSV shows it: its prompt source and its input
    and output lengths in tokens (the fixed lengths, or the means of a length distribution)."""
    w = config.get("workload") if isinstance(config, dict) else None
    if not isinstance(w, dict):
        return {}
    return {"workload_source": w.get("source"), "input_len": w.get("input_len"), "output_len": w.get("output_len")}


@dataclass(frozen=True)
class SweepRow:
    """A stored sweep or capacity search (its runs: :meth:`Store.sweep_runs`)."""

    id: int
    kind: str  # "sweep" or "capacity"
    name: str
    created_at: float
    finished_at: float | None
    status: str
    config: dict[str, Any]
    result: dict[str, Any]
    error: str | None


def sweep_row(r: sqlite3.Row) -> SweepRow:
    return SweepRow(
        id=int(r["id"]),
        kind=r["kind"],
        name=r["name"],
        created_at=float(r["created_at"]),
        finished_at=r["finished_at"],
        status=r["status"],
        config=json.loads(r["config_json"]),
        result=json.loads(r["result_json"] or "{}"),
        error=r["error"],
    )

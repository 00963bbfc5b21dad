"""Exports of one stored run in other tools' formats, pure: a store and a run id in, bytes out
(``python -m bench export RUN --format FORMAT``). Each format is registered once in
:data:`EXPORT_FORMATS`; the content is built apart from its encoding (:func:`vllm_result`,
:func:`request_rows`), so a test can check the numbers without parsing the bytes.

- ``vllm-json``: the result file ``vllm bench serve --save-result --save-detailed`` writes, same keys
  and units (per-request lists in s, aggregates in ms), so vLLM's own tools read it.
- ``parquet``: the per-request rows (:data:`bench.store.REQUEST_CSV_COLUMNS`), typed, with each
  column's unit and the run and its summary in the file's metadata.
- ``jsonl``: the same rows, one JSON object a line.

A figure MoE Bench did not measure is ``null``, never a made-up number.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.metrics.records import PERCENTILES, RequestRecord, Stat, describe
from bench.metrics.summary import RunSummary
from bench.store import Store
from bench.store.rows import REQUEST_CSV_COLUMNS, RunRow
from engines.errors import MoEBenchError

# Each per-request column's Arrow type and unit (None: no unit), in REQUEST_CSV_COLUMNS order.
REQUEST_COLUMN_TYPES: dict[str, tuple[str, str | None]] = {
    "run_id": ("int64", None),
    "request_id": ("string", None),
    "start_s": ("float64", "s"),
    "end_s": ("float64", "s"),
    "ttft_ms": ("float64", "ms"),
    "tpot_ms": ("float64", "ms"),
    "itl_mean_ms": ("float64", "ms"),
    "e2e_ms": ("float64", "ms"),
    "prompt_tokens": ("int64", "tokens"),
    "output_tokens": ("int64", "tokens"),
    "usage_output_tokens": ("int64", "tokens"),
    "ttft_any_ms": ("float64", "ms"),
    "send_lag_ms": ("float64", "ms"),
    "itl_token_mean_ms": ("float64", "ms"),
    "reasoning_tokens": ("int64", "tokens"),
    "answer_tokens": ("int64", "tokens"),
    "usage_reasoning_tokens": ("int64", "tokens"),
    "reasoning_ms": ("float64", "ms"),
    "error": ("string", None),
}
if tuple(REQUEST_COLUMN_TYPES) != REQUEST_CSV_COLUMNS:  # a column added to the CSV needs its type here
    raise RuntimeError("REQUEST_COLUMN_TYPES does not match bench.store.REQUEST_CSV_COLUMNS")


Writer = Callable[[Store, int], bytes]  # write(store, run_id) -> the file's bytes


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name on the command line, a line of help and its writer."""

    name: str
    help: str
    write: Writer


EXPORT_FORMATS: dict[str, ExportFormat] = {}


def register(name: str, help: str) -> Callable[[Writer], Writer]:
    """Register ``write(store, run_id) -> bytes`` as the export format ``name``."""

    def wrap(write: Writer) -> Writer:
        EXPORT_FORMATS[name] = ExportFormat(name, help, write)
        return write

    return wrap


def export_run(store: Store, run_id: int, fmt: str) -> bytes:
    """Run ``run_id`` in format ``fmt`` (a key of :data:`EXPORT_FORMATS`)."""
    if fmt not in EXPORT_FORMATS:
        raise MoEBenchError(f"unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}")
    _run_of(store, run_id)
    return EXPORT_FORMATS[fmt].write(store, run_id)


def _run_of(store: Store, run_id: int) -> RunRow:
    run = store.get_run(run_id)
    if run is None:
        raise MoEBenchError(f"no run with id {run_id} in {store.path}")
    return run


# --- per-request rows: Parquet and JSON Lines ---------------------------------------------------------


def _number(v: Any) -> Any:
    """A stored value as JSON/Arrow takes it: a non-finite float is not a measurement (None)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def request_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    """The run's per-request rows (:data:`REQUEST_CSV_COLUMNS`, in send order), ``None`` where a value
    was not measured; ``error`` is ``None`` for a request that succeeded (the CSV's empty cell)."""
    rows = store.sample_rows(run_id)
    for row in rows:
        for key, value in row.items():
            row[key] = _number(value)
        row["error"] = row["error"] or None
    return rows


@register("jsonl", "per-request rows, one JSON object a line (null: not measured)")
def requests_jsonl(store: Store, run_id: int) -> bytes:
    """One request a line, the keys of :data:`REQUEST_CSV_COLUMNS` in order."""
    lines = [json.dumps(row, allow_nan=False, ensure_ascii=False) for row in request_rows(store, run_id)]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _file_metadata(run: RunRow) -> dict[str, str]:
    units = {c: u for c, (_, u) in REQUEST_COLUMN_TYPES.items() if u is not None}
    return {
        "run_id": str(run.id),
        "run_name": run.name,
        "engine": run.engine,
        "model": run.model,
        "accelerator": run.accelerator,
        "mode": run.mode,
        "status": run.status,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.created_at)),
        "units": json.dumps(units),
        "summary": json.dumps(run.summary.as_dict() if run.summary is not None else None),
        "config": json.dumps(run.config),
    }


@register("parquet", "per-request rows as typed Parquet, units and the run's summary in its metadata")
def requests_parquet(store: Store, run_id: int) -> bytes:
    """The per-request rows as one Parquet table: int64 counts, float64 times, string ids and errors;
    each column's unit in its field metadata (``unit``) and in the file's ``units``; the run's id,
    name, engine, model, accelerator, mode, status, config and summary (JSON) in the file metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = _run_of(store, run_id)
    rows = request_rows(store, run_id)
    fields, arrays = [], []
    for column, (kind, unit) in REQUEST_COLUMN_TYPES.items():
        arrow_type = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}[kind]
        fields.append(pa.field(column, arrow_type, metadata={"unit": unit} if unit else None))
        arrays.append(pa.array([r[column] for r in rows], type=arrow_type))
    schema = pa.schema(fields, metadata=_file_metadata(run))
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), buf)
    return buf.getvalue()


# --- vllm bench serve's result file ----------------------------------------------------------------

VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")  # vllm's --percentile-metrics, as `vllm bench sweep` asks


def vllm_ttft_ms(rec: RequestRecord) -> float | None:
    """vLLM's TTFT of one request, in ms: the first output of any kind (a reasoning model's thinking
    included), as ``vllm bench serve`` times it; ``None`` when no output arrived. From the stored
    record (chunk times kept to the microsecond), as the run's summary is."""
    ms = rec.ttft_any_ms if rec.reasoning_chunks and rec.ttft_any_ms is not None else rec.ttft_ms
    return _number(ms)


def peak_output_per_s(records: Sequence[RequestRecord]) -> tuple[float, int] | None:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` as vLLM's ``calculate_metrics``
    defines them: over 1 s buckets from the first successful request's start, the most output chunks
    that arrived in one bucket (vLLM counts each chunk as one token) and the most successful requests
    active in one bucket; ``None`` when no request succeeded."""
    ok = [r for r in records if r.ok]
    if not ok:
        return None
    t0 = min(r.start_s for r in ok)
    buckets = int(np.ceil(max(r.end_s for r in ok) - t0)) + 1
    tokens = np.zeros(buckets)
    active = np.zeros(buckets)
    for r in ok:
        for t in r.chunk_times_s:
            b = int(t - t0)
            if 0 <= b < buckets:
                tokens[b] += 1
        active[int(r.start_s - t0) : int(r.end_s - t0) + 1] += 1
    return float(tokens.max()), int(active.max())


def _stat_keys(name: str, stat: Stat) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        f"mean_{name}_ms": _number(stat.mean),
        f"median_{name}_ms": _number(stat.p50),
        f"std_{name}_ms": _number(stat.std),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = _number(getattr(stat, f"p{p}"))
    return out


def _vllm_stats(
    summary: RunSummary, records: Sequence[RequestRecord], ttfts_ms: Sequence[float | None]
) -> dict[str, float | None]:
    """The aggregates, in ms, from the run's own summary. TTFT of a run with reasoning is recomputed
    from the first output of any kind (vLLM's TTFT; the summary's ``ttft_ms`` is the first answer)."""
    ttft = summary.ttft_ms
    if any(r.reasoning_chunks for r in records if r.ok):
        ttft = describe(t for r, t in zip(records, ttfts_ms, strict=True) if r.ok)
    stats = {"ttft": ttft, "tpot": summary.tpot_ms, "itl": summary.itl_ms, "e2el": summary.e2e_ms}
    out: dict[str, float | None] = {}
    for name in VLLM_METRICS:
        out.update(_stat_keys(name, stats[name]))
    return out


def _spec_keys(summary: RunSummary) -> dict[str, Any]:
    """vLLM's speculative-decoding keys (acceptance rate in %), only when the run has the counters."""
    if summary.spec_acceptance_rate is None or summary.spec_drafts is None:
        return {}
    return {
        "spec_decode_acceptance_rate": summary.spec_acceptance_rate * 100.0,
        "spec_decode_acceptance_length": summary.spec_acceptance_length,
        "spec_decode_num_drafts": int(summary.spec_drafts),
        "spec_decode_draft_tokens": int(summary.spec_draft_tokens or 0),
        "spec_decode_accepted_tokens": int(summary.spec_accepted_tokens or 0),
        "spec_decode_per_position_acceptance_rates": list(summary.spec_accepted_per_pos or []),
    }


def vllm_result(store: Store, run_id: int) -> dict[str, Any]:
    """The run as the dict ``vllm bench serve --save-result --save-detailed`` writes (vLLM 0.32,
    ``vllm/benchmarks/serve.py``): per-request ``ttfts``/``itls``/``latencies``/``start_times`` in s,
    aggregates in ms with ``--metric-percentiles 50,90,95,99`` and ``--percentile-metrics
    ttft,tpot,itl,e2el``. ``null`` where MoE Bench measured nothing: ``generated_texts`` (texts are not
    stored), ``queue_times`` (no client queue is timed), a failed request's ``ttfts`` without output and
    its ``latencies`` (vLLM times only complete responses), ``request_goodput`` without SLOs."""
    run = _run_of(store, run_id)
    s = run.summary
    if s is None:
        raise MoEBenchError(f"run {run_id} has no summary ({run.status}): vllm-json needs the run's totals")
    records = store.records(run_id)
    ttfts_ms = [vllm_ttft_ms(r) for r in records]
    peak = peak_output_per_s(records)
    engine_opts = run.config.get("engine") if isinstance(run.config.get("engine"), dict) else {}
    stamp = run.finished_at if run.finished_at is not None else run.created_at
    result: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(stamp)),
        "endpoint_type": run.engine,
        "backend": run.engine,
        "label": run.name or None,
        "model_id": run.model,
        "tokenizer_id": engine_opts.get("tokenizer") or run.model,  # vLLM's default: the model's own
        "num_prompts": s.requests,
        # --metadata KEY=VALUE pairs (vLLM writes them as strings)
        "moebench_run_id": str(run.id),
        "accelerator": run.accelerator,
        "request_rate": s.request_rate if s.request_rate is not None else "inf",
        "burstiness": s.burstiness,
        "max_concurrency": s.max_concurrency if s.max_concurrency is not None else run.concurrency,
        "duration": s.duration_s,
        "completed": s.completed,
        "failed": s.failed,
        "total_input_tokens": s.prompt_tokens,
        "total_output_tokens": s.output_tokens,
        "request_throughput": s.request_throughput_rps,
        "request_goodput": s.goodput_rps,
        "output_throughput": s.output_throughput_tok_s,
        "total_token_throughput": s.total_throughput_tok_s,
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.counted_output_tokens if r.ok else 0 for r in records],
        "ttfts": [None if t is None else t / 1000.0 for t in ttfts_ms],
        "itls": [[g / 1000.0 for g in r.itls_ms] for r in records],
        "latencies": [r.e2e_ms / 1000.0 if r.ok else None for r in records],
        "start_times": [r.start_s for r in records],
        "queue_times": [None for _ in records],
        "generated_texts": [None for _ in records],
        "errors": [r.error or "" for r in records],
        "max_output_tokens_per_s": peak[0] if peak else None,
        "max_concurrent_requests": peak[1] if peak else None,
        "rtfx": 0.0,  # no audio input: vLLM writes 0.0 for text benchmarks
        **_spec_keys(s),
        **_vllm_stats(s, records, ttfts_ms),
    }
    return result


@register("vllm-json", "vllm bench serve --save-result's JSON (same keys and units), for vLLM's own tools")
def vllm_json(store: Store, run_id: int) -> bytes:
    """:func:`vllm_result` as the JSON text vLLM writes."""
    return json.dumps(vllm_result(store, run_id), allow_nan=False).encode("utf-8")

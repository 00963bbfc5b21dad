"""Result files of other benchmark tools, read as MoE Bench runs: ``vllm bench serve --save-result``
JSON, AIPerf's profile export JSON (with its per-request ``.jsonl`` beside it, when there) and
guidellm's benchmarks JSON.

:func:`peer_bundle` tells a file's tool by its keys and turns the file into a ``moebench-run/1``
bundle (run, per-request samples, summary) that :meth:`bench.store.Store.import_bundle` stores in
one transaction. Every figure comes from the file itself, in the units the tool's own source gives
(vLLM's per-request lists in seconds, AIPerf's metrics with their ``unit``, guidellm's
``*_ms`` in ms and its ``request_latency`` in seconds); a figure a tool does not write stays empty
(None), never 0. A file that breaks its tool's schema raises :class:`MoEBenchError` with one line.
What maps to what: ``docs/interop.md``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.metrics.records import CANCELLED, Stat, describe
from bench.metrics.summary import RunSummary
from engines.errors import MoEBenchError, one_line

RUN_FORMAT = "moebench-run/1"
TEXT_MAX = 200  # longest name, model or tool text kept from a file
ERROR_MAX = 300  # longest per-request error kept (one line)
_TIME_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0, "seconds": 1000.0}


class _File:
    """One file being read: its tool and name for the one-line reasons, and typed getters."""

    def __init__(self, tool: str, path: Path) -> None:
        self.tool, self.path = tool, path

    def error(self, why: str) -> MoEBenchError:
        return MoEBenchError(f"{self.tool} result {self.path.name}: {why}")

    def real(self, v: Any, what: str, *, low: float = 0.0) -> float:
        """A finite number >= ``low`` (a JSON int or float), or one line saying why not."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(f"{what} is {str(v)[:40]!r}, not a number")
        if not math.isfinite(v):
            raise self.error(f"{what} is {v}, not a finite number")
        if v < low:
            raise self.error(f"{what} is {v}, below {low:g}")
        return float(v)

    def duration(self, v: Any, what: str) -> float:
        """A run's duration in s: a finite number above 0 (rates are divided by it)."""
        x = self.real(v, what)
        if x <= 0:
            raise self.error(f"{what} is {v}: a run that took no time has no rates")
        return x

    def opt_real(self, v: Any, what: str, *, low: float = 0.0) -> float | None:
        return None if v is None else self.real(v, what, low=low)

    def count(self, v: Any, what: str) -> int:
        """A whole number >= 0 (AIPerf writes counts as 30.0)."""
        x = self.real(v, what)
        if x != int(x) or x > 1e12:
            raise self.error(f"{what} is {v}, not a count")
        return int(x)

    def opt_count(self, v: Any, what: str) -> int | None:
        return None if v is None else self.count(v, what)

    def obj(self, v: Any, what: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.error(f"{what} is not an object")
        return v

    def items(self, v: Any, what: str, n: int | None = None) -> list[Any]:
        if not isinstance(v, list):
            raise self.error(f"{what} is not a list")
        if n is not None and len(v) != n:
            raise self.error(f"{what} has {len(v)} entries for {n} requests")
        return v

    def ms(self, v: Any, unit: Any, what: str) -> float:
        """A time in ms from a value in ``unit`` (ns, us, ms, s, sec)."""
        scale = _TIME_TO_MS.get(str(unit))
        if scale is None:
            raise self.error(f"{what} is in {str(unit)[:20]!r}, not a unit of time")
        return self.real(v, what) * scale


def _text(v: Any, default: str = "") -> str:
    return one_line(v, TEXT_MAX) if isinstance(v, str) and v.strip() else default


def _stat(
    count: int | None,
    mean: float | None = None,
    std: float | None = None,
    lo: float | None = None,
    hi: float | None = None,
    p50: float | None = None,
    p90: float | None = None,
    p95: float | None = None,
    p99: float | None = None,
) -> Stat:
    """A Stat from a tool's figures; a tool's statistics over no values are empty, not its zeros."""
    if count == 0:
        return describe([])
    return Stat(count, mean, std, lo, hi, p50, p90, p95, p99)


def _empty_stat() -> Stat:
    """A statistic the file does not have: no count, no values."""
    return Stat(None, None, None, None, None, None, None, None, None)


def _created(f: _File, when: Any, parse: Callable[[Any], float]) -> tuple[float, str]:
    """(seconds since 1970, where it came from): the file's own time, else the file's mtime."""
    if when is not None:
        try:
            t = parse(when)
        except (TypeError, ValueError, OverflowError, OSError) as exc:
            raise f.error(f"its start time {str(when)[:40]!r} is not a time ({exc})") from exc
        if not (0.0 < t < 4_102_444_800.0):
            raise f.error(f"its start time {str(when)[:40]!r} is not a time")
        return t, "file"
    return f.path.stat().st_mtime, "file modification time (the file has no start time)"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _load_text(concurrency: int | None, rate: float | None) -> str:
    """``c=4``, ``20 req/s``, ``c=4, 20 req/s`` or ``all at once``: the load, for a run's name."""
    parts = ([f"c={concurrency}"] if concurrency else []) + ([f"{rate:g} req/s"] if rate else [])
    return ", ".join(parts) or "all at once"


def _sample(
    seq: int,
    request_id: str,
    start_s: float,
    e2e_ms: float,
    chunk_times_s: Sequence[float],
    prompt_tokens: int,
    output_tokens: int,
    error: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """One stored request row (bench.store's ``samples`` columns)."""
    return {
        "seq": seq,
        "request_id": request_id[:TEXT_MAX],
        "start_s": round(start_s, 6),
        "end_s": round(start_s + e2e_ms / 1000.0, 6),
        "e2e_ms": e2e_ms,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "error": one_line(error, ERROR_MAX),
        "chunk_times_json": json.dumps([round(t, 6) for t in chunk_times_s]),
        **extra,
    }


def _bundle(
    f: _File,
    *,
    source_tool: str,
    version: str | None,
    engine: str,
    model: str,
    created: tuple[float, str],
    finished_at: float | None,
    concurrency: int | None,
    config: dict[str, Any],
    engine_info: dict[str, Any],
    summary: RunSummary,
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    label = f"{source_tool} {version}" if version else source_tool
    source = {"source_tool": label, "source_file": f.path.name[:TEXT_MAX]}
    created_at, created_from = created
    run = {
        "name": f"{source_tool}: {model} {_load_text(concurrency, config.get('request_rate'))} {_stamp(created_at)}",
        "created_at": created_at,
        "finished_at": finished_at,
        "status": "completed",
        "mode": "concurrency",
        "engine": engine,
        "model": model,
        "accelerator": "unknown",  # no tool's file says what the server ran on
        "concurrency": concurrency,
        "config_json": json.dumps({**source, **config}),
        "engine_json": json.dumps({**source, "created_at_from": created_from, **engine_info}),
        "summary_json": json.dumps(summary.as_dict()),
        "error": None,
    }
    return {"format": RUN_FORMAT, "run": run, "samples": samples, "timeseries": [], "artifacts": {}}


# --- vllm bench serve ---------------------------------------------------------------------------
# vllm/benchmarks/serve.py (0.32): the result JSON holds the run's settings (date, backend, model_id,
# num_prompts, request_rate, burstiness, max_concurrency), its totals and throughputs, and per metric
# mean_/median_/std_/pXX_<metric>_ms (ms); with --save-detailed also per-request lists in seconds
# (ttfts, itls, latencies, start_times) with input_lens, output_lens and errors ('' when it succeeded).
_VLLM_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
_PCTS = (("p50", "p50"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"))


def _is_vllm(doc: Mapping[str, Any]) -> bool:
    return {"duration", "completed", "total_input_tokens", "request_throughput"} <= doc.keys() and (
        "backend" in doc or "endpoint_type" in doc or "date" in doc
    )


def _vllm_stat(f: _File, doc: Mapping[str, Any], metric: str, base: Stat | None, count: int | None) -> Stat:
    """The file's own mean/median/std/pXX of ``metric`` (ms) over ``base`` (the same statistic
    computed from the per-request lists, where the file has them: min and max come only from there)."""
    if count == 0:
        return describe([])
    got = {k: doc.get(f"{k}_{metric}_ms") for k in ("mean", "median", "std")}
    got.update({ours: doc.get(f"{theirs}_{metric}_ms") for ours, theirs in _PCTS})
    if base is None and all(v is None for v in got.values()):
        return _empty_stat()
    vals = {k: f.opt_real(v, f"{k}_{metric}_ms") for k, v in got.items()}
    b = base or _empty_stat()

    def pick(computed: float | None, written: float | None) -> float | None:
        return written if written is not None else computed  # the file's own figure wins

    return _stat(
        b.count if base is not None else count,
        pick(b.mean, vals["mean"]),
        pick(b.std, vals["std"]),
        b.min,
        b.max,
        pick(b.p50, vals["p50"] if vals["p50"] is not None else vals["median"]),
        pick(b.p90, vals["p90"]),
        pick(b.p95, vals["p95"]),
        pick(b.p99, vals["p99"]),
    )


def _vllm_tpot(latency: float | None, ttft: float | None, output_len: int) -> float | None:
    """vLLM's TPOT of one request, in s: (latency - TTFT) / (output tokens - 1)."""
    if latency is None or ttft is None or output_len < 2:
        return None
    return (latency - ttft) / (output_len - 1)


def _served_summary(
    f: _File,
    doc: Mapping[str, Any],
    total_key: str,
    requests: int | None,
    completed: int,
    failed: int | None,
    duration: float,
    stats: Mapping[str, Stat],
    e2e: Stat,
    max_conc: int | None,
    rate: float | None,
    burstiness: float | None,
) -> RunSummary:
    """The summary of a serving benchmark's result (vllm bench serve's and SGLang's bench_serving
    write the same totals; the total-throughput key is each tool's own)."""
    return RunSummary(
        requests=requests,
        completed=completed,
        failed=failed,
        cancelled=None,
        usage_mismatches=None,
        duration_s=duration,
        prompt_tokens=f.count(doc.get("total_input_tokens"), "total_input_tokens"),
        output_tokens=f.count(doc.get("total_output_tokens"), "total_output_tokens"),
        request_throughput_rps=f.real(doc.get("request_throughput"), "request_throughput"),
        output_throughput_tok_s=f.opt_real(doc.get("output_throughput"), "output_throughput"),
        total_throughput_tok_s=f.opt_real(doc.get(total_key), total_key),
        ttft_ms=stats["ttft"],
        tpot_ms=stats["tpot"],
        itl_ms=stats["itl"],
        e2e_ms=e2e,
        max_concurrency=max_conc,
        request_rate=rate,
        burstiness=burstiness,
        goodput_rps=f.opt_real(doc.get("request_goodput"), "request_goodput"),
    )


def _chunk_times(first: float, gaps: Sequence[float]) -> list[float]:
    """A request's chunk times rebuilt from its first chunk's and the gaps after it."""
    return list(itertools.accumulate(gaps, initial=first))


def _vllm_samples(
    ttfts: list[float | None],
    itls: list[list[float]],
    lat: list[float | None],
    starts: list[float | None],
    ok: list[bool],
    in_lens: list[int],
    out_lens: list[int],
    errors: list[Any],
) -> list[dict[str, Any]]:
    """The per-request rows of a ``--save-detailed`` result: chunk times rebuilt from TTFT and the ITL gaps."""
    n = len(ok)
    samples: list[dict[str, Any]] = []
    t0 = min(starts) if starts else 0.0
    for i in range(n):
        start = starts[i] - t0
        ttft = ttfts[i]
        chunks = _chunk_times(start + ttft, itls[i]) if ok[i] and ttft is not None else []
        gaps = itls[i] if ok[i] else []
        samples.append(
            _sample(
                i,
                f"vllm-{i}",
                start,
                (lat[i] or 0.0) * 1000.0,  # vLLM times no failed request: 0.0, as it writes
                chunks,
                in_lens[i],
                out_lens[i] if ok[i] else 0,
                "" if ok[i] else str(errors[i] or "failed"),
                ttft_ms=ttft * 1000.0 if ok[i] and ttft is not None else None,
                ttft_any_ms=ttft * 1000.0 if ok[i] and ttft is not None else None,
                tpot_ms=None if not ok[i] or (tp := _vllm_tpot(lat[i], ttft, out_lens[i])) is None else tp * 1000,
                itl_mean_ms=sum(gaps) / len(gaps) * 1000.0 if gaps else None,
                itl_token_mean_ms=sum(gaps) / len(gaps) * 1000.0 if gaps else None,
            )
        )
    return samples


def _vllm_config(
    doc: dict[str, Any],
    num_prompts: int | None,
    max_conc: int | None,
    rate: float | None,
    burst: float | None,
    detailed: bool,
) -> dict[str, Any]:
    """What a vllm bench serve result says of its run's settings."""
    return {
        "requests": num_prompts,
        "concurrency": max_conc,
        "request_rate": rate,
        "burstiness": burst,
        "per_request": "rows from --save-detailed" if detailed else "none (saved without --save-detailed)",
        "source_settings": {
            k: doc[k]
            for k in (
                "backend",
                "endpoint_type",
                "label",
                "model_id",
                "tokenizer_id",
                "ramp_up_strategy",
                "ramp_up_start_rps",
                "ramp_up_end_rps",
            )
            if isinstance(doc.get(k), str | int | float)
        },
    }


def _vllm(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    f = _File("vllm bench serve", path)
    completed = f.count(doc.get("completed"), "completed")
    failed = f.opt_count(doc.get("failed"), "failed")
    n = completed + (failed or 0)
    duration = f.duration(doc.get("duration"), "duration")
    lists = {k: f.items(doc[k], k, n) for k in (*_VLLM_LISTS, "queue_times") if k in doc}
    errors = lists.get("errors")
    ok: list[bool] | None = None
    if errors is not None:
        if not all(e is None or isinstance(e, str) for e in errors):
            raise f.error("errors holds an entry that is not text")
        ok = [not e for e in errors]
        if sum(ok) != completed:
            raise f.error(f"errors lists {n - sum(ok)} failed requests, the file says {failed}")
    elif failed == 0 and lists:  # only per-request lists need it, and they are n long
        ok = [True] * n
    detailed = all(k in lists for k in _VLLM_LISTS)

    def seconds(key: str, ok: list[bool], empty_if_failed: bool = True) -> list[float | None]:
        """A per-request list in s; vLLM writes 0.0 for a failed request (MoE Bench's vllm-json null),
        and a request without output has no TTFT."""
        return [
            None if x is None and ((empty_if_failed and not ok[i]) or key == "ttfts") else f.real(x, f"{key}[{i}]")
            for i, x in enumerate(lists[key])
        ]

    ttfts = itls = lat = starts = None
    if detailed and ok is not None:
        ttfts = seconds("ttfts", ok)
        lat = seconds("latencies", ok)
        starts = seconds("start_times", ok, empty_if_failed=False)
        itls = [[f.real(g, f"itls[{i}]") for g in f.items(x, f"itls[{i}]")] for i, x in enumerate(lists["itls"])]
    elif "latencies" in lists and ok is not None:
        lat = seconds("latencies", ok)
    in_lens = [f.count(x, f"input_lens[{i}]") for i, x in enumerate(lists.get("input_lens", []))]
    out_lens = [f.count(x, f"output_lens[{i}]") for i, x in enumerate(lists.get("output_lens", []))]

    def mine(values: Iterable[float | None]) -> Stat:  # seconds -> the ms Stat vLLM computes over them
        return describe(1000.0 * v for v in values if v is not None)

    base: dict[str, Stat | None] = dict.fromkeys(("ttft", "tpot", "itl", "e2el"))
    counts: dict[str, int | None] = {"ttft": completed, "tpot": None, "itl": None, "e2el": completed}
    if ttfts is not None and itls is not None and lat is not None and ok is not None:
        good = [i for i in range(n) if ok[i]]
        tpots = [_vllm_tpot(lat[i], ttfts[i], out_lens[i]) for i in good]
        tpots = [t for t in tpots if t is not None]
        base.update(
            ttft=mine(ttfts[i] for i in good),
            tpot=mine(tpots),
            itl=mine(g for i in good for g in itls[i]),
            e2el=mine(lat[i] for i in good),
        )
        counts.update(tpot=len(tpots), itl=sum(len(itls[i]) for i in good))
    elif lat is not None and ok is not None:
        base["e2el"] = mine(lat[i] for i in range(n) if ok[i])
    stats = {m: _vllm_stat(f, doc, m, base[m], counts[m]) for m in base}

    rate_raw = doc.get("request_rate")
    rate = None if rate_raw in (None, "inf") else f.real(rate_raw, "request_rate")  # "inf": all at once
    burst = f.opt_real(doc.get("burstiness"), "burstiness")
    max_conc = f.opt_count(doc.get("max_concurrency"), "max_concurrency")
    num_prompts = f.opt_count(doc.get("num_prompts"), "num_prompts")
    summary = _served_summary(
        f, doc, "total_token_throughput", n if failed is not None else None, completed, failed, duration, stats,
        stats["e2el"], max_conc, rate, burst if rate is not None else None,
    )  # fmt: skip

    samples: list[dict[str, Any]] = []
    if ttfts is not None and itls is not None and lat is not None and starts is not None and ok is not None:
        samples = _vllm_samples(ttfts, itls, lat, starts, ok, in_lens, out_lens, lists.get("errors") or [])
    created = _created(f, doc.get("date"), lambda d: time.mktime(time.strptime(str(d), "%Y%m%d-%H%M%S")))
    backend = _text(doc.get("backend") or doc.get("endpoint_type"), "openai")
    return _bundle(
        f,
        source_tool="vllm bench serve",
        version=None,  # the result JSON does not record vLLM's version
        engine=backend,
        model=_text(doc.get("model_id"), "unknown"),
        created=created,
        finished_at=created[0] + duration,
        concurrency=max_conc,
        config=_vllm_config(doc, num_prompts, max_conc, rate, burst, bool(samples)),
        engine_info={"backend": backend},
        summary=summary,
        samples=samples,
    )


# --- AIPerf -------------------------------------------------------------------------------------
# aiperf/metrics/types/*.py (0.13): each metric is {"unit", "avg", "p1".."p99", "min", "max", "std",
# "count"}; time_to_first_token / time_to_first_output_token / request_latency per request,
# inter_token_latency = (latency - TTFT) / (OSL - 1) per request (MoE Bench's TPOT), inter_chunk_latency
# every gap between chunks (MoE Bench's ITL). request_count counts the successful requests,
# error_request_count the failed ones (written only when some failed), completed_request_count both.
# The per-request records are a separate file, NAME.jsonl (profile_export.jsonl beside
# profile_export_aiperf.json), one {"metadata", "metrics", "error"} a line.


def _is_aiperf(doc: Mapping[str, Any]) -> bool:
    return "aiperf_version" in doc or (
        "input_config" in doc and isinstance(doc.get("request_latency"), dict) and "benchmark_duration" in doc
    )


def _aiperf_value(f: _File, doc: Mapping[str, Any], tag: str) -> float | None:
    m = doc.get(tag)
    if m is None:
        return None
    return f.real(f.obj(m, tag).get("avg"), f"{tag}.avg")


def _aiperf_rate(f: _File, doc: Mapping[str, Any], tag: str) -> float | None:
    """A throughput (``requests/sec``, ``tokens/sec``): per second, or one line saying why not."""
    v = _aiperf_value(f, doc, tag)
    unit = str(doc[tag].get("unit")) if v is not None else ""
    if v is not None and not unit.endswith(("/sec", "/s")):
        raise f.error(f"{tag} is in {unit[:20]!r}, not per second")
    return v


def _aiperf_stat(f: _File, doc: Mapping[str, Any], tag: str) -> Stat:
    m = doc.get(tag)
    if m is None:
        return _empty_stat()
    m = f.obj(m, tag)
    unit = m.get("unit")

    def get(k: str) -> float | None:
        return None if m.get(k) is None else f.ms(m[k], unit, f"{tag}.{k}")

    return _stat(
        f.opt_count(m.get("count"), f"{tag}.count"),
        get("avg"), get("std"), get("min"), get("max"), get("p50"), get("p90"), get("p95"), get("p99"),
    )  # fmt: skip


def aiperf_records_path(path: Path) -> Path | None:
    """The per-request records AIPerf wrote beside its profile export JSON, if they are there:
    ``NAME.jsonl`` for ``NAME.json`` (``--profile-export-prefix NAME``), ``profile_export.jsonl``
    for ``profile_export_aiperf.json``."""
    for cand in (path.with_suffix(".jsonl"), path.with_name(path.stem.removesuffix("_aiperf") + ".jsonl")):
        if cand.is_file():
            return cand
    return None


def _aiperf_records(f: _File, path: Path, n: int, max_bytes: int) -> tuple[list[dict[str, Any]], str]:
    """The requests of AIPerf's records file (profiling phase only) as samples, and its name."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise f.error(f"{path.name} beside it is {size / 2**20:,.0f} MiB, over the {max_bytes >> 20} MiB allowed")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise f.error(f"cannot read {path.name} beside it: {one_line(exc, 120)}") from exc
    rows: list[tuple[float, dict[str, Any]]] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise f.error(f"{path.name} line {no} is not JSON ({one_line(exc, 80)})") from exc
        rec = f.obj(rec, f"{path.name} line {no}")
        meta = f.obj(rec.get("metadata"), f"{path.name} line {no} metadata")
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue  # warm-up requests are not the run's
        rows.append((f.real(meta.get("request_start_ns"), f"{path.name} line {no} request_start_ns"), rec))
    if len(rows) != n:
        raise f.error(
            f"{path.name} beside it holds {len(rows)} profiling records for {n} requests: not this run's records "
            "(move it away to import the summary alone)"
        )
    t0 = min((s for s, _ in rows), default=0.0)
    samples = []
    for seq, (start_ns, rec) in enumerate(sorted(rows, key=lambda r: r[0])):
        where = f"{path.name} record {seq}"
        metrics = f.obj(rec.get("metrics") or {}, f"{where} metrics")

        def value(tag: str, metrics: dict[str, Any] = metrics, where: str = where) -> Any:
            m = metrics.get(tag)
            return None if m is None else f.obj(m, f"{where} {tag}").get("value")

        def ms(tag: str, metrics: dict[str, Any] = metrics, where: str = where) -> float | None:
            m = metrics.get(tag)
            return None if m is None else f.ms(value(tag), m.get("unit"), f"{where} {tag}")

        meta = rec["metadata"]
        start = (start_ns - t0) / 1e9
        err = rec.get("error")
        error = "" if not err else (err.get("message") if isinstance(err, dict) else str(err)) or "failed"
        ttft_any, ttfo = ms("time_to_first_token"), ms("time_to_first_output_token")
        e2e = ms("request_latency")
        if e2e is None:
            e2e = (f.real(meta.get("request_end_ns"), f"{where} request_end_ns") - start_ns) / 1e6
        gaps_m = metrics.get("inter_chunk_latency")
        gaps: list[float] = []
        if gaps_m is not None:
            unit = f.obj(gaps_m, f"{where} inter_chunk_latency").get("unit")
            gaps = [f.ms(g, unit, f"{where} inter_chunk_latency") for g in f.items(value("inter_chunk_latency"), where)]
        chunks: list[float] = []
        if ttft_any is not None and not error:
            t = start + ttft_any / 1000.0
            chunks = [t]
            for g in gaps:
                t += g / 1000.0
                chunks.append(t)
        samples.append(
            _sample(
                seq,
                _text(meta.get("x_request_id"), f"aiperf-{seq}"),
                start,
                e2e,
                chunks,
                f.opt_count(value("input_sequence_length"), f"{where} input_sequence_length") or 0,
                f.opt_count(value("output_sequence_length"), f"{where} output_sequence_length") or 0,
                error,
                usage_output_tokens=f.opt_count(value("usage_completion_tokens"), f"{where} usage_completion_tokens"),
                ttft_ms=ttfo if ttfo is not None else ttft_any,
                ttft_any_ms=ttft_any,
                tpot_ms=ms("inter_token_latency"),
                itl_mean_ms=sum(gaps) / len(gaps) if gaps else None,
                itl_token_mean_ms=sum(gaps) / len(gaps) if gaps else None,
            )
        )
    return samples, path.name


def _aiperf(doc: dict[str, Any], path: Path, max_bytes: int) -> dict[str, Any]:
    version = _text(doc.get("aiperf_version")) or None
    f = _File("AIPerf", path)
    completed = f.count(_aiperf_value(f, doc, "request_count"), "request_count")
    errors = _aiperf_value(f, doc, "error_request_count")
    total = _aiperf_value(f, doc, "completed_request_count")
    failed = (
        f.count(errors, "error_request_count")
        if errors is not None
        else (f.count(total, "completed_request_count") - completed if total is not None else None)
    )
    if failed is not None and failed < 0:
        raise f.error(f"completed_request_count {total} is below request_count {completed}")
    n = completed + failed if failed is not None else None
    duration = _aiperf_value(f, doc, "benchmark_duration")
    dur_m = doc.get("benchmark_duration")
    duration_s = None if duration is None else f.ms(duration, f.obj(dur_m, "benchmark_duration").get("unit"),
                                                    "benchmark_duration") / 1000.0  # fmt: skip
    if duration_s is not None:
        f.duration(duration_s, "benchmark_duration")
    cfg = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    models = (cfg.get("models") or {}).get("items") if isinstance(cfg.get("models"), dict) else None
    model = _text(models[0].get("name"), "unknown") if isinstance(models, list) and models and isinstance(
        models[0], dict) else "unknown"  # fmt: skip
    phases = [p for p in cfg.get("phases") or [] if isinstance(p, dict)]
    phase = next((p for p in phases if p.get("kind") == "profiling"), phases[0] if phases else {})
    conc = f.opt_count(phase.get("concurrency"), "input_config phase concurrency")
    rate = f.opt_real(phase.get("rate"), "input_config phase rate")
    kind = _text(phase.get("type"))
    datasets = [d for d in cfg.get("datasets") or [] if isinstance(d, dict)]
    prompts = (datasets[0].get("prompts") or {}) if datasets and isinstance(datasets[0].get("prompts"), dict) else {}
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}

    ttft_tag = "time_to_first_output_token" if "time_to_first_output_token" in doc else "time_to_first_token"
    summary = RunSummary(
        requests=n,
        completed=completed,
        failed=failed,
        cancelled=None,
        usage_mismatches=None,
        duration_s=duration_s,
        prompt_tokens=f.opt_count(_aiperf_value(f, doc, "total_isl"), "total_isl"),
        output_tokens=f.opt_count(_aiperf_value(f, doc, "total_osl"), "total_osl"),
        request_throughput_rps=_aiperf_rate(f, doc, "request_throughput"),
        output_throughput_tok_s=_aiperf_rate(f, doc, "output_token_throughput"),
        total_throughput_tok_s=_aiperf_rate(f, doc, "total_token_throughput"),
        ttft_ms=_aiperf_stat(f, doc, ttft_tag),
        tpot_ms=_aiperf_stat(f, doc, "inter_token_latency"),
        itl_ms=_aiperf_stat(f, doc, "inter_chunk_latency"),
        e2e_ms=_aiperf_stat(f, doc, "request_latency"),
        max_concurrency=conc,
        request_rate=rate,
        burstiness=1.0 if rate is not None and kind == "poisson" else None,
        goodput_rps=_aiperf_rate(f, doc, "goodput"),
        good_requests=f.opt_count(_aiperf_value(f, doc, "good_request_count"), "good_request_count"),
    )
    samples: list[dict[str, Any]] = []
    records_file = None
    found = aiperf_records_path(path)
    if found is not None and n is not None:
        samples, records_file = _aiperf_records(f, found, n, max_bytes)

    def iso(v: Any) -> float:
        return datetime.fromisoformat(str(v)).timestamp()

    created = _created(f, doc.get("start_time"), iso)
    finished = _created(f, doc.get("end_time"), iso)[0] if doc.get("end_time") is not None else None
    return _bundle(
        f,
        source_tool="AIPerf",
        version=version,
        engine="openai",  # AIPerf names the endpoint type, not a server
        model=model,
        created=created,
        finished_at=finished,
        concurrency=conc,
        config={
            "requests": f.opt_count(phase.get("requests"), "input_config phase requests"),
            "concurrency": conc,
            "request_rate": rate,
            "arrival": kind or None,
            "workload": {
                "source": _text(datasets[0].get("type")) or None if datasets else None,
                "input_len": (prompts.get("isl") or {}).get("mean") if isinstance(prompts.get("isl"), dict) else None,
                "output_len": (prompts.get("osl") or {}).get("mean") if isinstance(prompts.get("osl"), dict) else None,
            },
            "per_request": f"rows from {records_file}" if records_file else "none (no records file beside it)",
            "source_settings": {
                "endpoint_type": _text(endpoint.get("type")) or None,
                "streaming": endpoint.get("streaming") if isinstance(endpoint.get("streaming"), bool) else None,
                "ttft_from": ttft_tag,
            },
        },
        engine_info={"endpoint_type": _text(endpoint.get("type")) or None},
        summary=summary,
        samples=samples,
    )


# --- guidellm -----------------------------------------------------------------------------------
# guidellm/schemas (0.8): {"metadata": {"guidellm_version"}, "benchmarks": [one per strategy]}; a
# benchmark has start_time/end_time/duration (s), config.strategy and config.backend, metrics.NAME
# .{successful,errored,incomplete,total} distributions (mean, median, std_dev, min, max, count,
# percentiles.pXX) and requests.{successful,errored,incomplete} per-request stats. Per request
# (schemas/base/request_stats.py): request_latency in s, time_to_first_token_ms,
# time_to_first_output_token_ms, inter_token_latency_ms = (last - first token) / (output - 1) (MoE
# Bench's TPOT), time_per_output_token_ms = (last token - start) / output (not MoE Bench's TPOT); the
# gaps between chunks are not kept (no ITL).


def _is_guidellm(doc: Mapping[str, Any]) -> bool:
    meta = doc.get("metadata")
    return isinstance(doc.get("benchmarks"), list) and (
        (isinstance(meta, dict) and "guidellm_version" in meta)
        or any(isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in doc["benchmarks"])
    )


def _guidellm_stat(f: _File, metrics: Mapping[str, Any], tag: str, scale: float = 1.0) -> Stat:
    m = metrics.get(tag)
    if m is None:
        return _empty_stat()
    d = f.obj(f.obj(m, tag).get("successful"), f"{tag}.successful")
    pct = d.get("percentiles") or {}
    pct = f.obj(pct, f"{tag}.successful.percentiles")

    def get(v: Any, what: str) -> float | None:
        return None if v is None else f.real(v, f"{tag}.successful.{what}") * scale

    return _stat(
        f.opt_count(d.get("count"), f"{tag}.successful.count"),
        get(d.get("mean"), "mean"), get(d.get("std_dev"), "std_dev"), get(d.get("min"), "min"),
        get(d.get("max"), "max"), get(pct.get("p50", d.get("median")), "p50"), get(pct.get("p90"), "p90"),
        get(pct.get("p95"), "p95"), get(pct.get("p99"), "p99"),
    )  # fmt: skip


def _guidellm(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = _text(meta.get("guidellm_version")) or None
    f = _File("guidellm", path)
    benches = f.items(doc["benchmarks"], "benchmarks")
    if len(benches) != 1:
        raise f.error(
            f"holds {len(benches)} benchmarks; MoE Bench imports a file with one (run guidellm with one rate "
            "or stream count per file)"
        )
    b = f.obj(benches[0], "benchmarks[0]")
    metrics = f.obj(b.get("metrics"), "benchmarks[0].metrics")
    totals = f.obj(metrics.get("request_totals"), "metrics.request_totals")
    completed = f.count(totals.get("successful"), "request_totals.successful")
    failed = f.count(totals.get("errored"), "request_totals.errored")
    cancelled = f.count(totals.get("incomplete"), "request_totals.incomplete")
    duration = f.duration(b.get("duration"), "benchmarks[0].duration")

    def tokens(tag: str) -> int | None:
        m = metrics.get(tag)
        if m is None:
            return None
        v = f.obj(f.obj(m, tag).get("successful"), f"{tag}.successful").get("total_sum")
        return f.opt_count(None if v is None else round(f.real(v, f"{tag}.successful.total_sum")), tag)

    prompt_tokens, output_tokens = tokens("prompt_token_count"), tokens("output_token_count")

    def per_s(x: float | None) -> float | None:
        return None if x is None or duration <= 0 else x / duration

    cfg = b.get("config") if isinstance(b.get("config"), dict) else {}
    strategy = cfg.get("strategy") if isinstance(cfg.get("strategy"), dict) else {}
    backend = cfg.get("backend") if isinstance(cfg.get("backend"), dict) else {}
    profile = cfg.get("profile") if isinstance(cfg.get("profile"), dict) else {}
    kind = _text(strategy.get("type_"))
    conc = (
        f.opt_count(strategy.get("streams"), "strategy.streams")
        if kind == "concurrent"
        else 1
        if kind == "synchronous"
        else None
    )
    rate = f.opt_real(strategy.get("rate"), "strategy.rate") if kind in ("constant", "poisson") else None
    ttft_tag = "time_to_first_output_token_ms"
    if ttft_tag not in metrics:
        ttft_tag = "time_to_first_token_ms"
    samples = _guidellm_samples(f, b)
    ok = [x for x in samples if not x["error"]]
    # MoE Bench's TPOT is a per-request statistic; guidellm's inter_token_latency_ms distribution weighs
    # each request by its output tokens - 1 (its ITL per token), so TPOT comes from the file's requests
    tpot = describe(x["tpot_ms"] for x in ok) if len(ok) == completed else _empty_stat()
    summary = RunSummary(
        requests=completed + failed + cancelled,
        completed=completed,
        failed=failed,
        cancelled=cancelled,
        usage_mismatches=None,
        duration_s=duration,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        request_throughput_rps=per_s(completed),
        output_throughput_tok_s=per_s(output_tokens),
        total_throughput_tok_s=per_s(
            None if prompt_tokens is None or output_tokens is None else prompt_tokens + output_tokens
        ),
        ttft_ms=_guidellm_stat(f, metrics, ttft_tag),
        tpot_ms=tpot,
        itl_ms=_empty_stat(),  # guidellm keeps no gaps between chunks
        itl_token_ms=_guidellm_stat(f, metrics, "inter_token_latency_ms"),
        e2e_ms=_guidellm_stat(f, metrics, "request_latency", 1000.0),
        max_concurrency=conc,
        request_rate=rate,
        burstiness=1.0 if kind == "poisson" else None,
    )
    constraints = cfg.get("constraints") if isinstance(cfg.get("constraints"), dict) else {}
    max_req = constraints.get("max_requests") if isinstance(constraints.get("max_requests"), dict) else {}
    spec = doc["config"].get("spec") if isinstance(doc.get("config"), dict) else None
    data = spec.get("data") if isinstance(spec, dict) else None
    data0 = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    created = _created(f, b.get("start_time"), float)
    engine = _text(backend.get("kind"), "openai")
    return _bundle(
        f,
        source_tool="guidellm",
        version=version,
        engine=engine,
        model=_text(backend.get("model"), "unknown"),
        created=created,
        finished_at=f.opt_real(b.get("end_time"), "benchmarks[0].end_time"),
        concurrency=conc,
        config={
            "requests": f.opt_count(
                (max_req.get("args") or {}).get("count") if isinstance(max_req.get("args"), dict) else None,
                "max_requests count",
            ),
            "concurrency": conc,
            "request_rate": rate,
            "arrival": kind or None,
            "workload": {
                "source": _text(data0.get("kind")) or None,
                "input_len": data0.get("prompt_tokens") if isinstance(data0.get("prompt_tokens"), int) else None,
                "output_len": data0.get("output_tokens") if isinstance(data0.get("output_tokens"), int) else None,
            },
            "per_request": f"{len(samples)} rows from the file's requests (first and last token times, no chunk gaps)",
            "source_settings": {
                "strategy": kind or None,
                "request_format": _text(backend.get("request_format")) or None,
                "warmup_duration": b.get("warmup_duration"),
                "cooldown_duration": b.get("cooldown_duration"),
                "profile": _text(profile.get("kind")) or None,
                "ttft_from": ttft_tag,
            },
        },
        engine_info={"backend": engine, "request_format": _text(backend.get("request_format")) or None},
        summary=summary,
        samples=samples,
    )


def _guidellm_samples(f: _File, b: Mapping[str, Any]) -> list[dict[str, Any]]:
    reqs = b.get("requests")
    if not isinstance(reqs, dict):
        return []
    rows: list[tuple[str, dict[str, Any]]] = []
    for status in ("successful", "errored", "incomplete"):
        got = reqs.get(status)
        if got is None:
            continue
        for i, r in enumerate(f.items(got, f"requests.{status}")):
            rows.append((status, f.obj(r, f"requests.{status}[{i}]")))
    # a request that never started (incomplete at the end) has no row, only its count in the summary
    started = [(f.opt_real(r.get("request_start_time"), f"{s} request_start_time"), s, r) for s, r in rows]
    timed = sorted(((t, s, r) for t, s, r in started if t is not None), key=lambda x: x[0])
    t0 = timed[0][0] if timed else 0.0
    samples = []
    for seq, (start_abs, status, r) in enumerate(timed):
        where = f"requests.{status} {r.get('request_id')!s:.40}"
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        timings = info.get("timings") if isinstance(info.get("timings"), dict) else {}
        lat = f.opt_real(r.get("request_latency"), f"{where} request_latency")
        if lat is None:
            end = f.opt_real(r.get("request_end_time"), f"{where} request_end_time")
            lat = max(0.0, end - start_abs) if end is not None else 0.0
        out = f.opt_count(r.get("output_tokens"), f"{where} output_tokens") or 0
        first = f.opt_real(timings.get("first_token_iteration"), f"{where} first_token_iteration")
        last = f.opt_real(timings.get("last_token_iteration"), f"{where} last_token_iteration")
        error = ""
        if status == "errored":
            error = str(info.get("error") or "failed")
        elif status == "incomplete":
            error = CANCELLED  # cut off when the benchmark ended: cancelled, not failed
        chunks: list[float] = []
        tokens: list[int] | None = None
        if not error and first is not None:
            chunks = [first - t0]
            if last is not None and out > 1 and last > first:
                chunks.append(last - t0)
                tokens = [1, out - 1]  # guidellm keeps the first and last token times only
        itl = f.opt_real(r.get("inter_token_latency_ms"), f"{where} inter_token_latency_ms") if not error else None
        ttft_any = f.opt_real(r.get("time_to_first_token_ms"), f"{where} time_to_first_token_ms")
        ttfo = f.opt_real(r.get("time_to_first_output_token_ms"), f"{where} time_to_first_output_token_ms")
        samples.append(
            _sample(
                seq,
                _text(r.get("request_id"), f"guidellm-{seq}"),
                start_abs - t0,
                lat * 1000.0,
                chunks,
                f.opt_count(r.get("prompt_tokens"), f"{where} prompt_tokens") or 0,
                out if not error else 0,
                error,
                ttft_ms=(ttfo if ttfo is not None else ttft_any) if not error else None,
                ttft_any_ms=ttft_any if not error else None,
                tpot_ms=itl,
                itl_mean_ms=None,
                itl_token_mean_ms=itl,
                chunk_tokens_json=None if tokens is None else json.dumps(tokens),
            )
        )
    return samples


# --- SGLang bench_serving -----------------------------------------------------------------------
# sglang/benchmark/serving.py (0.5.23; ``python -m sglang.bench_serving`` re-exports it): with
# --output-file each run appends one JSON line (the file is JSONL, several runs one after another).
# A line holds the run's settings (backend, dataset_name, request_rate: Infinity when all at once or
# "trace", max_concurrency, random_input_len/random_output_len), server_info (the server's
# /server_info, null when it has none), its totals and throughputs, and per metric mean_/median_/
# std_/p90_/p95_/p99_<metric>_ms for ttft, tpot, itl and e2e_latency (ms; numpy's linear percentiles
# over the successful requests). It writes no date, no model, no request count and no failed count:
# ``completed`` counts the successful requests. With --output-details the line also holds per-request
# lists over every request sent: input_lens, output_lens (0 when it failed), ttfts and itls (seconds;
# 0.0 and [] when it failed), generated_texts and errors ('' when it succeeded); no start times, no
# latencies. TPOT is (latency - TTFT) / (output - 1) per request.
_SGLANG_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
_SGLANG_METRICS = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2e_latency"))


def _is_sglang(doc: Mapping[str, Any]) -> bool:
    # vLLM's result has the same totals but names E2E ``e2el`` and writes no retokenized count
    return {"duration", "completed", "request_throughput"} <= doc.keys() and (
        "mean_e2e_latency_ms" in doc or "total_output_tokens_retokenized" in doc
    )


def _sglang_stat(f: _File, doc: Mapping[str, Any], metric: str, base: Stat | None, count: int | None) -> Stat:
    """SGLang's own mean/median/std/p90/p95/p99 of ``metric`` (ms); min and max only from ``base``
    (the same statistic over the per-request lists, where the line has them)."""
    if count == 0:
        return describe([])  # SGLang writes 0 (TTFT, TPOT, ITL) or NaN (E2E) over no values
    got = {
        k: f.opt_real(doc.get(f"{k}_{metric}_ms"), f"{k}_{metric}_ms")
        for k in ("mean", "median", "std", "p90", "p95", "p99")
    }
    if base is None and all(v is None for v in got.values()):
        return _empty_stat()
    b = base or _empty_stat()
    return _stat(count, got["mean"], got["std"], b.min, b.max, got["median"], got["p90"], got["p95"], got["p99"])


def _sglang_samples(
    ttfts: list[float],
    itls: list[list[float]],
    ok: list[bool],
    in_lens: list[int],
    out_lens: list[int],
    errors: list[Any],
) -> list[dict[str, Any]]:
    """The rows of an --output-details line. SGLang keeps no start times and no latencies per request:
    every row starts at 0 s, its chunks at TTFT and then each ITL gap, and it ends at its last chunk."""
    samples = []
    for i, good in enumerate(ok):
        chunks = _chunk_times(ttfts[i], itls[i]) if good else []
        gaps = itls[i] if good else []
        samples.append(
            _sample(
                i,
                f"sglang-{i}",
                0.0,
                chunks[-1] * 1000.0 if chunks else 0.0,
                chunks,
                in_lens[i],
                out_lens[i] if good else 0,
                "" if good else str(errors[i] or "failed"),
                ttft_ms=ttfts[i] * 1000.0 if good else None,
                ttft_any_ms=ttfts[i] * 1000.0 if good else None,
                tpot_ms=None,  # SGLang's TPOT needs the request's latency, which the line does not keep
                itl_mean_ms=sum(gaps) / len(gaps) * 1000.0 if gaps else None,
                itl_token_mean_ms=sum(gaps) / len(gaps) * 1000.0 if gaps else None,
            )
        )
    return samples


class _Line(_File):
    """One line of a file of several runs: its reasons name the line."""

    def __init__(self, tool: str, path: Path, line: int) -> None:
        super().__init__(tool, path)
        self.line = line

    def error(self, why: str) -> MoEBenchError:
        return MoEBenchError(f"{self.tool} result {self.path.name} line {self.line}: {why}")


def _sglang(doc: dict[str, Any], path: Path, line: tuple[int, int] | None = None) -> dict[str, Any]:
    """One run (one line) of an SGLang bench_serving result file; ``line``: (its number, the lines)."""
    tool = "SGLang bench_serving"
    f = _File(tool, path) if line is None or line[1] == 1 else _Line(tool, path, line[0])
    completed = f.count(doc.get("completed"), "completed")
    duration = f.duration(doc.get("duration"), "duration")
    detailed = all(k in doc for k in _SGLANG_LISTS)
    n = failed = None
    samples: list[dict[str, Any]] = []
    base: dict[str, Stat | None] = dict.fromkeys(m for m, _ in _SGLANG_METRICS)
    counts: dict[str, int | None] = {"ttft": completed, "tpot": None, "itl": None, "e2e": completed}
    if detailed:
        errors = f.items(doc["errors"], "errors")
        n = len(errors)
        lists = {k: f.items(doc[k], k, n) for k in _SGLANG_LISTS}
        if not all(e is None or isinstance(e, str) for e in errors):
            raise f.error("errors holds an entry that is not text")
        ok = [not e for e in errors]
        failed = n - sum(ok)
        if sum(ok) != completed:
            raise f.error(f"errors lists {sum(ok)} successful requests, completed says {completed}")
        ttfts = [f.real(x, f"ttfts[{i}]") for i, x in enumerate(lists["ttfts"])]
        itls = [[f.real(g, f"itls[{i}]") for g in f.items(x, f"itls[{i}]")] for i, x in enumerate(lists["itls"])]
        in_lens = [f.count(x, f"input_lens[{i}]") for i, x in enumerate(lists["input_lens"])]
        out_lens = [f.count(x, f"output_lens[{i}]") for i, x in enumerate(lists["output_lens"])]
        good = [i for i in range(n) if ok[i]]
        base["ttft"] = describe(ttfts[i] * 1000.0 for i in good)
        base["itl"] = describe(g * 1000.0 for i in good for g in itls[i])
        counts.update(itl=sum(len(itls[i]) for i in good), tpot=sum(1 for i in good if out_lens[i] > 1))
        samples = _sglang_samples(ttfts, itls, ok, in_lens, out_lens, errors)
    stats = {m: _sglang_stat(f, doc, theirs, base[m], counts[m]) for m, theirs in _SGLANG_METRICS}

    rate_raw = doc.get("request_rate")
    all_at_once = rate_raw is None or rate_raw == "trace" or (isinstance(rate_raw, float) and rate_raw == math.inf)
    rate = None if all_at_once else f.real(rate_raw, "request_rate")
    max_conc = f.opt_count(doc.get("max_concurrency"), "max_concurrency")
    summary = _served_summary(
        f, doc, "total_throughput", n, completed, failed, duration, stats, stats["e2e"], max_conc, rate,
        1.0 if rate is not None else None,  # SGLang draws exponential gaps: Poisson arrivals
    )  # fmt: skip
    info = doc.get("server_info") if isinstance(doc.get("server_info"), dict) else {}
    model = _text(info.get("served_model_name")) or _text(info.get("model_path"), "unknown")
    backend = _text(doc.get("backend"), "unknown")
    dataset = _text(doc.get("dataset_name")) or None
    random_lens = dataset is not None and dataset.startswith("random")
    where = f"line {line[0]} of {line[1]}" if line is not None else "its one line"
    return _bundle(
        f,
        source_tool="SGLang bench_serving",
        version=None,  # the result line does not record SGLang's version
        engine=backend,
        model=model,
        created=_created(f, None, float),  # the line has no date: the file's modification time
        finished_at=None,
        concurrency=max_conc,
        config={
            "requests": n,
            "concurrency": max_conc,
            "request_rate": rate,
            "arrival": "trace" if rate_raw == "trace" else "poisson" if rate is not None else None,
            "workload": {
                "source": dataset,
                "input_len": doc.get("random_input_len") if random_lens else None,
                "output_len": doc.get("random_output_len") if random_lens else None,
            },
            "source_line": f"{where} (SGLang appends one run a line; MoE Bench imports the last)",
            "per_request": (
                f"{n} rows from --output-details (TTFT and ITL gaps; no start times: each row starts at 0 s)"
                if detailed
                else "none (written without --output-details)"
            ),
            "source_settings": {
                k: doc[k]
                for k in (
                    "backend",
                    "dataset_name",
                    "tag",
                    "random_range_ratio",
                    "sharegpt_output_len",
                    "concurrency",
                    "accept_length",
                    "max_output_tokens_per_s",
                    "max_concurrent_requests",
                    "slo_attainment",
                )
                if isinstance(doc.get(k), str | int | float) and not isinstance(doc.get(k), bool)
            },
        },
        engine_info={"backend": backend},
        summary=summary,
        samples=samples,
    )


def sglang_jsonl_bundle(text: str, path: str | Path) -> dict[str, Any] | None:
    """The bundle of an SGLang bench_serving result file of several lines (runs appended one a line):
    the last line's run, every line checked first; None when the first line is not an SGLang result.
    Raises :class:`MoEBenchError` (one line) for a line that is not JSON or not an SGLang result."""
    path = Path(path)
    lines = [(no, line) for no, line in enumerate(text.splitlines(), 1) if line.strip()]

    def parse(no: int, line: str) -> Any:
        try:
            return json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise _File("SGLang bench_serving", path).error(f"line {no} is not JSON ({one_line(exc, 80)})") from exc

    if not lines:
        return None
    try:
        first = json.loads(lines[0][1])
    except (ValueError, RecursionError):
        return None
    if not isinstance(first, dict) or not _is_sglang(first):
        return None
    bundles = []
    for no, line in lines:
        doc = parse(no, line)
        if not isinstance(doc, dict) or not _is_sglang(doc):
            raise _File("SGLang bench_serving", path).error(f"line {no} is not an SGLang bench_serving result")
        bundles.append(_sglang(doc, path, (no, len(lines)) if len(lines) > 1 else None))
    return bundles[-1]


# --- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerFormat:
    """A tool whose result files MoE Bench reads: how to tell its files, how to read one."""

    tool: str
    detect: Callable[[Mapping[str, Any]], bool]
    convert: Callable[[dict[str, Any], Path, int], dict[str, Any]]


PEER_FORMATS: tuple[PeerFormat, ...] = (
    # SGLang's line carries vLLM's totals too (duration, completed, ...): it is told apart first
    PeerFormat("SGLang bench_serving", _is_sglang, lambda d, p, _cap: _sglang(d, p)),
    PeerFormat("vllm bench serve", _is_vllm, lambda d, p, _cap: _vllm(d, p)),
    PeerFormat("AIPerf", _is_aiperf, _aiperf),
    PeerFormat("guidellm", _is_guidellm, lambda d, p, _cap: _guidellm(d, p)),
)
PEER_TOOLS = ", ".join(p.tool for p in PEER_FORMATS[:-1]) + f" or {PEER_FORMATS[-1].tool}"  # for messages


def detect(doc: Any) -> PeerFormat | None:
    """The tool whose result file ``doc`` (a parsed JSON document) is, or None."""
    if not isinstance(doc, dict):
        return None
    return next((p for p in PEER_FORMATS if p.detect(doc)), None)


def peer_bundle(doc: Any, path: str | Path, max_bytes: int) -> dict[str, Any] | None:
    """A ``moebench-run/1`` bundle of another tool's result file (``doc``, parsed from ``path``), or
    None when ``doc`` is no known tool's. ``max_bytes`` caps a records file read beside it (AIPerf's
    ``.jsonl``). Raises :class:`MoEBenchError` (one line) for a file that breaks its tool's schema."""
    fmt = detect(doc)
    if fmt is None:
        return None
    return fmt.convert(doc, Path(path), max_bytes)

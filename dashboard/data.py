"""Data shaping for the dashboard: store rows -> pandas frames, tables with units, labels.

No Streamlit here (pages call these, and so do tests and the render benchmark). Reads
are bounded: a live view asks for the newest ``window`` requests and the per-second
series, never for every request of a run.

The Profiling page's frames and the example runs are :mod:`dashboard.profile_data`; the Compare
page's background comparison is :mod:`dashboard.compare_task`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.analysis.tuning import RUN_NAME as tuning_run_name
from bench.metrics.catalogue import DEFINITIONS, METRICS, latency_rows
from bench.metrics.run_limits import RunLimits, for_run_or_reason
from bench.metrics.slo import Slo, SloError, parse_slos
from bench.metrics.summary import RunSummary, Spread
from bench.run import gc_watch
from bench.run.artifacts import (
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_GC,
    ARTIFACT_LIMITS,
    ARTIFACT_LOAD_GENERATORS,
)
from bench.run.recorder import (
    SERIES_DONE,
    SERIES_IN_FLIGHT,
    SERIES_MEM_ALLOCATED,
    SERIES_MEM_PEAK,
    SERIES_MEM_RESERVED,
    SERIES_OUTPUT_TOK_S,
)
from bench.store import REQUEST_CSV_COLUMNS, RunRow, Store, SweepRow
from dashboard import charts
from engines.errors import ConfigError

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
    series_step_s: int = 1  # the series' bucket: 1 s, or 10 s / 100 s means on a long run


def load_live(store: Store, run_id: int, window: int = LIVE_WINDOW) -> LiveData:
    """The newest ``window`` requests of a run and its series: per second, or 10 s / 100 s means
    once a run is longer than :data:`SERIES_POINTS` seconds. Every read is bounded (an index range,
    a kept count, a rollup), so a million-request run draws as fast as a small one."""
    rows = store.sample_rows(run_id, limit=window)
    samples = pd.DataFrame(rows, columns=list(REQUEST_CSV_COLUMNS))
    step = store.series_level(run_id, SERIES_POINTS)
    ts = pd.DataFrame(store.timeseries(run_id, level=step), columns=["t_s", "name", "value"])
    total = len(samples) if len(samples) < window else store.sample_count(run_id)
    return LiveData(samples, ts, total, step)


SERIES_POINTS = 1500  # most points per series a live or detail view reads (25 minutes at 1 s)


# --- replay ------------------------------------------------------------------------------------

REPLAY_SPEEDS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class RunRecording:
    """A stored run, read once, to be played back: its requests and its per-second series."""

    run_id: int
    samples: pd.DataFrame  # REQUEST_CSV_COLUMNS, every request, by end time
    timeseries: pd.DataFrame  # t_s, name, value
    records: list[Any]  # RequestRecord, by end time (partial summaries)
    duration_s: float
    config: dict[str, Any]
    concurrency: int | None
    peak_memory_gib: float | None
    summary: RunSummary | None = None  # the run's stored summary: what the last frame shows


def load_recording(store: Store, run_id: int) -> RunRecording:
    """Everything a replay draws, read once (``ConfigError`` when the run has no requests)."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError(f"run {run_id} does not exist")
    samples = pd.DataFrame(store.sample_rows(run_id), columns=list(REQUEST_CSV_COLUMNS))
    if samples.empty:
        raise ConfigError(f"run {run_id} has no stored requests to replay")
    samples = samples.sort_values("end_s", kind="stable").reset_index(drop=True)
    ts = pd.DataFrame(store.timeseries(run_id), columns=["t_s", "name", "value"])
    records = sorted(store.records(run_id), key=lambda r: r.end_s)
    duration = run.summary.duration_s if run.summary is not None else float(samples["end_s"].max())
    duration = max(duration, float(samples["end_s"].max()), float(ts["t_s"].max()) if not ts.empty else 0.0)
    return RunRecording(
        run_id, samples, ts, records, duration, run.config, run.concurrency,
        run.summary.peak_memory_gib if run.summary is not None else None, run.summary,
    )  # fmt: skip


@dataclass(frozen=True)
class ReplayFrame:
    """What the live charts showed ``t_s`` seconds into a stored run."""

    t_s: float
    live: LiveData
    summary: RunSummary | None  # of the requests finished by t_s
    done: int
    in_flight: int
    total: int
    finished: bool


def replay_frame(rec: RunRecording, t_s: float, window: int = LIVE_WINDOW) -> ReplayFrame:
    """The run as it stood at ``t_s`` seconds: the requests finished by then (the newest
    ``window`` of them drawn), the series sampled by then, and the summary of those requests.
    Nothing is interpolated: every point drawn is one the run recorded. The last frame shows the
    run's stored summary, figure for figure (a summary of the records over the replay's clock
    would divide by the last request's end, not by the run's measured duration)."""
    from bench.metrics.summary import summarize

    t_s = max(0.0, min(t_s, rec.duration_s))
    done_n = int(rec.samples["end_s"].searchsorted(t_s, side="right"))
    finished = rec.samples.iloc[:done_n]
    in_flight = int(((rec.samples["start_s"] <= t_s) & (rec.samples["end_s"] > t_s)).sum())
    ts = rec.timeseries[rec.timeseries["t_s"] <= t_s]
    summary = None
    if t_s >= rec.duration_s and rec.summary is not None:
        summary = rec.summary
    elif done_n:
        summary = summarize(
            rec.records[:done_n],
            duration_s=t_s,
            max_concurrency=rec.concurrency,
            request_rate=rec.config.get("request_rate"),
            slos=rec.config.get("slos") or None,
        )
    live = LiveData(finished.iloc[-window:], ts, done_n)
    return ReplayFrame(t_s, live, summary, done_n, in_flight, len(rec.samples), t_s >= rec.duration_s)


def run_slos(config: Mapping[str, Any] | None, summary: RunSummary | None = None) -> list[Slo]:
    """A run's SLOs: its summary's (what it was judged on), else its stored config's; [] without.

    Stored texts were checked when the run was built; one that no longer parses is skipped
    with the rest (a chart line is not worth failing the page for).
    """
    texts = list(summary.slos or ()) if summary is not None else []
    if not texts and config:
        texts = [str(t) for t in config.get("slos") or ()]
    try:
        return parse_slos(texts)
    except SloError:
        return []


def run_limits(store: Store, run: RunRow | None, summary: RunSummary | None = None) -> RunLimits | str | None:
    """The hardware limits of a stored run (:mod:`bench.metrics.run_limits`): those the run stored when
    it finished, else computed from its config, engine info and ``summary`` (a run still going,
    or one imported from a bundle made before runs stored their limits); the one-line reason
    where there is none; None without a run."""
    if run is None:
        return None
    saved = store.artifact(run.id, ARTIFACT_LIMITS) if run.status != "running" else None
    if isinstance(saved, dict):
        return str(saved["reason"]) if "reason" in saved else RunLimits.from_dict(saved)
    # Never measure this CPU from a page: a run may be going (its figures come when it ends).
    return for_run_or_reason(run.config, run.engine_info, summary if summary is not None else run.summary,
                             run.accelerator, measure=False)  # fmt: skip


def watched_devices(store: Store, run_id: int | None) -> str | None:
    """One line naming the devices a run's telemetry reads (``dev0: NVIDIA H200 (nvml)``), or the
    sources until their first reading, and what could not be read; None when it reads none."""
    if run_id is None:
        return None
    found = store.artifact(run_id, ARTIFACT_DEVICE_TELEMETRY)
    if not isinstance(found, dict):
        return None
    names = list(found.get("devices") or []) or [str(s.get("name")) for s in found.get("sources") or []]
    missing = list(found.get("missing") or [])
    parts = []
    if names:
        parts.append(":material/developer_board: Watching " + ", ".join(names))
    if missing:
        parts.append("not read: " + "; ".join(missing))
    return " · ".join(parts) or None


def senders_line(store: Store, run_id: int) -> str | None:
    """Where a Ray run's sender actors ran and their clock offsets (None for local senders)."""
    found = store.artifact(run_id, ARTIFACT_LOAD_GENERATORS)
    if not isinstance(found, dict):
        return None
    from bench.send.ray import placement_line

    return "Sent from " + placement_line(found)


def gc_line(store: Store, run_id: int) -> str | None:
    """The run's long garbage-collector pauses in one line (None when it had none)."""
    found = store.artifact(run_id, ARTIFACT_GC)
    return gc_watch.note(found) if isinstance(found, dict) else None


def limits_line(limits: RunLimits | str | None) -> str | None:
    """The caption under a run's summary: the limit and how much of it the run reached."""
    if limits is None:
        return None
    if isinstance(limits, str):
        return f"No hardware limit for this run: {limits}."
    return f"Hardware limit: {limits.line()}."


def live_figures(
    data: LiveData,
    summary: RunSummary | None = None,
    slos: Sequence[Slo] | None = None,
    limits: RunLimits | str | None = None,
) -> dict[str, Any]:
    """The live panel's charts, by a stable name (also used as the chart key suffix).

    ``summary`` (the run's, possibly partial) supplies the p50/p99 lines so they describe
    the whole run even when the histogram shows only the newest window. ``slos`` (default:
    the summary's) are drawn on the latency charts of their metrics. ``limits`` (the run's,
    :func:`run_limits`): the hardware's shortest decode step on the TPOT histogram and its
    most output tokens/s on the throughput chart.
    """
    if slos is None:
        slos = run_slos(None, summary)

    def pct(stat_name: str) -> tuple[float | None, float | None]:
        if summary is None or summary.completed == 0:
            return None, None
        stat = getattr(summary, stat_name)
        return stat.p50, stat.p99

    tpot_limit = tok_s_limit = None
    if isinstance(limits, RunLimits):
        where = f"{limits.spec_name}, batch {limits.batch}"
        tpot_limit = (limits.tpot_limit_ms, f"hardware limit {limits.tpot_limit_ms:.3g} ms ({where})")
        tok_s_limit = (limits.output_tok_s_limit, f"hardware limit {limits.output_tok_s_limit:,.0f} tok/s ({where})")
    ttft50, ttft99 = pct("ttft_ms")
    tpot50, tpot99 = pct("tpot_ms")
    note = "" if data.total_samples <= len(data.samples) else f" (newest {len(data.samples):,} requests)"
    figs = {
        "latency": charts.latency_over_time(data.samples, title=f"Per-request latency over time{note}", slos=slos),
        "ttft": charts.distribution(
            data.samples,
            "ttft_ms",
            f"TTFT distribution{note}",
            p50=ttft50,
            p99=ttft99,
            color=charts.COLORS[1],
            slos=slos,
        ),
        "tpot": charts.distribution(
            data.samples,
            "tpot_ms",
            f"TPOT distribution{note}",
            p50=tpot50,
            p99=tpot99,
            color=charts.COLORS[2],
            slos=slos,
            limit=tpot_limit,
        ),
        "throughput": charts.throughput_over_time(data.timeseries, SERIES_OUTPUT_TOK_S, tok_s_limit),
        "in_flight": charts.in_flight_over_time(data.timeseries, SERIES_IN_FLIGHT),
        "memory": charts.memory_over_time(data.timeseries, MEMORY_SERIES, reported=_memory_reported(data.timeseries)),
    }
    for group in telemetry_groups(telemetry_series(data.timeseries)):
        figs[f"telemetry:{group.key}"] = charts.line_chart(
            data.timeseries, group.series, group.title, group.unit, integer=group.integer
        )
    if data.series_step_s > 1:  # a long run's series come as bucket means: say so on each chart
        for key, fig in figs.items():
            if key in ("throughput", "in_flight", "memory") or key.startswith("telemetry:"):
                title = fig.layout.title.text or ""
                fig.update_layout(title_text=f"{title} ({data.series_step_s} s means)")
    return figs


@dataclass(frozen=True)
class TelemetryGroup:
    """Telemetry series that share a unit: one small chart each, so %, tokens/s and counts
    never share an axis."""

    key: str
    title: str
    unit: str
    series: tuple[tuple[str, str], ...]  # (series name, legend label)
    integer: bool = False  # counts: whole-number ticks


# Series-name suffix -> (chart key, title, axis unit, counts?), checked in this order.
TELEMETRY_UNITS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("_acceptance_pct", "spec", "Speculative decoding: draft tokens accepted (per second)", "%", False),
    ("_pct", "pct", "Utilisation and load", "%", False),
    ("_balancedness", "eplb", "Expert-parallel balance (EPLB: mean / max tokens per rank, 1 = even)", "ratio", False),
    ("_cores", "cores", "CPU cores busy", "cores", False),
    ("_tok_s", "tok_s", "Server token rates", "tokens/s", False),
    ("_rps", "rps", "Server request rates", "requests/s", False),
    ("_gib", "gib", "Server and device memory", "GiB", False),
    ("_w", "w", "Power", "W", False),
    ("_c", "c", "Temperature", "°C", False),
    ("_mhz", "mhz", "Clock", "MHz", False),
    ("_cache_queries", "cache", "Prefix cache (cumulative prompt tokens)", "tokens", True),
    ("_cache_hits", "cache", "Prefix cache (cumulative prompt tokens)", "tokens", True),
)
COUNT_GROUP = ("count", "Server queues and events", "count", True)


def _series_label(name: str, suffix: str) -> str:
    core = name[: -len(suffix)] if suffix and name.endswith(suffix) else name
    return core.removeprefix("server_").replace("_", " ") or name


def telemetry_groups(names: Sequence[str]) -> list[TelemetryGroup]:
    """``names`` grouped into one chart per unit (by the unit suffix every series name carries;
    a name with none is a count: requests running or waiting, preemptions)."""
    groups: dict[str, tuple[str, str, bool, list[tuple[str, str]]]] = {}
    for name in names:
        match = next((u for u in TELEMETRY_UNITS if name.endswith(u[0])), None)
        suffix, key, title, unit, integer = match if match is not None else ("", *COUNT_GROUP)
        label = _series_label(name, suffix if key != "cache" else "")
        groups.setdefault(key, (title, unit, integer, []))[3].append((name, label))
    return [
        TelemetryGroup(key, title, unit, tuple(series), integer)
        for key, (title, unit, integer, series) in groups.items()
    ]


def _memory_reported(ts: pd.DataFrame) -> bool:
    """False once the run has sampled (the in-flight series exists) without any memory series."""
    if ts.empty:
        return True
    names = set(ts["name"].unique())
    return SERIES_IN_FLIGHT not in names or any(name in names for name, _ in MEMORY_SERIES)


def _cumulative(name: str) -> bool:
    """A running total kept for the run's figures, not for a chart: the speculative-decoding
    counters (their per-second acceptance is charted) and the devices' energy counters."""
    return (name.startswith("server_spec_") and not name.endswith("_pct")) or name.endswith("_energy_j")


def telemetry_series(ts: pd.DataFrame) -> list[str]:
    """Series the engine reported besides the runner's own (e.g. a vLLM server's KV-cache use)."""
    if ts.empty:
        return []
    return sorted(n for n in set(ts["name"].unique()) - set(LIVE_SERIES) - {SERIES_DONE} if not _cumulative(n))


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
    "workload",
    "setup",
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
    "goodput_rps",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "e2e_ms_mean",
    "peak_memory_gib",
    "moe_imbalance_max",
    "ep_rank_imbalance",
    "eplb_balancedness_whatif",
    "error",
    "disturbance",
    "note",
    "sweep_id",
    "sweep",
)
# The summary metrics of a run's row (numbers; empty where the run has no summary).
RUN_METRIC_COLUMNS: tuple[str, ...] = RUN_COLUMNS[RUN_COLUMNS.index("duration_s") : RUN_COLUMNS.index("error")]
SWEEP_FILTER_ALL = "all"
SWEEP_FILTER_NONE = "none"


def workload_text(mode: str, concurrency: int | None, config: Mapping[str, Any]) -> str:
    """``concurrency c=16 · 128→64 tok`` / ``rate 4 req/s · sharegpt``: the load and the lengths."""
    load = mode
    rate = config.get("request_rate")
    if rate:
        load = f"{mode} {float(rate):g} req/s"
    elif mode in ("concurrency", "sweep") and concurrency:
        load = f"{mode} c={concurrency}"
    workload = config.get("workload") if isinstance(config.get("workload"), Mapping) else {}
    if config.get("source_tool") and not workload.get("input_len"):  # another tool's result file (bench.peers)
        return f"{load} · {workload.get('source') or 'prompts'} (as {str(config['source_tool']).split()[0]} sent them)"
    source = str(workload.get("source") or "random")
    in_len, out_len = workload.get("input_len"), workload.get("output_len")
    varied = workload.get("input_dist", "fixed") != "fixed" or workload.get("output_dist", "fixed") != "fixed"
    approx = "~" if varied else ""
    if source in ("random", "shared_prefix", "multi_turn") and in_len and out_len:
        lengths = f"{approx}{in_len}→{approx}{out_len} tok"
    elif out_len and source == "builtin":
        lengths = f"builtin→{out_len} tok"
    else:
        lengths = source  # file prompts carry their own lengths
    return f"{load} · {lengths}"


def spread_frame(rows: Sequence[Spread]) -> pd.DataFrame:
    """The spread of repeated runs as a table: one row per headline figure."""
    return pd.DataFrame(
        [
            {"figure": r.label, "runs": r.n, "min": r.min, "median": r.median, "max": r.max,
             "CV %": None if r.cv is None else round(100.0 * r.cv, 1), "mean": r.mean, "± 95% CI": r.ci95}
            for r in rows
        ],
        columns=["figure", "runs", "min", "median", "max", "CV %", "mean", "± 95% CI"],
    )  # fmt: skip


# Another tool's name for one of MoE Bench's engine kinds (guidellm calls an OpenAI-compatible server
# ``openai_http``; MoE Bench, AIPerf and vllm bench serve call it ``openai``): one engine, one label.
ENGINE_ALIASES: dict[str, str] = {"openai_http": "openai"}


def engine_name(engine: str) -> str:
    """The label the dashboard shows for a stored run's engine (:data:`ENGINE_ALIASES`)."""
    return ENGINE_ALIASES.get(engine, engine)


def run_label(run: RunRow) -> str:
    """A short, unique label with the engine, the load and the lengths:
    ``#12 vllm · concurrency c=16 · 128→64 tok`` (the device too when it is not the CPU)."""
    where = "" if run.accelerator == "cpu" else f" · {run.engine_info.get('device') or run.accelerator}"
    tool = run.config.get("source_tool")
    engine = engine_name(run.engine)
    engine = f"{str(tool).split()[0]}→{engine}" if tool else engine  # another tool's result (bench.peers)
    return f"#{run.id} {engine} · {workload_text(run.mode, run.concurrency, run.config)}{where}"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>:~$])")


def plain(text: Any) -> str:
    """A name or other free text for a Markdown element, shown as the text it is: every Markdown
    mark escaped (no link, image, heading, colour or icon directive), line breaks as spaces."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def sweep_label(sweep: SweepRow) -> str:
    """``sweep #3 · c-sweep`` / ``capacity #4``: a sweep or capacity search in one short label."""
    what = "capacity" if sweep.kind == "capacity" else "sweep"
    return f"{what} #{sweep.id}" + (f" · {sweep.name}" if sweep.name else "")


def native_tuning(run: RunRow) -> list[str] | None:
    """The native engine's tuning options a run used, in words (``[]``: none, the eager baseline);
    None for another engine."""
    if run.engine != "native":
        return None
    e = run.config.get("engine") if isinstance(run.config.get("engine"), Mapping) else {}
    words = []
    if e.get("cuda_graphs"):
        words.append("CUDA graphs")
    elif e.get("cache") == "static":
        words.append("static cache")
    if e.get("compile") not in (None, "", "off"):
        words.append("torch.compile")
    if e.get("mla") == "absorbed":
        words.append("absorbed MLA")
    if e.get("experts_impl") == "lean_grouped_mm":
        words.append("lean experts")
    elif e.get("experts_impl"):
        words.append(f"experts {e['experts_impl']}")
    if e.get("router") == "lean":
        words.append("lean gate")
    if int(e.get("batch_size") or 1) > 1:
        words.append(f"batches of up to {int(e['batch_size'])}")
    return words


def is_tuning_run(run: RunRow) -> bool:
    """A row of a tuning ablation (``tuning-<config>-b<batch>``): one configuration of a study, no
    run to show by default beside the book or another engine."""
    return bool(tuning_run_name.match(run.name or ""))


def newest_shown_first(runs: Sequence[RunRow]) -> RunRow | None:
    """The run a picker starts on: the newest that is no tuning-ablation row, else the newest."""
    plain_runs = [r for r in runs if not is_tuning_run(r)]
    pool = plain_runs or list(runs)
    return max(pool, key=lambda r: (r.created_at, r.id)) if pool else None


def expert_parallel(run: RunRow) -> int:
    """The processes a native run's routed experts were spread over (1: one process)."""
    e = run.config.get("engine") if isinstance(run.config.get("engine"), Mapping) else {}
    try:
        return max(1, int(e.get("expert_parallel") or 1)) if run.engine == "native" else 1
    except (TypeError, ValueError):
        return 1


def tuning_tag(run: RunRow) -> str:
    """``tuned`` / ``eager baseline`` for a native run (with ``EP N`` where its experts were spread
    over N processes), '' for another engine (labels and tables)."""
    words = native_tuning(run)
    if words is None:
        return ""
    ep = expert_parallel(run)
    if ep > 1:
        return f"tuned · EP {ep}" if words else f"EP {ep}"
    return "tuned" if words else "eager baseline"


def run_conditions(run: RunRow) -> str:
    """What a run is, on its face: model (random weights or not), dtype, card, engine and its tuning."""
    from engines.models import random_weights

    e = run.config.get("engine") if isinstance(run.config.get("engine"), Mapping) else {}
    dtype = run.engine_info.get("dtype") or e.get("dtype") or "auto dtype"
    weights = "random weights: speed, not answers" if random_weights(run.model) else "trained weights"
    device = run.engine_info.get("device") or run.accelerator
    words = native_tuning(run)
    ep = expert_parallel(run)
    if words is None:
        how = f"{engine_name(run.engine)} engine"
    elif words:
        captured = any(w in ("CUDA graphs", "torch.compile") for w in words)
        how = "native engine, tuned: " + ", ".join(words) + (" (shapes compiled and captured before the clock)"
                                                              if captured else "")  # fmt: skip
    elif ep > 1:
        how = "native engine, no tuning options"
    else:
        how = "native engine, no tuning options: the eager baseline (transformers' generate per request, no batching)"
    if words is not None and ep > 1:
        how += f"; routed experts over {ep} processes (expert parallel, all-to-all)"
    return f"{run.model} ({weights}), {dtype}, {device}; {how}."


def unlike_runs_note(chosen: pd.DataFrame) -> str | None:
    """One line when runs compared side by side differ in what they ran (workload, model or card),
    so their bars compare those too; None when they match (engines may differ: that is the point)."""
    if len(chosen) < 2:
        return None
    differ = []
    for col, what in (("workload", "workloads"), ("model", "models"), ("device", "cards")):
        if col in chosen and chosen[col].nunique(dropna=False) > 1:
            values = list(dict.fromkeys(str(v) or "?" for v in chosen[col]))
            differ.append(f"{what} ({'; '.join(values[:4])}{'; …' if len(values) > 4 else ''})")
    if not differ:
        return None
    return (
        "These runs differ in " + " and ".join(differ) + ": a bar against a bar compares those too, not "
        "only the engines."
    )


def run_note(error: str | None, disturbance: str | None) -> str:
    """The compact table's one note on a run: why it failed, else what disturbed it, else ''. The
    kind comes first (``failed: ...`` / ``disturbed: ...``), so a cell cut at its width still says it."""
    if error:
        return f"failed: {error}"
    return f"disturbed: {disturbance}" if disturbance else ""


def runs_frame(runs: Sequence[RunRow], sweeps: Mapping[int, str] | None = None) -> pd.DataFrame:
    """One row per run with its key metrics (empty cells where a run has no summary); ``sweep_id``
    and ``sweep`` (the label from ``sweeps``, id -> label) for the runs a sweep made."""
    sweeps = sweeps or {}
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
                "workload": workload_text(run.mode, run.concurrency, run.config),
                "setup": " · ".join(
                    x
                    for x in (
                        # another tool's result: its name first (bench.peers), then the engine it drove
                        f"{run.config['source_tool']}: {engine_name(run.engine)}"
                        if run.config.get("source_tool")
                        else run.engine,
                        run.model,
                        str(run.engine_info.get("device") or run.accelerator),
                        tuning_tag(run),
                    )
                    if x
                ),
                "engine": engine_name(run.engine),
                "model": run.model,
                "accelerator": run.accelerator,
                "device": str(run.engine_info.get("device", "")),
                "concurrency": run.concurrency,
                "requests": flat.get("requests", cfg_requests),
                "completed": flat.get("completed"),
                "failed": flat.get("failed"),
                **{c: flat.get(c) for c in RUN_METRIC_COLUMNS},
                "error": run.error or "",
                "disturbance": flat.get("disturbance") or "",
                "note": run_note(run.error, flat.get("disturbance")),
                "sweep_id": run.sweep_id,
                "sweep": (sweeps.get(run.sweep_id) or f"sweep #{run.sweep_id}") if run.sweep_id is not None else "",
            }
        )
    df = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    for col in RUN_METRIC_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["sweep_id"] = pd.array(df["sweep_id"].tolist(), dtype="Int64")
    return df


def filter_runs(
    df: pd.DataFrame,
    statuses: Sequence[str] = (),
    engines: Sequence[str] = (),
    accelerators: Sequence[str] = (),
    modes: Sequence[str] = (),
    text: str = "",
    sweep: int | str = SWEEP_FILTER_ALL,
) -> pd.DataFrame:
    """Rows matching every non-empty filter; ``text`` searches name, model, label and device;
    ``sweep``: ``"all"``, ``"none"`` (runs no sweep made) or a sweep id."""
    mask = pd.Series(True, index=df.index)
    if sweep == SWEEP_FILTER_NONE:
        mask &= df["sweep_id"].isna()
    elif sweep != SWEEP_FILTER_ALL:
        mask &= (df["sweep_id"] == int(sweep)).fillna(False).astype(bool)
    for col, allowed in (("status", statuses), ("engine", engines), ("accelerator", accelerators), ("mode", modes)):
        if allowed:
            mask &= df[col].isin(list(allowed))
    if text.strip():
        needle = text.strip().lower()
        hay = (df["name"].astype(str) + " " + df["label"] + " " + df["device"].astype(str)).str.lower()
        mask &= hay.str.contains(needle, regex=False)
    return df[mask]


SORTS: dict[str, tuple[str, bool]] = {
    "newest first": ("created", False),  # when the run ran (an imported run keeps its own time), then its id
    "oldest first": ("created", True),
    "output throughput (high → low)": ("output_throughput_tok_s", False),
    "E2E p99 latency (low → high)": ("e2e_ms_p99", True),
    "TTFT p50 (low → high)": ("ttft_ms_p50", True),
    "peak memory (low → high)": ("peak_memory_gib", True),
}


def sort_runs(df: pd.DataFrame, how: str) -> pd.DataFrame:
    col, ascending = SORTS.get(how, SORTS["newest first"])
    by = [col, "run_id"] if col == "created" else [col]
    return df.sort_values(by, ascending=ascending, na_position="last", kind="stable")


@dataclass(frozen=True)
class TableColumn:
    """One column of the Results table: its header, its width in pixels (the header fits in it,
    a test measures it in the dashboard's font), its kind and number format, its tooltip."""

    label: str
    width: int
    kind: str = "number"  # number | text | datetime
    format: str | None = None
    help: str | None = None


_LATENCY_HELP = "{m} of the run's requests, in milliseconds"
# Every column the Results table can show. Units stay in each header (or, for the latencies, in each
# cell: "159.7 ms"), so the compact table fits a 1,600 px screen with its sidebar open.
RESULTS_COLUMNS: dict[str, TableColumn] = {
    "run_id": TableColumn("run", 44, format="%d"),
    "created": TableColumn("created", 86, "datetime", "MM-DD HH:mm"),
    "status": TableColumn("status", 82, "text"),
    "setup": TableColumn("engine · model · device", 166, "text"),
    "workload": TableColumn("workload", 130, "text", help="mode, concurrency or rate, prompt → output tokens"),
    "mode": TableColumn("mode", 96, "text"),
    "sweep": TableColumn("sweep", 120, "text", help="The sweep or capacity search that made the run"),
    "engine": TableColumn("engine", 72, "text"),
    "model": TableColumn("model", 130, "text"),
    "accelerator": TableColumn("accelerator", 92, "text"),
    "concurrency": TableColumn("concurrency", 96, format="%d"),
    "requests": TableColumn("requests", 76, format="%d"),
    "output_throughput_tok_s": TableColumn("output tok/s", 90, format="%.1f", help="output tokens / duration"),
    "request_throughput_rps": TableColumn("requests/s", 84, format="%.2f"),
    "goodput_rps": TableColumn(
        "goodput", 84, format="%.2f req/s", help="requests that met every SLO / duration (– : the run had no SLO)"
    ),
    "ttft_ms_p50": TableColumn("TTFT p50", 76, format="%.1f ms", help=_LATENCY_HELP.format(m="TTFT p50")),
    "ttft_ms_p99": TableColumn("TTFT p99", 80, format="%.1f ms", help=_LATENCY_HELP.format(m="TTFT p99")),
    "tpot_ms_p50": TableColumn("TPOT p50", 80, format="%.2f ms", help=_LATENCY_HELP.format(m="TPOT p50")),
    "e2e_ms_p50": TableColumn("E2E p50", 84, format="%.1f ms", help=_LATENCY_HELP.format(m="E2E p50")),
    "e2e_ms_p99": TableColumn("E2E p99", 80, format="%.1f ms", help=_LATENCY_HELP.format(m="E2E p99")),
    "e2e_ms_mean": TableColumn("E2E mean", 84, format="%.1f ms", help=_LATENCY_HELP.format(m="E2E mean")),
    "peak_memory_gib": TableColumn("peak GiB", 76, format="%.3f"),
    "duration_s": TableColumn("duration (s)", 88, format="%.2f"),
    "completed": TableColumn("completed", 84, format="%d"),
    "failed": TableColumn("failed", 60, format="%d"),
    "device": TableColumn("device", 130, "text"),
    "name": TableColumn("name", 130, "text"),
    "note": TableColumn(
        "note", 100, "text", help="Why the run failed, or what else loaded the host during it (hover for all of it)"
    ),
    "disturbance": TableColumn(
        "disturbed", 110, "text", help="What else loaded the host during the run (hover a cell for all of it)"
    ),
    "error": TableColumn("error", 110, "text", help="Why the run failed (all of it in Run details)"),
}
# The compact table (engine, model and device in one column; failure or disturbance in one note).
RESULTS_COMPACT: tuple[str, ...] = (
    "run_id", "created", "status", "setup", "workload", "output_throughput_tok_s", "goodput_rps",
    "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "e2e_ms_p99", "note",
)  # fmt: skip
RESULTS_FULL: tuple[str, ...] = (
    "run_id", "created", "status", "mode", "workload", "sweep", "engine", "model", "accelerator",
    "concurrency", "requests", "output_throughput_tok_s", "request_throughput_rps", "goodput_rps", "ttft_ms_p50",
    "ttft_ms_p99", "tpot_ms_p50", "e2e_ms_p50", "e2e_ms_p99", "e2e_ms_mean", "peak_memory_gib", "duration_s",
    "completed", "failed", "device", "name", "disturbance", "error",
)  # fmt: skip
MISSING = "–"  # what a table cell shows for a figure a run does not have


def results_columns(view: pd.DataFrame, full: bool) -> list[str]:
    """The Results table's columns for the runs in ``view``: a column no listed run has a value in
    (sweep, goodput, note, disturbance, error) is left out."""
    order = list(RESULTS_FULL if full else RESULTS_COMPACT)
    for col in ("sweep", "note", "disturbance", "error"):
        if col in order and view[col].eq("").all():
            order.remove(col)
    if view["goodput_rps"].isna().all():
        order.remove("goodput_rps")  # no listed run has SLOs: no goodput to show
    return order


# --- summary tables ---------------------------------------------------------------------------


def latency_table(summary: RunSummary) -> pd.DataFrame:
    """The catalogue's latency rows (TTFT, TPOT, ITL, ITL per token where chunks held several tokens,
    E2E, reasoning time and send lag where measured); columns count, mean, p50, p90, p95, p99 (ms)."""
    rows = []
    for m in latency_rows(summary):
        st = getattr(summary, m.name)
        rows.append(
            {
                "metric": m.label,
                "count": st.count,
                "mean (ms)": st.mean,
                "p50 (ms)": st.p50,
                "p90 (ms)": st.p90,
                "p95 (ms)": st.p95,
                "p99 (ms)": st.p99,
                "definition": m.definition,
            }
        )
    return pd.DataFrame(rows)


def _figure(summary: RunSummary, name: str) -> tuple[str, Any, str, str]:
    """A throughput-table row of one catalogue figure: its label, value, unit and definition."""
    m = METRICS[name]
    return m.label, getattr(summary, name), m.unit, m.definition


def throughput_table(summary: RunSummary) -> pd.DataFrame:
    """Run totals and throughputs, one row per figure with its unit."""
    rows = [
        *(_figure(summary, n) for n in ("requests", "completed", "failed")),
        *([_figure(summary, "cancelled")] if summary.cancelled else []),
        _figure(summary, "duration_s"),
        *([_figure(summary, "request_rate")] if summary.request_rate is not None else []),
        *(
            _figure(summary, n)
            for n in (
                "prompt_tokens",
                "output_tokens",
                "request_throughput_rps",
                "output_throughput_tok_s",
                "total_throughput_tok_s",
                "peak_memory_gib",
            )
        ),
        *(
            [
                _figure(summary, "goodput_rps"),
                _figure(summary, "good_requests"),
                ("SLOs " + " ".join(summary.slos), "met" if summary.slo_met else "NOT met", "", ""),
            ]
            if summary.slos
            else []
        ),
        *(
            [("prefix cache hits", summary.prefix_cache_hit_rate * 100, "% of prompt tokens", "")]
            if summary.prefix_cache_hit_rate is not None
            else []
        ),
        *serving_rows(summary),
    ]
    return pd.DataFrame(
        [
            {
                "figure": name,
                "value": "not measured" if value is None else value if isinstance(value, str) else fmt_num(value),
                "unit": unit,
                "definition": d,
            }
            for name, value, unit, d in rows
        ]
    )


def serving_rows(summary: RunSummary) -> list[tuple[str, Any, str, str]]:
    """Throughput-table rows for speculative decoding, reasoning and energy, where the run has them."""
    d = DEFINITIONS
    rows: list[tuple[str, Any, str, str]] = []
    if summary.spec_acceptance_rate is not None:
        per = " ".join(f"{v:.0%}" for v in summary.spec_accepted_per_pos or ())
        rows += [
            ("draft acceptance", summary.spec_acceptance_rate * 100, "% of draft tokens", d["spec_acceptance_rate"]),
            ("acceptance length", summary.spec_acceptance_length, "tokens/step", d["spec_acceptance_length"]),
            *([("acceptance by position", per, "", d["spec_accepted_per_pos"])] if per else []),
        ]
    if summary.reasoning_tokens is not None:
        rows += [
            ("reasoning tokens", summary.reasoning_tokens, "tokens", d["reasoning_tokens"]),
            ("answer tokens", summary.answer_tokens, "tokens", d["answer_tokens"]),
            ("answer throughput", summary.answer_throughput_tok_s, "tokens/s", d["answer_throughput_tok_s"]),
        ]
    if summary.energy_j is not None:
        rows += [
            ("energy", summary.energy_j, "J", d["energy_j"]),
            ("energy per output token", summary.joules_per_output_token, "J/token", d["joules_per_output_token"]),
            ("output tokens per joule", summary.output_tokens_per_j, "tokens/J", d["output_tokens_per_j"]),
            ("mean power", summary.power_avg_w, "W", d["power_avg_w"]),
            ("peak power", summary.power_peak_w, "W", d["power_peak_w"]),
            *([("goodput per watt", summary.goodput_per_w, "req/J", d["goodput_per_w"])]
              if summary.goodput_per_w is not None else []),
        ]  # fmt: skip
    return rows


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


# --- sweeps ------------------------------------------------------------------------------------


def sweep_frame(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """:func:`bench.report.sweep_table` rows as a frame whose headers carry units
    (``columns``: :func:`bench.report.table_columns`), narrow enough for the page: the min/max
    of the output throughput become one ``output range (tok/s)`` text column (left out when no
    point has more than one repeat), ``repeats`` is left out when every point has the same
    number, goodput and the SLO verdict when no point has them. ``runs`` is the run ids as text;
    ``SLOs met`` is yes / no / empty."""
    keep = [c for c in columns if c[0] not in ("output_throughput_tok_s_min", "output_throughput_tok_s_max")]
    spread = any((r.get("repeats") or 0) > 1 for r in rows)
    if spread:
        at = next(i for i, c in enumerate(keep) if c[0] == "output_throughput_tok_s") + 1
        keep.insert(at, ("output_range", "output range (tok/s)"))
    if len({r.get("repeats") for r in rows}) <= 1:
        keep = [c for c in keep if c[0] != "repeats"]
    for key in ("goodput_rps", "slo_met"):
        if all(r.get(key) is None for r in rows):
            keep = [c for c in keep if c[0] != key]
    if not any(r.get("disturbed") for r in rows):
        keep = [c for c in keep if c[0] != "disturbed"]  # nothing disturbed: no empty column
    out = []
    for r in rows:
        row = {}
        for key, header in keep:
            v = r.get(key)
            if key == "run_ids":
                v = ", ".join(f"#{i}" for i in v or [])
            elif key == "slo_met":
                v = "" if v is None else ("yes" if v else "no")
            elif key == "output_range":
                lo, hi = r.get("output_throughput_tok_s_min"), r.get("output_throughput_tok_s_max")
                v = f"{lo:.1f} – {hi:.1f}" if lo is not None and hi is not None else ""
            row[header] = v
        out.append(row)
    return pd.DataFrame(out, columns=[h for _, h in keep])


def probes_frame(result: Mapping[str, Any], runs: Sequence[RunRow]) -> pd.DataFrame:
    """A capacity search's probes in the order made: the value, the verdict and what its run measured."""
    by_id = {r.id: r for r in runs}
    axis = result.get("axis") or "rate"
    value_header = {"rate": "request rate (req/s)", "speedup": "trace speed-up (x)"}.get(axis, "concurrency")
    rows = []
    for i, probe in enumerate(result.get("probes") or [], start=1):
        run = by_id.get(int(probe.get("run_id") or 0))
        flat = run.summary.flat() if run is not None and run.summary is not None else {}
        rows.append(
            {
                "probe": i,
                value_header: probe.get("value"),
                "passed": "yes" if probe.get("passed") else "no",
                "verdict": probe.get("why") or "",
                "run": f"#{probe.get('run_id')}" if probe.get("run_id") is not None else "",
                "output (tok/s)": flat.get("output_throughput_tok_s"),
                "goodput (req/s)": flat.get("goodput_rps"),
                "TTFT p99 (ms)": flat.get("ttft_ms_p99"),
                "TPOT p99 (ms)": flat.get("tpot_ms_p99"),
                "failed requests": flat.get("failed"),
            }
        )
    frame = pd.DataFrame(rows)
    for col in ("output (tok/s)", "goodput (req/s)", "TTFT p99 (ms)", "TPOT p99 (ms)", "failed requests"):
        if col in frame:  # numbers stay numbers; a figure not measured is an empty cell, never "None"
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame

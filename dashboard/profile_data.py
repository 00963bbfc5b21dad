"""Data shaping for the Profiling page: profile artifacts -> frames (operator table, bottleneck
breakdown, expert routing, memory timeline, EPLB balance), and importing the example runs
(examples/*.json) that the Profiling, Replay and Results pages offer. No Streamlit here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.bundle import bundle_name, import_bundle_file, import_sweep, read_bundle
from bench.metrics import moe
from bench.report.csv_export import OPERATOR_CSV_COLUMNS
from bench.run.artifacts import (
    ARTIFACT_BREAKDOWN,
    ARTIFACT_OPERATORS,
    ARTIFACT_ROUTING,
)
from bench.store import ARTIFACT_TRACE, RunRow, Store
from dashboard import data
from dashboard.data import MEMORY_SERIES
from engines.profiling import CATEGORIES, CATEGORY_RULES

# --- profiling ---------------------------------------------------------------------------------

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"

# Sort keys of the operator table: label -> column (largest first).
OPERATOR_SORTS: dict[str, str] = {
    "self device time": "self_device_ms",
    "self CPU time": "self_cpu_ms",
    "CPU total (incl. children)": "cpu_total_ms",
    "calls": "calls",
    "self device memory": "device_memory_mib",
    "self CPU memory": "cpu_memory_mib",
}
OPERATOR_NUMERIC: tuple[str, ...] = tuple(c for c in OPERATOR_CSV_COLUMNS if c not in ("operator", "input_shapes"))
OPERATOR_MEMORY: tuple[str, ...] = ("cpu_memory_mib", "device_memory_mib")


def profile_runs(store: Store, limit: int = 500) -> list[RunRow]:
    """Finished profile runs, newest first by when they ran (imported examples among them by their
    own dates; the one running has no table yet)."""
    return newest_first([r for r in store.list_runs(limit=limit) if r.mode == "profile" and r.status != "running"])


def newest_first(runs: Sequence[RunRow]) -> list[RunRow]:
    """By when each run was made (an imported run keeps its date), then by id."""
    return sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)


EPLB_SERIES = "server_eplb_balancedness"  # a served EPLB deployment's balance (engines.vllm)


def routing_runs(store: Store, limit: int = 500) -> list[RunRow]:
    """Finished runs with an expert view, newest first: routing counts (native runs of any mode,
    runs against an SGLang server's recorder) or a served deployment's EPLB balancedness."""
    out = []
    for r in store.list_runs(limit=limit):
        if r.status == "running":
            continue
        if ARTIFACT_ROUTING in store.artifact_names(r.id) or (
            r.engine != "native" and EPLB_SERIES in store.series_names(r.id)
        ):
            out.append(r)
    return newest_first(out)


EPLB_REARRANGEMENTS = "server_eplb_rearrangements"  # count of the server's expert moves so far (engines.vllm)


def eplb_balancedness(store: Store, run_id: int) -> pd.DataFrame:
    """A run's EPLB balancedness over time (t_s, value); empty when it has none."""
    rows = store.timeseries(run_id, [EPLB_SERIES])
    return pd.DataFrame([(t, v) for t, _, v in rows if v is not None], columns=["t_s", "value"])


def latency_by_window(store: Store, run_id: int, step_s: float = 5.0) -> pd.DataFrame:
    """The run's mean TPOT per ``step_s`` window of request end times (t_s, value, n), for
    drawing latency beside a served deployment's EPLB balancedness on one timeline."""
    rows = store.windowed_means(run_id, "tpot_ms", step_s)
    return pd.DataFrame([(t + step_s / 2, v, n) for t, v, n in rows], columns=["t_s", "value", "n"])


def eplb_rearrangements(store: Store, run_id: int) -> list[float]:
    """When (s since the start) the server's EPLB moved experts during the run: the samples at
    which its count of rearrangements grew."""
    seen, out = 0.0, []
    for t, _, v in store.timeseries(run_id, [EPLB_REARRANGEMENTS]):
        if v is not None and v > seen:
            out.append(float(t))
            seen = v
    return out


SWEEP_SUFFIX = ".sweep.json"


def example_files(folder: Path = EXAMPLES_DIR) -> list[Path]:
    """The run bundles in ``examples/`` (not their ``*.trace.json[.gz]`` neighbours, not the sweep
    bundles ``*.sweep.json``)."""
    if not folder.is_dir():
        return []
    return sorted(
        p for p in folder.glob("*.json") if not p.name.endswith(".trace.json") and not p.name.endswith(SWEEP_SUFFIX)
    )


def example_sweep_files(folder: Path = EXAMPLES_DIR) -> list[Path]:
    """The sweep bundles in ``examples/`` (``NAME.sweep.json``: a sweep with its runs)."""
    return sorted(folder.glob("*" + SWEEP_SUFFIX)) if folder.is_dir() else []


def example_names(folder: Path = EXAMPLES_DIR) -> set[str]:
    """Run names of the example run bundles (their file names without ``.json``)."""
    return {p.stem for p in example_files(folder)}


def example_sweep_names(folder: Path = EXAMPLES_DIR) -> set[str]:
    """Sweep names of the example sweep bundles (their file names without ``.sweep.json``)."""
    return {p.name.removesuffix(SWEEP_SUFFIX) for p in example_sweep_files(folder)}


def examples_missing(store: Store, folder: Path = EXAMPLES_DIR) -> bool:
    """Whether an example run or sweep is not in the store yet (by name)."""
    runs = {r.name for r in store.list_runs()}
    sweeps = {s.name for s in store.list_sweeps()}
    return not (example_names(folder) <= runs and example_sweep_names(folder) <= sweeps)


def import_examples(store: Store, folder: Path = EXAMPLES_DIR) -> tuple[list[str], list[str]]:
    """Import every example run and sweep whose name is not in the store yet; (imported, skipped)
    names (a sweep's name stands for it and its runs).

    Raises :class:`MoEBenchError` naming the file when a bundle cannot be read.
    """
    existing = {r.name for r in store.list_runs()}
    existing_sweeps = {s.name for s in store.list_sweeps()}
    imported: list[str] = []
    skipped: list[str] = []
    for path in example_files(folder):
        bundle = read_bundle(path)
        name = bundle_name(bundle) or path.stem
        if name in existing:
            skipped.append(name)
            continue
        import_bundle_file(store, path, bundle)
        existing.add(name)
        imported.append(name)
    for path in example_sweep_files(folder):
        bundle = read_bundle(path)
        name = bundle_name(bundle) or path.name.removesuffix(SWEEP_SUFFIX)
        if name in existing_sweeps:
            skipped.append(name)
            continue
        import_sweep(store, bundle)
        existing_sweeps.add(name)
        imported.append(name)
    return imported, skipped


def profile_run_label(run: RunRow, examples: set[str] | frozenset[str] = frozenset()) -> str:
    """``#7 h200-profile · native·model·cuda · NVIDIA H200 · example`` (device and name when known)."""
    parts = [
        f"#{run.id}" + (f" {run.name}" if run.name else ""),
        f"{data.engine_name(run.engine)}·{run.model}·{run.accelerator}",
    ]
    device = run.engine_info.get("device")
    if device:
        parts.append(str(device))
    if run.mode != "profile":
        parts.append(run.mode)
    if run.status != "completed":
        parts.append(run.status)
    tag = data.tuning_tag(run)
    if tag:
        parts.append(tag)
    if run.name in examples:
        parts.append("imported example")
    return " · ".join(parts)


def showcase_run(runs: Sequence[RunRow], examples: set[str] | frozenset[str]) -> int | None:
    """The run a demo opens on: an imported example, tuned before eager, concurrency before
    latency, the fastest (output tokens/s) first; None when no example is stored. Profiles are
    not replayed."""
    shown = [r for r in runs if r.name in examples and r.mode != "profile"]
    if not shown:
        return None

    def speed(r: RunRow) -> float:
        return r.summary.output_throughput_tok_s if r.summary is not None else 0.0

    best = max(shown, key=lambda r: (data.tuning_tag(r) == "tuned", r.mode == "concurrency", speed(r), r.created_at))
    return best.id


def short_run_label(run: RunRow) -> str:
    """``#7 h200-profile · NVIDIA H200``: id, name (or model) and device, for chart axes."""
    device = run.engine_info.get("device") or run.accelerator
    return f"#{run.id} {run.name or run.model} · {device}"


def operators_frame(ops: Sequence[dict[str, Any]] | None) -> pd.DataFrame:
    """The operator table (:data:`OPERATOR_CSV_COLUMNS`; times in ms, memory in MiB)."""
    df = pd.DataFrame(list(ops or []), columns=list(OPERATOR_CSV_COLUMNS))
    for col in OPERATOR_NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
        if col not in OPERATOR_MEMORY:  # memory a trace does not hold stays unknown, not 0
            df[col] = df[col].fillna(0.0)
    df["calls"] = df["calls"].astype(int)
    df["input_shapes"] = df["input_shapes"].fillna("").astype(str)
    return df


def has_memory(df: pd.DataFrame) -> bool:
    """Whether an operator table carries memory figures (torch's own table; a table read
    from a server's trace has none)."""
    return not df.empty and bool(df[list(OPERATOR_MEMORY)].notna().any().any())


def has_device_times(df: pd.DataFrame) -> bool:
    """Whether an operator table carries device (kernel) times (CUDA, NPU, MLU runs)."""
    return not df.empty and float(df["self_device_ms"].abs().sum()) > 0


def top_operators(df: pd.DataFrame, sort: str, n: int) -> pd.DataFrame:
    """The ``n`` largest operators by ``sort`` (a key of :data:`OPERATOR_SORTS`), with a share column.

    ``share_pct``: the operator's share of the sorted column's total over the whole table.
    """
    col = OPERATOR_SORTS.get(sort, "self_cpu_ms")
    total = float(df[col].clip(lower=0).sum()) if not df.empty else 0.0
    out = df.sort_values(col, ascending=False, kind="stable").head(max(1, int(n))).copy()
    out.insert(0, "rank", range(1, len(out) + 1))
    out["share_pct"] = out[col].clip(lower=0) / total * 100.0 if total > 0 else 0.0
    return out.reset_index(drop=True)


def breakdown_basis(art: dict[str, Any] | None) -> list[str]:
    """The time bases a breakdown artifact has: ``["device", "cpu"]`` on a device, ``["cpu"]`` on CPU."""
    if not art or not art.get("rows") or not art.get("total_ms"):
        return []  # none, or nothing classified (a captured or compiled step: the artifact's note says so)
    has_device = any(r.get("device_ms") is not None for r in art["rows"])
    return ["device", "cpu"] if has_device else ["cpu"]


def breakdown_frame(items: Sequence[tuple[str, dict[str, Any] | None]], basis: str = "cpu") -> pd.DataFrame:
    """Long frame of bottleneck breakdowns: ``run``, ``category``, ``ms``, ``share_pct``, ``total_ms``.

    ``items``: (run label, ``profile_breakdown`` artifact). Shares are recomputed on ``basis``
    ("cpu" | "device") so every bar sums to 100%; runs without that basis (device time on
    a CPU run) or without a breakdown are left out. Categories follow :data:`CATEGORIES`.
    """
    col = "device_ms" if basis == "device" else "cpu_ms"
    rows: list[dict[str, Any]] = []
    for label, art in items:
        if basis not in breakdown_basis(art):
            continue
        assert art is not None
        values = {str(r["category"]): float(r.get(col) or 0.0) for r in art["rows"]}
        total = sum(values.values())
        order = [c for c in CATEGORIES if c in values] + [c for c in values if c not in CATEGORIES]
        for cat in order:
            ms = values[cat]
            rows.append(
                {
                    "run": label,
                    "category": cat,
                    "ms": ms,
                    "share_pct": 100.0 * ms / total if total else 0.0,
                    "total_ms": total,
                }
            )
    return pd.DataFrame(rows, columns=["run", "category", "ms", "share_pct", "total_ms"])


def breakdown_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Wide table: one row per category (CATEGORIES order), ``<run> (ms)`` and ``<run> (%)`` per run."""
    if frame.empty:
        return pd.DataFrame(columns=["category"])
    out = pd.DataFrame({"category": list(dict.fromkeys(frame["category"]))})
    for run in dict.fromkeys(frame["run"]):
        part = frame[frame["run"] == run].set_index("category")
        out[f"{run} (ms)"] = out["category"].map(part["ms"])
        out[f"{run} (%)"] = out["category"].map(part["share_pct"])
    return out


def rules_table() -> pd.DataFrame:
    """The classification rules (engines.profiling.CATEGORY_RULES) as shown to the user."""
    rows = [{"category": r.category, "target": r.target, "pattern": r.pattern, "why": r.why} for r in CATEGORY_RULES]
    rows.append(
        {
            "category": "other",
            "target": "(rest)",
            "pattern": "",
            "why": "time inside a request's generate scope that no rule claims: embeddings, norms, "
            "cache bookkeeping, Python overhead",
        }
    )
    return pd.DataFrame(rows, columns=["category", "target", "pattern", "why"])


@dataclass(frozen=True)
class TraceFile:
    """A profile run's trace: where it was written and whether it is still there."""

    path: Path | None  # None: the run recorded no trace
    exists: bool

    @property
    def mime(self) -> str:
        return "application/gzip" if self.path is not None and self.path.suffix == ".gz" else "application/json"


def trace_file(store: Store, run_id: int) -> TraceFile:
    """The run's trace: ``exists`` only when it is a file MoE Bench keeps in the store's traces
    folder (Store.trace_path); a recorded path anywhere else is named, never served."""
    path = store.trace_path(run_id)
    if path is not None:
        return TraceFile(path, True)
    art = store.artifact(run_id, ARTIFACT_TRACE)
    raw = art.get("path") if isinstance(art, dict) else None
    return TraceFile(Path(raw) if isinstance(raw, str) and raw else None, False)


@dataclass(frozen=True)
class ProfileData:
    """Everything the Profiling page draws for one run (read once per page run)."""

    operators: pd.DataFrame
    breakdown: dict[str, Any] | None
    routing: dict[str, Any] | None
    trace: TraceFile


def load_profile(store: Store, run_id: int) -> ProfileData:
    return ProfileData(
        operators=operators_frame(store.artifact(run_id, ARTIFACT_OPERATORS)),
        breakdown=store.artifact(run_id, ARTIFACT_BREAKDOWN),
        routing=store.artifact(run_id, ARTIFACT_ROUTING),
        trace=trace_file(store, run_id),
    )


def memory_series(store: Store, run_id: int) -> pd.DataFrame:
    """The memory series of a run (long: ``t_s``, ``name``, ``value``; GiB)."""
    points = store.timeseries(run_id, [n for n, _ in MEMORY_SERIES])
    return pd.DataFrame(points, columns=["t_s", "name", "value"])


def routing_summary(routing: dict[str, Any] | None) -> pd.DataFrame:
    """Per layer: routed tokens (:data:`bench.metrics.moe.ROUTED_TOKENS`, the CLI's ``routing``
    figure), busiest / idlest expert, max/mean imbalance."""
    if not routing or not routing.get("counts"):
        return pd.DataFrame(columns=["layer", "tokens", "busiest expert", "idlest expert", "max / mean"])
    rows = []
    for layer, counts in zip(moe.layer_routing(routing), moe.counts_array(routing), strict=False):
        busiest, idlest = int(counts.argmax()), int(counts.argmin())
        rows.append(
            {
                "layer": layer.layer,
                "tokens": layer.tokens,
                "busiest expert": f"{busiest} ({counts[busiest]:,.0f} tokens)",
                "idlest expert": f"{idlest} ({counts[idlest]:,.0f} tokens)",
                "max / mean": layer.imbalance,
            }
        )
    return pd.DataFrame(rows)


def routing_caption(routing: dict[str, Any]) -> str:
    """The Profiling page's line over a routing heat map: layers, experts, top-k, groups and the
    routed tokens per layer in the CLI's words and figure (:func:`bench.metrics.moe.routed_tokens_figure`)."""
    source = routing.get("source") or "counted at the model's gates (native engine)"
    top_k = f"top-{routing['top_k']}" if routing.get("top_k") else "top-k unknown"
    return (
        f"{len(moe.counts_array(routing))} MoE layers · {routing.get('num_experts', '?')} routed experts · {top_k} · "
        f"{moe.expert_groups(routing)} expert group(s) · {moe.routed_tokens_figure(routing)} {moe.ROUTED_TOKENS} "
        f"({moe.ROUTED_TOKENS_MEANING}) · {source}."
    )


def communication_frame(comm: dict[str, Any] | None) -> pd.DataFrame:
    """One row per rank of an expert-parallel run's all-to-alls (the ``communication`` artifact)."""
    rows = [
        {
            "rank": int(r["rank"]),
            "sent (MB)": r["sent_bytes"] / 1e6,
            "received (MB)": r["recv_bytes"] / 1e6,
            "all-to-all (ms)": r["seconds"] * 1e3,
            "experts (ms)": r["expert_seconds"] * 1e3,
            "MoE layer exchanges": int(r["layers"]),
            "GB/s": r.get("a2a_gbps"),
        }
        for r in (comm or {}).get("ranks", [])
    ]
    return pd.DataFrame(rows, columns=["rank", "sent (MB)", "received (MB)", "all-to-all (ms)", "experts (ms)",
                                       "MoE layer exchanges", "GB/s"])  # fmt: skip

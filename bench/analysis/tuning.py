"""The native engine's tuning ablation (``bench/analysis/tuning_ablation.py``) as stored runs.

The ablation stores each row as a run named ``tuning-<config>-b<batch>``; its correctness
check (greedy tokens and logits against the baseline's) is the run's ``tuning_check``
artifact. Here: the rows of the runs in a store (:func:`tuning_rows`), the saved H200 rows
imported from ``examples/tuning`` (:func:`import_saved`), and a new ablation started in the
background (:class:`AblationTask`: the benchmark script in its own process, its runs imported
when it ends), which the dashboard's Tuning page uses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.bundle import import_bundle_file
from bench.metrics.run_limits import for_run_or_reason
from bench.run.task import BackgroundTask
from bench.store import Store
from bench.store.rows import RunRow
from engines.models import random_weights

ROOT = Path(__file__).resolve().parents[2]
SAVED = ROOT / "examples" / "tuning"
RUN_NAME = re.compile(r"^tuning-(?P<config>[a-z0-9_]+)-b(?P<batch>\d+)(?:-r(?P<round>\d+))?$")
ARTIFACT_TUNING_CHECK = "tuning_check"


def run_name(config: str, batch: int, round_: int | None = None) -> str:
    """The stored run's name of one ablation row; ``-r<k>`` marks round k of a repeated ablation."""
    return f"tuning-{config}-b{batch}" + (f"-r{round_}" if round_ else "")


# The ablation's configurations: option changes from the engine's defaults (each alone).
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {},  # the engine's defaults (transformers' experts and attention kernels)
    "experts_eager": {"experts_impl": "eager"},
    "experts_grouped_mm": {"experts_impl": "grouped_mm"},
    "experts_batched_mm": {"experts_impl": "batched_mm"},
    "experts_lean": {"experts_impl": "lean_grouped_mm"},
    "attn_eager": {"attn_impl": "eager"},
    "static_cache": {"cache": "static"},
    "no_inference_mode": {"inference_mode": False},
    "cudnn_benchmark": {"cudnn_benchmark": True},
    "compile_default": {"cache": "static", "compile": "default"},
    "compile_max_autotune": {"cache": "static", "compile": "max-autotune"},
    "compile_reduce_overhead": {"cache": "static", "compile": "reduce-overhead"},
    "cuda_graphs": {"cache": "static", "cuda_graphs": True},
    "cuda_graphs_compile": {"cache": "static", "cuda_graphs": True, "compile": "default"},
    "mla_absorbed": {"mla": "absorbed"},
    "cuda_graphs_mla": {"cache": "static", "cuda_graphs": True, "mla": "absorbed"},
    "cuda_graphs_compile_mla": {"cache": "static", "cuda_graphs": True, "compile": "default", "mla": "absorbed"},
    "cuda_graphs_compile_mla_lean": {
        "cache": "static",
        "cuda_graphs": True,
        "compile": "default",
        "mla": "absorbed",
        "experts_impl": "lean_grouped_mm",  # MoE Bench's grouped GEMM (engines/experts.py)
    },
    "router_lean": {"router": "lean"},  # the gate without its group stage where it keeps every group
    "cuda_graphs_compile_mla_lean_router": {
        "cache": "static",
        "cuda_graphs": True,
        "compile": "default",
        "mla": "absorbed",
        "experts_impl": "lean_grouped_mm",
        "router": "lean",  # engines/router.py
    },
}
CHECK_FIELDS = (
    "greedy_match",
    "logits_max_abs_diff_step0",
    "logits_max_abs_diff_agreeing_steps",
    "steps_all_tokens_agree",
    "ref_top2_gap_median",
    "warmup_s",
    "uncompiled_shapes",  # shapes a compiled, captured step ran uncompiled (torch's recompile limit)
)


@dataclass(frozen=True)
class TuningRow:
    """One configuration at one batch size, as one stored run measured it."""

    run_id: int
    config: str
    batch: int
    device: str
    dtype: str
    step_ms_p50: float | None  # the gaps between a sequence's tokens (ITL): one decode step each
    step_ms_p99: float | None
    output_tok_s: float
    ttft_ms_p50: float | None
    peak_memory_gib: float | None
    hbm_limit_ms: float | None
    greedy_match: str | None
    logits_max_abs_diff: float | None
    warmup_s: float | None
    created_at: float  # when the run ran (time.time())
    tuning: dict[str, Any]  # what transformers resolved for the run (engine_info["tuning"])
    transformers: str | None = None  # its version (engine_info["versions"]), when recorded
    round: int | None = None  # of a repeated ablation (``--rounds``, run name ``-r<k>``)
    rounds: int = 1  # the repeats this row stands for: the median round by output tokens/s
    tok_s_range: tuple[float, float] | None = None  # the lowest and highest of those rounds
    uncompiled_shapes: int | None = None  # a compiled step's shapes captured uncompiled (recompile limit)
    model: str = ""  # the model preset or folder the run loaded

    @property
    def group(self) -> str:
        """Rows comparable with each other: one device, one dtype, one transformers (its kernels and
        bookkeeping change between versions: a newer run must not stand in for an older one's row)."""
        return f"{self.device} · {self.dtype}" + (f" · transformers {self.transformers}" if self.transformers else "")


def _row(store: Store, run: RunRow) -> TuningRow | None:
    m = RUN_NAME.match(run.name or "")
    s = run.summary
    if m is None or s is None or run.status != "completed" or not s.completed:
        return None
    lim = for_run_or_reason(run.config, run.engine_info, s, run.accelerator, measure=False)
    check = store.artifact(run.id, ARTIFACT_TUNING_CHECK) or {}
    return TuningRow(
        run_id=run.id,
        config=COMBINED if m["config"] == "best" else m["config"],
        model=run.model,
        batch=int(m["batch"]),
        device=str(run.engine_info.get("device") or run.accelerator),
        dtype=str(run.engine_info.get("dtype") or "-"),
        step_ms_p50=s.itl_ms.p50,
        step_ms_p99=s.itl_ms.p99,
        output_tok_s=s.output_throughput_tok_s,
        ttft_ms_p50=s.ttft_ms.p50,
        peak_memory_gib=s.peak_memory_gib,
        hbm_limit_ms=None if isinstance(lim, str) else lim.tpot_limit_ms,
        greedy_match=check.get("greedy_match"),
        logits_max_abs_diff=check.get("logits_max_abs_diff_step0"),
        warmup_s=check.get("warmup_s"),
        created_at=run.created_at,
        tuning={k: v for k, v in (run.engine_info.get("tuning") or {}).items() if k != "batch_size"},
        transformers=(run.engine_info.get("versions") or {}).get("transformers"),
        round=int(m["round"]) if m["round"] else None,
        uncompiled_shapes=check.get(
            "uncompiled_shapes", (run.engine_info.get("tuning") or {}).get("cuda_graphs_uncompiled")
        ),
    )


# ``--best`` rows: the combination an ablation was asked to add, which is not always the fastest of
# its group (on the H200 its 38.4 ms lost to cuda_graphs' 8.6 ms): shown as what it is, not as "best".
COMBINED = "combined"


def _matched(row: TuningRow) -> int:
    """How many prompts of its check gave the baseline's greedy tokens ("3/4 (...)" -> 3; none: -1)."""
    head = (row.greedy_match or "").split("/", 1)[0]
    return int(head) if head.isdigit() else -1


def _ablations(repeats: list[TuningRow]) -> list[list[TuningRow]]:
    """One (group, config, batch)'s runs in time order, as measurements: a run without a round
    alone, the rounds of one repeated ablation together (its rounds come in increasing order: a
    round number that does not increase starts another ablation)."""
    found: list[list[TuningRow]] = []
    for r in sorted(repeats, key=lambda r: (r.created_at, r.run_id)):
        last = found[-1][-1] if found else None
        if r.round is not None and last is not None and last.round is not None and r.round > last.round:
            found[-1].append(r)
        else:
            found.append([r])
    return found


def tuning_rows(store: Store) -> list[TuningRow]:
    """Every ablation row stored, one per (group, config, batch): the newest measurement. A
    measurement in several rounds (``--rounds``) is its round of median output tokens/s (the
    lower of the two middle ones), with the number of rounds, their lowest and highest tokens/s,
    and the worst correctness check of any round (fewest greedy matches, largest logits
    difference): a failing round is not hidden behind the median."""
    found: dict[tuple[str, str, int], list[TuningRow]] = {}
    for run in store.list_runs():
        row = _row(store, run)
        if row is not None:
            found.setdefault((row.group, row.config, row.batch), []).append(row)
    picked: list[TuningRow] = []
    for repeats in found.values():
        rounds = sorted(_ablations(repeats)[-1], key=lambda r: (r.output_tok_s, r.run_id))
        if len(rounds) == 1:
            picked.append(rounds[0])
            continue
        median = rounds[(len(rounds) - 1) // 2]
        worst = min(rounds, key=_matched)
        diffs = [r.logits_max_abs_diff for r in rounds if r.logits_max_abs_diff is not None]
        picked.append(
            replace(
                median,
                rounds=len(rounds),
                tok_s_range=(rounds[0].output_tok_s, rounds[-1].output_tok_s),
                greedy_match=worst.greedy_match if _matched(worst) < _matched(median) else median.greedy_match,
                logits_max_abs_diff=max(diffs) if diffs else None,
            )
        )
    return sorted(picked, key=lambda r: (r.group, r.config, r.batch))


@dataclass(frozen=True)
class Headline:
    """One group's best measured row by one measure, set against the same group's baseline at
    the same batch and against the hardware's limit there (None where the group has neither)."""

    row: TuningRow
    baseline: TuningRow | None  # the "baseline" config at the row's batch, in the same group
    vs_baseline: float | None  # fastest: the baseline's step / this step; throughput: this tok/s / the baseline's
    limit_ms: float | None  # the HBM limit at the row's batch: the shortest step the memory allows


def headlines(rows: Sequence[TuningRow]) -> dict[str, Headline]:
    """The rows a demo leads with, from one group's rows (:attr:`TuningRow.group`): ``fastest``,
    the shortest decode step (p50) at the group's smallest batch; ``throughput``, the most output
    tokens/s at any batch. Rows that ran shapes uncompiled count as measured (the page flags
    them). A measure no row has is left out."""
    found: dict[str, Headline] = {}
    if not rows:
        return found
    smallest = min(r.batch for r in rows)
    timed = [r for r in rows if r.batch == smallest and r.step_ms_p50]
    picks = {"throughput": max(rows, key=lambda r: (r.output_tok_s, r.config))}
    if timed:
        picks["fastest"] = min(timed, key=lambda r: (r.step_ms_p50, r.config))
    for key in ("fastest", "throughput"):
        if (row := picks.get(key)) is None:
            continue
        base = next((r for r in rows if r.config == "baseline" and r.batch == row.batch and r is not row), None)
        ratio = None
        if base is not None and key == "fastest" and base.step_ms_p50:
            ratio = base.step_ms_p50 / row.step_ms_p50
        elif base is not None and key == "throughput" and base.output_tok_s > 0:
            ratio = row.output_tok_s / base.output_tok_s
        at_batch = (r.hbm_limit_ms for r in rows if r.batch == row.batch and r.hbm_limit_ms)
        limit = row.hbm_limit_ms or next(at_batch, None)
        found[key] = Headline(row, base, ratio, limit)
    return found


def _greedy_words(row: TuningRow) -> str:
    """The greedy-token check in words a reader without the study follows: what ran and what it found."""
    head, _, tail = (row.greedy_match or "").partition(" ")
    got, _, of = head.partition("/")
    if not (got.isdigit() and of.isdigit()) or int(of) == 0:
        return "no greedy-token check was run for this row"
    n, same = int(of), int(got)
    prompts = f"{n} check prompt" + ("s" if n != 1 else "")
    if same == n:
        return f"greedy tokens checked on {prompts}: the same as the baseline's"
    where = re.search(r"token (\d+)", tail)
    first = f", the first at token {where.group(1)}" if where else ""
    differ = n - same
    said = f"greedy tokens checked on {prompts}: {differ} differ{'s' * (differ == 1)} from the baseline's{first}"
    if row.dtype in ("bfloat16", "float16") and random_weights(row.model):
        return said + (
            f" (expected in {row.dtype} on random weights: any kernel change flips near-tied tokens, so this check "
            "cannot judge a kernel; the float32 checks can)"
        )
    return said


def conditions(h: Headline) -> str:
    """What a headline figure is, on its face: model (random weights or not), dtype, batch, card, the
    baseline's origin and the correctness check's verdict in words."""
    r = h.row
    random = "random weights" if random_weights(r.model) else "trained weights"
    parts = [f"{r.model or 'model'} ({random}), {r.dtype}, batch {r.batch}, {r.device}, run {r.run_id}"]
    if h.baseline is not None:
        b = h.baseline
        apart = abs(float(r.created_at) - float(b.created_at)) if _is_time(r.created_at, b.created_at) else 0.0
        where = "measured in another call on the same kind of card" if apart > 3600 else "measured in the same call"
        parts.append(f"baseline run {b.run_id} ({where})")
    if r.config != "baseline":
        parts.append(_greedy_words(r))
    return "; ".join(parts) + "."


def _is_time(*values: Any) -> bool:
    return all(isinstance(v, int | float) for v in values)


def group_overview(rows: Sequence[TuningRow]) -> list[dict[str, Any]]:
    """One line per group (:attr:`TuningRow.group`) from its :func:`headlines`: where each
    ablation got to, so a page that shows one group at a time still says where another's best
    figure is. Groups stepping at batch 1 come first, the fastest step first; a group with no
    timed step last. Cells a group has no row for are None (never 0)."""
    lines: list[dict[str, Any]] = []
    for group in sorted({r.group for r in rows}):
        mine = [r for r in rows if r.group == group]
        best = headlines(mine)
        fast, top = best.get("fastest"), best.get("throughput")
        lines.append(
            {
                "group": group,
                "rows": len(mine),
                "step_ms": fast.row.step_ms_p50 if fast else None,
                "step_batch": fast.row.batch if fast else None,
                "step_config": fast.row.config if fast else None,
                "limit_ms": fast.limit_ms if fast else None,
                "tok_s": top.row.output_tok_s if top else None,
                "tok_s_batch": top.row.batch if top else None,
                "tok_s_config": top.row.config if top else None,
            }
        )
    return sorted(lines, key=lambda d: (d["step_ms"] is None, d["step_batch"] or 0, d["step_ms"] or 0.0))


def import_results(store: Store, bundles: Path, results: Path | None) -> list[str]:
    """Import the runs of one ablation (its ``bundles.tar.gz``) with each row's check from its
    ``results.json``; runs already in the store (same name, device, dtype, times) are skipped.
    Returns the names imported."""
    checks: dict[str, dict[str, Any]] = {}
    if results is not None and results.is_file():
        for r in json.loads(results.read_text(encoding="utf-8")).get("rows", []):
            if "run_id" in r:
                checks[run_name(r["config"], r["batch"], r.get("round"))] = {k: r.get(k) for k in CHECK_FIELDS}
    have = {(r.name, r.created_at) for r in store.list_runs()}
    imported: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(bundles) as tar:
        tar.extractall(tmp, filter="data")
        for path in sorted(Path(tmp).glob("tuning-*.json")):
            bundle = json.loads(path.read_text(encoding="utf-8"))
            run = bundle.get("run") or {}
            if (run.get("name"), run.get("created_at")) in have:
                continue
            run_id = import_bundle_file(store, path)
            if path.stem in checks:
                store.put_artifact(run_id, ARTIFACT_TUNING_CHECK, checks[path.stem])
            imported.append(path.stem)
    return imported


def import_saved(store: Store, folder: Path = SAVED) -> list[str]:
    """The ablations saved in ``examples/tuning`` (``NAME.bundles.tar.gz`` + ``NAME.results.json``)."""
    imported: list[str] = []
    for bundles in sorted(folder.glob("*.bundles.tar.gz")):
        results = bundles.with_name(bundles.name.replace(".bundles.tar.gz", ".results.json"))
        imported += import_results(store, bundles, results)
    return imported


class AblationTask(BackgroundTask):
    """``native_tuning.py`` in its own process (the model loads there, never in the dashboard),
    followed line by line; its runs are imported into ``store`` when it ends. Cancel stops it."""

    def __init__(self, store: Store, out_dir: Path, argv: Sequence[str]) -> None:
        super().__init__("tuning ablation")
        self.store = store
        self.out_dir = out_dir
        self.argv = list(argv)
        self.lines: list[str] = []
        self.imported: list[str] = []

    def run(self) -> None:
        self.start(self._body)

    def _body(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "bench", "tune", "--out", str(self.out_dir), *self.argv]
        self.transition("running", phase="loading the model")
        with open(self.out_dir / "ablation.log", "w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip()
                if line and "warn" not in line.lower():
                    self.lines.append(line)
                    if " b=" in line or line.startswith("loaded"):
                        self.set_phase(line[:160])
                if self.cancel_event.is_set():
                    proc.terminate()
                    break
            rc = proc.wait()
        bundles = self.out_dir / "bundles.tar.gz"
        if bundles.is_file():
            self.imported = import_results(self.store, bundles, self.out_dir / "results.json")
        if self.cancel_event.is_set():
            self.transition("cancelled", phase="stopped")
        elif rc != 0:
            last = next((ln for ln in reversed(self.lines) if ln.strip()), f"exit status {rc}")
            self.transition("failed", error=f"the ablation stopped (exit {rc}): {last[:300]}")
        else:
            self.transition("completed", phase=f"{len(self.imported)} runs stored")


def ablation_argv(
    model: str, accelerator: str, dtype: str, configs: Sequence[str], batches: Sequence[int], input_len: int = 128,
    output_len: int = 64, rounds: int = 1,
) -> list[str]:  # fmt: skip
    """The benchmark's arguments for a page's choices (``rounds`` > 1: repeated in ABBA order)."""
    return [
        "--model", model, "--accelerator", accelerator, "--dtype", dtype, "--configs", ",".join(configs),
        "--batches", ",".join(str(b) for b in batches), "--input-len", str(input_len), "--output-len",
        str(output_len), "--budget-s", "3600", *(["--rounds", str(rounds)] if rounds > 1 else []),
    ]  # fmt: skip


def out_dir(data_dir: Path) -> Path:
    """Where a new ablation writes (``data/tuning/<time>``)."""
    return data_dir / "tuning" / time.strftime("%Y%m%d-%H%M%S")


_RUN_COUNTERS = ("cuda_graphs_captured", "cuda_graphs_capture_s", "cuda_graphs_uncompiled")


def config_texts(rows: Sequence[TuningRow]) -> dict[str, str]:
    """What each configuration changed from the baseline's tuning (``cache=static, attn_impl=eager``),
    from the tuning its runs recorded; the baseline reads as its own settings."""
    by_config: dict[str, dict[str, Any]] = {}
    for r in rows:  # what was set, not what happened during the run (graphs captured, capture time)
        by_config.setdefault(r.config, {k: v for k, v in r.tuning.items() if k not in _RUN_COUNTERS})
    base = by_config.get("baseline", {})
    out: dict[str, str] = {}
    for config, tun in by_config.items():
        if config == "baseline":
            out[config] = ", ".join(f"{k}={v}" for k, v in tun.items()) or "the engine's defaults"
        else:
            changed = {k: v for k, v in tun.items() if base.get(k) != v}
            out[config] = ", ".join(f"{k}={v}" for k, v in changed.items()) or "no change recorded"
    return out


# The decode step alone (``studies/cuda_graphs_check.py --time --profile``), saved.
STEP_STUDY_GLOB = "*-profile-summary.json"
STEP_NAMES = {
    "eager_static_step": "eager (static cache, no graph)",
    "graphs": "CUDA graph",
    "graphs_sync": "CUDA graph, step-by-step loop",
    "graphs_sync+mla": "CUDA graph, step-by-step loop, absorbed MLA",
    "graphs_compile_default": "compile=default, then CUDA graph",
    "eager_static_step+mla": "eager, absorbed MLA",
    "graphs+mla": "CUDA graph, absorbed MLA",
    "graphs_compile_default+mla": "compile=default, then CUDA graph, absorbed MLA",
}


@dataclass(frozen=True)
class StepStudy:
    """One saved study of the decode step: its timing rows and profile rows, with provenance."""

    source: str  # the file it came from
    title: str  # device, model, dtype, versions
    how: str
    timing: list[dict[str, Any]]  # config (readable), batch, ms_per_step_p50, ms_per_step_p90, tok_s, capture_s
    profile: list[dict[str, Any]]  # config, batch, kernels/step, host launches/step, GPU kernel ms/step, busy


def step_studies(folder: Path = SAVED) -> list[StepStudy]:
    """The saved decode-step studies in ``folder`` (files this repository ships, checked by the tests)."""
    out: list[StepStudy] = []
    for path in sorted(folder.glob(STEP_STUDY_GLOB)):
        d = json.loads(path.read_text())
        versions = ", ".join(f"{k} {v}" for k, v in (d.get("versions") or {}).items())
        title = f"{d.get('device', '?')} · {d.get('model', '?')} · {d.get('dtype', '?')}" + (
            f" ({versions})" if versions else ""
        )
        if d.get("loop"):  # which decode loop its timings ran, when not today's pipelined one
            title += f" · {d['loop']}"
        timing = [
            {**r, "config": STEP_NAMES.get(r["config"], r["config"])}
            for r in d.get("step_timing_ms") or []
            if not r.get("error")
        ]
        profile = []
        for key, p in (d.get("profile") or {}).items():
            config, _, batch = key.rpartition("/b")
            profile.append({
                "config": STEP_NAMES.get(config, config), "batch": int(batch),
                "kernels_per_step": p.get("kernels_per_step"),
                "host_launches_per_step": p.get("host_kernel_launches_per_step"),
                "gpu_kernel_ms_per_step": p.get("gpu_kernel_ms_per_step"),
                "wall_ms_per_step": p.get("wall_ms_per_step"),
                "gpu_busy_pct": None if p.get("gpu_busy_fraction") is None else 100 * p["gpu_busy_fraction"],
            })  # fmt: skip
        out.append(StepStudy(path.name, title, str(d.get("how", "")), timing, profile))
    return out

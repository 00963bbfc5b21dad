"""The serving curve, as numbers: output tok/s per accelerator against tok/s per user (interactivity)
for each run or sweep point, as InferenceMAX, vLLM's ``sweep plot_pareto`` and AIPerf draw it; the
Pareto front of each curve, its knee, the best throughput at an interactivity target, and what a
million output tokens cost in dollars and joules there.

Per run (:func:`run_serving`):

- tok/s per user: ``interactivity_tok_s`` p50 where the summary has it; a run stored before it existed
  gets ``1000 / TPOT p50`` and says so (``per_user_from``);
- output tok/s per accelerator: ``output_tok_s_per_accelerator`` where the summary has it, else
  ``output_throughput_tok_s / accelerators`` counted from the recorded deployment
  (:func:`bench.metrics.deployment.accelerator_count`); a run whose accelerators are not known is left
  out with a one-line note, never guessed;
- $/M and J/M output tokens: :mod:`bench.metrics.cost`.

A sweep point is the mean of its completed runs' figures. Pure functions over stored rows; the
figure is :func:`bench.report.figures.serving_pareto_figure`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.analysis.sweep_analysis import fmt_num, knee, load_axis_of, point_label, short_label, varying_keys
from bench.metrics.cost import (
    Price,
    card_of,
    joules_per_million_output_tokens,
    usd_per_million_output_tokens,
)
from bench.metrics.deployment import accelerator_count
from bench.store.rows import RunRow, SweepRow
from bench.sweep.spec import PointResult

DEFAULT_TARGET_TOK_S_PER_USER = 20.0  # DeepSeek's users saw 20-22 tok/s (its inference system overview)
FROM_INTERACTIVITY = "interactivity_tok_s_p50"
FROM_TPOT = "1000 / tpot_ms_p50"
# Engine options a legend never names: where a server listens, how long it may take to start.
_QUIET_OPTIONS = frozenset(
    {"kind", "model", "accelerator", "port", "base_url", "start_timeout_s", "timeout_s", "served_model_name"}
)


def priced(
    card: str, accelerators: int | None, output_tok_s: float | None, prices: Mapping[str, Price]
) -> float | None:
    """$ per million output tokens of ``accelerators`` of ``card`` at ``output_tok_s`` (None without a price)."""
    price = prices.get(card)
    return usd_per_million_output_tokens(price.usd_per_hour if price else None, accelerators, output_tok_s)


@dataclass(frozen=True)
class RunServing:
    """One run's serving figures (see the module docstring); ``note`` says why a figure is missing."""

    per_user_tok_s: float | None
    per_user_from: str  # FROM_INTERACTIVITY or FROM_TPOT ("" when neither was measured)
    output_tok_s: float | None
    accelerators: int | None
    per_accelerator_tok_s: float | None
    joules_per_output_token: float | None
    card: str
    note: str = ""

    def usd_per_million(self, prices: Mapping[str, Price]) -> float | None:
        """$ per million output tokens at the card's price (None without a price or a count)."""
        return priced(self.card, self.accelerators, self.output_tok_s, prices)

    @property
    def joules_per_million(self) -> float | None:
        return joules_per_million_output_tokens(self.joules_per_output_token)


def run_serving(run: RunRow) -> RunServing:
    """A completed run's serving figures; a run without a summary has none (``note`` says so)."""
    card = card_of(run.accelerator, run.engine_info)
    s = run.summary
    if s is None or run.status != "completed":
        return RunServing(None, "", None, None, None, None, card, f"run {run.id}: not completed")
    per_user, origin = None, ""
    if s.interactivity_tok_s is not None and s.interactivity_tok_s.p50 is not None:
        per_user, origin = float(s.interactivity_tok_s.p50), FROM_INTERACTIVITY
    elif s.tpot_ms.p50 is not None and s.tpot_ms.p50 > 0:
        per_user, origin = 1000.0 / float(s.tpot_ms.p50), FROM_TPOT
    accelerators = s.accelerators or accelerator_count(run.config, run.engine_info)
    per_acc = s.output_tok_s_per_accelerator
    if per_acc is None and accelerators:
        per_acc = s.output_throughput_tok_s / accelerators
    notes = []
    if not accelerators:
        notes.append(f"run {run.id}: accelerators not recorded (a server reached by URL), left out")
    if per_user is None:
        notes.append(f"run {run.id}: no TPOT measured (one-token outputs), left out")
    return RunServing(
        per_user, origin, s.output_throughput_tok_s, accelerators, per_acc, s.joules_per_output_token, card,
        "; ".join(notes),
    )  # fmt: skip


@dataclass(frozen=True)
class ServingPoint:
    """A run or sweep point on the curve: the mean of its completed runs' figures."""

    label: str  # its swept values, short: "c=32"
    point: dict[str, Any]
    run_ids: tuple[int, ...]
    per_user_tok_s: float
    per_user_from: str  # FROM_TPOT when any of its runs predates interactivity_tok_s
    output_tok_s: float
    accelerators: int
    per_accelerator_tok_s: float
    joules_per_output_token: float | None  # None unless every run measured its energy
    card: str

    def usd_per_million(self, prices: Mapping[str, Price]) -> float | None:
        """$ per million output tokens at the card's price (None without a price)."""
        return priced(self.card, self.accelerators, self.output_tok_s, prices)

    @property
    def joules_per_million(self) -> float | None:
        return joules_per_million_output_tokens(self.joules_per_output_token)


@dataclass
class ServingCurve:
    """One sweep (or set of runs) on the chart: its points, Pareto front, knee and left-out runs."""

    name: str  # the legend: "#3 vllm · H100 · max_num_seqs=32"
    engine: str
    card: str
    points: list[ServingPoint]
    front: list[ServingPoint] = field(default_factory=list)
    knee: ServingPoint | None = None
    notes: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # the engine options the runs were started with

    @property
    def derived(self) -> bool:
        """Some point's tok/s per user is 1000 / TPOT p50 (runs stored before interactivity_tok_s)."""
        return any(p.per_user_from == FROM_TPOT for p in self.points)


def pareto(points: Sequence[ServingPoint]) -> list[ServingPoint]:
    """The points no other point beats on both tok/s per user and output tok/s per accelerator (both
    higher is better), sorted by tok/s per user."""
    ordered = sorted(points, key=lambda p: (-p.per_user_tok_s, -p.per_accelerator_tok_s))
    front: list[ServingPoint] = []
    best = float("-inf")
    for p in ordered:
        if p.per_accelerator_tok_s > best:  # nothing at least as interactive serves as much per accelerator
            front.append(p)
            best = p.per_accelerator_tok_s
    return sorted(front, key=lambda p: p.per_user_tok_s)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values)


def _serving_point(p: PointResult, varying: set[str]) -> tuple[ServingPoint | None, list[str]]:
    figures = [(r, run_serving(r)) for r in p.runs if r.status == "completed" and r.summary is not None]
    notes = [f.note for _, f in figures if f.note]
    used = [(r, f) for r, f in figures if f.per_user_tok_s is not None and f.per_accelerator_tok_s is not None]
    if not used:
        return None, notes
    energy = [f.joules_per_output_token for _, f in used]
    return (
        ServingPoint(
            label=short_label(p.point, varying) if p.point else (used[0][0].name or f"run {used[0][0].id}"),
            point=dict(p.point),
            run_ids=tuple(r.id for r, _ in used),
            per_user_tok_s=_mean([f.per_user_tok_s for _, f in used if f.per_user_tok_s is not None]),
            per_user_from=FROM_TPOT if any(f.per_user_from == FROM_TPOT for _, f in used) else FROM_INTERACTIVITY,
            output_tok_s=_mean([f.output_tok_s for _, f in used if f.output_tok_s is not None]),
            accelerators=used[0][1].accelerators or 0,
            per_accelerator_tok_s=_mean([f.per_accelerator_tok_s for _, f in used if f.per_accelerator_tok_s]),
            joules_per_output_token=_mean([e for e in energy if e is not None]) if None not in energy else None,
            card=used[0][1].card,
        ),
        notes,
    )


def _engine_options(runs: Sequence[RunRow]) -> dict[str, Any]:
    first = next((r for r in runs), None)
    engine = dict((first.config.get("engine") or {}) if first else {})
    return {k: v for k, v in engine.items() if k not in _QUIET_OPTIONS}


def serving_curve(points: Sequence[PointResult], name: str = "") -> ServingCurve:
    """A curve of a sweep's points (or of plain runs, one point each): its points, front and knee (the knee
    of output throughput against the load, :func:`bench.analysis.sweep_analysis.knee`, where it is on the
    curve), and a note per run left out."""
    varying = varying_keys(points)
    made: list[tuple[PointResult, ServingPoint]] = []
    notes: list[str] = []
    for p in points:
        sp, why = _serving_point(p, varying)
        notes += why
        if sp is not None:
            made.append((p, sp))
    runs = [r for p in points for r in p.runs]
    first = next((r for r in runs), None)
    engine = first.engine if first else ""
    card = made[0][1].card if made else (card_of(first.accelerator, first.engine_info) if first else "")
    curve = ServingCurve(name=name, engine=engine, card=card, points=[sp for _, sp in made], notes=notes)
    curve.options = _engine_options(runs)
    curve.front = pareto(curve.points)
    k = knee([p for p, _ in made], load_axis_of([p for p, _ in made]))
    curve.knee = next((sp for p, sp in made if p is k), None)
    return curve


def sweep_curve(sweep: SweepRow, points: Sequence[PointResult]) -> ServingCurve:
    """:func:`serving_curve` of a stored sweep, named ``#ID NAME`` (the legend adds engine, card, options)."""
    return serving_curve(points, f"#{sweep.id} {sweep.name}".strip())


def name_curves(curves: Sequence[ServingCurve], card_names: Mapping[str, str] | None = None) -> list[str]:
    """Each curve's legend: its name, engine and card, and the engine options whose values differ between
    the overlaid curves of the same engine (at most three)."""
    names = []
    for c in curves:
        peers = [o for o in curves if o.engine == c.engine and o is not c]
        differing = [k for k, v in c.options.items() if peers and any(repr(o.options.get(k)) != repr(v) for o in peers)]
        opts = ", ".join(f"{k}={c.options[k]}" for k in differing[:3])
        card = (card_names or {}).get(c.card, c.card)
        names.append(" · ".join(x for x in (c.name, c.engine, card, opts) if x))
    return names


def best_at_target(curve: ServingCurve, target_tok_s_per_user: float) -> ServingPoint | None:
    """The point with the most output tok/s per accelerator among those serving each user at least
    ``target_tok_s_per_user``; None when no point does."""
    ok = [p for p in curve.points if p.per_user_tok_s >= target_tok_s_per_user]
    return max(ok, key=lambda p: p.per_accelerator_tok_s) if ok else None


def target_caption(
    curves: Sequence[ServingCurve],
    names: Sequence[str],
    target_tok_s_per_user: float,
    prices: Mapping[str, Price],
) -> str:
    """One sentence per curve naming its best throughput at the target (with $/M and J/M where known),
    or saying none reaches it; then the price assumptions used."""
    parts = []
    for c, name in zip(curves, names, strict=True):
        best = best_at_target(c, target_tok_s_per_user)
        if best is None:
            most = max((p.per_user_tok_s for p in c.points), default=None)
            reach = f" (at most {fmt_num(most)} tok/s per user)" if most is not None else ""
            parts.append(f"{name}: no point reaches {target_tok_s_per_user:g} tok/s per user{reach}")
            continue
        extra = []
        usd = best.usd_per_million(prices)
        if usd is not None:
            extra.append(f"${usd:.3g} per million output tokens")
        if best.joules_per_million is not None:
            extra.append(f"{fmt_num(best.joules_per_million)} J per million")
        tail = f", {', '.join(extra)}" if extra else ""
        parts.append(
            f"{name}: {fmt_num(best.per_accelerator_tok_s)} output tok/s per accelerator at {best.label} "
            f"({fmt_num(best.per_user_tok_s)} tok/s per user{tail})"
        )
    used = sorted({c.card for c in curves if c.card in prices})
    priced = "; ".join(prices[k].text for k in used)
    head = f"Best throughput at ≥ {target_tok_s_per_user:g} tok/s per user — "
    return head + "; ".join(parts) + "." + (f" Prices: {priced}." if priced else "")


SERVING_TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("curve", "sweep"),
    ("point", "point"),
    ("tok_s_per_user", "tok/s per user"),
    ("per_user_from", "per user from"),
    ("output_tok_s_per_accelerator", "output tok/s per accelerator"),
    ("accelerators", "accelerators"),
    ("usd_per_million_output_tokens", "$ per M output tokens"),
    ("joules_per_million_output_tokens", "J per M output tokens"),
    ("on_front", "Pareto front"),
    ("knee", "knee"),
    ("run_ids", "runs"),
)


def serving_rows(
    curves: Sequence[ServingCurve], names: Sequence[str], prices: Mapping[str, Price]
) -> list[dict[str, Any]]:
    """The table beside the chart: one row per point (keys: :data:`SERVING_TABLE_COLUMNS`), in each
    curve's order of tok/s per user."""
    rows = []
    for c, name in zip(curves, names, strict=True):
        front = {id(p) for p in c.front}
        for p in sorted(c.points, key=lambda q: q.per_user_tok_s):
            rows.append(
                {
                    "curve": name,
                    "point": point_label(p.point) if p.point else p.label,
                    "tok_s_per_user": p.per_user_tok_s,
                    "per_user_from": p.per_user_from,
                    "output_tok_s_per_accelerator": p.per_accelerator_tok_s,
                    "accelerators": p.accelerators,
                    "usd_per_million_output_tokens": p.usd_per_million(prices),
                    "joules_per_million_output_tokens": p.joules_per_million,
                    "on_front": id(p) in front,
                    "knee": p is c.knee,
                    "run_ids": list(p.run_ids),
                }
            )
    return rows

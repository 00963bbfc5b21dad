"""The book's reference tables (chapter 8, sections 8.2.4 and 8.3.3) as data, with their source.

These numbers are the *book's* figures, not measurements. Pages and reports show them
labelled "book" next to values measured by this project, labelled "measured"; the two are
never combined into one figure (a gain is computed from two book values or from two
measured runs, never from one of each).

Also here: the pure functions that turn measured :class:`bench.metrics.RunSummary`
objects into the same rows (throughput, latency, memory), so the CLI and the dashboard
compare runs to the book the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bench.metrics.summary import RunSummary


@dataclass(frozen=True)
class Source:
    """Where a reference table comes from."""

    chapter: int
    section: str
    title: str
    title_en: str

    def cite(self) -> str:
        """``Chapter 8, section 8.2.4 (vLLM performance comparison)``; ``title`` keeps the original."""
        return f"Chapter {self.chapter}, section {self.section} ({self.title_en})"


SOURCE_ENGINES = Source(8, "8.2.4", "vLLM 性能对比", "vLLM performance comparison")
SOURCE_ACCELERATORS = Source(8, "8.3.3", "国产芯片性能对比", "domestic accelerator performance comparison")

Gain = Literal["ratio_up", "ratio_down", "points"]


@dataclass(frozen=True)
class EngineRow:
    """One row of the book's native-vs-vLLM table (8.2.4).

    ``gain``: how the book's "提升" column is computed from the two values:
    ``ratio_up`` = vllm / native (higher is better), ``ratio_down`` = native / vllm
    (lower is better), ``points`` = vllm - native (percentage points).
    """

    key: str
    metric: str
    metric_zh: str
    unit: str
    native: float
    vllm: float
    gain: Gain
    book_gain_text: str  # as printed in the book


ENGINE_TABLE: tuple[EngineRow, ...] = (
    EngineRow("throughput", "Throughput", "吞吐量", "tokens/s", 50.0, 500.0, "ratio_up", "10x"),
    EngineRow("p99_latency", "P99 latency", "P99延迟", "ms", 500.0, 100.0, "ratio_down", "5x"),
    EngineRow("memory_efficiency", "Memory efficiency", "显存效率", "%", 60.0, 90.0, "points", "30%"),
)


@dataclass(frozen=True)
class AcceleratorRow:
    """One platform of the book's accelerator table (8.3.3); every figure is % of the H100's."""

    platform: str
    platform_zh: str
    accelerator: str  # this project's accelerator name for the same vendor: cuda | npu | mlu
    throughput_pct: float
    latency_pct: float
    memory_pct: float

    @property
    def card(self) -> str:
        """The card the platform is named for: ``H100``, ``910B``, ``MLU590`` (matched in device names)."""
        return self.platform.split()[-1]

    @property
    def short(self) -> str:
        """The name chart labels use: ``NVIDIA H100``, ``Ascend 910B``, ``Cambricon MLU590``."""
        return {"Huawei Ascend 910B": "Ascend 910B"}.get(self.platform, self.platform)


ACCELERATOR_TABLE: tuple[AcceleratorRow, ...] = (
    AcceleratorRow("NVIDIA H100", "NVIDIA H100", "cuda", 100.0, 100.0, 100.0),
    AcceleratorRow("Huawei Ascend 910B", "华为昇腾 910B", "npu", 70.0, 120.0, 80.0),
    AcceleratorRow("Cambricon MLU590", "寒武纪思元 590", "mlu", 60.0, 150.0, 70.0),
)


def on_card(accelerator: str, device: object, row: AcceleratorRow) -> bool:
    """A run of ``accelerator`` kind with the recorded device name ``device`` (``engine_info["device"]``,
    e.g. ``NVIDIA H100 80GB HBM3``) ran on ``row``'s card: the same accelerator kind and a device name
    that names the card (``H100``, ``910B``, ``MLU590``). An H200 is no H100; an unrecorded device is
    no card."""
    name = str(device or "").replace(" ", "").lower()
    return accelerator == row.accelerator and bool(name) and row.card.replace(" ", "").lower() in name


def platform_of(accelerator: str, device: object) -> AcceleratorRow | None:
    """The book's platform (8.3.3) a run ran on (:func:`on_card`); None for any other accelerator
    (a CPU, an H200, a device that was not recorded)."""
    return next((r for r in ACCELERATOR_TABLE if on_card(accelerator, device, r)), None)


ACCELERATOR_METRICS: tuple[tuple[str, str, str], ...] = (
    # (key, label, what the measured value is)
    ("throughput_pct", "Throughput", "output tokens/s"),
    ("latency_pct", "Latency", "mean E2E latency, ms"),
    ("memory_pct", "Memory use", "peak memory, GiB"),
)

# Which latency statistic stands for the book's "P99 latency" when measured runs are compared.
LATENCY_METRICS: dict[str, str] = {
    "e2e_ms": "E2E latency (request sent -> last token)",
    "ttft_ms": "TTFT (time to first token)",
    "tpot_ms": "TPOT (time per output token)",
    "itl_ms": "ITL (inter-token latency)",
}

NOT_MEASURED_MEMORY_EFFICIENCY = (
    "not measured: the engine reports no KV-cache use (the native engine reserves no KV-cache pool) and the run "
    "has no device telemetry beside a device allocator peak (a CPU run has none) to measure the used share of"
)


def gain(kind: Gain, native: float | None, vllm: float | None) -> float | None:
    """The improvement of ``vllm`` over ``native`` as the book defines it; None when undefined."""
    if native is None or vllm is None:
        return None
    if kind == "points":
        return vllm - native
    if kind == "ratio_up":
        return vllm / native if native > 0 else None
    return native / vllm if vllm > 0 else None


def format_gain(kind: Gain, value: float | None) -> str:
    """``10.0x`` for ratios, ``+30.0 points`` for differences, ``-`` when undefined."""
    if value is None:
        return "-"
    if kind == "points":
        return f"{value:+.1f} points"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def book_gain(row: EngineRow) -> float:
    """The book's gain recomputed from its own two values (10, 5, 30 for 8.2.4)."""
    value = gain(row.gain, row.native, row.vllm)
    assert value is not None
    return value


def measured_engine_values(
    summary: RunSummary | None, latency_metric: str = "e2e_ms", memory_efficiency_pct: float | None = None
) -> dict[str, float | None]:
    """A measured run as the 8.2.4 rows: throughput (output tokens/s), P99 latency (ms) and
    memory efficiency (%), as ``bench.analysis.compare.memory_efficiency`` measured it (KV-cache use, or
    tensor memory / device memory in use from telemetry); None otherwise, never an estimate."""
    if latency_metric not in LATENCY_METRICS:
        raise ValueError(f"unknown latency metric '{latency_metric}'; use one of {', '.join(LATENCY_METRICS)}")
    if summary is None or summary.completed == 0:
        return {"throughput": None, "p99_latency": None, "memory_efficiency": None}
    stat = getattr(summary, latency_metric)
    return {
        "throughput": summary.output_throughput_tok_s,
        "p99_latency": stat.p99,
        "memory_efficiency": memory_efficiency_pct,
    }


def book_accelerator_pct(row: AcceleratorRow, baseline: AcceleratorRow) -> dict[str, float]:
    """The book's figures of ``row`` as % of ``baseline``'s, keyed like :data:`ACCELERATOR_METRICS`:
    the printed ones when ``baseline`` is the H100 (70 / 120 / 80 for the 910B), else rebased,
    book / book (the H100 is 143 % of the 910B's throughput)."""
    return {key: getattr(row, key) / getattr(baseline, key) * 100.0 for key, _, _ in ACCELERATOR_METRICS}


def measured_accelerator_values(summary: RunSummary | None) -> dict[str, float | None]:
    """Absolute measured values behind the 8.3.3 columns: output tokens/s, mean E2E ms, peak GiB
    (the engine's own peak; ``bench.analysis.compare.run_memory`` adds device telemetry)."""
    if summary is None or summary.completed == 0:
        return {"throughput_pct": None, "latency_pct": None, "memory_pct": None}
    return {
        "throughput_pct": summary.output_throughput_tok_s,
        "latency_pct": summary.e2e_ms.mean,
        "memory_pct": summary.peak_memory_gib,
    }


def relative_pct(base: float | None, value: float | None) -> float | None:
    """``value`` as a percentage of ``base`` (the book's "relative to H100" form)."""
    if base is None or value is None or base <= 0:
        return None
    return value / base * 100.0

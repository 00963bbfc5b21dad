"""A run's physical limits: its model's roofline (:mod:`bench.metrics.roofline`) on its accelerator, at
the batch and context length the run decoded at, and how much of it the run reached.

* **model**: the config the engine recorded (``engine_info["model_config"]``, the native
  engine), else a preset's config held in memory, else ``config.json`` in the model's local
  folder; a model with neither (a remote server's name) has no limit, and says so.
* **accelerator**: the device the engine named (``engine_info["device"]``, e.g. "NVIDIA
  H200" -> the H200's datasheet figures); an NPU or MLU run without a name uses the spec
  table's default for its kind (its figures carry their low confidence); a CUDA device not in
  the table has no limit. ``cpu`` is this machine's measured bandwidth and matmul rate, so a
  CPU limit is only drawn for runs computed on this host: the native engine, or a server MoE
  Bench launched here (``engine_info["managed"]``); a server it only connected to, even on
  localhost (a stub, a server started by hand), has hardware unknown to it and no limit.
* **batch**: up to ``max_concurrency`` sequences decode together (1 for a latency run): the
  limit is what the hardware allows for that many, whether or not the engine batches.
* **context**: the mean prompt length plus half the mean output length (the KV cache a
  decode step reads, on average over the run).

``tpot_pct`` = limit / measured TPOT p50 x 100 and ``throughput_pct`` = measured output
tokens/s / limit x 100: 100 % would be an engine at the hardware's limit.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.metrics.accelerator_specs import DEFAULT_SPEC_FOR, SPECS, AcceleratorSpec, dtype_bytes
from bench.metrics.cpu_limits import cpu_measured, cpu_spec
from bench.metrics.model_shape import ModelShape
from bench.metrics.roofline import Limits, get_spec, limits, preset_config, roofline
from bench.metrics.summary import RunSummary

# engine_info["device"] substrings -> spec keys (checked in order; the first match wins).
# NVML names the parts "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
# "NVIDIA H200", "NVIDIA H200 NVL"; an H100 of no named form is taken as the SXM one.
DEVICE_SPECS: tuple[tuple[str, str], ...] = (
    ("h200nvl", "h200-nvl"),
    ("h200", "h200"),
    ("h100nvl", "h100-nvl"),
    ("h100pcie", "h100-pcie"),
    ("h100", "h100-sxm"),
    ("910b2", "ascend-910b2"),
    ("910b3", "ascend-910b3"),
    ("910b", "ascend-910b3"),
    ("mlu590", "mlu590"),
)


@dataclass(frozen=True)
class RunLimits:
    """The limits one run is measured against (all figures lower bounds on time)."""

    model: str
    spec_key: str
    spec_name: str
    confidence: str  # the weakest of the spec figures used (bench.metrics.accelerator_specs.Confidence)
    dtype: str
    batch: int
    context_len: int
    bound: str  # "memory" | "compute" at this batch
    tpot_limit_ms: float  # the shortest decode step at ``batch``
    output_tok_s_limit: float  # the most output tokens/s ``batch`` sequences could reach
    tpot_pct: float | None  # limit / measured TPOT p50 x 100
    throughput_pct: float | None  # measured output tokens/s / limit x 100
    bandwidth_gb_s: float
    peak_tflops: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunLimits:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def reached(self, summary: RunSummary | None) -> RunLimits:
        """These limits with the share reached recomputed from ``summary`` (a replay's frame)."""
        tpot = thr = None
        if summary is not None and summary.completed:
            if summary.tpot_ms.p50 is not None and summary.tpot_ms.p50 > 0:
                tpot = self.tpot_limit_ms / summary.tpot_ms.p50 * 100.0
            if summary.output_throughput_tok_s > 0:
                thr = summary.output_throughput_tok_s / self.output_tok_s_limit * 100.0
        return dataclasses.replace(self, tpot_pct=tpot, throughput_pct=thr)

    @property
    def caveat(self) -> str:
        """'' for datasheet or measured figures; else a note that the spec figures are weak."""
        return "" if self.confidence in ("high", "measured") else f" (spec figures: {self.confidence} confidence)"

    def line(self) -> str:
        """One line for the CLI and the dashboard's summaries."""
        reached = [
            f"{what} {pct:.3g} %"
            for what, pct in (("TPOT p50", self.tpot_pct), ("output tok/s", self.throughput_pct))
            if pct is not None
        ]
        return (
            f"{self.spec_name}, {self.dtype}, batch {self.batch}, context {self.context_len}: "
            f"decode step >= {self.tpot_limit_ms:.3g} ms, output <= {self.output_tok_s_limit:,.0f} tok/s "
            f"({self.bound}-bound)" + (f"; reached: {', '.join(reached)}" if reached else "") + self.caveat
        )


class NoLimit(Exception):
    """Why a run has no limit (one line)."""


def model_shape_for(config: Mapping[str, Any], engine_info: Mapping[str, Any]) -> ModelShape:
    """The run's model shape (see the module docstring), or :class:`NoLimit` with the reason."""
    model = str(engine_info.get("model") or (config.get("engine") or {}).get("model") or "")
    recorded = engine_info.get("model_config")
    if isinstance(recorded, Mapping):
        try:
            return ModelShape.from_config(recorded, name=model or None)
        except (ValueError, TypeError) as exc:
            raise NoLimit(f"model '{model}': {exc}") from None
    try:
        return ModelShape.from_config(preset_config(model), name=model)
    except (ValueError, ImportError):
        pass
    for candidate in (engine_info.get("model_path"), model):
        if not candidate:
            continue
        path = Path(str(candidate)).expanduser()
        if (path / "config.json").is_file():
            try:
                return ModelShape.from_config(path, name=model or path.name)
            except (ValueError, OSError, json.JSONDecodeError) as exc:
                raise NoLimit(f"{path / 'config.json'}: {exc}") from None
    raise NoLimit(f"no config for model '{model}' here (not a preset, no local config.json)")


def spec_for(accelerator: str, engine_info: Mapping[str, Any], measure: bool = True) -> AcceleratorSpec:
    """The accelerator spec a run is held against (see the module docstring), or :class:`NoLimit`.
    ``measure=False``: never measure this CPU now (a page drawing a run in progress), use the
    figures kept from an earlier measurement or say there are none yet."""
    device = str(engine_info.get("device") or "")
    low = device.lower().replace(" ", "")
    for needle, key in DEVICE_SPECS:
        if needle in low:
            return get_spec(key)
    kind = (accelerator or "cpu").lower()
    if kind == "cpu":
        host = engine_info.get("host")
        if host and host != socket.gethostname():
            raise NoLimit(f"measured on another host ({host}): this machine's CPU figures would not apply")
        server = urlsplit(str(engine_info.get("base_url") or "")).hostname
        if server and server not in (*_LOCAL_NAMES, socket.gethostname()):
            raise NoLimit(f"served from {server}: this machine's CPU figures would not apply")

        if not measure:
            kept = cpu_measured()
            if kept is None:
                raise NoLimit("this CPU's bandwidth is measured when the run ends (not during it)")
            return cpu_spec(kept)
        return get_spec("cpu")
    if kind in ("npu", "mlu"):
        return get_spec(kind)
    raise NoLimit(f"no spec for the device '{device or kind}' (known: H100 SXM, H200, Ascend 910B, MLU590)")


def link_figure(accelerator: str, engine_info: Mapping[str, Any]) -> tuple[str, float] | None:
    """(the catalogue's name, its link GB/s both ways) of the accelerator a run or a device name
    stands for, where the catalogue gives a link figure; None on a CPU or an unknown part. Never
    measures."""
    if (accelerator or "cpu").lower() == "cpu":
        return None
    try:
        spec = spec_for(accelerator, engine_info, measure=False)
    except Exception:  # noqa: BLE001 - no spec (an unknown part): no limit
        return None
    link = getattr(spec, "link_gb_s", None)
    return (spec.name, float(link.value)) if link is not None else None


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def _known_server(engine_info: Mapping[str, Any]) -> None:
    """:class:`NoLimit` for a server MoE Bench did not launch and that named no device: it may compute
    anywhere (a GPU elsewhere, nowhere at all for a stub), even when it listens on localhost, so no
    hardware's figures apply to it. A server MoE Bench launched (``managed``) computes here."""
    server = urlsplit(str(engine_info.get("base_url") or "")).hostname
    if server not in (*_LOCAL_NAMES, socket.gethostname()):
        return  # none, or another host's (spec_for says why this CPU's figures do not apply to it)
    if not engine_info.get("managed") and not engine_info.get("device"):
        raise NoLimit(f"a server MoE Bench did not launch ({server}): its hardware is unknown")


def _dtype(config: Mapping[str, Any], engine_info: Mapping[str, Any]) -> str:
    for d in (engine_info.get("dtype"), (config.get("engine") or {}).get("dtype")):
        if d and str(d).lower() not in ("auto", "none"):
            try:
                dtype_bytes(str(d))
                return str(d)
            except ValueError:
                continue
    return "bf16"


def for_run(
    config: Mapping[str, Any] | None,
    engine_info: Mapping[str, Any] | None,
    summary: RunSummary | None,
    accelerator: str | None = None,
    measure: bool = True,
) -> RunLimits:
    """The run's limits, with the % reached where the summary has the figure; :class:`NoLimit`
    (one line) when the model or the accelerator has none."""
    config = config or {}
    engine_info = engine_info or {}
    accelerator = accelerator or str((config.get("engine") or {}).get("accelerator") or "cpu")
    _known_server(engine_info)
    shape = model_shape_for(config, engine_info)
    spec = spec_for(accelerator, engine_info, measure)
    dtype = _dtype(config, engine_info)
    batch = 1
    if summary is not None and str(config.get("mode")) != "latency":
        batch = max(1, int(summary.max_concurrency or 1))
        open_loop = config.get("request_rate") or (config.get("workload") or {}).get("source") == "trace"
        if open_loop and summary.completed and summary.e2e_ms.mean:
            # arrivals, not slots, set the batch: the mean in flight (Little's law), at most the cap
            in_flight = summary.request_throughput_rps * summary.e2e_ms.mean / 1000.0
            batch = max(1, min(batch, round(in_flight)))
    if summary is not None and summary.completed:
        context = round(summary.prompt_tokens / summary.completed + summary.output_tokens / summary.completed / 2)
    else:  # nothing finished yet: the workload's lengths
        wl = config.get("workload") or {}
        context = int(wl.get("input_len") or 0) + int(wl.get("output_len") or 0) // 2
    point = roofline(shape, spec, batch, context, dtype)
    return RunLimits(
        model=shape.name,
        spec_key=spec.key,
        spec_name=spec.name,
        confidence=spec.confidence,
        dtype=dtype,
        batch=batch,
        context_len=context,
        bound=point.bound,
        tpot_limit_ms=point.step_ms,
        output_tok_s_limit=point.tok_s,
        tpot_pct=None,
        throughput_pct=None,
        bandwidth_gb_s=spec.bandwidth_gb_s.value,
        peak_tflops=spec.peak_flops(dtype) / 1e12,
    ).reached(summary)


def for_run_or_reason(
    config: Mapping[str, Any] | None,
    engine_info: Mapping[str, Any] | None,
    summary: RunSummary | None,
    accelerator: str | None = None,
    measure: bool = True,
) -> RunLimits | str:
    """:func:`for_run`, with the one-line reason in place of a limit where there is none."""
    try:
        return for_run(config, engine_info, summary, accelerator, measure)
    except NoLimit as exc:
        return str(exc)
    except (ValueError, ZeroDivisionError) as exc:
        return f"no limit: {exc}"


LIMIT_BATCHES: tuple[int, ...] = (1, 8, 32, 128, 256)
AUTO_DTYPE = {"cpu": "float32", "cuda": "bfloat16", "npu": "float16", "mlu": "float16"}


def spec_choices(accelerator: str, device: str = "") -> tuple[list[str], str]:
    """The spec keys a page offers for ``accelerator`` and the default one: the loaded device's
    own when it is in the table (an H100 picks ``h100-sxm``), else the kind's default."""
    keys = [*SPECS, "cpu"]
    low = device.lower().replace(" ", "")
    default = next((key for needle, key in DEVICE_SPECS if needle in low), None)
    return keys, default or DEFAULT_SPEC_FOR.get(accelerator, "h200")


def model_limits_table(
    model: str,
    spec_key: str | AcceleratorSpec,
    dtype: str = "auto",
    context_len: int = 1024,
    batches: tuple[int, ...] = LIMIT_BATCHES,
    engine_info: Mapping[str, Any] | None = None,
) -> tuple[Limits, list[dict[str, Any]]]:
    """A model's limits on one spec, and its roofline at ``batches``: the Engine page's table
    (one row per batch: shortest step, most output tokens/s, which ceiling binds). :class:`NoLimit`
    with the reason when the model has no config here."""
    shape = model_shape_for({"engine": {"model": model}}, engine_info or {"model": model})
    spec = spec_key if isinstance(spec_key, AcceleratorSpec) else get_spec(spec_key)
    if dtype in ("", "auto"):
        dtype = AUTO_DTYPE.get(spec.accelerator, "bf16")
    model_limits = limits(shape, spec, dtype=dtype, context_len=context_len)
    rows = []
    for b in batches:
        p = model_limits.roofline(b)
        rows.append(
            {
                "batch": b,
                "min step (ms)": p.step_ms,
                "max output tok/s": p.tok_s,
                "memory time (ms)": p.memory_ms,
                "compute time (ms)": p.compute_ms,
                "bound": p.bound,
            }
        )
    return model_limits, rows

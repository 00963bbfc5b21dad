"""How many accelerators a run's engine ran on, from what the run recorded: the per-accelerator
throughput's denominator (InferenceMAX's and vLLM's output tok/s per GPU).

- a server MoE Bench launched (vLLM, LMDeploy) records its deployment: tensor x pipeline x data
  parallel sizes (vLLM's expert parallelism spreads experts over those same devices);
- the native engine: the processes its routed experts were spread over (``expert_parallel``), else one;
- a CPU run: one (the host);
- a server reached at ``base_url`` records no deployment: unknown (None), never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def accelerator_count(config: Mapping[str, Any] | None, engine_info: Mapping[str, Any] | None) -> int | None:
    """The accelerators the run's engine used (see the module docstring), or None when not recorded."""
    engine = (config or {}).get("engine")
    engine = engine if isinstance(engine, Mapping) else {}
    info = engine_info or {}
    kind = str(engine.get("kind") or info.get("engine") or "")
    deployment = info.get("deployment")
    if isinstance(deployment, Mapping):
        sizes = [deployment.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")]
        counted = [int(v) for v in sizes if isinstance(v, int) and not isinstance(v, bool) and v >= 1]
        if counted:
            total = 1
            for v in counted:
                total *= v
            return total
    if kind == "native":
        ep = engine.get("expert_parallel")
        return int(ep) if isinstance(ep, int) and not isinstance(ep, bool) and ep > 1 else 1
    if str(engine.get("accelerator") or "").lower() == "cpu" and not engine.get("base_url"):
        return 1
    return None


def per_accelerator(output_tok_s: float | None, accelerators: int | None) -> float | None:
    """Output tok/s per accelerator (None when either is unknown)."""
    if output_tok_s is None or not accelerators:
        return None
    return output_tok_s / accelerators

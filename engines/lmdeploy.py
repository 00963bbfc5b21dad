"""The ``lmdeploy`` engine: LMDeploy's OpenAI-compatible ``api_server``, measured over HTTP.

- **managed**: launches ``python -m lmdeploy serve api_server MODEL --backend pytorch|turbomind
  [--device cuda|ascend|camb] --tp N --server-name HOST --server-port PORT --model-name NAME``
  (flags as in LMDeploy 0.18's CLI) with the interpreter that has lmdeploy
  (``MOEBENCH_LMDEPLOY_PYTHON``, else this one), then talks to it through the OpenAI client.
- **connect** (``base_url``): any running LMDeploy server (``http://host:23333/v1``).

LMDeploy has no CPU backend: on a machine without CUDA, Ascend or Cambricon the engine is
listed as unavailable and says why (a remote LMDeploy server is still reachable with the
``openai`` engine). TurboMind runs on CUDA only; Ascend (``--device ascend``)
and Cambricon (``--device camb``) need the PyTorch backend.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from engines.accelerators import Availability, get_accelerator
from engines.base import ProgressFn, register_engine
from engines.errors import ConfigError, EngineUnavailable
from engines.launch import free_port
from engines.managed import ServerEngine, probe_interpreter
from engines.openai_http import OpenAIEngine, OpenAIOptions
from engines.settings import get_settings
from engines.telemetry import visible_devices

NO_CPU_BACKEND = "LMDeploy has no CPU backend; it runs on CUDA, Ascend (npu) or Cambricon (mlu)"

# MoE Bench accelerator -> LMDeploy --device
DEVICES: dict[str, str] = {"cuda": "cuda", "npu": "ascend", "mlu": "camb"}
INSTALL = {
    "cuda": "pip install lmdeploy",
    "npu": "pip install lmdeploy dlinfer-ascend (with CANN and torch-npu)",
    "mlu": "install lmdeploy with dlinfer for Cambricon (torch_mlu from Cambricon's release)",
}


class LMDeployOptions(OpenAIOptions):
    """LMDeploy server options. ``model`` is the checkpoint (preset or folder)."""

    kind: Literal["lmdeploy"] = "lmdeploy"  # type: ignore[assignment]
    base_url: str | None = Field(
        None, title="Server URL (empty: MoE Bench starts one)", json_schema_extra={"group": "connect"}
    )  # type: ignore[assignment]  # connect instead of launching
    backend: Literal["pytorch", "turbomind"] = Field(
        "pytorch", title="LMDeploy backend", json_schema_extra={"group": "server"}
    )
    tp: int = Field(
        1,
        ge=1,
        le=64,
        description="Tensor parallelism: devices one replica spans (--tp)",
        title="Tensor parallel (tp)",
        json_schema_extra={"group": "parallel"},
    )
    dp: int = Field(
        1,
        ge=1,
        le=1024,
        description="Data parallelism: replicas of the attention layers, one per device group (--dp)",
        title="Data parallel (dp)",
        json_schema_extra={"group": "parallel"},
    )
    ep: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Expert parallelism: the routed experts spread over this many devices (--ep; PyTorch backend, "
        "with dp)",
        title="Expert parallel (ep)",
        json_schema_extra={"group": "parallel"},
    )
    session_len: int | None = Field(None, ge=16, title="Session length (tokens)", json_schema_extra={"group": "server"})
    max_batch_size: int | None = Field(None, ge=1, title="Max batch size", json_schema_extra={"group": "server"})
    cache_max_entry_count: float | None = Field(
        None, gt=0.0, le=1.0, title="KV cache share of free memory", json_schema_extra={"group": "server"}
    )
    eager_mode: bool = Field(False, title="Eager mode", json_schema_extra={"group": "server"})
    served_model_name: str | None = Field(None, title="Served model name", json_schema_extra={"group": "server"})
    extra_args: list[str] = Field(
        default_factory=list, title="Extra server flags (JSON list)", json_schema_extra={"group": "advanced"}
    )
    start_timeout_s: float | None = Field(
        None, gt=0, title="Server start timeout (s)", json_schema_extra={"group": "advanced"}
    )
    send_min_tokens: bool = Field(
        True, title="Also send a minimum length (min tokens)", json_schema_extra={"group": "advanced"}
    )

    @model_validator(mode="after")
    def _backend_fits_device(self) -> LMDeployOptions:
        if self.base_url is None and self.backend == "turbomind" and self.accelerator in ("npu", "mlu"):
            raise ValueError(
                f"LMDeploy's turbomind backend runs on CUDA only; use backend pytorch on {self.accelerator}"
            )
        return self


_PROBE = r"""
import importlib.util as u, json
print(json.dumps({"lmdeploy": u.find_spec("lmdeploy") is not None}))
"""


def lmdeploy_python() -> str:
    """The interpreter that has lmdeploy: ``MOEBENCH_LMDEPLOY_PYTHON``, else this one."""
    return os.environ.get("MOEBENCH_LMDEPLOY_PYTHON", "") or sys.executable


def lmdeploy_installed(python: str | None = None) -> bool:
    """Whether ``python`` (default :func:`lmdeploy_python`) can import lmdeploy."""
    return bool(probe_interpreter(python or lmdeploy_python(), _PROBE, timeout=30.0).get("lmdeploy"))


def managed_availability(accelerator: str) -> Availability:
    """Whether a managed LMDeploy server can start here on ``accelerator``, and why not."""
    if accelerator not in DEVICES:
        return Availability(False, NO_CPU_BACKEND)
    if not lmdeploy_installed():
        return Availability(False, f"lmdeploy is not installed: {INSTALL[accelerator]}")
    dev = get_accelerator(accelerator).availability()
    if not dev.ok:
        return Availability(False, f"no {accelerator} device for LMDeploy: {dev.reason}")
    return Availability(True)


def server_argv(python: str, model_dir: str, name: str, host: str, port: int, o: LMDeployOptions) -> list[str]:
    """The ``lmdeploy serve api_server`` command line for these options."""
    if o.accelerator not in DEVICES:
        raise ConfigError("LMDeploy has no CPU backend; pick cuda, npu or mlu")
    argv = [python, "-m", "lmdeploy", "serve", "api_server", model_dir, "--backend", o.backend]
    if o.backend == "pytorch":
        argv += ["--device", DEVICES[o.accelerator]]
        if o.eager_mode:
            argv.append("--eager-mode")
    argv += ["--tp", str(o.tp), "--server-name", host, "--server-port", str(port), "--model-name", name]
    if o.dp > 1:
        argv += ["--dp", str(o.dp)]
    if o.ep:
        argv += ["--ep", str(o.ep)]
    if o.session_len:
        argv += ["--session-len", str(o.session_len)]
    if o.max_batch_size:
        argv += ["--max-batch-size", str(o.max_batch_size)]
    if o.cache_max_entry_count is not None:
        argv += ["--cache-max-entry-count", f"{o.cache_max_entry_count:g}"]
    if o.dtype != "auto":
        argv += ["--dtype", o.dtype]
    if o.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + [str(a) for a in o.extra_args]


def deployment_shape(o: LMDeployOptions) -> dict[str, Any]:
    """The deployment a launch asks for, and the devices it needs on this node (TP x DP)."""
    return {
        "tensor_parallel_size": o.tp,
        "data_parallel_size": o.dp,
        "expert_parallel_size": o.ep or 1,
        "backend": o.backend,
        "devices_on_this_node": o.tp * o.dp,
        "nodes": 1,
    }


def check_deployment(o: LMDeployOptions, config: dict[str, Any] | None, visible: int | None) -> None:
    """Refuse, in one line and before anything starts, an LMDeploy deployment that cannot launch."""
    ep = o.ep or 1
    if ep > 1 and o.backend != "pytorch":
        raise ConfigError(f"ep={ep}: LMDeploy runs expert parallelism on its pytorch backend, not {o.backend}")
    if ep > 1 and o.dp == 1:
        raise ConfigError(f"ep={ep} needs dp above 1: LMDeploy's pytorch engine spreads experts over its DP ranks")
    if ep > o.tp * o.dp:
        raise ConfigError(f"ep={ep} is more than the {o.tp * o.dp} devices of tp={o.tp} x dp={o.dp}")
    if config:
        heads = int(config.get("num_attention_heads") or 0)
        if heads and heads % o.tp:
            raise ConfigError(f"tp={o.tp} does not divide the model's {heads} attention heads")
        experts = int(config.get("n_routed_experts") or 0)
        if ep > 1 and experts and experts % ep:
            raise ConfigError(f"ep={ep} does not divide the model's {experts} routed experts")
    need = o.tp * o.dp
    if need > 1 and visible is not None and need > visible:
        raise ConfigError(
            f"this deployment needs {need} {o.accelerator} devices on this node (tp {o.tp} x dp {o.dp}); "
            f"{visible} visible"
        )


@register_engine
class LMDeployEngine(ServerEngine, OpenAIEngine):
    """LMDeploy's api_server (managed or connect); see the module docstring."""

    kind = "lmdeploy"
    label = "LMDeploy (api_server)"
    options_model = LMDeployOptions

    server_label = "lmdeploy"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.lopts: LMDeployOptions = options
        self.model_name = options.served_model_name or options.model

    def health_url(self) -> str:
        return f"{self.base_url}/models"

    @property
    def served_name(self) -> str:
        return self.model_name

    @classmethod
    def availability(cls) -> Availability:
        """Unavailable on a machine with none of LMDeploy's devices (every run there fails);
        connect only where lmdeploy itself is not installed."""
        if not any(get_accelerator(acc).availability().ok for acc in DEVICES):
            return Availability(
                False,
                f"{NO_CPU_BACKEND}, and none is available here (for a remote LMDeploy server use the openai engine)",
            )
        if not lmdeploy_installed():
            return Availability(True, "connect only (base_url): lmdeploy is not installed here (pip install lmdeploy)")
        return Availability(True)

    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        report = progress or (lambda msg, frac: None)
        if self.lopts.base_url:
            super().start(report)
            return
        avail = managed_availability(self.lopts.accelerator)
        if not avail.ok:
            raise EngineUnavailable(f"cannot launch LMDeploy: {avail.reason}")
        from engines.models import PRESETS, resolve_model

        name, path = resolve_model(self.lopts.model)
        config_file = Path(path) / "config.json"
        model_config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
        check_deployment(self.lopts, model_config, visible_devices(self.lopts.accelerator))
        self.checkpoint_dir = str(path)
        if not self.lopts.served_model_name:
            self.model_name = name if self.lopts.model.lower() in PRESETS else self.lopts.model
        settings = get_settings()
        port = free_port(settings.host)
        argv = server_argv(lmdeploy_python(), str(path), self.model_name, settings.host, port, self.lopts)
        self._load_tokenizer(report)
        report(f"starting LMDeploy on port {port}", 0.15)
        self.launch(argv, f"http://{settings.host}:{port}/v1", report, timeout=self.lopts.start_timeout_s)
        self.started = True
        report("ready", 1.0)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(engine="lmdeploy", backend=self.lopts.backend)
        if self.server is not None:  # the shape a launch asked for (a connected server reports none)
            info["deployment"] = deployment_shape(self.lopts)
        return info

"""The ``triton`` engine: NVIDIA Triton Inference Server's generate extension over HTTP.

Two ways to use it:

- **connect** (``base_url`` set): talk to a running Triton server and a model that
  follows the generate-extension conventions of Triton's vLLM and TensorRT-LLM backends
  (input ``text_input``, ``max_tokens``, ``stream``; output ``text_output``; every name
  configurable). Readiness: ``/v2/health/ready`` and ``/v2/models/{model}/ready``.
- **managed** (no ``base_url``): MoE Bench writes a model repository (``config.pbtxt`` and
  a Python-backend ``model.py`` that runs the model with transformers and streams tokens
  as a decoupled model) and starts ``tritonserver`` on it: the system's when it is on
  PATH (or ``MOEBENCH_TRITON_SERVER``), else the binary shipped in the ``nvidia-pytriton``
  wheel of the Triton environment (``.venv-triton``, ``make triton``; see docs/engines.md).

Requests go to ``/v2/models/{model}/generate_stream`` (SSE, one event per response).
Server metrics come from Triton's Prometheus endpoint (port 8002 by default).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from engines.accelerators import Availability
from engines.base import GenerationRequest, ProgressFn, StreamChunk, register_engine
from engines.errors import EngineUnavailable, RequestFailed, one_line
from engines.http_client import HTTPOptions
from engines.http_errors import error_message, http_get
from engines.launch import ManagedProcess, free_port
from engines.managed import ServerEngine, probe_interpreter
from engines.prometheus import CounterRates, parse_prometheus
from engines.settings import PROJECT_ROOT, get_settings
from engines.sse import sse_object, sse_payloads
from engines.tokens import TextCounter

MODEL_TEMPLATE = Path(__file__).resolve().parent / "triton_repo" / "model.py"

# Triton Prometheus metrics -> time-series names (gauges as they are; counters as rates).
GAUGES: dict[str, str] = {
    "nv_inference_pending_request_count": "server_requests_waiting",
    "nv_cpu_memory_used_bytes": "server_cpu_mem_gib",
    "nv_gpu_memory_used_bytes": "server_gpu_mem_gib",
    "nv_gpu_utilization": "server_gpu_util_pct",
}
COUNTERS: dict[str, str] = {
    "nv_inference_request_success": "server_request_success_rps",
    "nv_inference_request_failure": "server_request_failure_rps",
}


# OpenAI-protocol fields that TritonOptions carried (and never read) before it had its own
# base: a stored config (a sweep to resume) still holds them; they are dropped on load.
_OPENAI_ONLY_FIELDS = ("endpoint", "send_min_tokens", "server_token_counts", "check_model", "async_client")


class TritonOptions(HTTPOptions):
    """Triton options. ``model`` is the checkpoint (preset or folder) for a managed server."""

    kind: Literal["triton"] = "triton"  # type: ignore[assignment]
    base_url: str | None = Field(
        None,
        description="A running Triton server's root, e.g. http://127.0.0.1:8000; empty: launch one",
        title="Server URL (empty: MoE Bench starts one)",
        json_schema_extra={"group": "connect"},
    )
    exact_lengths: bool = Field(
        True,
        description="Send the ignore_eos input so every output is exactly the requested length",
        title="Exact output length (ignore EOS)",
        json_schema_extra={"group": "connect"},
    )
    model_name: str = Field(
        "moebench",
        description="The Triton model to call (and the name of the managed one)",
        title="Triton model name",
        json_schema_extra={"group": "server"},
    )
    metrics_url: str | None = Field(
        None,
        description="Triton's Prometheus URL; default: the server's host on metrics_port",
        title="Metrics URL",
        json_schema_extra={"group": "advanced"},
    )
    metrics_port: int = Field(8002, ge=1, le=65535, title="Metrics port", json_schema_extra={"group": "advanced"})
    input_name: str = Field("text_input", title="Input tensor name", json_schema_extra={"group": "advanced"})
    output_name: str = Field("text_output", title="Output tensor name", json_schema_extra={"group": "advanced"})
    max_tokens_name: str = Field("max_tokens", title="Max-tokens tensor name", json_schema_extra={"group": "advanced"})
    stream_name: str | None = Field("stream", title="Stream tensor name", json_schema_extra={"group": "advanced"})
    ignore_eos_name: str | None = Field(
        "ignore_eos",
        description="Input for ignore_eos; empty: not sent",
        title="Ignore-EOS tensor name",
        json_schema_extra={"group": "advanced"},
    )
    tokens_name: str | None = Field(
        "num_tokens",
        description="Per-response token count output; empty: count with the tokenizer",
        title="Token-ids tensor name",
        json_schema_extra={"group": "advanced"},
    )
    instance_count: int = Field(1, ge=1, le=64, title="Model instances", json_schema_extra={"group": "server"})
    start_timeout_s: float | None = Field(
        None, gt=0, title="Server start timeout (s)", json_schema_extra={"group": "advanced"}
    )
    record_routing: bool = Field(
        True,
        description="Managed server: MoE Bench's model counts each request's expert routing at its gates and "
        "returns it (the run's routing record, as the native engine's)",
        title="Record expert routing",
        json_schema_extra={"group": "server"},
    )
    routing_name: str | None = Field(
        "expert_routing",
        description="Output holding a request's routing counts (JSON shape + counts); empty: none",
        title="Routing output name",
        json_schema_extra={"group": "advanced"},
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_openai_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(k in data for k in _OPENAI_ONLY_FIELDS):
            data = {k: v for k, v in data.items() if k not in _OPENAI_ONLY_FIELDS}
        return data


def triton_python() -> str:
    """The interpreter of the Triton environment (``MOEBENCH_TRITON_PYTHON``, else ``.venv-triton``)."""
    configured = os.environ.get("MOEBENCH_TRITON_PYTHON", "")
    if configured:
        return configured
    return str(PROJECT_ROOT / ".venv-triton" / "bin" / "python")


_PROBE = r"""
import importlib.util as u, json, sys, sysconfig
spec = u.find_spec("pytriton")
root = None
if spec and spec.submodule_search_locations:
    root = list(spec.submodule_search_locations)[0]
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2],
    "libdir": sysconfig.get_config_var("LIBDIR"),
    "purelib": sysconfig.get_paths()["purelib"],
    "pytriton": root,
    "torch": u.find_spec("torch") is not None,
    "transformers": u.find_spec("transformers") is not None,
}))
"""


def server_env() -> tuple[dict[str, Any] | None, str]:
    """(layout, reason): where tritonserver, its Python backend and the model's packages are."""
    python = triton_python()
    if not os.path.exists(python):
        return None, f"no Triton environment at {python}: run `make triton` (or set MOEBENCH_TRITON_PYTHON)"
    info = probe_interpreter(python, _PROBE)
    if "error" in info:
        return None, info["error"]
    if not (info.get("torch") and info.get("transformers")):
        return None, f"{python} lacks torch/transformers, which the Triton model needs"
    system = os.environ.get("MOEBENCH_TRITON_SERVER") or shutil.which("tritonserver")
    if system:
        return {"server": system, "backends": None, **info}, ""
    if not info.get("pytriton"):
        return None, f"no tritonserver on PATH and no nvidia-pytriton in {python}: run `make triton`"
    root = Path(info["pytriton"]) / "tritonserver"
    stub = root / "python_backend_stubs" / info["version"] / "triton_python_backend_stub"
    if not stub.exists():
        return None, f"nvidia-pytriton has no Python-backend stub for Python {info['version']}"
    return {
        "server": str(root / "bin" / "tritonserver"),
        "backends": str(root / "backends"),
        "stub": str(stub),
        "libs": str(Path(info["pytriton"]).parent / "nvidia_pytriton.libs"),
        **info,
    }, ""


def write_repository(
    repo: Path,
    name: str,
    model_dir: str,
    device: str,
    dtype: str,
    instances: int,
    extra_sys_path: list[str],
    record_routing: bool = True,
) -> Path:
    """Write a Triton model repository with one decoupled Python-backend model; return it."""
    model = repo / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    source = MODEL_TEMPLATE.read_text(encoding="utf-8")
    source = source.replace("EXTRA_SYS_PATH: list = []", f"EXTRA_SYS_PATH: list = {json.dumps(extra_sys_path)}", 1)
    (model / "1" / "model.py").write_text(source, encoding="utf-8")
    kind = "KIND_GPU" if device.startswith("cuda") else "KIND_CPU"
    config = f"""name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "ignore_eos" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "expert_routing" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: {kind} }} ]
parameters {{ key: "model_dir" value: {{ string_value: {json.dumps(model_dir)} }} }}
parameters {{ key: "device" value: {{ string_value: "{device}" }} }}
parameters {{ key: "dtype" value: {{ string_value: "{dtype}" }} }}
parameters {{ key: "record_routing" value: {{ string_value: "{str(record_routing).lower()}" }} }}
"""
    (model / "config.pbtxt").write_text(config, encoding="utf-8")
    return repo


@register_engine
class TritonEngine(ServerEngine):
    """Triton's generate extension (connect or managed); see the module docstring."""

    kind = "triton"
    label = "Triton Inference Server"
    options_model = TritonOptions

    server_label = "tritonserver"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.topts: TritonOptions = options
        self.metrics_url: str | None = options.metrics_url
        self._rates = CounterRates()
        self._work: Path | None = None  # the model repository and backend folder of a managed server

    def stop(self) -> None:
        """Stop the server (and wait until its processes are gone), then remove its scratch folder."""
        super().stop()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def health_url(self) -> str:
        return f"{self.base_url}/v2/models/{self.served_name}/ready"

    @property
    def served_name(self) -> str:
        return self.topts.model_name

    @classmethod
    def availability(cls) -> Availability:
        _, reason = server_env()
        if reason:
            return Availability(True, f"connect only (base_url): managed server unavailable: {reason}")
        return Availability(True)

    # --- lifecycle --------------------------------------------------------------------
    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        report = progress or (lambda msg, frac: None)
        if self.topts.base_url:
            self._load_tokenizer(report)
            self._client = self._make_client()
            report(f"connecting to {self.base_url}", 0.8)
            self._check_server()
            self.started = True
            report("ready", 1.0)
            return
        self._launch(report)

    def _launch(self, report: ProgressFn) -> None:
        layout, reason = server_env()
        if layout is None:
            raise EngineUnavailable(f"cannot launch Triton: {reason}")
        acc = self.topts.accelerator
        if acc not in ("cpu", "cuda"):
            raise EngineUnavailable(f"the managed Triton model runs on cpu or cuda, not {acc}")
        from engines.accelerators import get_accelerator
        from engines.models import resolve_model

        if acc == "cuda":
            get_accelerator("cuda").require()
        report("resolving model", 0.02)
        _name, path = resolve_model(self.topts.model)
        self.checkpoint_dir = str(path)
        dtype = self.topts.dtype
        if dtype == "auto":
            dtype = "float32" if acc == "cpu" else "bfloat16"
        self._dtype = dtype  # what the model computes in (describe() says it; the run's limits read it)
        settings = get_settings()
        work = settings.data_dir / "triton" / f"{os.getpid()}-{id(self) & 0xFFFF:04x}"
        self._work = work
        repo = write_repository(
            work / "repo",
            self.topts.model_name,
            str(path),
            "cuda:0" if acc == "cuda" else "cpu",
            dtype,
            self.topts.instance_count,
            [layout["purelib"], str(PROJECT_ROOT)],
            self.topts.record_routing,
        )
        env = dict(os.environ)
        backend_args: list[str] = []
        if layout.get("backends"):
            # pytriton's server: a backend folder holding its Python backend and the stub built
            # for this interpreter; the stub links libpython (LIBDIR) and the wheel's own libs.
            backends = work / "backends" / "python"
            backends.mkdir(parents=True, exist_ok=True)
            for item in ("libtriton_python.so", "triton_python_backend_utils.py"):
                target = backends / item
                if not target.exists():
                    target.symlink_to(Path(layout["backends"]) / "python" / item)
            stub = backends / "triton_python_backend_stub"
            if not stub.exists():
                shutil.copy2(layout["stub"], stub)
            backend_args = ["--backend-directory", str(work / "backends")]
            libs = [layout["libdir"], layout["libs"], env.get("LD_LIBRARY_PATH", "")]
            env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
        host = settings.host
        http, grpc, metrics = free_port(host), free_port(host), free_port(host)
        argv = [
            layout["server"], "--model-repository", str(repo), *backend_args,
            "--http-address", host, "--http-port", str(http),
            "--grpc-address", host, "--grpc-port", str(grpc),
            "--metrics-address", host, "--metrics-port", str(metrics),
            "--exit-on-error", "true", "--disable-auto-complete-config", "--log-verbose", "0",
        ]  # fmt: skip
        self._load_tokenizer(report)
        report(f"starting tritonserver on port {http}", 0.15)
        self.metrics_url = f"http://{host}:{metrics}/metrics"
        try:
            self.launch(argv, f"http://{host}:{http}", report, env=env, timeout=self.topts.start_timeout_s)
        except EngineUnavailable as exc:
            reason = _model_load_error(self.server) if self.server is not None else None
            if reason:
                raise EngineUnavailable(f"Triton could not load the model: {reason}") from exc
            raise
        self.started = True
        report("ready", 1.0)

    def _check_server(self) -> None:
        import httpx

        try:
            ready = http_get(self._client, f"{self.base_url}/v2/health/ready", timeout=10.0)
            model = http_get(self._client, f"{self.base_url}/v2/models/{self.served_name}/ready", timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(
                f"cannot reach Triton at {self.base_url}: {type(exc).__name__}: {one_line(exc, 200) or 'no answer'}"
            ) from exc
        if ready.status_code != 200:
            raise EngineUnavailable(f"Triton at {self.base_url} is not ready (HTTP {ready.status_code})")
        if model.status_code != 200:
            raise EngineUnavailable(
                f"model '{self.served_name}' is not ready on Triton at {self.base_url} (HTTP {model.status_code}): "
                f"{error_message(model.content)}"
            )
        if self.metrics_url is None:
            from urllib.parse import urlsplit

            parts = urlsplit(self.base_url)
            self.metrics_url = f"{parts.scheme}://{parts.hostname}:{self.topts.metrics_port}/metrics"

    # --- requests ---------------------------------------------------------------------
    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        o, sp = self.topts, request.sampling
        body: dict[str, Any] = {o.input_name: request.prompt, o.max_tokens_name: sp.max_tokens}
        if o.stream_name:
            body[o.stream_name] = True
        if o.ignore_eos_name and sp.ignore_eos and o.exact_lengths:
            body[o.ignore_eos_name] = True
        if sp.temperature > 0:
            body.update(temperature=sp.temperature, top_p=sp.top_p)
        return body

    def async_capable(self) -> bool:
        return False  # generate_stream goes through the threaded client (stream below)

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        url = f"{self.base_url}/v2/models/{self.served_name}/generate_stream"
        with self.post_stream(url, self.request_body(request), "Triton") as chunks:
            yield from self._triton_events(chunks, cancel)

    def _triton_events(self, chunks: Iterator[bytes], cancel: threading.Event | None) -> Iterator[StreamChunk]:
        o = self.topts
        counter = TextCounter(self._tokenizer)
        for payload in sse_payloads(chunks):
            if cancel is not None and cancel.is_set():
                return
            obj = sse_object(payload, "Triton")
            if "error" in obj:
                raise RequestFailed(f"Triton error: {one_line(obj['error'], 200)}")
            if o.routing_name and o.routing_name in obj:
                yield StreamChunk(text="", tokens=0, routing=routing_payload(obj[o.routing_name]))
                continue
            if o.output_name not in obj:
                continue
            text = obj[o.output_name]
            text = text if isinstance(text, str) else json.dumps(text)
            if o.tokens_name and o.tokens_name in obj:
                n, guess = int(obj[o.tokens_name]), False
            else:  # the tokenizer's count of the text so far; one per response without one
                n, guess = counter.add(text, True), counter.tokenizer is None
            yield StreamChunk(text=text, tokens=n, estimated=guess)

    # --- telemetry and health ---------------------------------------------------------
    def telemetry(self) -> dict[str, float]:
        if not self.metrics_url or self._client is None:
            return {}
        try:
            text = self.probe_client().get(self.metrics_url, timeout=2.0).text
        except Exception:  # noqa: BLE001 - no metrics endpoint: a gap in the series
            return {}
        values = parse_prometheus(text)
        out: dict[str, float] = {}
        for prom, name in GAUGES.items():
            if prom in values:
                v = values[prom]
                out[name] = v / 1024**3 if name.endswith("_gib") else v * (100.0 if name.endswith("_pct") else 1.0)
        out.update(self._rates.update({name: values[prom] for prom, name in COUNTERS.items() if prom in values}))
        return out

    def served_dtype(self) -> str:
        """The managed model's dtype as MoE Bench wrote it: ``auto`` is float32 on CPU, bfloat16 on CUDA."""
        return getattr(self, "_dtype", None) or super().served_dtype()

    def routing_layout(self) -> dict[str, Any] | None:
        """The managed model's MoE layers (MoE Bench's model counts at their gates), from its config."""
        if self.topts.base_url or not self.topts.record_routing or not getattr(self, "checkpoint_dir", None):
            return None
        try:
            cfg = json.loads((Path(self.checkpoint_dir) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        first, total = int(cfg.get("first_k_dense_replace", 0) or 0), int(cfg.get("num_hidden_layers", 0) or 0)
        return {
            "layers": [f"layer {i}" for i in range(first, total)],
            "num_experts": cfg.get("n_routed_experts"),
            "top_k": cfg.get("num_experts_per_tok"),
            "n_group": cfg.get("n_group") or 1,
            "source": "counted at the gates of the Triton server's model (MoE Bench's Python backend), per request",
        }

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            engine="triton",
            base_url=self.base_url,
            triton_model=self.served_name,
            metrics_url=self.metrics_url,
        )
        return info


def routing_payload(value: Any) -> Any:
    """A response's routing output (JSON ``{"shape": [...], "counts": [...]}``, as MoE Bench's model
    sends it) as an int array of that shape; what cannot be read is passed on as it came, for the
    recorder to refuse with its reason (engines.routing.check_routing)."""
    import numpy as np

    try:
        obj = json.loads(value) if isinstance(value, str) else value
        return np.asarray(obj["counts"], dtype=np.int64).reshape(obj["shape"])
    except (ValueError, TypeError, KeyError, IndexError):
        return str(value)[:80]


def _model_load_error(server: ManagedProcess) -> str | None:
    """Triton's own reason when a model failed to load (from its log), one line."""
    for line in reversed(server.tail(200)):
        if "failed to load" in line and "'" in line:
            return one_line(line.split("]", 1)[-1].strip().strip('"'), 400)
    return None

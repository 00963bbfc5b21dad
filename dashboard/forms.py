"""Form specs without Streamlit: engine option fields read from an engine's options model,
and the SLO inputs' texts.

The Engine page draws one widget per :class:`FieldSpec`, so an engine kind registered
later (vLLM with ``tensor_parallel_size``, ``max_num_batched_tokens``, ``quantization``,
``enable_prefix_caching``, ...) shows its own options without any page change. No
Streamlit here: this module only describes the fields and parses the widgets' values.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bench.metrics.slo import Slo, SloError, parse_slos
from engines.base import EngineOptions
from engines.errors import ConfigError

# Fields every engine has; the Engine page draws them itself (model, accelerator, dtype, ...).
COMMON_FIELDS: frozenset[str] = frozenset(EngineOptions.model_fields)

Widget = Literal["checkbox", "int", "float", "select", "text", "json"]


@dataclass(frozen=True)
class FieldSpec:
    """How to draw and parse one option field."""

    name: str
    label: str
    widget: Widget
    default: Any
    optional: bool = False  # None is allowed (an empty text box means "engine default")
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            return args[0], optional
        return annotation, optional
    return annotation, False


def _bounds(info: FieldInfo) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo = m.gt
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi = m.lt
    return lo, hi


def field_spec(name: str, info: FieldInfo) -> FieldSpec:
    """The widget for one pydantic field (unknown types fall back to a JSON text box)."""
    annotation, optional = _strip_optional(info.annotation)
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    label = info.title or name.replace("_", " ")
    help_text = info.description or ""
    lo, hi = _bounds(info)
    common: dict[str, Any] = {"name": name, "label": label, "default": default, "optional": optional, "help": help_text}
    if typing.get_origin(annotation) is Literal:
        # An optional choice offers None first: "engine default" (the engine or library decides).
        choices = ((None,) if optional else ()) + tuple(typing.get_args(annotation))
        return FieldSpec(widget="select", choices=choices, **common)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return FieldSpec(widget="select", choices=tuple(e.value for e in annotation), **common)
    if annotation is bool:
        if optional:  # three states: engine default / on / off
            return FieldSpec(widget="select", choices=(None, True, False), **common)
        return FieldSpec(widget="checkbox", **common)
    if annotation is int:
        return FieldSpec(widget="int", minimum=lo, maximum=hi, **common)
    if annotation is float:
        return FieldSpec(widget="float", minimum=lo, maximum=hi, **common)
    if annotation is str:
        return FieldSpec(widget="text", **common)
    return FieldSpec(widget="json", **common)


# Option groups, in the order the Engine page draws them. The book's 8.2.3 ``LLM(...)``
# arguments come first; what only shapes the client (pool sizes, tensor names, ports) last,
# under "Advanced", closed by default.
GROUP_BOOK = "The book's launch arguments (8.2.3)"
GROUP_SERVER = "Server"
GROUP_CONNECT = "Connection and requests"
GROUP_ADVANCED = "Advanced: client plumbing"
GROUP_TUNING = "Tuning (the book's 8.4.2-8.4.3)"
GROUP_PARALLEL = "Parallelism (several GPUs or nodes)"
OPTION_GROUPS: tuple[str, ...] = (GROUP_BOOK, GROUP_TUNING, GROUP_PARALLEL, GROUP_SERVER, GROUP_CONNECT, GROUP_ADVANCED)

# Field name -> (human label, group). A field missing here keeps its model title (or its
# name with spaces) and goes under "Advanced": a test checks every engine's fields are named.
OPTION_META: dict[str, tuple[str, str]] = {
    # the book's 8.2.3 vLLM arguments
    "tensor_parallel_size": ("Tensor parallel size (GPUs)", GROUP_BOOK),
    "max_num_batched_tokens": ("Max batched tokens per step", GROUP_BOOK),
    "quantization": ("Quantization (e.g. fp8)", GROUP_BOOK),
    "enable_prefix_caching": ("Prefix caching", GROUP_BOOK),
    # the native engine's tuning (book 8.4.2-8.4.3)
    "batch_size": ("Batch size (static batching)", GROUP_TUNING),
    "batch_wait_ms": ("Batch fill wait (ms)", GROUP_TUNING),
    "capture_sizes": ("Graph batch sizes", GROUP_TUNING),
    "cache": ("KV cache", GROUP_TUNING),
    "compile": ("torch.compile mode", GROUP_TUNING),
    "experts_impl": ("Experts kernels", GROUP_TUNING),
    "attn_impl": ("Attention kernels", GROUP_TUNING),
    "inference_mode": ("Inference mode (no autograd)", GROUP_TUNING),
    "cudnn_benchmark": ("cuDNN benchmark (CUDA)", GROUP_TUNING),
    "cuda_graphs": ("CUDA graphs (decode step)", GROUP_TUNING),
    "mla": ("Latent attention (MLA) decode", GROUP_TUNING),
    "router": ("MoE gate (router)", GROUP_TUNING),
    # expert parallelism of the native engine (processes started by MoE Bench)
    "expert_parallel": ("Expert-parallel ranks (processes; all-to-all)", GROUP_PARALLEL),
    # parallel deployments (vLLM)
    "pipeline_parallel_size": ("Pipeline parallel size (stages)", GROUP_PARALLEL),
    "data_parallel_size": ("Data parallel size (replicas, all nodes)", GROUP_PARALLEL),
    "data_parallel_size_local": ("Replicas on this node", GROUP_PARALLEL),
    "data_parallel_address": ("Data-parallel head address", GROUP_PARALLEL),
    "data_parallel_rpc_port": ("Data-parallel RPC port", GROUP_PARALLEL),
    "enable_expert_parallel": ("Expert parallelism (EP)", GROUP_PARALLEL),
    "enable_eplb": ("Expert load balancing (EPLB)", GROUP_PARALLEL),
    "eplb_num_redundant_experts": ("Redundant experts (EPLB)", GROUP_PARALLEL),
    "distributed_executor_backend": ("Worker backend (mp or ray)", GROUP_PARALLEL),
    "ray_address": ("Ray cluster address", GROUP_PARALLEL),
    "cpu_threads_bind": ("CPU cores per worker (cpu)", GROUP_PARALLEL),
    # parallel deployments (LMDeploy)
    "tp": ("Tensor parallel (tp)", GROUP_PARALLEL),
    "dp": ("Data parallel (dp)", GROUP_PARALLEL),
    "ep": ("Expert parallel (ep)", GROUP_PARALLEL),
    # the server's own
    "max_num_seqs": ("Max sequences per step", GROUP_SERVER),
    "max_model_len": ("Max model length (tokens)", GROUP_SERVER),
    "gpu_memory_utilization": ("GPU memory fraction for vLLM", GROUP_SERVER),
    "cpu_kvcache_space_gib": ("CPU KV cache (GiB)", GROUP_SERVER),
    "enforce_eager": ("Eager mode (no CUDA graphs)", GROUP_SERVER),
    "speculative_method": ("Speculative decoding (MTP, n-gram, EAGLE)", GROUP_SERVER),
    "num_speculative_tokens": ("Draft tokens per step", GROUP_SERVER),
    "speculative_model": ("Draft model folder (EAGLE, draft model)", GROUP_SERVER),
    "reasoning_parser": ("Reasoning parser (DeepSeek-R1: thinking streamed apart from the answer)", GROUP_SERVER),
    "served_model_name": ("Served model name", GROUP_SERVER),
    "sglang_expert_distribution_dir": ("SGLang: expert distribution dump folder", GROUP_CONNECT),
    "routed_experts": ("Ask for each request's routed experts (SGLang)", GROUP_CONNECT),
    "routing_pass": ("Routing pass: requests re-sent, not streamed, for routed experts (vLLM)", GROUP_CONNECT),
    "backend": ("LMDeploy backend", GROUP_SERVER),
    "session_len": ("Session length (tokens)", GROUP_SERVER),
    "max_batch_size": ("Max batch size", GROUP_SERVER),
    "cache_max_entry_count": ("KV cache share of free memory", GROUP_SERVER),
    "eager_mode": ("Eager mode", GROUP_SERVER),
    "instance_count": ("Model instances", GROUP_SERVER),
    "model_name": ("Triton model name", GROUP_SERVER),
    "record_routing": ("Record expert routing", GROUP_SERVER),
    "profiler_dir": ("Profiler output folder", GROUP_SERVER),
    "profiler_with_stack": ("Profiler records Python stacks", GROUP_SERVER),
    # where the server is and what a request asks for
    "base_url": ("Server URL (empty: MoE Bench starts one)", GROUP_CONNECT),
    "endpoint": ("API endpoint", GROUP_CONNECT),
    "exact_lengths": ("Exact output length (ignore EOS)", GROUP_CONNECT),
    "tokenizer": ("Tokenizer folder", GROUP_CONNECT),
    "timeout_s": ("Request deadline (s)", GROUP_CONNECT),
    # client plumbing
    "max_connections": ("HTTP connection pool size", GROUP_ADVANCED),
    "send_min_tokens": ("Also send a minimum length (min tokens)", GROUP_ADVANCED),
    "server_token_counts": ("Per-chunk token counts from the server", GROUP_ADVANCED),
    "check_model": ("Check the model is served at start", GROUP_ADVANCED),
    "async_client": ("Asynchronous HTTP client", GROUP_ADVANCED),
    "extra_args": ("Extra server flags (JSON list)", GROUP_ADVANCED),
    "port": ("Server port (empty: a free one)", GROUP_ADVANCED),
    "start_timeout_s": ("Server start timeout (s)", GROUP_ADVANCED),
    "metrics_url": ("Metrics URL", GROUP_ADVANCED),
    "metrics_port": ("Metrics port", GROUP_ADVANCED),
    "input_name": ("Input tensor name", GROUP_ADVANCED),
    "output_name": ("Output tensor name", GROUP_ADVANCED),
    "max_tokens_name": ("Max-tokens tensor name", GROUP_ADVANCED),
    "stream_name": ("Stream tensor name", GROUP_ADVANCED),
    "ignore_eos_name": ("Ignore-EOS tensor name", GROUP_ADVANCED),
    "tokens_name": ("Token-ids tensor name", GROUP_ADVANCED),
    "routing_name": ("Routing output name", GROUP_ADVANCED),
}


def option_fields(options_model: type[BaseModel]) -> list[FieldSpec]:
    """The engine-specific fields of an options model (those not common to every engine),
    with their human labels."""
    out = []
    for n, info in options_model.model_fields.items():
        if n in COMMON_FIELDS:
            continue
        spec = field_spec(n, info)
        if n in OPTION_META and not info.title:
            spec = dataclasses.replace(spec, label=OPTION_META[n][0])
        out.append(spec)
    return out


def grouped_option_fields(options_model: type[BaseModel]) -> list[tuple[str, list[FieldSpec]]]:
    """The option fields by group, groups in :data:`OPTION_GROUPS` order, empty groups left out."""
    by_group: dict[str, list[FieldSpec]] = {g: [] for g in OPTION_GROUPS}
    for spec in option_fields(options_model):
        by_group[OPTION_META.get(spec.name, ("", GROUP_ADVANCED))[1]].append(spec)
    return [(g, specs) for g, specs in by_group.items() if specs]


def parse_value(spec: FieldSpec, raw: Any) -> Any:
    """A widget's raw value -> the field value; an empty optional text box -> None.

    Raises :class:`ConfigError` naming the field for unparsable input (pydantic
    validates ranges later, when the options are built).
    """
    if spec.widget in ("text", "json") and isinstance(raw, str):
        text = raw.strip()
        if not text:
            if spec.optional or spec.default is None:
                return None
            return spec.default if spec.widget == "json" else ""
        if spec.widget == "json":
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{spec.name}: not valid JSON ({exc.msg})") from exc
        return text
    if spec.widget == "int" and raw is not None:
        return int(raw)
    if spec.widget == "float" and raw is not None:
        return float(raw)
    return raw


def widget_default(spec: FieldSpec) -> Any:
    """The value a widget starts with (text boxes show JSON or an empty string for None)."""
    if spec.widget == "json":
        return "" if spec.default is None else json.dumps(spec.default)
    if spec.widget == "text":
        return "" if spec.default is None else str(spec.default)
    return spec.default


# --- SLO inputs --------------------------------------------------------------------------------

SLO_NO_PRESET = "none"  # the preset choice that adds no SLO


def slo_texts(preset: str | None, lines: str | None) -> list[str]:
    """The SLO texts of a preset choice and a free-text box: the preset's name first (unless
    :data:`SLO_NO_PRESET`), then each non-empty line. Not checked: see :func:`checked_slos`."""
    texts = [] if not preset or preset == SLO_NO_PRESET else [str(preset)]
    return texts + [line.strip() for line in str(lines or "").splitlines() if line.strip()]


def checked_slos(texts: list[str]) -> list[Slo]:
    """``texts`` parsed (presets expanded, a later SLO on the same metric and statistic wins);
    :class:`ConfigError` with :mod:`bench.metrics.slo`'s one-line reason for the first bad one."""
    try:
        return parse_slos(texts)
    except SloError as exc:
        raise ConfigError(str(exc)) from None

"""The ``native`` engine: transformers in this process, on the chosen accelerator.

Each request runs ``model.generate`` in its own thread (the seed's 8.4.1 model of
concurrency: no batching across requests) and streams every new token through a
queue as soon as the decode step produced it. ``ignore_eos`` sets
``min_new_tokens = max_tokens`` so the output is exactly ``max_tokens`` tokens long.
A cancel event stops generation at the next decode step. Token ids become text through
:class:`IncrementalDetokenizer`, whose work per token is bounded, so detokenizing stays
linear in the output length on the thread that stamps the chunks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engines import experts, mla, router
from engines.accelerators import Accelerator, Availability, MemoryStats, get_accelerator
from engines.base import (
    Engine,
    EngineOptions,
    GenerationRequest,
    ProgressFn,
    StreamChunk,
    register_engine,
)
from engines.batching import END as BATCH_END
from engines.batching import BatchRows, Failed, Pending, StaticBatcher, left_pad
from engines.errors import ConfigError, EngineUnavailable, ModelLoadError
from engines.graphs import COMPILE_SHAPES, GraphedDecoder, dynamo_name
from engines.models import count_parameters, load_spec
from engines.profiling import ProfileSession, generate_scope
from engines.routing import RoutingRecorder

_END = object()
_REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character


class IncrementalDetokenizer:
    """Token ids in, text deltas out, decoding only a short window of recent ids.

    Decoding every id so far on every step is quadratic in the output length. This
    follows the scheme of vLLM's and TGI's detokenizers: the window holds the ids of
    the last emitted delta (context, since decoders such as SentencePiece's treat the
    start of a string differently) followed by the pending ids; the delta is the
    window's text past what was emitted. Then the pending ids become the context and
    the older ones are dropped, so the ids decoded per :meth:`add` are bounded by
    ``hold_limit`` and the size of the last additions, not by the output length.

    Special tokens, and ids the tokenizer does not know (a model's vocabulary may be
    larger than its tokenizer's), are dropped, as ``decode(..., skip_special_tokens=True)``
    does. Text ending in U+FFFD (a character whose other bytes come in later tokens) is
    held back until it completes. Output that is not valid UTF-8 could hold text back
    indefinitely, so past ``hold_limit`` pending ids all but that last character goes
    out. For byte-level BPE tokenizers the deltas and :meth:`flush` join to exactly
    ``tokenizer.decode(ids, skip_special_tokens=True)``.
    """

    def __init__(self, tokenizer: Any, hold_limit: int = 8) -> None:
        self.tokenizer = tokenizer
        # At least 3: the held character's first byte must be among the pending ids (a
        # byte-level token holds one byte or more, a split character at most 3 bytes) so
        # that dropping the ids before them keeps its bytes together.
        self.hold_limit = max(3, hold_limit)
        self._special = frozenset(tokenizer.all_special_ids)
        self._window: list[int] = []  # context ids, then pending ids
        self._read = 0  # where the pending ids start
        self._context = ""  # the context ids' text
        self._held = 0  # trailing characters of the context not emitted yet (0 or 1)

    def add(self, ids: Iterable[int]) -> str:
        """Take the next ids; return the text they complete (``""`` while a character is split)."""
        ids = list(ids)
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        new = [i for i, t in zip(ids, tokens, strict=True) if t is not None and i not in self._special]
        if not new:
            return ""
        self._window.extend(new)
        text = self._decode(self._window)
        if not text.endswith(_REPLACEMENT):
            return self._advance(text, held=0)
        if len(self._window) - self._read <= self.hold_limit:
            return ""
        return self._advance(text, held=1)

    def flush(self) -> str:
        """Everything not emitted yet, an unfinished character's U+FFFD included (end of stream)."""
        return self._advance(self._decode(self._window), held=0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _advance(self, text: str, held: int) -> str:
        """Emit ``text`` past what went out, less ``held`` final characters; pending ids become the context."""
        start = len(self._context) - self._held
        delta = text[start : len(text) - held]
        held = min(held, max(len(text) - start, 0))  # 0 when that character went out already
        del self._window[: self._read]
        self._read = len(self._window)
        self._context = self._decode(self._window)
        self._held = held if self._context.endswith(_REPLACEMENT) else 0
        return delta


class NativeOptions(EngineOptions):
    """The native engine's options: routing counts, and the book's tuning knobs (8.4.2-8.4.3)."""

    kind: Literal["native"] = "native"
    record_routing: bool = Field(
        True, title="Record expert routing", json_schema_extra={"group": "server"}
    )  # count tokens per expert (hooks on the MoE gates)
    batch_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="Requests in flight decoded together (static batching: up to N per generate call, prompts "
        "left-padded, each sequence streamed and timed on its own). 1: each request runs its own generate "
        "(the book's 8.4.1 model, no batching).",
        title="Batch size (static batching)",
        json_schema_extra={"group": "tuning"},
    )
    batch_wait_ms: float = Field(
        5.0,
        ge=0.0,
        le=10_000.0,
        description="How long a batch waits to fill (ms): it is taken once it is full, or once this long passes "
        "with no new request (a wave still arriving keeps it open, up to 50 times this long).",
        title="Batch fill wait (ms)",
        json_schema_extra={"group": "tuning"},
    )
    capture_sizes: str = Field(
        "",
        description="With cuda_graphs: the batch sizes whose decode step is compiled and captured before a run "
        "starts its clock, comma-separated (e.g. 1,8,32,128); a batch runs in the smallest captured size that holds "
        "it (extra rows padded, their tokens dropped). Empty: 1, 2, 4, ... (powers of two) and batch_size.",
        title="Graph batch sizes",
        json_schema_extra={"group": "tuning"},
    )
    cache: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="KV cache: dynamic grows per step; static is preallocated at prompt + max tokens (fixed shapes, "
        "what compile needs).",
        title="KV cache",
        json_schema_extra={"group": "tuning"},
    )
    compile: Literal["off", "default", "reduce-overhead", "max-autotune"] = Field(
        "off",
        description="torch.compile the decode step (transformers' generate compiles the forward once with a static "
        "cache): off, or the compile mode. Needs cache=static.",
        title="torch.compile mode",
        json_schema_extra={"group": "tuning"},
    )
    experts_impl: Literal["eager", "grouped_mm", "batched_mm", "lean_grouped_mm"] | None = Field(
        None,
        description="How the routed experts are computed: eager (transformers' loop over experts), grouped_mm (its "
        "grouped GEMM), batched_mm (gathers each token's experts' weights), lean_grouped_mm (MoE Bench's grouped "
        "GEMM without transformers' masking, the routing weight on the narrow side: engines/experts.py). Empty: "
        "transformers' default.",
        title="Experts kernels",
        json_schema_extra={"group": "tuning"},
    )
    attn_impl: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None,
        description="Attention kernels: eager, sdpa (PyTorch's), flash_attention_2 (where installed).",
        title="Attention kernels",
        json_schema_extra={"group": "tuning"},
    )
    inference_mode: bool = Field(
        True,
        description="Run generate under torch.inference_mode (off: torch.no_grad).",
        title="Inference mode (no autograd)",
        json_schema_extra={"group": "tuning"},
    )
    cudnn_benchmark: bool = Field(
        False,
        description="torch.backends.cudnn.benchmark: let cuDNN pick its fastest kernels per shape (CUDA only).",
        title="cuDNN benchmark (CUDA)",
        json_schema_extra={"group": "tuning"},
    )
    cuda_graphs: bool = Field(
        False,
        description="Capture the decode step in a CUDA graph (one per batch shape) and replay it each step: the prompt "
        "runs eagerly, then every step is one graph launch over static input buffers. NVIDIA GPUs only; needs "
        "cache=static. With compile=default/max-autotune the step is compiled before it is captured.",
        title="CUDA graphs (decode step)",
        json_schema_extra={"group": "tuning"},
    )
    mla: Literal["expand", "absorbed"] = Field(
        "expand",
        description="Multi-head latent attention in the decode step: expand (transformers: the cached latents are "
        "expanded into every head's keys and values each step) or absorbed (kv_b_proj folded into the query and "
        "the output, attention over the cached latents themselves, as vLLM and SGLang do). DeepSeek-V3 models.",
        title="Latent attention (MLA) decode",
        json_schema_extra={"group": "tuning"},
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        le=64,
        description="Ranks the routed experts spread over (expert parallelism): this process is rank 0 and serves "
        "every request; N-1 follower processes each hold 1/N of every MoE layer's routed experts, and each MoE layer "
        "sends its (token, expert) pairs to the experts' ranks and back by all-to-all (gloo on CPU, NCCL on GPUs, "
        "one GPU per rank). 1: one process.",
        title="Expert-parallel ranks (processes; all-to-all)",
        json_schema_extra={"group": "parallel"},
    )
    router: Literal["transformers", "lean"] = Field(
        "transformers",
        description="The MoE gate: transformers (always runs DeepSeek-V3's group-limited stage: two more top-k per "
        "layer) or lean (skips that stage where it keeps every group, e.g. n_group=1 as the V2-Lite shape: the "
        "same experts and weights, bit for bit: engines/router.py). DeepSeek-V3 gates.",
        title="MoE gate (router)",
        json_schema_extra={"group": "tuning"},
    )

    @field_validator("capture_sizes", mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> str:
        # --engine-opt capture_sizes=128 arrives as the number 128; a list from Python code too
        if isinstance(v, int | float) and not isinstance(v, bool):
            v = str(int(v))
        elif isinstance(v, list | tuple):
            v = ",".join(str(x) for x in v)
        elif not isinstance(v, str):
            raise ValueError(f"capture_sizes takes batch sizes like 1,8,32,128, got {v!r}")
        try:
            sizes = sorted({int(x) for x in v.replace(" ", "").split(",") if x})
        except ValueError:
            raise ValueError(f"capture_sizes takes batch sizes like 1,8,32,128, got '{v}'") from None
        if any(s < 1 for s in sizes):
            raise ValueError(f"capture_sizes takes batch sizes of at least 1, got '{v}'")
        return ",".join(map(str, sizes))

    @model_validator(mode="after")
    def _sizes_fit(self) -> NativeOptions:
        too_big = [s for s in self.graph_sizes() if s > self.batch_size]
        if too_big:
            raise ValueError(f"capture_sizes {too_big} exceed batch_size {self.batch_size}: no batch is that large")
        return self

    def graph_sizes(self) -> list[int]:
        """The batch sizes captured before a run: ``capture_sizes``, else 1, 2, 4, ... and ``batch_size``."""
        if self.capture_sizes:
            sizes = [int(x) for x in self.capture_sizes.split(",")]
            return sorted({*sizes, self.batch_size})  # the largest batch always has its graph
        out, s = [], 1
        while s < self.batch_size:
            out.append(s)
            s *= 2
        return [*out, self.batch_size]


def _installed(*modules: str) -> Availability:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return Availability(False, f"{', '.join(missing)} not installed: pip install -r requirements.txt")
    return Availability(True)


@register_engine
class NativeEngine(Engine):
    """transformers ``generate`` in-process; see the module docstring."""

    kind = "native"
    label = "Native PyTorch / transformers"
    options_model = NativeOptions
    model_in_process = True

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.accelerator: Accelerator = get_accelerator(options.accelerator)
        self.model: Any = None
        self._tokenizer: Any = None
        self.model_name = options.model
        self.model_path: str = ""
        self.num_parameters = 0
        self.load_seconds = 0.0
        self._batcher: StaticBatcher | None = None
        self._graphed: GraphedDecoder | None = None
        self._loaded_impls: tuple[str | None, str | None] | None = None
        self.weights_bytes = 0
        self._routing: RoutingRecorder | None = None
        self._ep: Any = None  # engines.expert_parallel.ServingGroup with expert_parallel > 1

    @classmethod
    def availability(cls) -> Availability:
        return _installed("torch", "transformers")

    def start(self, progress: ProgressFn | None = None) -> None:
        if self.started:
            return
        avail = self.availability()
        if not avail.ok:
            raise EngineUnavailable(f"native engine unavailable: {avail.reason}")
        report = progress or (lambda msg, frac: None)
        self.accelerator.require()
        self._check_tuning()
        dtype = self.accelerator.resolve_dtype(self.options.dtype)
        t0 = time.perf_counter()
        report(f"loading {self.options.model} onto {self.accelerator.name}", 0.2)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        name, path, self.model, self._tokenizer = load_spec(
            self.options.model, self.accelerator.device(), dtype, trust_remote_code=self.options.trust_remote_code
        )
        try:
            self._apply_tuning()
            self._start_expert_parallel(report, dtype)
        except BaseException:
            self.model = None
            raise
        self.accelerator.synchronize()
        self.model_name, self.model_path = name, str(path)
        self.num_parameters = count_parameters(self.model)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.load_seconds = time.perf_counter() - t0
        if getattr(self.options, "record_routing", True):
            self._routing = RoutingRecorder(self.model)
            self._routing.enabled = not getattr(self.options, "cuda_graphs", False)
        self.started = True
        report("ready", 1.0)

    def _start_expert_parallel(self, report: ProgressFn, dtype: Any) -> None:
        o: NativeOptions = self.options  # type: ignore[assignment]
        if o.expert_parallel <= 1:
            return
        from engines.expert_parallel import ServingGroup

        report(f"starting {o.expert_parallel - 1} expert-parallel rank(s)", 0.5)
        resolved = str(dtype).removeprefix("torch.")
        self._ep = ServingGroup(o.model, o.expert_parallel, self.accelerator.name, resolved,
                                experts_impl=o.experts_impl, trust_remote_code=o.trust_remote_code)  # fmt: skip
        try:
            self._ep.start(self.model, report)
        except BaseException:
            self._ep = None
            raise

    def _check_tuning(self) -> None:
        """The tuning options that cannot apply here, refused in one line before anything loads."""
        o: NativeOptions = self.options  # type: ignore[assignment]
        acc = self.accelerator.name
        if o.cudnn_benchmark and acc != "cuda":
            raise ConfigError(f"cudnn_benchmark: cuDNN is NVIDIA's, so it does nothing on {acc}; leave it off")
        if o.compile != "off" and o.cache != "static":
            raise ConfigError(
                f"compile={o.compile} needs cache=static: transformers compiles the decode step only with a "
                "static cache (fixed shapes)"
            )
        if o.expert_parallel > 1 and (o.cuda_graphs or o.compile != "off"):
            raise ConfigError(
                f"expert_parallel={o.expert_parallel} with {'cuda_graphs' if o.cuda_graphs else 'compile'}: the "
                "expert exchange sizes its all-to-alls on the host each layer, which a captured or compiled step "
                "cannot redo; leave cuda_graphs and compile off"
            )
        if self._ep is not None and (self._ep.world, self._ep.experts_impl) != (o.expert_parallel, o.experts_impl):
            raise ConfigError(
                "expert_parallel and experts_impl cannot change on a loaded expert-parallel model (the other ranks "
                "hold their experts as loaded); stop the engine and start it again"
            )
        if o.attn_impl == "flash_attention_2":
            import importlib.util

            if acc != "cuda":
                raise ConfigError(f"attn_impl=flash_attention_2: FlashAttention runs on NVIDIA GPUs, not on {acc}")
            if importlib.util.find_spec("flash_attn") is None:
                raise ConfigError("attn_impl=flash_attention_2: the flash-attn package is not installed")
        if o.cuda_graphs:
            if acc != "cuda":
                raise ConfigError(f"cuda_graphs: CUDA graphs need an NVIDIA GPU; this run is on {acc}")
            if o.cache != "static":
                raise ConfigError(
                    "cuda_graphs needs cache=static: a captured step writes into cache buffers fixed at capture"
                )
            if o.compile == "reduce-overhead":
                raise ConfigError(
                    "cuda_graphs with compile=reduce-overhead: that mode captures CUDA graphs of its own; use "
                    "compile=default or max-autotune"
                )
            if o.experts_impl == "eager":
                raise ConfigError(
                    "cuda_graphs with experts_impl=eager: its loop picks the experts to run on the host (nonzero), "
                    "which a replayed graph cannot redo; use grouped_mm or batched_mm"
                )
            if o.attn_impl == "flash_attention_2":
                raise ConfigError("cuda_graphs with attn_impl=flash_attention_2: the captured step needs sdpa or eager")

    def _apply_tuning(self) -> None:
        """Experts and attention kernels, and how generate compiles (see :class:`NativeOptions`)."""
        import torch

        o: NativeOptions = self.options  # type: ignore[assignment]
        if o.cudnn_benchmark or self.accelerator.name == "cuda":
            torch.backends.cudnn.benchmark = o.cudnn_benchmark
        cfg = self.model.config
        if self._loaded_impls is None:  # what transformers chose at load: "default" when retuned back
            self._loaded_impls = (
                getattr(cfg, "_experts_implementation", None),
                getattr(cfg, "_attn_implementation", None),
            )
        for option, value, setter, loaded in (
            ("experts_impl", o.experts_impl, "set_experts_implementation", self._loaded_impls[0]),
            ("attn_impl", o.attn_impl, "set_attn_implementation", self._loaded_impls[1]),
        ):
            value = value if value is not None else loaded
            if value is None:
                continue
            if not hasattr(self.model, setter):
                raise ConfigError(f"{option}={value}: this transformers model cannot switch its {option}")
            if value == experts.NAME and (reason := experts.register()):
                raise ConfigError(reason)
            try:
                getattr(self.model, setter)(value)
            except (ValueError, ImportError, RuntimeError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigError(f"{option}={value} is unavailable here: {first}") from exc
        gc = self.model.generation_config
        if o.compile == "off":
            # generate would compile by itself on CUDA with a static cache: only when asked.
            gc.disable_compile = True
        else:
            # generate's compiled forward meets a new shape per batch size and cache length: past
            # torch's default of 8 it runs uncompiled unnoticed (met by the captured step on the
            # H100; likely what made an H200 batch-32 compile row warm up in 4.8 s and step as
            # eager). Raised for the process and left raised (a higher limit changes nothing else);
            # past 64 shapes generate's path still falls back unnoticed: only the captured step
            # counts its uncompiled shapes.
            import torch._dynamo.config as dc
            from transformers import CompileConfig

            if name := dynamo_name(dc, "recompile_limit", "cache_size_limit"):
                setattr(dc, name, max(int(getattr(dc, name)), COMPILE_SHAPES))
            cc = CompileConfig(mode=o.compile, fullgraph=False)
            cc._compile_all_devices = self.accelerator.name != "cuda"  # generate compiles only on GPUs by default
            gc.compile_config = cc
            gc.disable_compile = False
        reason = mla.unsupported(self.model) if o.mla == "absorbed" else None
        if reason:
            raise ConfigError(reason)
        mla.set_absorbed(self.model, o.mla == "absorbed")
        reason = router.unsupported(self.model) if o.router == "lean" else None
        if reason:
            raise ConfigError(reason)
        router.set_lean(self.model, o.router == "lean")
        self._graphed = None
        if o.cuda_graphs:
            impls = (getattr(cfg, "_experts_implementation", None), getattr(cfg, "_attn_implementation", None))
            if impls[0] == "eager":
                raise ConfigError(
                    "cuda_graphs: this model resolved experts_impl=eager, whose host-side expert loop a graph "
                    "cannot replay; set experts_impl=grouped_mm"
                )
            if impls[1] not in ("sdpa", "eager"):
                raise ConfigError(f"cuda_graphs: the captured step needs attn_impl sdpa or eager, not {impls[1]}")
            if impls[0] in ("grouped_mm", experts.NAME) and self.model.dtype == torch.float32:
                raise ConfigError(
                    f"cuda_graphs with float32 {impls[0]} experts: torch's float32 grouped GEMM copies through the "
                    "host, which a capture forbids; use bfloat16 or experts_impl=batched_mm"
                )
            self._graphed = GraphedDecoder(self.model, o.compile)
        if self._routing is not None:
            self._routing.enabled = not o.cuda_graphs  # gate hooks cannot run inside a replayed graph
        if o.batch_size > 1 or o.cuda_graphs:  # the graphed path decodes through the batcher (a batch of 1 too)
            self._batcher = StaticBatcher(self._run_batch, o.batch_size, o.batch_wait_ms / 1000.0)

    def retune(self, **changes: Any) -> None:
        """Apply other tuning options to the loaded model without loading it again (the tuning
        benchmark's ablation); refused in one line, the old tuning kept, where one cannot apply.
        Call it between runs, not during one."""
        if self.model is None:
            raise EngineUnavailable("the native engine is not started; load the model first")
        old = self.options
        new = type(old).model_validate({**old.model_dump(), **changes})
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self.options = new
        try:
            self._check_tuning()
            self._apply_tuning()
        except BaseException:
            self.options = old
            self._apply_tuning()
            raise

    def prepare(
        self,
        requests: Sequence[GenerationRequest],
        concurrency: int,
        progress: Callable[[str], None] | None = None,
    ) -> str | None:
        """With ``cuda_graphs``: compile and capture the decode step for every batch size the run can
        form (:meth:`NativeOptions.graph_sizes` up to its concurrency) at the cache length of its
        longest sampled prompt and output, before the clock; a batch then runs in the smallest
        captured size that holds it. Without graphs there is nothing to prepare."""
        if self._graphed is None or not requests:
            return None
        o: NativeOptions = self.options  # type: ignore[assignment]
        most = max(1, min(o.batch_size, concurrency))
        sizes = o.graph_sizes()
        sizes = [s for s in sizes if s < most] + [next(s for s in sizes if s >= most)]
        width = max(len(self._prompt_ids(r)) for r in requests)
        max_new = max(r.sampling.max_tokens for r in requests)
        before, t0 = self._graphed.captures, time.perf_counter()
        say = progress or (lambda line: None)

        def step(i: int, n: int, size: int) -> None:
            spent = time.perf_counter() - t0
            say(f"compiling and capturing the decode step for batch {size} ({i + 1}/{n}, {spent:.0f} s so far)")

        with self._grad_mode():
            self._graphed.prepare(sizes, width, max_new, step)
        self.accelerator.synchronize()
        new = self._graphed.captures - before
        return (
            f"decode step captured for batch sizes {', '.join(map(str, sizes))} (prompts up to {width} tokens, "
            f"{max_new} out) before the clock: {new} new in {time.perf_counter() - t0:.1f} s"
        )

    def tuning(self) -> dict[str, Any]:
        """The tuning in effect (what transformers resolved, not only what was asked)."""
        o: NativeOptions = self.options  # type: ignore[assignment]
        cfg = self.model.config if self.model is not None else None
        tuning: dict[str, Any] = {
            "batch_size": o.batch_size,
            "cache": o.cache,
            "compile": o.compile,
            "experts_impl": getattr(cfg, "_experts_implementation", None) if cfg is not None else o.experts_impl,
            "attn_impl": getattr(cfg, "_attn_implementation", None) if cfg is not None else o.attn_impl,
            "inference_mode": o.inference_mode,
            "cudnn_benchmark": o.cudnn_benchmark,
            "cuda_graphs": o.cuda_graphs,
            "mla": o.mla,
            "router": o.router,
            "expert_parallel": o.expert_parallel,
        }
        if self._graphed is not None:
            tuning["cuda_graphs_captured"] = self._graphed.captures
            tuning["cuda_graphs_capture_s"] = round(self._graphed.capture_s, 3)
            tuning["cuda_graphs_pipelined"] = self._graphed.pipeline
            if self._graphed.compile_mode != "off":  # shapes torch would not compile (its recompile limit)
                tuning["cuda_graphs_uncompiled"] = len(self._graphed.uncompiled)
        return tuning

    def stop(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self._graphed = None
        if self._routing is not None:
            self._routing.close()
            self._routing = None
        if self._ep is not None:
            self._ep.stop()
            self._ep = None
        self.model = None
        self._tokenizer = None
        self.started = False
        import gc

        gc.collect()
        if self.accelerator.name != "cpu" and self.accelerator.availability().ok:
            empty = getattr(self.accelerator._torch_module(), "empty_cache", None)  # type: ignore[attr-defined]
            if empty is not None:
                empty()

    def tokenizer(self) -> Any | None:
        return self._tokenizer

    def context_length(self) -> int | None:
        n = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def expert_routing(self) -> dict[str, Any] | None:
        if self._routing is None or not self._routing.enabled:
            return None  # with cuda_graphs the decode steps run no hooks: counts would cover the prompts only
        return self._routing.snapshot()

    def reset_expert_routing(self) -> None:
        if self._routing is not None:
            self._routing.reset()

    def health(self) -> str | None:
        return self._ep.health() if self._ep is not None else None

    def communication(self) -> dict[str, Any] | None:
        return self._ep.communication() if self._ep is not None else None

    def reset_communication(self) -> None:
        if self._ep is not None:
            self._ep.reset()

    def profiler(self, trace_path: Any, with_stack: bool = True) -> ProfileSession:
        if not self.started or self.model is None:
            raise EngineUnavailable("the native engine is not started; load the model first")
        return ProfileSession(self.model, self.accelerator.name, trace_path, with_stack=with_stack)

    def memory(self) -> MemoryStats | None:
        return self.accelerator.memory()

    def reset_peak_memory(self) -> None:
        self.accelerator.reset_peak()

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        info = super().describe()
        info.update(
            model=self.model_name,
            model_path=self.model_path,
            dtype=str(self.model.dtype).removeprefix("torch.") if self.model is not None else self.options.dtype,
            device=self.accelerator.device_name(),
            parameters=self.num_parameters,
            weights_gib=self.weights_bytes / 1024**3,
            load_seconds=round(self.load_seconds, 3),
            versions={"torch": torch.__version__, "transformers": transformers.__version__},
            tuning=self.tuning(),
        )
        if self.model is not None:
            # The config's plain fields (sizes, layer counts, expert counts): what a run's
            # limits are computed from (bench.metrics.run_limits), also for a run imported elsewhere.
            cfg = self.model.config.to_dict()
            info["model_config"] = {
                k: v for k, v in cfg.items() if v is None or isinstance(v, bool | int | float | str)
            }
        return info

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        else:
            ids = self._tokenizer(request.prompt, add_special_tokens=True).input_ids
        if not ids:
            raise ModelLoadError("empty prompt")
        return ids

    def _grad_mode(self) -> Any:
        import torch

        return torch.inference_mode() if getattr(self.options, "inference_mode", True) else torch.no_grad()

    def _gen_kwargs(
        self, sp: Any, input_ids: Any, attention_mask: Any, max_new: int, streamer: Any, stopping: Any
    ) -> dict[str, Any]:
        from transformers import StoppingCriteriaList

        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "max_new_tokens": max_new,
            "streamer": streamer,
            "stopping_criteria": StoppingCriteriaList([stopping]),
            "pad_token_id": self._tokenizer.pad_token_id,
        }
        if getattr(self.options, "cache", "dynamic") == "static":
            kwargs["cache_implementation"] = "static"
        if sp.ignore_eos:
            kwargs["min_new_tokens"] = max_new
        if sp.temperature > 0:
            kwargs.update(do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kwargs

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        if not self.started or self.model is None:
            raise EngineUnavailable("the native engine is not started; load the model first")
        if self._batcher is not None:
            yield from self._stream_batched(request, cancel)
            return
        import torch

        out_q: queue.Queue[Any] = queue.Queue()
        stop_event = threading.Event()
        streamer_cls, cancel_cls = _generation_hooks()

        sp = request.sampling
        input_ids = torch.tensor([self._prompt_ids(request)], dtype=torch.long, device=self.accelerator.device())
        gen_kwargs = self._gen_kwargs(
            sp,
            input_ids,
            torch.ones_like(input_ids),
            sp.max_tokens,
            streamer_cls(out_q),
            cancel_cls(stop_event, cancel),
        )

        errors: list[BaseException] = []
        model = self.model

        def _run() -> None:
            try:
                if sp.seed is not None:
                    torch.manual_seed(sp.seed)
                with self._grad_mode(), generate_scope():
                    model.generate(**gen_kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer thread
                errors.append(exc)
                out_q.put(_END)

        worker = threading.Thread(target=_run, name=f"native-gen-{request.request_id}", daemon=True)
        worker.start()
        yield StreamChunk(text="", tokens=0, prompt_tokens=int(input_ids.shape[1]))
        detok = IncrementalDetokenizer(self._tokenizer)  # no flush at the end: an unfinished character is not text
        try:
            while True:
                item = out_q.get()
                if item is _END:
                    break
                yield StreamChunk(text=detok.add(item), tokens=len(item), token_ids=tuple(item))
            if errors:
                exc = errors[0]
                raise RuntimeError(f"generate failed: {type(exc).__name__}: {exc}") from exc
        finally:
            stop_event.set()
            worker.join(timeout=30)

    def _stream_batched(self, request: GenerationRequest, cancel: threading.Event | None) -> Iterator[StreamChunk]:
        """One request of a static batch (:mod:`engines.batching`): its own stream of its own row."""
        assert self._batcher is not None
        sp = request.sampling
        pending = Pending(ids=self._prompt_ids(request), max_tokens=sp.max_tokens, sampling=sp, cancel=cancel)
        self._batcher.submit(pending)
        yield StreamChunk(text="", tokens=0, prompt_tokens=len(pending.ids))
        detok = IncrementalDetokenizer(self._tokenizer)
        try:
            while True:
                item = pending.out_q.get()
                if item is BATCH_END:
                    break
                if isinstance(item, Failed):
                    exc = item.error
                    raise RuntimeError(f"generate failed: {type(exc).__name__}: {exc}") from exc
                yield StreamChunk(text=detok.add(item), tokens=len(item), token_ids=tuple(item))
        finally:
            pending.left.set()

    def _run_batch(self, batch: list[Pending]) -> None:
        """One generate over ``batch`` (on the batcher's thread): prompts left-padded to one
        length, each decode step's tokens routed to each row's stream."""
        import torch

        dev = self.accelerator.device()
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        ids, mask = left_pad([p.ids for p in batch], pad)
        sp = batch[0].sampling
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        rows = BatchRows(batch, eos_ids, stop_at_eos=not sp.ignore_eos)
        max_new = max(p.max_tokens for p in batch)
        if self._graphed is not None:
            try:
                if sp.seed is not None:
                    torch.manual_seed(sp.seed)
                with self._grad_mode():
                    self._graphed.decode(
                        [p.ids for p in batch],
                        pad,
                        max_new,
                        on_step=rows.step,
                        done=lambda: all(rows.done()),
                        suppress=eos_ids if sp.ignore_eos else (),
                        temperature=sp.temperature,
                        top_p=sp.top_p,
                    )
            except BaseException as exc:  # noqa: BLE001 - every open stream of the batch gets the reason
                rows.finish(exc)
                return
            rows.finish()
            return
        streamer_cls, stop_cls = _batch_hooks()
        kwargs = self._gen_kwargs(
            sp,
            torch.tensor(ids, dtype=torch.long, device=dev),
            torch.tensor(mask, dtype=torch.long, device=dev),
            max_new,
            streamer_cls(rows),
            stop_cls(rows),
        )
        try:
            if sp.seed is not None:
                torch.manual_seed(sp.seed)
            with self._grad_mode(), generate_scope():
                self.model.generate(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - every open stream of the batch gets the reason
            rows.finish(exc)
            return
        rows.finish()


_BATCH_HOOKS: tuple[type, type] | None = None


def _batch_hooks() -> tuple[type, type]:
    """The streamer and stopping criterion of a batched generate (defined once, see :func:`_generation_hooks`)."""
    global _BATCH_HOOKS
    if _BATCH_HOOKS is None:
        import torch
        from transformers import StoppingCriteria
        from transformers.generation.streamers import BaseStreamer

        class RowStreamer(BaseStreamer):
            """Each decode step's tokens, one per row, to the rows' streams (the prompt is skipped)."""

            def __init__(self, rows: BatchRows) -> None:
                self.rows = rows
                self.prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                self.rows.step(value.reshape(-1).tolist())

            def end(self) -> None:
                self.rows.finish()

        class RowsDone(StoppingCriteria):
            """Rows that reached their own length, their EOS, or were cancelled: generate pads them."""

            def __init__(self, rows: BatchRows) -> None:
                self.rows = rows

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.tensor(self.rows.done(), dtype=torch.bool, device=input_ids.device)

        _BATCH_HOOKS = (RowStreamer, RowsDone)
    return _BATCH_HOOKS


_HOOKS: tuple[type, type] | None = None


def _generation_hooks() -> tuple[type, type]:
    """The streamer and stopping-criterion classes ``generate`` is given, defined once.

    Defined on first use (transformers is imported lazily), not per request: a class made
    per call is a few KB that transformers' and abc's caches kept alive, a leak of about
    1.2 KB per completed request (studies/memory_per_request.py).
    """
    global _HOOKS
    if _HOOKS is None:
        import torch
        from transformers import StoppingCriteria
        from transformers.generation.streamers import BaseStreamer

        class QueueStreamer(BaseStreamer):
            """Puts each generated step's ids on a queue (the prompt, sent first, is skipped)."""

            def __init__(self, out_q: queue.Queue[Any]) -> None:
                self.out_q = out_q
                self.prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:  # generate() first sends the prompt
                    self.prompt_seen = True
                    return
                self.out_q.put(value.reshape(-1).tolist())

            def end(self) -> None:
                self.out_q.put(_END)

        class CancelCriterion(StoppingCriteria):
            """Stops generating once the consumer left or the run was cancelled."""

            def __init__(self, stop_event: threading.Event, cancel: threading.Event | None) -> None:
                self.stop_event, self.cancel = stop_event, cancel

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                flag = self.stop_event.is_set() or (self.cancel is not None and self.cancel.is_set())
                return torch.full((input_ids.shape[0],), flag, dtype=torch.bool, device=input_ids.device)

        _HOOKS = (QueueStreamer, CancelCriterion)
    return _HOOKS

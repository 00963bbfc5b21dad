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
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from engines.accelerators import Accelerator, Availability, MemoryStats, get_accelerator
from engines.base import (
    Engine,
    EngineOptions,
    GenerationRequest,
    ProgressFn,
    StreamChunk,
    register_engine,
)
from engines.errors import EngineUnavailable, ModelLoadError
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
    kind: Literal["native"] = "native"
    record_routing: bool = True  # count tokens per expert (hooks on the MoE gates)


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
        self.weights_bytes = 0
        self._routing: RoutingRecorder | None = None

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
        dtype = self.accelerator.resolve_dtype(self.options.dtype)
        t0 = time.perf_counter()
        report(f"loading {self.options.model} onto {self.accelerator.name}", 0.2)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        name, path, self.model, self._tokenizer = load_spec(
            self.options.model, self.accelerator.device(), dtype, trust_remote_code=self.options.trust_remote_code
        )
        self.accelerator.synchronize()
        self.model_name, self.model_path = name, str(path)
        self.num_parameters = count_parameters(self.model)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.load_seconds = time.perf_counter() - t0
        if getattr(self.options, "record_routing", True):
            self._routing = RoutingRecorder(self.model)
        self.started = True
        report("ready", 1.0)

    def stop(self) -> None:
        if self._routing is not None:
            self._routing.close()
            self._routing = None
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
        return self._routing.snapshot() if self._routing is not None else None

    def reset_expert_routing(self) -> None:
        if self._routing is not None:
            self._routing.reset()

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
        )
        if self.model is not None:
            # The config's plain fields (sizes, layer counts, expert counts): what a run's
            # limits are computed from (bench.run_limits), also for a run imported elsewhere.
            cfg = self.model.config.to_dict()
            info["model_config"] = {
                k: v for k, v in cfg.items() if v is None or isinstance(v, bool | int | float | str)
            }
        return info

    def _input_ids(self, request: GenerationRequest) -> Any:
        import torch

        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        else:
            ids = self._tokenizer(request.prompt, add_special_tokens=True).input_ids
        if not ids:
            raise ModelLoadError("empty prompt")
        return torch.tensor([ids], dtype=torch.long, device=self.accelerator.device())

    def stream(self, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[StreamChunk]:
        if not self.started or self.model is None:
            raise EngineUnavailable("the native engine is not started; load the model first")
        import torch
        from transformers import StoppingCriteriaList

        out_q: queue.Queue[Any] = queue.Queue()
        stop_event = threading.Event()
        streamer_cls, cancel_cls = _generation_hooks()

        sp = request.sampling
        input_ids = self._input_ids(request)
        gen_kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": sp.max_tokens,
            "streamer": streamer_cls(out_q),
            "stopping_criteria": StoppingCriteriaList([cancel_cls(stop_event, cancel)]),
            "pad_token_id": self._tokenizer.pad_token_id,
        }
        if sp.ignore_eos:
            gen_kwargs["min_new_tokens"] = sp.max_tokens
        if sp.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=0)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)

        errors: list[BaseException] = []
        model = self.model

        def _run() -> None:
            try:
                if sp.seed is not None:
                    torch.manual_seed(sp.seed)
                with torch.inference_mode(), generate_scope():
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
                yield StreamChunk(text=detok.add(item), tokens=len(item))
            if errors:
                exc = errors[0]
                raise RuntimeError(f"generate failed: {type(exc).__name__}: {exc}") from exc
        finally:
            stop_event.set()
            worker.join(timeout=30)


_HOOKS: tuple[type, type] | None = None


def _generation_hooks() -> tuple[type, type]:
    """The streamer and stopping-criterion classes ``generate`` is given, defined once.

    Defined on first use (transformers is imported lazily), not per request: a class made
    per call is a few KB that transformers' and abc's caches kept alive, a leak of about
    1.2 KB per completed request (bench/benchmarks/memory_per_request.py).
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

"""The native engine's decode step captured in CUDA graphs (the ``cuda_graphs`` option):
:class:`GraphedDecoder` keeps one static cache, static input buffers and one captured graph per
(batch size, cache length), prepares the batch sizes a run will form before its clock
(:meth:`GraphedDecoder.prepare`) and decodes a batch by replaying its graph step after step."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from engines.batching import left_pad
from engines.errors import ConfigError

CACHE_LEN_STEP = 64  # graphs are keyed by (batch, cache length rounded up to this): fewer captures
# How many shapes the compiled decode step may be compiled for in one process (torch counts per
# function, over every decoder of the process: each tuning of an ablation adds its shapes, and a
# shape seen before is reused). torch's default is 8, past which it silently runs the function
# uncompiled: the captured step is then the eager graph, 1.8x slower at batch 1 on an H100,
# under a "compiled" label. Past this limit a shape is captured uncompiled and counted
# (``GraphedDecoder.uncompiled``, the engine's ``cuda_graphs_uncompiled``).
COMPILE_SHAPES = 64


def dynamo_name(config: Any, *names: str) -> str | None:
    """The first of ``names`` torch's dynamo config has (newer torch renamed the limits)."""
    return next((n for n in names if hasattr(config, n)), None)


@dataclass(eq=False)
class _Captured:
    """One batch shape's static cache, static input and output buffers, and its captured step."""

    batch: int
    cache_len: int
    cache: Any  # a transformers StaticCache of batch x cache_len
    input_ids: Any  # [B, 1] long: the token each row feeds next
    position_ids: Any  # [B, 1] long: its position (left padding shifts a row's positions)
    valid: Any  # [B, L] bool: the cache slots a row may attend to (its prompt's real tokens, then its own)
    mask: Any  # [B, 1, 1, L]: valid as the attention implementation wants it (bool for sdpa, additive for eager)
    eos_bias: Any  # [V] float32: -inf on the EOS ids while they are suppressed (ignore_eos), else 0
    logits: Any  # [B, V] float32: the step's last logits
    next_ids: Any  # [B] long: their greedy choice
    graph: Any = None
    forward: Any = None  # the step's forward for this shape: the compiled one, or eager past COMPILE_SHAPES


class GraphedDecoder:
    """The decode step captured in CUDA graphs (the ``cuda_graphs`` option).

    The prompt runs eagerly through the model's forward into a transformers ``StaticCache``;
    every decode step after it is one replay of a graph captured for that batch shape. What a
    step depends on lives in static buffers written in place before each replay: the tokens
    fed, their positions, the attention mask over the cache (passed as a ready 4-D mask, so
    transformers builds none on the host), and the EOS suppression. The cache's write slot is
    its own device counter (``cumulative_length``), advanced inside the graph; the warm-up steps
    run before capture (on a side stream, as capture requires) advance it too, so it is put
    back after them. Greedy choice happens inside the graph; sampling draws from the replayed
    logits outside it. ``compile`` (default / max-autotune) compiles the step before capture.

    Pipelined (the default): step k+1 is launched before step k's tokens are read on the host,
    so the host's work per step (streaming the tokens to each row's consumer) overlaps the
    GPU's instead of following it. Each step's tokens are copied into pinned memory behind
    its replay and an event marks them ready; waiting on that event waits for that step only,
    not for the one queued behind it. A stop decided after step k (EOS, length, cancel) wastes
    the one step already queued. ``pipeline=False`` (or ``MOEBENCH_GRAPH_PIPELINE=off``, for
    side-by-side timings) reads each step's tokens before launching the next.

    Numerics are eager's: the same kernels run, over a cache rounded up to a multiple of
    :data:`CACHE_LEN_STEP` whose extra slots are masked out.
    """

    def __init__(
        self, model: Any, compile_mode: str = "off", max_graphs: int = 4, pipeline: bool | None = None
    ) -> None:
        self.model = model
        if pipeline is None:
            pipeline = os.environ.get("MOEBENCH_GRAPH_PIPELINE", "on").strip().lower() not in ("off", "0", "false")
        self.pipeline = pipeline
        self.max_graphs = max_graphs
        self._shapes: collections.OrderedDict[tuple[int, int], _Captured] = collections.OrderedDict()
        self.sizes: list[int] = []  # batch sizes prepared before a run (:meth:`prepare`): batches pad up to them
        self.captures = 0
        self.capture_s = 0.0
        self.compile_mode = compile_mode
        # (batch, cache length) shapes captured uncompiled: torch's recompile limit reached (COMPILE_SHAPES)
        self.uncompiled: set[tuple[int, int]] = set()
        self._forward: Any = self._step_logits
        if compile_mode != "off":
            import torch

            # max-autotune would add inductor's own CUDA graphs inside ours
            mode = "max-autotune-no-cudagraphs" if compile_mode == "max-autotune" else compile_mode
            self._forward = torch.compile(self._step_logits, mode=mode, dynamic=False, fullgraph=False)

    def _step_logits(self, input_ids: Any, position_ids: Any, mask: Any, cache: Any) -> Any:
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _step(self, c: _Captured) -> None:
        """What the graph holds: one forward over the static buffers, logits and greedy ids out."""
        import torch

        logits = (c.forward or self._forward)(c.input_ids, c.position_ids, c.mask, c.cache)
        c.logits.copy_(logits)
        c.next_ids.copy_(torch.argmax(logits + c.eos_bias, dim=-1))

    def _allow(self, c: _Captured, cols: Any, rows: Any = slice(None)) -> None:
        """Let ``rows`` attend to cache slot(s) ``cols`` (in place, in the captured mask)."""
        c.valid[rows, cols] = True
        if c.mask.dtype != c.valid.dtype:  # eager attention adds its mask
            c.mask[rows, 0, 0, cols] = 0.0

    def bucket(self, batch: int) -> int:
        """The batch size a batch of ``batch`` rows runs in: the smallest prepared size that holds it
        (its extra rows padded), else ``batch`` itself (a shape of its own, captured when first met)."""
        return next((s for s in self.sizes if s >= batch), batch)

    def _buffers(self, batch: int, cache_len: int) -> _Captured:
        import torch
        from transformers import StaticCache

        key = (batch, cache_len)
        if key not in self._shapes:
            # a captured shape of this batch with room for more (its extra cache slots stay masked)
            roomy = sorted(k for k in self._shapes if k[0] == batch and k[1] >= cache_len and self._shapes[k].graph)
            key = roomy[0] if roomy else key
        if key in self._shapes:
            self._shapes.move_to_end(key)
            return self._shapes[key]
        while len(self._shapes) >= self.max_graphs:
            self._shapes.popitem(last=False)
        model = self.model
        dev = next(model.parameters()).device
        vocab = int(model.config.vocab_size)
        valid = torch.zeros(batch, cache_len, dtype=torch.bool, device=dev)
        if model.config._attn_implementation == "sdpa":
            mask = valid.view(batch, 1, 1, cache_len)  # the same storage: writes to valid are the mask's
        else:
            mask = torch.full((batch, 1, 1, cache_len), torch.finfo(model.dtype).min, dtype=model.dtype, device=dev)
        c = _Captured(
            batch=batch,
            cache_len=cache_len,
            cache=StaticCache(config=model.config, max_cache_len=cache_len),
            input_ids=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            position_ids=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            valid=valid,
            mask=mask,
            eos_bias=torch.zeros(vocab, dtype=torch.float32, device=dev),
            logits=torch.zeros(batch, vocab, dtype=torch.float32, device=dev),
            next_ids=torch.zeros(batch, dtype=torch.long, device=dev),
        )
        self._shapes[key] = c
        return c

    def _prefill(self, c: _Captured, prompts: list[list[int]], pad: int) -> Any:
        """The prompts, left-padded, through the model's forward into ``c.cache`` (eager): their last
        logits [B, V] float32; afterwards the buffers hold the first decode step's state."""
        import torch

        dev = c.input_ids.device
        ids, am = left_pad(prompts, pad)
        width = len(ids[0])
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        real = torch.tensor(am, dtype=torch.bool, device=dev)
        pos = (real.long().cumsum(-1) - 1).masked_fill(~real, 0)  # as generate numbers a left-padded row
        c.cache.reset()
        c.valid.zero_()
        if c.mask.dtype != c.valid.dtype:
            c.mask.fill_(torch.finfo(c.mask.dtype).min)
        allowed = torch.ones(width, width, dtype=torch.bool, device=dev).tril()[None] & real[:, None, :]
        allowed |= torch.eye(width, dtype=torch.bool, device=dev)[None]  # a padding row sees itself: no empty row
        full = torch.zeros(c.batch, 1, width, c.cache_len, dtype=torch.bool, device=dev)
        full[:, 0, :, :width] = allowed
        if c.mask.dtype != torch.bool:
            full = torch.zeros(full.shape, dtype=c.mask.dtype, device=dev).masked_fill_(
                ~full, torch.finfo(c.mask.dtype).min
            )
        logits = self._step_logits(ids_t, pos, full, c.cache)
        c.valid[:, :width] = real
        if c.mask.dtype != c.valid.dtype:
            c.mask[:, 0, 0, :width].masked_fill_(real, 0.0)
        c.position_ids.copy_(pos[:, -1:] + 1)
        return logits

    def _compile_limits(self) -> Any:
        """While a compiled step runs for a new shape: torch may compile up to COMPILE_SHAPES
        shapes, and past them fails (caught in :meth:`_warm`) instead of silently running eager."""
        import contextlib

        if self.compile_mode == "off":
            return contextlib.nullcontext()
        import torch._dynamo.config as dc

        patch: dict[str, Any] = {}
        if limit := dynamo_name(dc, "recompile_limit", "cache_size_limit"):
            patch[limit] = max(int(getattr(dc, limit)), COMPILE_SHAPES)
        if total := dynamo_name(dc, "accumulated_recompile_limit", "accumulated_cache_size_limit"):
            patch[total] = max(int(getattr(dc, total)), 4 * COMPILE_SHAPES)
        if fail := dynamo_name(dc, "fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
            patch[fail] = True
        return dc.patch(**patch)

    def _warm(self, c: _Captured) -> None:
        """Three steps before capture: compile (if asked) and lazy allocations happen here, not in
        the capture. Past torch's recompile limit this shape runs its step uncompiled, counted."""
        c.forward = self._forward
        try:
            with self._compile_limits():
                for _ in range(3):
                    self._step(c)
        except Exception as exc:
            if type(exc).__name__ not in ("FailOnRecompileLimitHit", "FailOnCacheLimitHit"):
                raise
            c.forward = self._step_logits
            self.uncompiled.add((c.batch, c.cache_len))  # a shape evicted and captured again counts once
            for _ in range(3):
                self._step(c)

    def _capture(self, c: _Captured) -> None:
        """Warm up on a side stream, then capture :meth:`_step`; the cache's counters are put back."""
        import torch

        t0 = time.perf_counter()
        counters = [layer.cumulative_length for layer in c.cache.layers]
        if not all(isinstance(n, torch.Tensor) for n in counters):
            raise ConfigError("cuda_graphs: this transformers' static cache keeps its length on the host")
        saved = [n.clone() for n in counters]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._warm(c)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with self._compile_limits(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step(c)
        except Exception as exc:  # torch's capture errors, and a recompile-limit failure (not a RuntimeError)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"cuda_graphs: the decode step could not be captured: {first}") from exc
        for n, v in zip(counters, saved, strict=True):
            n.copy_(v)
        torch.cuda.synchronize()
        c.graph = graph
        self.captures += 1
        self.capture_s += time.perf_counter() - t0

    @staticmethod
    def cache_len_for(width: int, max_new: int) -> int:
        """The static cache length of a batch whose longest prompt is ``width`` tokens, generating
        ``max_new``: rounded up to :data:`CACHE_LEN_STEP` (the capture's warm-ups write 3 slots)."""
        need = width + max(max_new, 4) - 1  # the last token is never fed back
        return -(-need // CACHE_LEN_STEP) * CACHE_LEN_STEP

    def prepare(
        self, sizes: Iterable[int], width: int, max_new: int, progress: Callable[[int, int, int], Any] | None = None
    ) -> None:
        """Compile and capture the decode step for each batch size of ``sizes`` at the cache length of
        prompts up to ``width`` tokens generating ``max_new`` (before a run's clock, as vLLM captures its
        graph sizes at start-up); later batches run in the smallest of them that holds them.
        ``progress(i, n, size)`` is called before each."""
        sizes = sorted(set(sizes))
        self.sizes = sorted({*self.sizes, *sizes})
        self.max_graphs = max(self.max_graphs, len(self.sizes) + 2)
        cache_len = self.cache_len_for(width, max_new)
        for i, size in enumerate(sizes):
            if progress is not None:
                progress(i, len(sizes), size)
            c = self._buffers(size, cache_len)
            if c.graph is None:
                self._prefill(c, [[0] * width] * size, 0)
                self._capture(c)

    def decode(
        self,
        prompts: list[list[int]],
        pad: int,
        max_new: int,
        on_step: Callable[[list[int]], Any],
        done: Callable[[], bool] = lambda: False,
        suppress: Iterable[int] = (),
        temperature: float = 0.0,
        top_p: float = 1.0,
        keep_logits: bool = False,
    ) -> list[Any]:
        """Generate up to ``max_new`` tokens for each prompt (one batch): each step's tokens, one per
        row, go to ``on_step`` as soon as they are known; ``done()`` stops early. ``suppress``: token
        ids never chosen (EOS under ignore_eos, as generate's min_new_tokens). With ``keep_logits``,
        each step's logits [B, V] (float32, on the CPU) are returned."""
        import torch

        width = max(len(p) for p in prompts)
        rows = len(prompts)
        padded = self.bucket(rows)
        if padded > rows:  # run in a prepared size: the extra rows repeat the first prompt, their tokens dropped
            prompts = [*prompts, *[prompts[0]] * (padded - rows)]
            deliver = on_step
            on_step = lambda tokens: deliver(tokens[:rows])  # noqa: E731 - the real rows' tokens only
        c = self._buffers(padded, self.cache_len_for(width, max_new))
        kept: list[Any] = []
        logits = self._prefill(c, prompts, pad)
        c.eos_bias.zero_()
        ban = sorted(set(suppress))
        if ban:
            c.eos_bias[ban] = float("-inf")
        if c.graph is None and max_new > 1:
            self._capture(c)
        sample = temperature > 0

        def pick(logits: Any, k: int) -> Any:
            """Step k's tokens, on the device (queued behind its replay; nothing waits here)."""
            if sample:
                return _sample(logits + c.eos_bias, temperature, top_p)
            if k == 0:
                return torch.argmax(logits + c.eos_bias, dim=-1)
            return c.next_ids.clone()  # the next replay overwrites next_ids

        def launch(chosen: Any, k: int) -> Any:
            """Feed ``chosen`` as step k's input and replay: step k's tokens, on the device."""
            c.input_ids.copy_(chosen.view(-1, 1))
            self._allow(c, width + k - 1)  # the cache slot the token fed now is written to
            c.graph.replay()
            c.position_ids.add_(1)
            return pick(c.logits, k)

        fetch = _HostFetch(c.batch, c.input_ids.device) if self.pipeline else None
        chosen = pick(logits, 0)
        for k in range(max_new):
            if keep_logits:
                kept.append(logits[:rows].to("cpu", copy=True))
            if not self.pipeline:
                on_step(chosen.tolist())
                if done() or k + 1 == max_new:
                    break
                chosen = launch(chosen, k + 1)
                logits = c.logits
                continue
            assert fetch is not None
            fetch.start(chosen)  # step k's tokens, on their way to the host
            ahead = launch(chosen, k + 1) if k + 1 < max_new else None  # step k+1 runs meanwhile
            on_step(fetch.result())
            if done() or ahead is None:
                break
            chosen, logits = ahead, c.logits
        return kept


class _HostFetch:
    """A step's tokens [B] copied to the host without waiting for the steps queued after it: on
    CUDA into pinned memory behind the copy's own event; elsewhere (CPU tests) a plain copy."""

    def __init__(self, batch: int, device: Any) -> None:
        import torch

        self._cuda = device.type == "cuda"
        self._host = torch.empty(batch, dtype=torch.long, pin_memory=self._cuda)
        self._ready = torch.cuda.Event() if self._cuda else None

    def start(self, tokens: Any) -> None:
        self._host.copy_(tokens, non_blocking=self._cuda)
        if self._ready is not None:
            self._ready.record()

    def result(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()


def _sample(scores: Any, temperature: float, top_p: float) -> Any:
    """One token per row from ``scores`` [B, V] as generate's temperature and top-p warpers do."""
    import torch

    scores = scores / temperature
    if top_p < 1.0:
        ordered, idx = torch.sort(scores, descending=False)
        cum = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False  # keep at least one
        scores = scores.masked_fill(remove.scatter(1, idx, remove), float("-inf"))
    return torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)

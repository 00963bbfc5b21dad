"""The native engine's tuning options on the real tiny model on CPU: static batching groups the
requests in flight as configured and gives each the tokens it would get alone, with exact
lengths; the options that apply on CPU give eager's outputs; those that cannot apply are
refused in one line before anything loads."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.base import GenerationRequest, SamplingParams, create_engine
from engines.errors import ConfigError

RNG = random.Random(7)
# Different prompt lengths (left padding in a batch) and different output lengths.
PROMPTS = [[RNG.randrange(10, 1000) for _ in range(n)] for n in (16, 9, 24, 16, 5, 12)]
MAX_TOKENS = [8, 12, 8, 5, 12, 3]


def _start(**opts: Any) -> Any:
    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", **opts})
    engine.start()
    return engine


def _generate(engine: Any, i: int, out: list[Any], cancel: threading.Event | None = None, **sampling: Any) -> None:
    req = GenerationRequest(
        str(i), "", SamplingParams(max_tokens=MAX_TOKENS[i], **sampling), prompt_token_ids=tuple(PROMPTS[i])
    )
    text, tokens, prompt = "", 0, None
    for chunk in engine.stream(req, cancel):
        text += chunk.text
        tokens += chunk.tokens
        prompt = chunk.prompt_tokens if chunk.prompt_tokens is not None else prompt
    out[i] = (tokens, text, prompt)


def _all_at_once(engine: Any, indices: list[int], **sampling: Any) -> list[Any]:
    out: list[Any] = [None] * len(PROMPTS)
    threads = [threading.Thread(target=_generate, args=(engine, i, out), kwargs=sampling) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _first_three(engine: Any, batched: bool) -> list[Any]:
    """The first three prompts through ``engine``: sent all at once (to batch) or one after another."""
    if batched:
        return _all_at_once(engine, [0, 1, 2])
    out: list[Any] = [None] * len(PROMPTS)
    for i in range(3):
        _generate(engine, i, out)
    return out


@pytest.fixture(scope="module")
def alone(tiny_model: Path) -> Iterator[list[Any]]:
    """Each prompt generated on its own by the default (eager, unbatched) engine: the reference."""
    engine = _start()
    out: list[Any] = [None] * len(PROMPTS)
    for i in range(len(PROMPTS)):
        _generate(engine, i, out)
    engine.stop()
    yield out


def test_static_batching_groups_requests_and_keeps_each_ones_tokens(alone: list[Any]) -> None:
    engine = _start(batch_size=4, batch_wait_ms=200)
    try:
        got = _all_at_once(engine, list(range(len(PROMPTS))))
        assert got == alone  # same tokens, same text, exact lengths, each prompt's own length
        assert [g[0] for g in got] == MAX_TOKENS and [g[2] for g in got] == [len(p) for p in PROMPTS]
        batches = engine._batcher.batches
        assert sum(batches) == len(PROMPTS) and max(batches) == 4  # 200 ms is time enough to fill one
        assert engine.describe()["tuning"]["batch_size"] == 4
    finally:
        engine.stop()


def test_requests_with_other_sampling_wait_for_a_batch_of_their_own(alone: list[Any]) -> None:
    engine = _start(batch_size=8, batch_wait_ms=200)
    try:
        out: list[Any] = [None] * len(PROMPTS)
        threads = [
            threading.Thread(target=_generate, args=(engine, i, out), kwargs={"ignore_eos": i % 2 == 0})
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(engine._batcher.batches) == [2, 2]
        assert out[0] == alone[0] and out[2] == alone[2]  # ignore_eos=True: exact lengths as alone
    finally:
        engine.stop()


def test_a_cancelled_request_leaves_its_batch_and_the_others_finish(alone: list[Any]) -> None:
    engine = _start(batch_size=4, batch_wait_ms=200)
    try:
        cancel = threading.Event()
        cancel.set()  # cancelled before its first token: it ends at once, with no output
        out: list[Any] = [None] * len(PROMPTS)
        threads = [threading.Thread(target=_generate, args=(engine, 1, out, cancel))]
        threads += [threading.Thread(target=_generate, args=(engine, i, out)) for i in (0, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out[1][0] == 0
        assert out[0] == alone[0] and out[2] == alone[2]
    finally:
        engine.stop()


@pytest.mark.parametrize(
    "opts",
    [
        {"cache": "static"},
        {"experts_impl": "eager"},
        {"experts_impl": "batched_mm"},
        {"attn_impl": "eager"},
        {"inference_mode": False},
        {"cache": "static", "batch_size": 3, "batch_wait_ms": 200},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_options_that_apply_on_cpu_give_eagers_outputs(alone: list[Any], opts: dict[str, Any]) -> None:
    engine = _start(**opts)
    try:
        if opts.get("batch_size", 1) > 1:
            got = _all_at_once(engine, [0, 1, 2])[:3]
        else:
            got = [None] * len(PROMPTS)
            for i in range(3):
                _generate(engine, i, got)
            got = got[:3]
        assert got == alone[:3]
        tuning = engine.describe()["tuning"]
        for key in ("experts_impl", "attn_impl", "cache"):
            if key in opts:
                assert tuning[key] == opts[key]  # what transformers resolved, not only what was asked
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        ({"cudnn_benchmark": True}, "cudnn_benchmark: cuDNN is NVIDIA's, so it does nothing on cpu; leave it off"),
        ({"compile": "default"}, "compile=default needs cache=static: transformers compiles the decode step only"),
        ({"attn_impl": "flash_attention_2"}, "attn_impl=flash_attention_2: FlashAttention runs on NVIDIA GPUs"),
        ({"cuda_graphs": True, "cache": "static"}, "cuda_graphs: CUDA graphs need an NVIDIA GPU; this run is on cpu"),
    ],
)
def test_options_that_cannot_apply_are_refused_in_one_line(tiny_model: Path, opts: dict[str, Any], reason: str) -> None:
    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", **opts})
    with pytest.raises(ConfigError) as err:
        engine.start()
    assert str(err.value).startswith(reason) and "\n" not in str(err.value)
    assert engine.model is None  # refused before loading


@pytest.mark.slow
def test_compile_with_a_static_cache_matches_eager_and_compiles_once(alone: list[Any]) -> None:
    """torch.compile on CPU (inductor, about a minute on 2 cores): the same tokens as eager, and
    a second round of requests of the same shapes compiles nothing new (no per-step or
    per-request recompiles)."""
    from torch._dynamo.utils import counters

    engine = _start(cache="static", compile="default", record_routing=False)
    try:
        got: list[Any] = [None] * len(PROMPTS)
        _generate(engine, 0, got)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 1  # it did compile
        _generate(engine, 0, got)
        _generate(engine, 3, got)  # another prompt of the same length and output length
        assert counters["stats"]["unique_graphs"] == graphs
        assert got[0] == alone[0] and got[3] == alone[3]
        assert engine.describe()["tuning"]["compile"] == "default"
    finally:
        engine.stop()


def test_retune_switches_the_loaded_model_and_back(alone: list[Any]) -> None:
    engine = _start()
    try:
        assert engine.describe()["tuning"]["experts_impl"] == "grouped_mm"  # transformers' default here
        engine.retune(experts_impl="eager", cache="static", batch_size=3, batch_wait_ms=200)
        got = _all_at_once(engine, [0, 1, 2])
        assert got[:3] == alone[:3] and engine._batcher.batches == [3]
        assert engine.describe()["tuning"]["experts_impl"] == "eager"
        with pytest.raises(ConfigError, match="cudnn_benchmark"):
            engine.retune(cudnn_benchmark=True)
        assert engine.describe()["tuning"]["batch_size"] == 3  # refused: the tuning before it stays
        engine.retune(experts_impl=None, cache="dynamic", batch_size=1)
        assert engine.describe()["tuning"]["experts_impl"] == "grouped_mm" and engine._batcher is None
    finally:
        engine.stop()


@pytest.mark.cuda
@pytest.mark.parametrize(
    "opts",
    [
        {"cache": "static"},
        {"cudnn_benchmark": True},
        {"batch_size": 3, "batch_wait_ms": 200},
        {"cache": "static", "compile": "default", "record_routing": False},
        {"cache": "static", "cuda_graphs": True, "experts_impl": "batched_mm", "record_routing": False},
        {"cache": "static", "cuda_graphs": True, "experts_impl": "batched_mm", "compile": "default"},
        {"mla": "absorbed"},
        {"cache": "static", "cuda_graphs": True, "experts_impl": "batched_mm", "mla": "absorbed"},
        {"cache": "static", "cuda_graphs": True, "experts_impl": "batched_mm", "compile": "default", "mla": "absorbed"},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_options_on_cuda_give_eagers_tokens_in_float32(tiny_model: Path, opts: dict[str, Any]) -> None:
    """On a GPU (the H200 via the device tool), float32: each option gives the default engine's tokens."""
    from engines.accelerators import get_accelerator

    avail = get_accelerator("cuda").availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    base = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cuda", "dtype": "float32"}
    ref_engine = create_engine(base)
    ref_engine.start()
    ref: list[Any] = [None] * len(PROMPTS)
    for i in range(3):
        _generate(ref_engine, i, ref)
    ref_engine.stop()
    engine = create_engine({**base, **opts})
    engine.start()
    try:
        got = _all_at_once(engine, [0, 1, 2]) if opts.get("batch_size", 1) > 1 else [None] * len(PROMPTS)
        if opts.get("batch_size", 1) == 1:
            for i in range(3):
                _generate(engine, i, got)
        assert got[:3] == ref[:3]
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        ({}, "cuda_graphs needs cache=static: a captured step writes into cache buffers fixed at capture"),
        ({"cache": "static", "compile": "reduce-overhead"}, "cuda_graphs with compile=reduce-overhead: that mode"),
        ({"cache": "static", "experts_impl": "eager"}, "cuda_graphs with experts_impl=eager: its loop picks"),
    ],
)
def test_cuda_graphs_combinations_that_cannot_work_are_refused_in_one_line(
    tiny_model: Path, opts: dict[str, Any], reason: str
) -> None:
    """On a GPU too (the accelerator is taken for CUDA here): refused before anything loads."""
    import types

    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "cuda_graphs": True,
                            **opts})  # fmt: skip
    engine.accelerator = types.SimpleNamespace(name="cuda")
    with pytest.raises(ConfigError) as err:
        engine._check_tuning()
    assert str(err.value).startswith(reason) and "\n" not in str(err.value)


def _fake_capture(decoder: Any) -> None:
    """CUDA graphs do not exist on a CPU: "replay" runs the captured step eagerly, so everything
    around the graph (static buffers, masks, positions, the cache's counter put back after the
    warm-up steps) is what the test checks."""
    import types

    def capture(c: Any) -> None:
        counters = [layer.cumulative_length for layer in c.cache.layers]
        saved = [n.clone() for n in counters]
        decoder._warm(c)  # the warm-up steps advance the cache's counter, as on a GPU
        for n, v in zip(counters, saved, strict=True):
            n.copy_(v)
        c.graph = types.SimpleNamespace(replay=lambda: decoder._step(c))
        decoder.captures += 1

    decoder._capture = capture


@pytest.mark.parametrize(("attn", "pipeline"), [("sdpa", True), ("eager", True), ("sdpa", False)])
def test_graphed_decoder_gives_generates_tokens_and_logits(tiny_model: Path, attn: str, pipeline: bool) -> None:
    """The captured step's inputs (tokens, positions, mask over a rounded-up static cache) give
    generate's greedy tokens and logits, alone and as a left-padded batch; one graph shape serves
    prompts of different lengths (a replay follows its new inputs). Pipelined (step k+1 launched
    before step k's tokens are read) and not."""
    import torch

    from engines.batching import left_pad
    from engines.graphs import GraphedDecoder

    engine = _start(dtype="float32", attn_impl=attn, record_routing=False)
    try:
        model, pad, steps = engine.model, engine._tokenizer.pad_token_id or 0, 10
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        decoder = GraphedDecoder(model, pipeline=pipeline)
        _fake_capture(decoder)
        for prompts in ([PROMPTS[0]], [PROMPTS[1]], [PROMPTS[2]], PROMPTS[:4]):
            ids, mask = left_pad(prompts, pad)
            with torch.inference_mode():
                ref = model.generate(
                    input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=steps,
                    min_new_tokens=steps, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad,
                    output_logits=True, return_dict_in_generate=True,
                )  # fmt: skip
                got: list[list[int]] = []
                logits = decoder.decode(prompts, pad, steps, got.append, suppress=eos, keep_logits=True)
            assert [list(r) for r in zip(*got, strict=True)] == ref.sequences[:, len(ids[0]) :].tolist()
            diff = (torch.stack(logits, 1) - torch.stack(ref.logits, 1).float()).abs().max()
            assert float(diff) < 1e-5
        assert decoder.captures == 2 and sorted(decoder._shapes) == [(1, 64), (4, 64)]
    finally:
        engine.stop()


def test_compile_raises_torchs_recompile_limit_for_generates_shapes(tiny_model: Path) -> None:
    """generate's compiled forward meets a shape per batch size and cache length; past torch's
    default of 8 it would run uncompiled unnoticed: with compile on, the engine raises the limit."""
    import torch._dynamo.config as dc

    from engines.graphs import COMPILE_SHAPES

    with dc.patch(recompile_limit=8):  # torch's default, whatever ran before in this process
        engine = _start(cache="static", compile="default", record_routing=False)
        try:
            assert dc.recompile_limit >= COMPILE_SHAPES > 8
        finally:
            engine.stop()


def test_a_shape_past_torchs_recompile_limit_is_captured_uncompiled_and_counted(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past torch's recompile limit a compiled function silently runs eager; a compiled decoder
    instead compiles up to COMPILE_SHAPES batch shapes, captures a shape past them uncompiled
    and counts it (``cuda_graphs_uncompiled`` in the engine's tuning), tokens unchanged. Real
    dynamo with its eager backend here (inductor's C++ build takes minutes on this CPU; the
    count of shapes is dynamo's either way); the limit lowered to 1 shape."""
    import torch

    from engines import graphs
    from engines.batching import left_pad
    from engines.graphs import GraphedDecoder

    engine = _start(dtype="float32", record_routing=False)
    try:
        model, pad, steps = engine.model, engine._tokenizer.pad_token_id or 0, 6
        monkeypatch.setattr(graphs, "COMPILE_SHAPES", 1)
        torch._dynamo.reset()  # other tests' compiled steps (the same function) would count here
        lowered = torch._dynamo.config.patch(recompile_limit=1)  # the engine never lowers a limit set higher
        lowered.__enter__()
        decoder = GraphedDecoder(model, compile_mode="default")
        decoder._forward = torch.compile(decoder._step_logits, backend="eager", dynamic=False, fullgraph=False)
        _fake_capture(decoder)
        for prompts, uncompiled in (([PROMPTS[1]], 0), (PROMPTS[:4], 1), ([PROMPTS[2]], 1)):
            ids, mask = left_pad(prompts, pad)
            with torch.inference_mode():
                ref = model.generate(
                    input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=steps,
                    min_new_tokens=steps, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad,
                )  # fmt: skip
                got: list[list[int]] = []
                decoder.decode(prompts, pad, steps, got.append, suppress=[])
            assert [list(r) for r in zip(*got, strict=True)] == ref[:, len(ids[0]) :].tolist()
            assert len(decoder.uncompiled) == uncompiled
        assert decoder._shapes[(1, 64)].forward is decoder._forward  # the first shape: compiled
        assert decoder._shapes[(4, 64)].forward == decoder._step_logits  # past the limit: eager, counted
        assert decoder.uncompiled == {(4, 64)} and decoder.captures == 2
        engine._graphed = decoder  # what the engine reports (and every run records) of it
        assert engine.tuning()["cuda_graphs_uncompiled"] == 1
        decoder._shapes.clear()  # as when more shapes than max_graphs came: evicted, then seen again
        with torch.inference_mode():
            decoder.decode(PROMPTS[:4], pad, steps, lambda t: None, suppress=[])
        assert decoder.uncompiled == {(4, 64)} and decoder.captures == 3  # captured again, one shape still
    finally:
        lowered.__exit__(None, None, None)
        engine._graphed = None
        engine.stop()


@pytest.mark.parametrize("pipeline", [True, False])
def test_graphed_decoder_stops_when_done_and_the_next_decode_is_unharmed(tiny_model: Path, pipeline: bool) -> None:
    """``done()`` after the third step's tokens ends the decode there: three steps delivered. The
    pipelined loop has launched one step more (queued before the third step's tokens were read),
    the other none; that wasted step leaves nothing behind: the next decode through the same
    graph gives the tokens of a decode that ran to the end."""
    from engines.graphs import GraphedDecoder

    engine = _start(dtype="float32", record_routing=False)
    try:
        pad = engine._tokenizer.pad_token_id or 0
        decoder = GraphedDecoder(engine.model, pipeline=pipeline)
        _fake_capture(decoder)
        full: list[list[int]] = []
        decoder.decode([PROMPTS[1]], pad, 10, full.append)
        replays = 0
        c = decoder._shapes[(1, 64)]
        step = c.graph.replay

        def counted() -> None:
            nonlocal replays
            replays += 1
            step()

        c.graph.replay = counted
        got: list[list[int]] = []
        decoder.decode([PROMPTS[2]], pad, 10, got.append, done=lambda: len(got) == 3)
        assert len(got) == 3
        assert replays == (3 if pipeline else 2)  # the prompt's forward gives step 0's tokens
        again: list[list[int]] = []
        decoder.decode([PROMPTS[1]], pad, 10, again.append)
        assert again == full and len(full) == 10
    finally:
        engine.stop()


def test_graphed_decoder_samples_the_same_tokens_pipelined_or_not(tiny_model: Path) -> None:
    """Sampling (temperature, top-p) with a seed draws the same tokens through both loops: the
    pipelined one draws each step's sample in the same order, before the next replay."""
    import torch

    from engines.graphs import GraphedDecoder

    engine = _start(dtype="float32", record_routing=False)
    try:
        pad = engine._tokenizer.pad_token_id or 0
        runs = []
        for pipeline in (False, True):
            decoder = GraphedDecoder(engine.model, pipeline=pipeline)
            _fake_capture(decoder)
            got: list[list[int]] = []
            torch.manual_seed(7)
            with torch.inference_mode():
                decoder.decode(PROMPTS[:3], pad, 12, got.append, temperature=1.3, top_p=0.9)
            runs.append(got)
        assert runs[0] == runs[1] and len(runs[0]) == 12
        greedy: list[list[int]] = []
        with torch.inference_mode():
            decoder.decode(PROMPTS[:3], pad, 12, greedy.append)
        assert runs[0] != greedy  # the draw did sample (a test that cannot tell would be worthless)
    finally:
        engine.stop()


def test_graphed_path_streams_each_request_as_alone(alone: list[Any]) -> None:
    """The engine's graphed decode loop (the capture faked, see above), unbatched and batched:
    each request's tokens, text and exact length as the eager engine's."""
    from engines.graphs import GraphedDecoder

    for opts in ({"cache": "static"}, {"cache": "static", "batch_size": 3, "batch_wait_ms": 200}):
        engine = _start(**opts)
        try:
            engine._graphed = GraphedDecoder(engine.model)
            _fake_capture(engine._graphed)
            if engine._batcher is None:  # what cuda_graphs=True sets up: the batcher, a batch of 1 too
                from engines.batching import StaticBatcher

                engine._batcher = StaticBatcher(engine._run_batch, 1, 0.0)
            got = _all_at_once(engine, [0, 1, 2]) if opts.get("batch_size") else [None] * len(PROMPTS)
            if not opts.get("batch_size"):
                for i in range(3):
                    _generate(engine, i, got)
            assert got[:3] == alone[:3]
            assert engine._graphed.captures >= 1
            assert engine.tuning()["cuda_graphs_pipelined"] is True  # runs record which loop streamed them
        finally:
            engine.stop()


@pytest.mark.cuda
@pytest.mark.parametrize("batch_size", [1, 3])
def test_cuda_graphs_give_eagers_tokens_and_logits_in_float32(tiny_model: Path, batch_size: int) -> None:
    """On a GPU (the H200 via the device tool), float32: the engine with real captured graphs gives
    the default engine's tokens for three prompts of different lengths (one graph replayed for all
    when unbatched: a replay follows new inputs), and logits within 1e-4 of generate's. batched_mm
    experts: torch's float32 grouped_mm cannot be captured (refused, see below)."""
    import torch

    from engines.accelerators import get_accelerator
    from engines.batching import left_pad

    avail = get_accelerator("cuda").availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    base = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cuda", "dtype": "float32"}
    ref_engine = create_engine(base)
    ref_engine.start()
    ref: list[Any] = [None] * len(PROMPTS)
    for i in range(3):
        _generate(ref_engine, i, ref)
    ref_engine.stop()
    engine = create_engine({**base, "cache": "static", "cuda_graphs": True, "batch_size": batch_size,
                            "batch_wait_ms": 200, "experts_impl": "batched_mm"})  # fmt: skip
    engine.start()
    try:
        if batch_size > 1:
            got = _all_at_once(engine, [0, 1, 2])
        else:
            got = [None] * len(PROMPTS)
            for i in range(3):
                _generate(engine, i, got)
        assert got[:3] == ref[:3]
        tuning = engine.describe()["tuning"]
        assert tuning["cuda_graphs"] is True and tuning["cuda_graphs_captured"] == 1
        model, pad = engine.model, engine._tokenizer.pad_token_id or 0
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        prompts = PROMPTS[:batch_size]
        ids, mask = left_pad(prompts, pad)
        dev = torch.device("cuda")
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.tensor(ids, device=dev), attention_mask=torch.tensor(mask, device=dev),
                max_new_tokens=8, min_new_tokens=8, do_sample=False, temperature=None, top_p=None, top_k=None,
                pad_token_id=pad, output_logits=True, return_dict_in_generate=True, disable_compile=True,
            )  # fmt: skip
            got_ids: list[list[int]] = []
            logits = engine._graphed.decode(prompts, pad, 8, got_ids.append, suppress=eos, keep_logits=True)
        assert [list(r) for r in zip(*got_ids, strict=True)] == out.sequences[:, len(ids[0]) :].tolist()
        assert float((torch.stack(logits, 1) - torch.stack(out.logits, 1).float().cpu()).abs().max()) < 1e-4
    finally:
        engine.stop()


@pytest.mark.cuda
@pytest.mark.parametrize("mla", ["expand", "absorbed"])
def test_cuda_graphs_replay_the_eager_step_exactly_in_bf16(tiny_model: Path, mla: str) -> None:
    """bf16 with grouped_mm experts (the fast path): the replayed graph gives the same tokens and
    logits as the same step run eagerly (same static cache, mask and kernels, no graph), for four
    prompts through one graph and for a padded batch; float32 grouped_mm is refused in one line."""
    import torch

    from engines.accelerators import get_accelerator
    from engines.graphs import GraphedDecoder

    avail = get_accelerator("cuda").availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    base = {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cuda", "record_routing": False}
    engine = create_engine({**base, "dtype": "bfloat16", "cache": "static", "cuda_graphs": True, "mla": mla})
    engine.start()
    try:
        model, pad = engine.model, engine._tokenizer.pad_token_id or 0
        eager = GraphedDecoder(model)
        _fake_capture(eager)  # the same step, run eagerly
        for prompts in ([PROMPTS[0]], [PROMPTS[1]], [PROMPTS[2]], [PROMPTS[3]], PROMPTS[:4]):
            runs = []
            for dec in (engine._graphed, eager):
                toks: list[list[int]] = []
                with torch.inference_mode():
                    logits = dec.decode(prompts, pad, 12, toks.append, keep_logits=True)
                runs.append((toks, torch.stack(logits, 1)))
            assert runs[0][0] == runs[1][0]
            assert float((runs[0][1] - runs[1][1]).abs().max()) <= 1e-3
        assert engine._graphed.captures == 2  # batch 1 (four prompts) and batch 4
    finally:
        engine.stop()
    fp32 = create_engine({**base, "dtype": "float32", "cache": "static", "cuda_graphs": True})
    with pytest.raises(ConfigError, match=r"^cuda_graphs with float32 grouped_mm experts"):
        fp32.start()


def test_prepared_batch_sizes_serve_smaller_batches_and_shorter_prompts(tiny_model: Path) -> None:
    """Sizes prepared before a run (captured once each) serve every later batch: a batch of 3 runs
    in the prepared size 4 (its extra row padded, its tokens dropped) and gives generate's tokens
    for its own 3 rows; shorter prompts reuse the prepared longer cache; nothing is captured after."""
    import torch

    from engines.batching import left_pad
    from engines.graphs import GraphedDecoder

    engine = _start(dtype="float32", record_routing=False)
    try:
        pad = engine._tokenizer.pad_token_id or 0
        decoder = GraphedDecoder(engine.model)
        _fake_capture(decoder)
        seen: list[int] = []
        width = max(len(p) for p in PROMPTS) + 70  # a longer cache than these prompts need (2 cache steps)
        with torch.inference_mode():
            decoder.prepare([4, 1], width, 8, lambda i, n, size: seen.append(size))
        assert seen == [1, 4] and decoder.captures == 2 and decoder.sizes == [1, 4]
        assert sorted(decoder._shapes) == [(1, 128), (4, 128)] and GraphedDecoder.cache_len_for(width, 8) == 128
        assert decoder.bucket(3) == 4 and decoder.bucket(1) == 1 and decoder.bucket(5) == 5
        for prompts in (PROMPTS[:3], [PROMPTS[2]], PROMPTS[1:3]):
            ids, mask = left_pad(prompts, pad)
            with torch.inference_mode():
                ref = engine.model.generate(
                    input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=8,
                    min_new_tokens=8, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad,
                )  # fmt: skip
                got: list[list[int]] = []
                logits = decoder.decode(prompts, pad, 8, got.append, suppress=[], keep_logits=True)
            assert all(len(step) == len(prompts) for step in got)  # the padded row's tokens never reach a stream
            assert [list(r) for r in zip(*got, strict=True)] == ref[:, len(ids[0]) :].tolist()
            assert logits[0].shape[0] == len(prompts)
        assert decoder.captures == 2  # every batch ran in a prepared shape
    finally:
        engine.stop()


def test_capture_sizes_default_to_powers_of_two_and_are_checked() -> None:
    """The sizes captured before a run: 1, 2, 4, ... and batch_size; a size past batch_size is refused."""
    from engines.base import parse_options
    from engines.errors import ConfigError

    def sizes(**opts: Any) -> list[int]:
        return parse_options({"kind": "native", **opts}).graph_sizes()

    assert sizes() == [1]
    assert sizes(batch_size=128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert sizes(batch_size=100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert sizes(batch_size=128, capture_sizes="32, 8,1") == [1, 8, 32, 128]
    assert sizes(batch_size=128, capture_sizes=128) == [128]  # --engine-opt capture_sizes=128 parses as a number
    assert sizes(batch_size=128, capture_sizes=[8, 128]) == [8, 128]
    with pytest.raises(ConfigError, match="exceed batch_size"):
        parse_options({"kind": "native", "batch_size": 8, "capture_sizes": "16"})
    with pytest.raises(ConfigError, match="capture_sizes takes batch sizes"):
        parse_options({"kind": "native", "batch_size": 8, "capture_sizes": "8,x"})


def test_a_wave_arriving_over_longer_than_the_wait_batches_together() -> None:
    """Requests arriving 10 ms apart with a 50 ms wait: one batch of all eight (a fixed window from
    the first arrival cut such a wave in two, and the two halves alternated for the whole run)."""
    from engines.batching import Pending, StaticBatcher

    formed: list[int] = []

    def run(batch: list[Any]) -> None:
        formed.append(len(batch))
        for p in batch:
            p.out_q.put(None)

    batcher = StaticBatcher(run, 8, 0.05)
    try:
        items = [Pending(ids=[1, 2], max_tokens=1, sampling=SamplingParams(max_tokens=1)) for _ in range(8)]
        for p in items:
            batcher.submit(p)
            time.sleep(0.01)
        for p in items:
            p.out_q.get(timeout=10)
        assert formed == [8]
    finally:
        batcher.close()

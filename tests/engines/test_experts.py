"""MoE Bench's own grouped-GEMM experts (``experts_impl=lean_grouped_mm``, engines/experts.py) on the
real tiny DeepSeek-V3: in float32 on CPU each layer's output equals transformers' ``grouped_mm``
to rounding (uneven routing and experts with no tokens included), and the engine with it
streams the default engine's tokens unbatched, statically batched and through the graphed
decode loop; on a GPU, bf16, the same within bf16 rounding and a real captured step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines import experts
from tests.engines.test_native_tuning import PROMPTS, _fake_capture, _first_three, _generate, _start


def _experts_modules(model: Any) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]


def _routing(tokens: int, k: int, n_experts: int, seed: int, skew: bool) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    if skew:  # most pairs on two experts, some experts with none
        pool = torch.tensor([0, 1, 0, 1, 0, 1, n_experts - 1])
        first = pool[torch.randint(len(pool), (tokens,), generator=g)]
        idx = torch.stack([(first + j) % n_experts for j in range(k)], dim=1)
    else:
        idx = torch.stack([torch.randperm(n_experts, generator=g)[:k] for _ in range(tokens)])
    return idx, torch.rand(tokens, k, generator=g)


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)


@pytest.mark.parametrize("tokens", [1, 5, 97])
@pytest.mark.parametrize("skew", [False, True], ids=["spread", "skewed"])
def test_each_layer_matches_transformers_grouped_mm_in_float32(model: Any, tokens: int, skew: bool) -> None:
    import torch
    from transformers.integrations.moe import grouped_mm_experts_forward

    mods = _experts_modules(model)
    assert mods, "the tiny model has routed experts"
    k = int(model.config.num_experts_per_tok)
    with torch.inference_mode():
        for layer, mod in enumerate(mods):
            h = torch.randn(tokens, mod.gate_up_proj.shape[-1], generator=torch.Generator().manual_seed(layer))
            idx, w = _routing(tokens, k, int(mod.num_experts), layer, skew)
            ref = grouped_mm_experts_forward(mod, h, idx, w)
            got = experts.lean_forward(mod, h, idx, w)
            assert got.shape == ref.shape and got.dtype == ref.dtype
            scale = float(ref.abs().max())
            assert scale > 0
            assert float((got - ref).abs().max()) <= 1e-5 * scale, (layer, tokens, skew)


def test_transposed_weights_and_a_module_without_apply_gate(model: Any) -> None:
    """The same experts stored transposed ([E, in, out], ``is_transposed``) give the same output,
    and a module without transformers' ``_apply_gate`` gets act(gate) * up from the forward."""
    import copy

    import torch

    mod = _experts_modules(model)[1]
    h = torch.randn(23, mod.gate_up_proj.shape[-1], generator=torch.Generator().manual_seed(5))
    idx, w = _routing(23, 2, int(mod.num_experts), 5, True)
    with torch.inference_mode():
        ref = experts.lean_forward(mod, h, idx, w)
        flipped = copy.deepcopy(mod)
        flipped.gate_up_proj = torch.nn.Parameter(mod.gate_up_proj.transpose(-2, -1).contiguous())
        flipped.down_proj = torch.nn.Parameter(mod.down_proj.transpose(-2, -1).contiguous())
        flipped.is_transposed = True
        got = experts.lean_forward(flipped, h, idx, w)
        assert float((got - ref).abs().max()) <= 1e-6 * float(ref.abs().max())

        class NoGate:  # the attributes the forward reads, and no _apply_gate
            def __init__(self, m: Any) -> None:
                for name in ("gate_up_proj", "down_proj", "num_experts", "act_fn"):
                    setattr(self, name, getattr(m, name))

        bare = NoGate(mod)
        assert not hasattr(bare, "_apply_gate") and experts._simple(bare)
        assert torch.equal(experts.lean_forward(bare, h, idx, w), ref)


def test_other_layouts_fall_back_to_transformers(model: Any) -> None:
    """Expert-parallel weights (sentinel experts) are transformers' case: its own forward runs."""
    import torch
    from transformers.integrations.moe import grouped_mm_experts_forward

    mod = _experts_modules(model)[0]
    h = torch.randn(7, mod.gate_up_proj.shape[-1])
    idx, w = _routing(7, 2, int(mod.num_experts), 3, False)
    mod._is_expert_parallel = True
    try:
        assert not experts._simple(mod)
        with torch.inference_mode():
            assert torch.equal(experts.lean_forward(mod, h, idx, w), grouped_mm_experts_forward(mod, h, idx, w))
    finally:
        mod._is_expert_parallel = False
    assert experts._simple(mod)


def test_engine_with_lean_experts_streams_the_default_tokens(alone3: list[Any]) -> None:
    from engines.batching import StaticBatcher
    from engines.graphs import GraphedDecoder

    real = experts.lean_forward
    for opts in ({}, {"cache": "static", "batch_size": 3, "batch_wait_ms": 200}, {"cache": "static", "graph": True}):
        graph = opts.pop("graph", False)
        engine = _start(experts_impl="lean_grouped_mm", **opts)
        try:
            assert engine.describe()["tuning"]["experts_impl"] == "lean_grouped_mm"
            if graph:
                engine._graphed = GraphedDecoder(engine.model)
                _fake_capture(engine._graphed)
                engine._batcher = StaticBatcher(engine._run_batch, 1, 0.0)
            calls = 0

            def counting(*a: Any, **kw: Any) -> Any:
                nonlocal calls
                calls += 1
                return real(*a, **kw)

            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            ALL_EXPERTS_FUNCTIONS._global_mapping[experts.NAME] = counting
            try:
                got = _first_three(engine, bool(opts.get("batch_size")))
            finally:
                ALL_EXPERTS_FUNCTIONS._global_mapping[experts.NAME] = real
            assert calls > 0, "the lean forward ran"
            assert got[:3] == alone3[:3], opts
            engine.retune(experts_impl=None)  # back to what transformers chose at load
            assert engine.describe()["tuning"]["experts_impl"] == "grouped_mm"
        finally:
            engine.stop()


@pytest.mark.cuda
def test_lean_experts_on_cuda_in_bf16_and_captured(tiny_model: Path) -> None:
    """On a GPU: each layer within bf16 rounding of transformers' grouped_mm, and the engine with
    it captures the decode step in a real CUDA graph and streams every token asked for."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations.moe import grouped_mm_experts_forward

    from engines.accelerators import get_accelerator

    avail = get_accelerator("cuda").availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    m = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.bfloat16).cuda()
    k = int(m.config.num_experts_per_tok)
    with torch.inference_mode():
        for layer, mod in enumerate(_experts_modules(m)):
            h = torch.randn(300, mod.gate_up_proj.shape[-1], device="cuda", dtype=torch.bfloat16)
            idx, w = _routing(300, k, int(mod.num_experts), layer, True)
            ref = grouped_mm_experts_forward(mod, h, idx.cuda(), w.cuda()).float()
            got = experts.lean_forward(mod, h, idx.cuda(), w.cuda()).float()
            assert float((got - ref).abs().max()) <= 2e-2 * float(ref.abs().max()), layer
    from engines.base import create_engine

    engine = create_engine(
        {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cuda", "dtype": "bfloat16",
         "cache": "static", "cuda_graphs": True, "experts_impl": "lean_grouped_mm", "record_routing": False}
    )  # fmt: skip
    engine.start()
    try:
        got: list[Any] = [None] * len(PROMPTS)
        for i in range(3):
            _generate(engine, i, got)
        from tests.engines.test_native_tuning import MAX_TOKENS

        assert [g[0] for g in got[:3]] == MAX_TOKENS[:3]
        assert engine.tuning()["cuda_graphs_captured"] >= 1
    finally:
        engine.stop()

"""Absorbed MLA (the native engine's ``mla=absorbed``) on the real tiny DeepSeek-V3 on CPU, in
float32: the same greedy tokens as transformers' expanding attention and logits within 1e-5,
alone, left-padded, with dynamic and static caches and both attention kernels' masks, through
the engine and through the graphed decode loop; turned off, the model is transformers' again;
a model without MLA is refused in one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import mla
from engines.base import create_engine
from tests.engines.test_native_tuning import PROMPTS, _fake_capture, _first_three, _generate, _start


@contextlib.contextmanager
def _expansions(model: Any) -> Iterator[list[int]]:
    """The token counts kv_b_proj (transformers' expansion of the cached latents) is called with,
    one call per layer per forward: the cache so far (with a static cache, its whole length)."""
    seen: list[int] = []
    handles = [
        m.kv_b_proj.register_forward_hook(lambda _m, inp, _o: seen.append(inp[0].shape[-2]))
        for m in model.modules()
        if type(m).__name__ == "DeepseekV3Attention"
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _greedy(model: Any, prompts: list[list[int]], pad: int, steps: int, **kw: Any) -> tuple[list[list[int]], Any]:
    import torch

    from engines.batching import left_pad

    ids, mask = left_pad(prompts, pad)
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=steps,
            min_new_tokens=steps, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad,
            output_logits=True, return_dict_in_generate=True, **kw,
        )  # fmt: skip
    return out.sequences[:, len(ids[0]) :].tolist(), torch.stack(out.logits, 1).float()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_absorbed_decode_matches_transformers_mla(tiny_model: Path, attn: str) -> None:
    engine = _start(dtype="float32", attn_impl=attn, record_routing=False)
    try:
        model, pad = engine.model, engine._tokenizer.pad_token_id or 0
        calls = {"n": 0}
        for cache in ("dynamic", "static"):
            for prompts in ([PROMPTS[0]], PROMPTS[:4]):
                kw = {"cache_implementation": "static"} if cache == "static" else {}
                mla.set_absorbed(model, False)
                ref_ids, ref_logits = _greedy(model, prompts, pad, 12, **kw)
                assert mla.set_absorbed(model, True) == model.config.num_hidden_layers
                with _expansions(model) as seen:
                    ids, logits = _greedy(model, prompts, pad, 12, **kw)
                # the prompt expanded once per layer (over the whole static cache, or the prompt); no
                # decode step did: the absorbed path ran
                assert len(seen) == model.config.num_hidden_layers and min(seen) >= max(map(len, prompts))
                calls["n"] += 1
                assert ids == ref_ids, (cache, len(prompts))
                assert float((logits - ref_logits).abs().max()) < 1e-5
                assert float(ref_logits.abs().max()) > 0.1  # logits of a real scale, not all zero
        assert calls["n"] == 4
        assert mla.set_absorbed(model, False) == model.config.num_hidden_layers and not mla.is_absorbed(model)
    finally:
        engine.stop()


def test_the_other_mla_variants_match_too() -> None:
    """The tiny model has rope_interleave and a query LoRA; DeepSeek-V2-Lite's shape has neither
    (q_proj, plain rope): a small random model of that kind, float32, absorbed against expanded."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, rope_interleave=False, max_position_embeddings=256,
    )  # fmt: skip
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    model.generation_config.eos_token_id = None
    assert mla.unsupported(model) is None and model.model.layers[0].self_attn.q_proj is not None
    prompts = [[int(t) % 512 for t in p] for p in PROMPTS[:3]]
    ref_ids, ref_logits = _greedy(model, prompts, 0, 10)
    mla.set_absorbed(model, True)
    with _expansions(model) as seen:
        ids, logits = _greedy(model, prompts, 0, 10)
    assert seen == [max(len(p) for p in prompts)] * 2
    assert ids == ref_ids and float((logits - ref_logits).abs().max()) < 1e-5


def test_a_wrapped_or_foreign_attention_is_refused(tiny_model: Path) -> None:
    engine = _start(record_routing=False)
    try:
        attn = next(m for m in engine.model.modules() if type(m).__name__ == "DeepseekV3Attention")
        attn.forward = attn.forward  # an instance-level forward, as accelerate's hooks set
        assert mla.unsupported(engine.model) == (
            "mla=absorbed: the attention's forward is wrapped (e.g. accelerate's offloading hooks); it would skip it"
        )
        del attn.forward
        assert mla.unsupported(engine.model) is None
    finally:
        engine.stop()


def test_engine_with_absorbed_mla_streams_eagers_tokens(alone3: list[Any]) -> None:
    """Through the engine (bf16 would flip random-weight tokens; the tiny model loads float32 on
    CPU): unbatched, statically batched, and through the graphed decode loop (capture faked)."""
    from engines.batching import StaticBatcher
    from engines.graphs import GraphedDecoder

    for opts in ({}, {"cache": "static", "batch_size": 3, "batch_wait_ms": 200}, {"cache": "static", "graph": True}):
        graph = opts.pop("graph", False)
        engine = _start(mla="absorbed", **opts)
        try:
            if graph:
                engine._graphed = GraphedDecoder(engine.model)
                _fake_capture(engine._graphed)
                engine._batcher = StaticBatcher(engine._run_batch, 1, 0.0)
            with _expansions(engine.model) as seen:
                got = _first_three(engine, bool(opts.get("batch_size")))
            assert got[:3] == alone3[:3], opts
            # each request's (or batch's) prompt expanded once per layer; no decode step did
            assert seen and len(seen) % engine.model.config.num_hidden_layers == 0
            assert len(seen) <= 3 * engine.model.config.num_hidden_layers
            assert mla.is_absorbed(engine.model)
            if graph:
                assert engine._graphed.captures >= 1
        finally:
            engine.stop()


def test_retune_turns_absorption_on_and_off(tiny_model: Path) -> None:
    engine = _start(record_routing=False)
    try:
        assert not mla.is_absorbed(engine.model) and engine.describe()["tuning"]["mla"] == "expand"
        engine.retune(mla="absorbed")
        assert mla.is_absorbed(engine.model)
        engine.retune(mla="expand")
        assert not mla.is_absorbed(engine.model)
    finally:
        engine.stop()


def test_a_model_without_mla_is_refused_in_one_line() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))  # fmt: skip
    assert mla.unsupported(llama) == (
        "mla=absorbed is written for DeepSeek-V3 attention (MLA); this model is LlamaForCausalLM"
    )
    assert mla.set_absorbed(llama, True) == 0 and not mla.is_absorbed(llama)


def test_the_option_is_validated(tiny_model: Path) -> None:
    with pytest.raises(Exception, match="mla"):
        create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "mla": "folded"})


@pytest.mark.slow
def test_absorbed_decode_compiles_once_and_matches_eager(alone3: list[Any]) -> None:
    """torch.compile (inductor on CPU) over the absorbed step, static cache: eager's tokens, and
    another prompt of the same shapes compiles nothing new (what cuda_graphs_compile_mla relies on)."""
    from torch._dynamo.utils import counters

    engine = _start(cache="static", compile="default", mla="absorbed", record_routing=False)
    try:
        got: list[Any] = [None] * len(PROMPTS)
        _generate(engine, 0, got)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 1
        _generate(engine, 0, got)
        assert counters["stats"]["unique_graphs"] == graphs
        with _expansions(engine.model) as seen:
            for i in (1, 2):
                _generate(engine, i, got)
        assert got[:3] == alone3[:3]
        assert len(seen) == 2 * engine.model.config.num_hidden_layers  # two prompts; compiled steps do not expand
    finally:
        engine.stop()

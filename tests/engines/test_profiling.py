"""Profiling pieces on the real tiny model: classification rules, routing hooks."""

from __future__ import annotations

import pytest

from engines.base import GenerationRequest, SamplingParams, timed_stream
from engines.profiling import CATEGORIES, CATEGORY_RULES, classified_modules, classify_module, classify_op


def test_every_rule_targets_a_known_category() -> None:
    assert {r.category for r in CATEGORY_RULES} <= set(CATEGORIES)
    assert all(r.why for r in CATEGORY_RULES)


def test_tiny_deepseek_modules_are_classified(native_engine: object) -> None:
    model = native_engine.model  # type: ignore[attr-defined]
    found: dict[str, list[str]] = {}
    for name, cat, _module in classified_modules(model):
        found.setdefault(cat, []).append(name)
    assert found["attention_kv"] == [f"model.layers.{i}.self_attn" for i in range(3)]
    assert found["dense_mlp"] == ["model.layers.0.mlp"]  # first_k_dense_replace = 1
    assert found["moe_routing"] == ["model.layers.1.mlp.gate", "model.layers.2.mlp.gate"]
    assert found["routed_experts"] == ["model.layers.1.mlp.experts", "model.layers.2.mlp.experts"]
    assert found["shared_experts"] == ["model.layers.1.mlp.shared_experts", "model.layers.2.mlp.shared_experts"]
    assert found["sampling"] == ["lm_head"]


def test_module_rules_by_class_and_path() -> None:
    class DeepseekV2MLP:  # an expert MLP class name, as in DeepSeek-V2's ModuleList of experts
        pass

    assert classify_module("model.layers.3.mlp.experts", object()) == "routed_experts"
    assert classify_module("model.layers.3.mlp.shared_experts", DeepseekV2MLP()) == "shared_experts"
    assert classify_module("model.layers.0.mlp", DeepseekV2MLP()) == "dense_mlp"


def test_op_rules() -> None:
    assert classify_op("c10d::allreduce_") == "communication"
    assert classify_op("c10d::alltoall_base_") == "communication"
    assert classify_op("nccl:all_reduce") == "communication"
    assert classify_op("aten::_scaled_mm") == "quantization"
    assert classify_op("aten::argmax", inside_module=False) == "sampling"
    assert classify_op("aten::argmax", inside_module=True) is None
    assert classify_op("aten::mm") is None


def test_routing_counts_add_up_to_tokens_times_top_k(native_engine: object) -> None:
    engine = native_engine
    engine.reset_expert_routing()  # type: ignore[attr-defined]
    req = GenerationRequest("r", "", SamplingParams(max_tokens=6), prompt_token_ids=tuple(range(20, 30)))
    res = timed_stream(engine, req)  # type: ignore[arg-type]
    assert res.error is None
    snap = engine.expert_routing()  # type: ignore[attr-defined]
    assert snap is not None and snap["layers"] == ["layer 1", "layer 2"]
    tokens = 10 + 6 - 1  # prefill of 10, then one token per decode step (the last is not fed back)
    assert snap["tokens"] == [tokens, tokens]
    for row in snap["counts"]:
        assert len(row) == 8 and sum(row) == tokens * 2  # top-2
    for groups in snap["group_counts"]:
        assert len(groups) == 2 and sum(groups) == tokens  # topk_group = 1: one group per token
    assert all(x is None or x >= 1.0 for x in snap["imbalance"])
    engine.reset_expert_routing()  # type: ignore[attr-defined]
    assert sum(map(sum, engine.expert_routing()["counts"])) == 0  # type: ignore[attr-defined]


@pytest.mark.cuda
def test_profile_on_cuda_when_present(tiny_model: object) -> None:
    from engines.accelerators import get_accelerator
    from engines.base import create_engine

    avail = get_accelerator("cuda").availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    engine = create_engine({"kind": "native", "accelerator": "cuda"})
    engine.start()
    try:
        with engine.profiler(None, with_stack=False) as session:
            timed_stream(engine, GenerationRequest("c", "hello", SamplingParams(max_tokens=4)))
        assert session.result is not None and session.result.time_basis == "device"
        assert any(o["self_device_ms"] > 0 for o in session.result.operators)
    finally:
        engine.stop()


def test_an_operator_table_read_from_a_trace_file_is_torchs_own() -> None:
    """The saved H200 profile has both torch's table (key_averages, at record time) and the
    trace torch exported from the same profile: the table read back from the trace alone
    (as for a vLLM server's trace) must be torch's, row for row: calls, self and total CPU,
    self and total device time (kernels reached through their launches' ids), nested
    duplicates merged (aten::sort calls aten::sort)."""
    import collections
    import json
    from pathlib import Path

    from engines.profiling import operator_table_from_trace

    examples = Path(__file__).resolve().parents[2] / "examples"
    bundle = json.loads((examples / "h200-profile.json").read_text())
    keys = ("calls", "self_cpu_ms", "cpu_total_ms", "self_device_ms", "device_total_ms")
    torch_rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for op in bundle["artifacts"]["profile_operators"]:  # grouped by input shape there: by name here
        for k in keys:
            torch_rows[op["operator"]][k] += op[k]
    mine = {r["operator"]: r for r in operator_table_from_trace(examples / "h200-profile.trace.json.gz")}
    assert set(mine) == set(torch_rows)
    off = [
        (name, k, torch_rows[name][k], mine[name][k])
        for name in torch_rows
        for k in keys
        if abs(mine[name][k] - torch_rows[name][k]) > max(0.01, 0.01 * abs(torch_rows[name][k]))
    ]
    assert not off, off[:5]
    assert mine["aten::mm"]["self_device_ms"] > 20 and mine["aten::sort"]["calls"] == torch_rows["aten::sort"]["calls"]
    assert mine["aten::mm"]["cpu_memory_mib"] is None  # not in a trace: not made up

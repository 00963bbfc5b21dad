"""bench.metrics (accelerator_specs, cpu_limits, model_shape, roofline): parameter counts, bytes and
FLOPs per step, the roofline, the spec table and the CPU measurement.

Reference figures: DeepSeek-V2-Lite is 15.7 B parameters with 2.4 B active (its model card);
DeepSeek-V3 671 B with 37 B active (its technical report); FACTS.md puts the H200 HBM limit
for the V2-Lite-shaped model at batch 1 near 1.1 ms per step. No timing is asserted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.metrics.accelerator_specs import SPECS, AcceleratorSpec, dtype_bytes
from bench.metrics.cpu_limits import CpuMeasurement, cpu_spec, measure_cpu, measure_cpu_uncached
from bench.metrics.model_shape import (
    ModelShape,
    bytes_per_step,
    count_params,
    expected_distinct_experts,
    flops_per_token,
    kv_cache_bytes_per_seq,
)
from bench.metrics.roofline import (
    compute_bound_tok_s,
    get_spec,
    limits,
    min_tpot_ms,
    pct_of_limit,
    preset_config,
    roofline,
)
from engines.models import TINY, TINY_CONFIG, V2_LITE_SHAPE

# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3), the fields that set its size, written by hand.
V3_CONFIG: dict = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "tie_word_embeddings": False,
}


def shape(config: dict, name: str = "m") -> ModelShape:
    return ModelShape.from_config(config, name=name)


V2_LITE = shape(preset_config("random-v2-lite-shape"), "random-v2-lite-shape")
V3 = shape(V3_CONFIG, "deepseek-v3")
TINY_SHAPE = shape(preset_config(TINY), TINY)


# --- parameters -------------------------------------------------------------------------


def test_v2_lite_total_and_active_match_the_published_figures() -> None:
    p = count_params(V2_LITE)
    assert 15.5e9 <= p.total <= 15.9e9  # "15.7 B"
    assert 2.2e9 <= p.active <= 2.6e9  # "2.4 B active"


def test_v3_total_and_active_match_the_published_figures() -> None:
    p = count_params(V3)
    assert 660e9 <= p.total <= 680e9  # "671 B" (the MTP module is not in num_hidden_layers)
    assert 36e9 <= p.active <= 38e9  # "37 B activated"


def test_counts_equal_transformers_parameter_count() -> None:
    """The formula counts exactly what transformers builds (on the meta device: no memory)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for config in (TINY_CONFIG, V2_LITE_SHAPE):
        with torch.device("meta"):
            model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**config))
        assert count_params(shape(config)).total == sum(p.numel() for p in model.parameters())


def test_tiny_preset_is_the_documented_size() -> None:
    p = count_params(TINY_SHAPE)
    assert 1.4e6 <= p.total <= 1.6e6  # FACTS.md: 1.5 M parameters
    assert p.active < p.total


def test_active_is_total_minus_the_unrouted_experts_and_the_embedding_table() -> None:
    p = count_params(V2_LITE)
    unrouted = V2_LITE.moe_layers * (V2_LITE.n_routed_experts - V2_LITE.num_experts_per_tok) * p.expert
    # active reads one embedding row instead of the table
    assert p.active == p.total - unrouted - p.embedding + V2_LITE.hidden_size


def test_tied_embeddings_are_counted_once_but_still_read_as_lm_head() -> None:
    tied = shape({**V2_LITE_SHAPE, "tie_word_embeddings": True})
    untied, t = count_params(V2_LITE), count_params(tied)
    assert untied.total - t.total == V2_LITE.vocab_size * V2_LITE.hidden_size
    assert t.active == untied.active


def test_moe_layer_rule_and_a_dense_model() -> None:
    assert V3.dense_layers == 3 and V3.moe_layers == 58
    assert V2_LITE.dense_layers == 1 and V2_LITE.moe_layers == 26
    every_other = shape({**V2_LITE_SHAPE, "moe_layer_freq": 2})
    assert every_other.moe_layers == 13
    dense = shape({**V2_LITE_SHAPE, "n_routed_experts": None})
    assert dense.moe_layers == 0
    p = count_params(dense)
    assert p.active == p.total - p.embedding + dense.hidden_size


def test_from_config_reads_a_config_object_and_a_checkpoint_folder(tmp_path: Path) -> None:
    class Cfg:
        pass

    obj = Cfg()
    for k, v in V2_LITE_SHAPE.items():
        setattr(obj, k, v)
    assert ModelShape.from_config(obj, name="x") == shape(V2_LITE_SHAPE, "x")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(V3_CONFIG), encoding="utf-8")
    from_folder = ModelShape.from_config(tmp_path / "ckpt")
    assert from_folder.name == "ckpt" and count_params(from_folder).total == count_params(V3).total


def test_a_non_mla_config_is_refused_with_what_is_missing() -> None:
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelShape.from_config({"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 2})


def test_preset_config_covers_presets_built_from_config() -> None:
    assert preset_config(TINY) == TINY_CONFIG
    assert preset_config("random-v2-lite-shape") == V2_LITE_SHAPE
    with pytest.raises(ValueError, match="checkpoint"):
        preset_config("deepseek-v3")


# --- experts touched, bytes, FLOPs --------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(64, 6), (256, 8), (8, 2)])
def test_distinct_experts_is_top_k_at_batch_1_and_saturates_at_n_routed(n: int, k: int) -> None:
    assert expected_distinct_experts(n, k, 1) == pytest.approx(k)
    values = [expected_distinct_experts(n, k, b) for b in (1, 2, 4, 16, 64, 256, 4096)]
    assert values == sorted(values)
    assert all(v <= n for v in values)
    assert values[-1] == pytest.approx(n, rel=1e-6)


def test_distinct_experts_rejects_nonsense() -> None:
    assert expected_distinct_experts(0, 0, 4) == 0.0
    with pytest.raises(ValueError):
        expected_distinct_experts(8, 9, 1)
    with pytest.raises(ValueError):
        expected_distinct_experts(8, 2, 0)


def test_dtype_bytes() -> None:
    assert [dtype_bytes(d) for d in ("bf16", "fp16", "fp32", "fp8", "torch.bfloat16")] == [2, 2, 4, 1, 2]
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("int3")


def test_bytes_per_step_at_batch_1_is_active_weights_plus_kv_cache() -> None:
    p = count_params(V2_LITE)
    assert bytes_per_step(V2_LITE, 1, 0, "bf16") == pytest.approx(p.active * 2)
    assert bytes_per_step(V2_LITE, 1, 0, "fp8") == pytest.approx(p.active)
    # MLA: (512 + 64) values per token per layer, 27 layers, 2 bytes
    assert kv_cache_bytes_per_seq(V2_LITE, 1000) == 1000 * 27 * 576 * 2
    assert bytes_per_step(V2_LITE, 1, 1000) == pytest.approx(p.active * 2 + 1000 * 27 * 576 * 2)
    assert bytes_per_step(V2_LITE, 1, 1000, "bf16", kv_dtype="fp8") == pytest.approx(p.active * 2 + 1000 * 27 * 576)


def test_bytes_per_step_grows_with_batch_but_weights_saturate() -> None:
    b = [bytes_per_step(V2_LITE, n) for n in (1, 2, 8, 64, 512)]
    assert b == sorted(b)
    p = count_params(V2_LITE)
    all_experts = (p.always_read + V2_LITE.moe_layers * V2_LITE.n_routed_experts * p.expert) * 2
    assert bytes_per_step(V2_LITE, 512) <= all_experts + 512 * V2_LITE.hidden_size * 2 + 1
    # with context, KV grows linearly in batch
    assert bytes_per_step(V2_LITE, 8, 4096) - bytes_per_step(V2_LITE, 8, 0) == pytest.approx(
        8 * kv_cache_bytes_per_seq(V2_LITE, 4096)
    )


def test_flops_per_token_is_twice_active_plus_attention() -> None:
    p = count_params(V3)
    assert flops_per_token(V3, 0) == 2 * p.active
    extra = flops_per_token(V3, 1000) - flops_per_token(V3, 0)
    assert extra == 2 * 1000 * (576 + 512) * 128 * 61


# --- limits, roofline ---------------------------------------------------------------------


def test_v2_lite_hbm_limit_on_h200_is_about_a_millisecond() -> None:
    ms = min_tpot_ms(V2_LITE, SPECS["h200"], batch=1, context_len=0, dtype="bf16")
    assert 0.9 <= ms <= 1.2  # FACTS.md: ~1.1 ms (active bytes / 4.8 TB/s)
    lim = limits(V2_LITE_SHAPE, "h200", name="random-v2-lite-shape")
    assert lim.min_tpot_ms == pytest.approx(ms)
    assert lim.bytes_per_step == pytest.approx(count_params(V2_LITE).active * 2)
    # FACTS.md's eager transformers, 83.3 ms per step at batch 1, is about 1.2-1.3 % of it
    assert 1.0 <= lim.pct(83.3) <= 1.5


def test_v3_limits_on_h200() -> None:
    lim = limits(V3_CONFIG, "cuda", name="deepseek-v3")
    assert lim.accelerator == "h200"
    assert 14.0 <= lim.min_tpot_ms <= 16.5  # ~73 GB of bf16 weights / 4.8 TB/s
    assert lim.compute_bound_tok_s == pytest.approx(989.4e12 / (2 * lim.active_params))
    assert "deepseek-v3" in lim.describe() and "H200" in lim.describe() and "\n" not in lim.describe()


@pytest.mark.parametrize("context_len", [0, 4096])
@pytest.mark.parametrize("spec_key", ["h200", "ascend-910b3", "mlu590"])
def test_roofline_is_monotonic_in_batch(spec_key: str, context_len: int) -> None:
    spec = SPECS[spec_key]
    for s in (V2_LITE, V3, TINY_SHAPE):
        points = [roofline(s, spec, b, context_len) for b in (1, 2, 4, 8, 16, 64, 256, 1024, 8192, 65536)]
        steps = [p.step_ms for p in points]
        rates = [p.tok_s for p in points]
        assert steps == sorted(steps)
        assert rates == sorted(rates)
        ceiling = compute_bound_tok_s(s, spec, context_len)
        assert all(r <= ceiling * (1 + 1e-9) for r in rates)
        assert points[0].bound == "memory"
        if context_len == 0:
            assert points[-1].bound == "compute" and points[-1].tok_s == pytest.approx(ceiling)
        else:  # each sequence reads its own KV cache: long-context decode stays memory-bound at any batch
            kv_bound = spec.bandwidth_bytes_s / kv_cache_bytes_per_seq(s, context_len)
            assert points[-1].tok_s <= kv_bound
        assert all(p.step_ms == max(p.memory_ms, p.compute_ms) for p in points)


def test_limits_object_batch_methods_agree_with_roofline() -> None:
    lim = limits(V2_LITE_SHAPE, "h200", context_len=512)
    for b in (1, 16, 128):
        point = roofline(V2_LITE, SPECS["h200"], b, 512)
        assert lim.max_tok_s_at(b) == pytest.approx(point.tok_s)
        assert lim.step_ms_at(b) == pytest.approx(point.step_ms)
    assert lim.max_tok_s_at(1) == pytest.approx(1000 / lim.min_tpot_ms)


def test_fp8_uses_the_fp8_peak_and_one_byte_weights() -> None:
    bf16, fp8 = limits(V3_CONFIG, "h200"), limits(V3_CONFIG, "h200", dtype="fp8")
    assert fp8.min_tpot_ms == pytest.approx(bf16.min_tpot_ms / 2)
    assert fp8.compute_bound_tok_s == pytest.approx(2 * bf16.compute_bound_tok_s, rel=1e-3)


def test_pct_of_limit() -> None:
    assert pct_of_limit(2.0, 1.0) == 50.0
    assert pct_of_limit(1.0, 1.0) == 100.0
    with pytest.raises(ValueError):
        pct_of_limit(0.0, 1.0)
    with pytest.raises(ValueError):
        pct_of_limit(float("nan"), 1.0)


def test_measured_figures_replace_the_specs() -> None:
    measured = limits(V2_LITE_SHAPE, "h200", bandwidth_gb_s=2400, peak_tflops=500)
    spec = limits(V2_LITE_SHAPE, "h200")
    assert measured.min_tpot_ms == pytest.approx(2 * spec.min_tpot_ms)
    assert measured.spec.bandwidth_gb_s.confidence == "measured"
    assert measured.compute_bound_tok_s == pytest.approx(spec.compute_bound_tok_s * 500 / 989.4)
    with pytest.raises(ValueError, match="positive"):
        get_spec("h200", bandwidth_gb_s=-1)


def test_unknown_accelerator_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="h200"):
        get_spec("tpu-v9")


# --- the spec table -----------------------------------------------------------------------


def test_every_spec_figure_has_a_source_and_a_confidence() -> None:
    assert {"h100-sxm", "h200", "ascend-910b3", "ascend-910b2", "mlu590"} <= set(SPECS)
    for key, spec in SPECS.items():
        assert spec.key == key and spec.accelerator in ("cuda", "npu", "mlu")
        figures = spec.figures()
        assert {"bandwidth_gb_s", "peak_tflops_16", "memory_gb"} <= set(figures)
        for name, fig in figures.items():
            assert fig.source.strip(), f"{key}.{name} has no source"
            assert fig.confidence in ("high", "medium", "low", "unverified"), f"{key}.{name}"
            assert fig.value > 0 and math.isfinite(fig.value)
        # the secondary and unverified figures say so in their source; a vendor's own document is named
        if spec.accelerator != "cuda":
            assert spec.confidence in ("low", "unverified")
            assert all(
                f.source.startswith(("secondary", "unverified", "Huawei"))
                for f in (spec.bandwidth_gb_s, spec.peak_tflops_16)
            )


def test_the_910b_peaks_are_huaweis_and_every_hopper_form_has_its_own_figures() -> None:
    """Issue 34: the 910B peaks were below the 313 / 376 TFLOPS their own note cited; any device
    name with "h100" got the SXM figures."""
    from bench.metrics.run_limits import spec_for

    b3, b2 = SPECS["ascend-910b3"], SPECS["ascend-910b2"]
    assert (b3.peak_tflops_16.value, b2.peak_tflops_16.value) == (313, 376)
    assert all("e.huawei.com" in s.peak_tflops_16.source and s.peak_tflops_16.confidence == "medium" for s in (b3, b2))
    names = {
        "NVIDIA H100 80GB HBM3": ("h100-sxm", 989.4, 3350), "NVIDIA H100 PCIe": ("h100-pcie", 756.5, 2000),
        "NVIDIA H100 NVL": ("h100-nvl", 835.5, 3900), "NVIDIA H200": ("h200", 989.4, 4800),
        "NVIDIA H200 NVL": ("h200-nvl", 835.5, 4800),
    }  # fmt: skip
    for device, (key, tflops, bandwidth) in names.items():
        spec = spec_for("cuda", {"device": device})
        assert (spec.key, spec.peak_tflops_16.value, spec.bandwidth_gb_s.value) == (key, tflops, bandwidth), device


def test_nvidia_figures() -> None:
    h100, h200 = SPECS["h100-sxm"], SPECS["h200"]
    assert (h100.memory_gb.value, h100.bandwidth_gb_s.value, h100.peak_tflops_16.value) == (80, 3350, 989.4)
    assert (h200.memory_gb.value, h200.bandwidth_gb_s.value, h200.peak_tflops_16.value) == (141, 4800, 989.4)
    assert h200.confidence == "high" and "nvidia.com" in h200.bandwidth_gb_s.source
    links = {k: SPECS[k].link_gb_s.value for k in ("h100-sxm", "h100-pcie", "h100-nvl", "h200", "h200-nvl")}
    assert links == {"h100-sxm": 900, "h100-pcie": 128, "h100-nvl": 600, "h200": 900, "h200-nvl": 900}
    assert all("NVLink" in SPECS[k].link_gb_s.source for k in links)


# --- the CPU, measured --------------------------------------------------------------------


def test_cpu_measurement_is_positive_and_finite_and_cached() -> None:
    m = measure_cpu_uncached(rounds=2, array_mib=16, matmul_n=128)
    for stat in (m.copy_gb_s, m.read_gb_s, m.matmul_gflops):
        assert 0 < stat.min <= stat.median <= stat.max and math.isfinite(stat.max)
    assert "GB/s" in m.describe()
    first = measure_cpu()
    assert measure_cpu() is first  # cached: measured once per process
    assert isinstance(first, CpuMeasurement) and first.read_gb_s.median > 0


def test_cpu_spec_from_a_measurement_or_passed_values() -> None:
    m = measure_cpu_uncached(rounds=1, array_mib=8, matmul_n=64)
    spec = cpu_spec(m)
    assert spec.bandwidth_gb_s.value == pytest.approx(m.read_gb_s.median, rel=1e-3)
    assert spec.peak_tflops_16.value == pytest.approx(m.matmul_gflops.median / 1000)
    assert spec.confidence == "measured" and "measured" in spec.bandwidth_gb_s.source
    given = cpu_spec(bandwidth_gb_s=20.0, peak_gflops=100.0)
    assert (given.bandwidth_gb_s.value, given.peak_tflops_16.value) == (20.0, 0.1)
    lim = limits(V2_LITE_SHAPE, given)
    assert lim.min_tpot_ms == pytest.approx(count_params(V2_LITE).active * 2 / 20e9 * 1e3)
    via_key = limits(V2_LITE_SHAPE, "cpu", bandwidth_gb_s=20.0, peak_tflops=0.1)
    assert via_key.min_tpot_ms == pytest.approx(lim.min_tpot_ms)
    assert isinstance(via_key.spec, AcceleratorSpec) and via_key.accelerator == "cpu"

"""The book's tables as data, engine option forms from pydantic models, the engine slot."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from bench.analysis import reference as ref
from bench.metrics.summary import summarize
from dashboard import forms
from engines.base import EngineOptions
from engines.errors import AcceleratorUnavailable, ConfigError, UnknownEngine
from tests.dashboard.synthetic import synthetic_records

# --- the book's tables -------------------------------------------------------------------------


def test_engine_table_is_the_books_8_2_4() -> None:
    rows = {r.key: r for r in ref.ENGINE_TABLE}
    assert (rows["throughput"].native, rows["throughput"].vllm, rows["throughput"].unit) == (50, 500, "tokens/s")
    assert (rows["p99_latency"].native, rows["p99_latency"].vllm, rows["p99_latency"].unit) == (500, 100, "ms")
    assert (rows["memory_efficiency"].native, rows["memory_efficiency"].vllm) == (60, 90)
    # The book's "提升" column follows from its own values: 10x, 5x, +30 points.
    assert [ref.book_gain(r) for r in ref.ENGINE_TABLE] == [10.0, 5.0, 30.0]
    assert [r.book_gain_text for r in ref.ENGINE_TABLE] == ["10x", "5x", "30%"]
    assert ref.SOURCE_ENGINES.section == "8.2.4" and ref.SOURCE_ENGINES.chapter == 8


def test_accelerator_table_is_the_books_8_3_3() -> None:
    got = [(r.platform, r.accelerator, r.throughput_pct, r.latency_pct, r.memory_pct) for r in ref.ACCELERATOR_TABLE]
    assert got == [
        ("NVIDIA H100", "cuda", 100, 100, 100),
        ("Huawei Ascend 910B", "npu", 70, 120, 80),
        ("Cambricon MLU590", "mlu", 60, 150, 70),
    ]
    assert "8.3.3" in ref.SOURCE_ACCELERATORS.cite()


def test_measured_values_never_invent_memory_efficiency() -> None:
    summary = summarize(synthetic_records(20), peak_memory_gib=1.0)
    vals = ref.measured_engine_values(summary, "e2e_ms")
    assert vals["throughput"] == pytest.approx(summary.output_throughput_tok_s)
    assert vals["p99_latency"] == pytest.approx(summary.e2e_ms.p99)
    assert vals["memory_efficiency"] is None
    assert ref.measured_engine_values(summary, "ttft_ms")["p99_latency"] == pytest.approx(summary.ttft_ms.p99)
    assert ref.measured_engine_values(None) == {"throughput": None, "p99_latency": None, "memory_efficiency": None}
    with pytest.raises(ValueError, match="unknown latency metric"):
        ref.measured_engine_values(summary, "nope")


def test_gains_and_relative_percentages() -> None:
    assert ref.gain("ratio_up", 50, 500) == 10
    assert ref.gain("ratio_down", 500, 100) == 5
    assert ref.gain("points", 60, 90) == 30
    assert ref.gain("ratio_up", None, 500) is None
    assert ref.gain("ratio_up", 0, 500) is None
    assert ref.format_gain("ratio_up", 10.0) == "10.0x"
    assert ref.format_gain("ratio_down", 2.345) == "2.35x"
    assert ref.format_gain("points", 30.0) == "+30.0 points"
    assert ref.format_gain("points", None) == "-"
    assert ref.relative_pct(200.0, 140.0) == pytest.approx(70.0)
    assert ref.relative_pct(None, 1.0) is None and ref.relative_pct(0.0, 1.0) is None
    summary = summarize(synthetic_records(10), peak_memory_gib=2.0)
    acc = ref.measured_accelerator_values(summary)
    assert acc == {
        "throughput_pct": summary.output_throughput_tok_s,
        "latency_pct": summary.e2e_ms.mean,
        "memory_pct": 2.0,
    }


# --- option forms -------------------------------------------------------------------------------


class _FakeVLLMOptions(EngineOptions):
    kind: Literal["fake-vllm"] = "fake-vllm"
    tensor_parallel_size: int = Field(1, ge=1, le=1024, description="GPUs per model replica")
    max_num_batched_tokens: int | None = Field(None, ge=1)
    quantization: Literal["fp8", "awq"] | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    served_model_name: str | None = None
    extra_args: list[str] = Field(default_factory=list)


def test_option_fields_cover_engine_specific_fields_only() -> None:
    specs = {s.name: s for s in forms.option_fields(_FakeVLLMOptions)}
    assert set(specs) == {
        "tensor_parallel_size",
        "max_num_batched_tokens",
        "quantization",
        "enable_prefix_caching",
        "enforce_eager",
        "gpu_memory_utilization",
        "served_model_name",
        "extra_args",
    }
    tp = specs["tensor_parallel_size"]
    assert (tp.widget, tp.default, tp.minimum, tp.maximum, tp.help) == ("int", 1, 1, 1024, "GPUs per model replica")
    assert specs["max_num_batched_tokens"].optional and specs["max_num_batched_tokens"].default is None
    # optional: "engine default" (None) first, so a choice can be taken back
    assert specs["quantization"].widget == "select" and specs["quantization"].choices == (None, "fp8", "awq")
    assert specs["enable_prefix_caching"].choices == (None, True, False)  # engine default / on / off
    assert specs["enforce_eager"].widget == "checkbox"
    assert specs["gpu_memory_utilization"].widget == "float" and specs["gpu_memory_utilization"].maximum == 1.0
    assert specs["served_model_name"].widget == "text"
    assert specs["extra_args"].widget == "json" and forms.widget_default(specs["extra_args"]) == "[]"


def test_parse_values_round_trip_through_the_options_model() -> None:
    specs = {s.name: s for s in forms.option_fields(_FakeVLLMOptions)}
    values = {
        "tensor_parallel_size": forms.parse_value(specs["tensor_parallel_size"], 16),
        "max_num_batched_tokens": forms.parse_value(specs["max_num_batched_tokens"], 32768),
        "quantization": forms.parse_value(specs["quantization"], "fp8"),
        "enable_prefix_caching": forms.parse_value(specs["enable_prefix_caching"], True),
        "served_model_name": forms.parse_value(specs["served_model_name"], "  "),
        "extra_args": forms.parse_value(specs["extra_args"], '["--trust-remote-code"]'),
    }
    opts = _FakeVLLMOptions.model_validate({"kind": "fake-vllm", **values})
    assert opts.tensor_parallel_size == 16 and opts.max_num_batched_tokens == 32768
    assert opts.quantization == "fp8" and opts.enable_prefix_caching is True
    assert opts.served_model_name is None and opts.extra_args == ["--trust-remote-code"]
    assert forms.parse_value(specs["extra_args"], "") == []
    with pytest.raises(ConfigError, match="extra_args: not valid JSON"):
        forms.parse_value(specs["extra_args"], "[oops")


# --- the engine slot --------------------------------------------------------------------------


def test_engine_slot_rejects_bad_options_at_once() -> None:
    from dashboard.services import EngineSlot

    slot = EngineSlot()
    with pytest.raises(UnknownEngine, match="known engines"):
        slot.load({"kind": "nope"})
    with pytest.raises(AcceleratorUnavailable, match="mlu"):
        slot.load({"kind": "native", "accelerator": "mlu"})
    with pytest.raises(ConfigError, match="accelerator"):
        slot.load({"kind": "native", "accelerator": "tpu"})
    assert slot.state().status == "empty" and slot.engine() is None and slot.memory() is None


def test_engine_slot_reports_a_failed_load_as_one_line(tmp_path: Path) -> None:
    from dashboard.services import EngineSlot

    slot = EngineSlot()
    slot.load({"kind": "native", "model": str(tmp_path / "missing"), "accelerator": "cpu"})
    state = slot.wait(60)
    assert state.status == "failed"
    assert "does not exist" in (state.error or "") and "\n" not in (state.error or "")
    assert slot.engine() is None


def test_engine_slot_loads_and_unloads_the_tiny_model(tiny_model: Path) -> None:
    from dashboard.services import EngineSlot

    slot = EngineSlot()
    seen: list[str] = []
    slot.load({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"})
    seen.append(slot.state().status)
    with pytest.raises(ConfigError, match="busy"):
        slot.load({"kind": "native"})  # while the first load is in progress
    state = slot.wait(120)
    assert "loading" in seen and state.status == "ready", state.error
    assert state.info["parameters"] > 1_000_000 and state.info["dtype"] == "float32"
    mem = slot.memory()
    assert mem is not None and mem.allocated_bytes > 0
    assert slot.engine() is not None and slot.engine().started
    slot.unload()
    state = slot.wait(30)
    assert state.status == "empty" and slot.engine() is None


def test_every_engine_option_has_a_human_label_and_the_book_arguments_come_first() -> None:
    from engines.base import engine_class, list_engines

    for kind, _label, _avail in list_engines():
        try:
            model = engine_class(kind).options_model
        except Exception:  # noqa: BLE001 - an engine whose module cannot load here has no form either
            continue
        for spec in forms.option_fields(model):
            info = model.model_fields[spec.name]  # label and group declared with the option, in its engine
            assert info.title and spec.label == info.title, f"{kind}.{spec.name} has no human label"
            assert (
                isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("group") in forms.GROUP_TITLES
            )
            assert "_" not in spec.label, spec.label  # "cpu kvcache space gib" style names are gone
    groups = forms.grouped_option_fields(engine_class("vllm").options_model)
    names = [g for g, _ in groups]
    assert names[0] == forms.GROUP_BOOK and names[-1] == forms.GROUP_ADVANCED
    book = [s.name for s in groups[0][1]]
    assert book == ["tensor_parallel_size", "max_num_batched_tokens", "quantization", "enable_prefix_caching"]
    advanced = {s.name for s in groups[-1][1]}
    assert {"max_connections", "async_client", "port"} <= advanced
    labels = {s.name: s.label for _, specs in groups for s in specs}
    assert labels["cpu_kvcache_space_gib"] == "CPU KV cache (GiB)"

"""The tiny DeepSeek-V3 checkpoint and model resolution, on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.errors import ModelLoadError
from engines.models import PRESETS, TINY, load_model, resolve_model, validate_checkpoint


def test_tiny_checkpoint_is_a_normal_hf_folder_vllm_can_load(tiny_model: Path) -> None:
    names = {p.name for p in tiny_model.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    # vLLM's MLA accepts head size kv_lora_rank + qk_rope_head_dim = 576 only (FACTS.md)
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576
    assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
    assert cfg["n_routed_experts"] == 8 and cfg["num_experts_per_tok"] == 2 and cfg["first_k_dense_replace"] == 1


def test_tiny_reloads_and_generates(tiny_model: Path) -> None:
    import torch

    model, tok = load_model(tiny_model, torch.device("cpu"), torch.float32)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 3_000_000
    ids = tok("分析以下金融数据：", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "分析以下金融数据："
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] == ids.shape[1] + 5
    assert tok.chat_template and "Assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_preset_name_resolves_to_the_built_folder(tiny_model: Path) -> None:
    name, path = resolve_model(TINY)
    assert name == TINY and path == tiny_model


def test_missing_path_is_a_one_line_reason(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as err:
        resolve_model(str(tmp_path / "nope"))
    assert "\n" not in str(err.value)


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        validate_checkpoint(tmp_path)


def test_non_causal_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    with pytest.raises(ModelLoadError, match="BertModel config, not a causal language model"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize(
    ("content", "reason"),
    [([1, 2], "holds a JSON list, not a model config object"), ({"architectures": "X"}, "should be a list")],
)
def test_a_config_of_the_wrong_shape_is_one_line(tmp_path: Path, content: object, reason: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(content))
    with pytest.raises(ModelLoadError, match=reason) as err:
        resolve_model(str(tmp_path))
    assert "\n" not in str(err.value)


def test_real_presets_not_on_this_machine_say_where_to_put_them() -> None:
    for name in ("deepseek-v2-lite", "deepseek-v3", "deepseek-r1"):
        assert PRESETS[name].hub_id
        with pytest.raises(ModelLoadError, match="is not on this machine") as err:
            resolve_model(name)
        assert PRESETS[name].hub_id in str(err.value)


def test_broken_weights_give_a_load_error(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    import torch

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="could not load"):
        load_model(broken, torch.device("cpu"), torch.float32)


def test_checkpoint_stats_read_the_safetensors_headers_only(tiny_model: Path, tmp_path: Path) -> None:
    """What a launched server is described with: the tensors' elements and bytes, counted from
    the headers, agree with opening every tensor."""
    from safetensors import safe_open

    from engines.models import checkpoint_stats

    stats = checkpoint_stats(tiny_model)
    assert stats is not None
    numel = nbytes = 0
    for f in tiny_model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                numel += t.numel()
                nbytes += t.numel() * t.element_size()
    assert stats["parameters"] == numel and stats["weights_gib"] * 2**30 == nbytes
    assert stats["checkpoint_dtype"] == "float32"
    assert checkpoint_stats(tmp_path) is None  # no safetensors: nothing made up

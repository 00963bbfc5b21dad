"""The vLLM engine's CUDA seams that run without a GPU: the torch pin check, the model-runner
choice for routed experts, and the weightless checkpoint of a random-weights preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.models import PRESETS
from engines.vllm import availability_for, needs_v2_runner, random_checkpoint, torch_mismatch


def _info(torch: str, pin: str) -> dict:
    return {"vllm": True, "dists": {"vllm": "0.25.0", "torch": torch}, "torch_pins": {"vllm": [f"torch=={pin}"]}}


def test_matching_torch_is_accepted() -> None:
    assert torch_mismatch(_info("2.11.0+cu130", "2.11.0")) is None
    assert availability_for("cuda", _info("2.11.0+cu130", "2.11.0")).ok


def test_mismatched_torch_is_refused_in_one_line() -> None:
    avail = availability_for("cuda", _info("2.13.0+cpu", "2.11.0"))
    assert not avail.ok
    assert "needs torch==2.11.0" in avail.reason and "2.13.0+cpu" in avail.reason
    assert "\n" not in avail.reason


def test_no_pin_no_refusal() -> None:
    assert torch_mismatch({"dists": {"torch": "2.11.0"}}) is None


@pytest.mark.parametrize(("version", "v2"), [("0.25.0", False), ("0.28.1", False), ("0.32.0", True), (None, True)])
def test_v2_runner_only_from_0_32(version: str | None, v2: bool) -> None:
    assert needs_v2_runner(version) is v2


def test_random_checkpoint_has_the_preset_config_and_no_weights(tmp_path: Path, monkeypatch) -> None:
    tok = tmp_path / "tiny"
    tok.mkdir()
    (tok / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "hidden_size": 128,
                "moebench_tiny_version": "2",
            }
        )
    )
    (tok / "tokenizer.json").write_text("{}")
    (tok / "model.safetensors").write_bytes(b"x")
    monkeypatch.setenv("MOEBENCH_DATA_DIR", str(tmp_path / "data"))
    folder = random_checkpoint("random-v2-lite-shape", PRESETS["random-v2-lite-shape"].random_config or {}, tok)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["hidden_size"] == 2048 and cfg["n_routed_experts"] == 64
    assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
    assert "moebench_tiny_version" not in cfg
    assert (folder / "tokenizer.json").exists() and not (folder / "model.safetensors").exists()

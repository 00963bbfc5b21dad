"""The per-accelerator throughput's denominator, from what real runs recorded (the example bundles)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.metrics.deployment import accelerator_count, per_accelerator

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _run(name: str) -> tuple[dict, dict]:
    run = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))["run"]
    return json.loads(run["config_json"]), json.loads(run["engine_json"])


def test_a_launched_vllm_counts_its_deployment() -> None:
    config, info = _run("h100-vllm-concurrency-128.json")
    assert info["deployment"]["tensor_parallel_size"] == 1
    assert accelerator_count(config, info) == 1
    wide = {**info, "deployment": {**info["deployment"], "tensor_parallel_size": 4, "data_parallel_size": 2}}
    assert accelerator_count(config, wide) == 8
    assert per_accelerator(7444.6, accelerator_count(config, wide)) == 7444.6 / 8


def test_the_native_engine_counts_its_expert_parallel_processes() -> None:
    config, info = _run("h100-native-beside-vllm-concurrency-128.json")
    assert accelerator_count(config, info) == 1
    spread = {**config, "engine": {**config["engine"], "expert_parallel": 4}}
    assert accelerator_count(spread, info) == 4


def test_a_server_reached_by_url_is_not_guessed() -> None:
    config = {"engine": {"kind": "openai", "base_url": "http://gpu-host:8000/v1", "accelerator": "cpu"}}
    assert accelerator_count(config, {"engine": "openai"}) is None
    assert per_accelerator(1000.0, None) is None

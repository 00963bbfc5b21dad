"""What MoE Bench's probe of vLLM's interpreter sees is what the server it starts will see: a vLLM
installed with ``pip install --target DIR`` and reached through PYTHONPATH (the GPU machines,
which have no package index) counts as installed; FlashInfer's absence is reported, so a CUDA
launch turns vLLM's FlashInfer sampler off instead of dying at start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engines.vllm import probe_vllm


def test_the_probe_sees_what_pythonpath_adds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "vllm_ascend").mkdir(parents=True)
    (site / "vllm_ascend" / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    before = probe_vllm(sys.executable)
    assert before.get("vllm_ascend") is False and before.get("flashinfer") is False
    monkeypatch.setenv("PYTHONPATH", str(site))
    after = probe_vllm(sys.executable)  # probed again: PYTHONPATH is part of what is cached
    assert after.get("vllm_ascend") is True

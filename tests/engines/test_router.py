"""The lean MoE gate (``router=lean``, engines/router.py) on the real tiny DeepSeek-V3: made a
one-group model (its checkpoint with ``n_group=1``, as the V2-Lite shape has), each gate's
output is bit-identical to transformers' in float32 and bf16, and the engine with it streams
the same tokens unbatched, batched and (CUDA) through captured graphs; on the tiny model as
built (1 of 2 groups kept) it is refused in one line and the engine keeps its tuning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engines import router
from engines.base import create_engine
from engines.errors import ConfigError
from tests.engines.test_native_tuning import _first_three


@pytest.fixture(scope="module")
def one_group(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with one expert group (every group kept: the stage lean skips)."""
    dest = tmp_path_factory.mktemp("one-group") / "tiny-one-group"
    shutil.copytree(tiny_model, dest)
    cfg = json.loads((dest / "config.json").read_text())
    assert (cfg["n_group"], cfg["topk_group"]) == (2, 1)  # as built: the group stage matters there
    cfg.update(n_group=1, topk_group=1)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lean_gate_gives_transformers_choice_and_weights_bit_for_bit(one_group: Path, dtype: str) -> None:
    import torch

    from engines.models import load_model

    model, _ = load_model(one_group, "cpu", getattr(torch, dtype))
    gates = router._gates(model)
    assert len(gates) == 2 and router.unsupported(model) is None
    g = torch.Generator().manual_seed(0)
    for gate in gates:
        with torch.no_grad():  # scale the bias as training leaves it: it decides near-ties
            gate.e_score_correction_bias.copy_(torch.randn(gate.num_experts, generator=g) * 0.05)
    hidden = torch.randn(3, 17, model.config.hidden_size, generator=g).to(model.dtype)
    ref = [type(gate).forward(gate, hidden) for gate in gates]
    assert router.set_lean(model, True) == 2 and router.is_lean(model)
    got = [gate(hidden) for gate in gates]
    for (r_logits, r_w, r_idx), (logits, w, idx) in zip(ref, got, strict=True):
        assert torch.equal(r_logits, logits) and torch.equal(r_idx, idx) and torch.equal(r_w, w)
        assert idx.shape == (3 * 17, model.config.num_experts_per_tok)
    assert router.set_lean(model, False) == 2 and not router.is_lean(model)
    assert all("forward" not in gate.__dict__ for gate in gates)  # the class's forward again


def test_engine_with_lean_gate_streams_transformers_tokens_unbatched_and_batched(one_group: Path) -> None:
    base = {"kind": "native", "model": str(one_group), "accelerator": "cpu"}
    ref_engine = create_engine(base)
    ref_engine.start()
    try:
        ref = _first_three(ref_engine, batched=False)
    finally:
        ref_engine.stop()
    for opts, batched in (({}, False), ({"batch_size": 3, "batch_wait_ms": 200}, True)):
        engine = create_engine({**base, "router": "lean", **opts})
        engine.start()
        try:
            assert router.is_lean(engine.model) and engine.describe()["tuning"]["router"] == "lean"
            got = _first_three(engine, batched=batched)
            assert got == ref, opts
            assert [t for t, _, _ in got[:3]] == [8, 12, 8]  # exact lengths kept
            engine.retune(router="transformers")
            assert not router.is_lean(engine.model) and engine.tuning()["router"] == "transformers"
        finally:
            engine.stop()


def test_lean_gate_is_refused_in_one_line_where_the_group_stage_matters(native_engine: Any) -> None:
    """The tiny model as built keeps 1 of its 2 groups: lean would change nothing, so it says so."""
    reason = router.unsupported(native_engine.model)
    assert reason is not None and "1 of 2 expert groups" in reason and "\n" not in reason
    before = native_engine.tuning()
    with pytest.raises(ConfigError, match="1 of 2 expert groups"):
        native_engine.retune(router="lean")
    assert native_engine.tuning() == before and not router.is_lean(native_engine.model)


@pytest.mark.cuda
def test_lean_gate_under_a_captured_step_gives_transformers_tokens_on_cuda(one_group: Path) -> None:
    """bf16 on a GPU, the decode step captured in a CUDA graph: lean's tokens are transformers'
    (the gate's kernels are the same, less two top-k, so the replay is the same computation)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    base = {"kind": "native", "model": str(one_group), "accelerator": "cuda", "dtype": "bfloat16",
            "cache": "static", "cuda_graphs": True, "experts_impl": "batched_mm"}  # fmt: skip
    runs = []
    for gate in ("transformers", "lean"):
        engine = create_engine({**base, "router": gate, "batch_size": 3, "batch_wait_ms": 200})
        engine.start()
        try:
            runs.append(_first_three(engine, batched=True))
        finally:
            engine.stop()
    assert runs[0] == runs[1] and [t for t, _, _ in runs[1][:3]] == [8, 12, 8]


def test_lean_gate_is_refused_where_transformers_gate_itself_cannot_run(one_group: Path) -> None:
    """topk_group above n_group (or groups of one expert) is a gate transformers' top-k fails on:
    lean, which skips that top-k, would run it, so there is nothing to be identical to."""
    import torch

    from engines.models import load_model

    model, _ = load_model(one_group, "cpu", torch.float32)
    for gate in router._gates(model):
        gate.topk_group = 2  # of n_group=1
    reason = router.unsupported(model)
    assert reason is not None and "is not a gate transformers runs" in reason and "\n" not in reason

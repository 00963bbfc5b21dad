"""Expert parallelism on the CPU (engines.expert_parallel): two ranks under torch's own launcher
with gloo, each holding half the tiny model's routed experts, against one process: the same
greedy tokens, the same logits within float32 rounding, and all-to-all bytes counted by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_two_ranks_give_one_processs_tokens_and_logits(tiny_model: Path) -> None:
    batch, seq, steps = 4, 16, 3
    from engines.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "engines.expert_parallel", "--check", str(tiny_model), "--batch", str(batch), "--seq", str(seq),
           "--steps", str(steps)]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("EP-CHECK "))
    out = json.loads(line.removeprefix("EP-CHECK "))
    config = json.loads((tiny_model / "config.json").read_text())
    experts, k, hidden = config["n_routed_experts"], config["num_experts_per_tok"], config["hidden_size"]
    moe_layers = config["num_hidden_layers"] - config["first_k_dense_replace"]
    assert out["world"] == 2 and out["experts_per_rank"] == [experts // 2] * moe_layers
    assert out["same_greedy_tokens"] is True
    assert out["max_abs_diff"] <= 1e-5 * max(1.0, out["max_abs_logit"])  # float32: within rounding
    # bytes, by hand: per forward and MoE layer, each rank sends its counts ([2 ranks, E/2] int64) and
    # every (token, expert) pair twice in all (out to the expert's rank, back from it), float32 rows
    pairs = sum(batch * (seq + s) * k for s in range(steps))  # no KV cache: step s reads seq + s tokens
    sent = sum(r["sent_bytes"] for r in out["comm"])
    assert sent == moe_layers * (steps * 2 * experts * 8 + 2 * pairs * hidden * 4)
    assert sum(r["recv_bytes"] for r in out["comm"]) == sent
    assert all(r["calls"] == 3 * moe_layers * steps for r in out["comm"])

"""``bench/benchmarks/routing_near_ties.py``'s instruments on the real tiny model (CPU, float32):
the routing it records is the model's own, and a flip forced by hand changes that one decision
to the runner-up expert and nothing before it."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.benchmarks.routing_near_ties import _flips, _margin, _routing
from engines.models import load_model


def test_recorded_routing_is_deterministic_and_a_forced_flip_changes_one_decision_and_nothing_earlier(
    tiny_model: Path,
) -> None:
    model, _ = load_model(tiny_model, "cpu", torch.float32)
    ids = torch.tensor([[(37 * i) % 900 + 100 for i in range(16)]])
    last, seen = _routing(model, ids)
    again_last, again = _routing(model, ids)
    layers = sorted(seen)
    assert layers == [1, 2]  # the tiny model: layer 0 dense, then two MoE layers
    assert torch.equal(last, again_last) and all(torch.equal(seen[i][1], again[i][1]) for i in layers)
    gap, weakest, runner_up = _margin(*seen[1], groups=int(model.config.n_group))
    assert bool((gap >= 0).all())  # within the groups it chose from, no unchosen expert scores higher

    tok = 5
    got_last, got = _routing(model, ids, forced=(1, tok))
    before, after = seen[1][1], got[1][1]
    assert _flips(before, after) == 1 and _flips(before[:tok], after[:tok]) == 0
    assert int(weakest[tok]) in before[tok].tolist() and int(runner_up[tok]) not in before[tok].tolist()
    assert sorted(after[tok].tolist()) == sorted(
        [int(runner_up[tok]) if e == int(weakest[tok]) else e for e in before[tok].tolist()]
    )
    assert _flips(seen[2][1][:tok], got[2][1][:tok]) == 0  # causal: earlier tokens never see the flip
    assert float((got_last - last).abs().max()) > 0  # the last position sees it through attention

"""``studies/routing_near_ties.py``'s instruments on the real tiny model (CPU, float32):
the routing it records is the model's own, and a flip forced by hand changes that one decision
to the runner-up expert and nothing before it."""

from __future__ import annotations

from pathlib import Path

import torch

from engines.models import load_model
from studies.routing_near_ties import compare_paths, count_flips, near_tie_margin, path_figures, routing_of


def test_recorded_routing_is_deterministic_and_a_forced_flip_changes_one_decision_and_nothing_earlier(
    tiny_model: Path,
) -> None:
    model, _ = load_model(tiny_model, "cpu", torch.float32)
    ids = torch.tensor([[(37 * i) % 900 + 100 for i in range(16)]])
    last, seen = routing_of(model, ids)
    again_last, again = routing_of(model, ids)
    layers = sorted(seen)
    assert layers == [1, 2]  # the tiny model: layer 0 dense, then two MoE layers
    assert torch.equal(last, again_last) and all(torch.equal(seen[i][1], again[i][1]) for i in layers)
    gap, weakest, runner_up = near_tie_margin(*seen[1], groups=int(model.config.n_group))
    assert bool((gap >= 0).all())  # within the groups it chose from, no unchosen expert scores higher

    tok = 5
    got_last, got = routing_of(model, ids, forced=(1, tok))
    before, after = seen[1][1], got[1][1]
    assert count_flips(before, after) == 1 and count_flips(before[:tok], after[:tok]) == 0
    assert int(weakest[tok]) in before[tok].tolist() and int(runner_up[tok]) not in before[tok].tolist()
    assert sorted(after[tok].tolist()) == sorted(
        [int(runner_up[tok]) if e == int(weakest[tok]) else e for e in before[tok].tolist()]
    )
    assert count_flips(seen[2][1][:tok], got[2][1][:tok]) == 0  # causal: earlier tokens never see the flip
    assert float((got_last - last).abs().max()) > 0  # the last position sees it through attention


def test_static_cache_path_records_the_prompts_routing_and_compare_reports_a_flip_where_it_began(
    tiny_model: Path,
) -> None:
    """The study's second path (the prompts through ``generate`` with a static cache, as the
    tuning check's ``cache=static`` rows run) records the prompt's routing, not a decode step's,
    and its last logits are the prompt's; ``compare_paths`` finds a flip forced by hand at its place
    with its alone margin, and ``path_figures`` names it as the first."""
    model, _ = load_model(tiny_model, "cpu", torch.float32)
    groups = int(model.config.n_group)
    ids = torch.tensor([[(37 * i) % 900 + 100 for i in range(16)], [(53 * i) % 700 + 40 for i in range(16)]])
    n = ids.shape[1]
    alone = [routing_of(model, ids[j : j + 1]) for j in range(2)]
    static_last, static = routing_of(model, ids, static_steps=3)
    assert all(static[i][1].shape[0] == ids.numel() for i in static)  # the prompt's tokens, not a decode step's
    cmp = compare_paths(alone, static, n, groups)
    assert float(cmp["gap"].min()) > 1e-5  # no near-tie in these prompts: any flip would be a bug
    assert cmp["flipped"] == [] and float(cmp["moved"].abs().max()) < 1e-4
    figs = path_figures(cmp, static_last, alone, [0, 1])
    assert figs["flips"] == 0 and figs["first_flips"] == [] and len(figs["closest_decisions_margin_move"]) == 2
    assert figs["last_logits_max_abs_diff"] < 1e-4  # the prompt's logits: a decode step's would be far off

    tok = 7
    _, forced = routing_of(model, ids[:1], forced=(1, tok))
    got = compare_paths(alone[:1], forced, n, groups)
    gap = near_tie_margin(*alone[0][1][1], groups=groups)[0]
    assert got["flipped"][0] == (1, 0, tok, float(gap[tok]), 0.0)  # same scores, another expert: moved 0
    assert all(i > 1 for i, *_ in got["flipped"][1:])  # the rest are its cascade, in later layers
    figs = path_figures(got, alone[0][0], alone[:1], [tok])
    assert [(f["layer"], f["token"]) for f in figs["first_flips"]] == [(1, tok)]
    assert figs["closest_decisions_margin_move"] == [0.0]

"""The GPU check's comparison (``studies/cuda_graphs_check.py``), on made-up logits on the CPU:
what each reported figure covers."""

import torch

from studies.cuda_graphs_check import compare, result_rows


def test_compare_reports_the_first_differing_step_whose_inputs_were_the_same() -> None:
    ref_logits = torch.zeros(2, 4, 5)
    ref_logits[:, :, 1] = 1.0  # greedy token 1 at every step
    got_logits = ref_logits.clone()
    got_logits[0, 1, 2] = 1.5  # row 0, step 1: token 2 wins by 0.5 (same inputs: step 0 agreed)
    got_logits[0, 2, 3] = 9.0  # after the split the two run on different tokens: not compared
    ref = ([[1, 1, 1, 1], [1, 1, 1, 1]], ref_logits)
    got = ([[1, 2, 3, 1], [1, 1, 1, 1]], got_logits)
    out = compare(got, ref)
    assert out["tokens_equal"] is False
    assert out["first_difference"] == 1
    assert out["logits_max_abs_diff"] == 0.0  # the agreeing steps only
    assert out["logits_max_abs_diff_same_inputs"] == 1.5  # step 1 too, not step 2's 9.0
    assert out["logits_max_abs_diff_step0"] == 0.0


def test_compare_equal_tokens_cover_every_step_and_rows() -> None:
    lg = torch.randn(3, 6, 7)
    toks = lg.argmax(-1).tolist()
    moved = lg.clone()
    moved[2, 5] += 1e-3  # the last step of the last row: tokens still equal
    out = compare((toks, moved), (toks, lg))
    assert out["tokens_equal"] is True and out["first_difference"] is None
    assert abs(out["logits_max_abs_diff_same_inputs"] - 1e-3) < 1e-6  # every step compared
    assert abs(out["logits_max_abs_diff"] - 1e-3) < 1e-6
    assert out["logits_max_abs_diff_step0"] == 0.0
    picked = result_rows((toks, lg), [0, 2])
    assert picked[0] == [toks[0], toks[2]]
    assert torch.equal(picked[1], lg[[0, 2]])

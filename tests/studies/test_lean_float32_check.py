"""studies/lean_float32_check.py on the tiny model (CPU): the lean parts pass its tolerance, and a
planted error in the experts fails it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from studies import lean_float32_check as check


def test_the_tiny_model_passes_and_the_report_says_what_it_measured(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    assert check.main(["--tiny", "--prompts", "2", "--input-len", "24", "--steps", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["variants"]) == set(check.VARIANTS)
    for name, v in res["variants"].items():
        assert v["verdict"] == "pass", (name, v)
        assert v["greedy_tokens_equal"] and v["routing_flips"] == 0
        assert v["relative"] is not None and v["relative"] <= res["tolerance"]["rtol_of_logit_scale"]
    # absorbed MLA changes only the single-token decode step: the prompt's logits are untouched
    assert res["variants"]["absorbed_mla"]["logits_max_abs_diff_where_routing_agrees"] == 0.0


def test_a_wrong_expert_output_fails_the_tolerance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The lean experts scaled by 1.01: the check must say FAIL, not pass."""
    from engines import experts

    real = experts.lean_forward

    def off_by_one_percent(module: Any, *args: Any) -> Any:
        return real(module, *args) * 1.01

    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    experts.register()
    monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS._global_mapping, experts.NAME, off_by_one_percent)
    out = tmp_path / "check.json"
    check.main(["--tiny", "--prompts", "1", "--input-len", "16", "--steps", "2", "--out", str(out)])
    res = json.loads(out.read_text())["variants"]
    assert res["lean_experts"]["verdict"] == "FAIL" and res["headline"]["verdict"] == "FAIL"
    assert res["lean_router"]["verdict"] == "pass"

"""Prompt sources with the real tiny tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.workloads import SEED_PROMPT, WorkloadSpec, build_requests, parse_jsonl
from engines.base import SamplingParams
from engines.errors import WorkloadError


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize("length", [1, 32, 200])
def test_random_prompts_reencode_to_exactly_the_input_length(tokenizer: object, length: int) -> None:
    reqs = build_requests(WorkloadSpec(source="random", input_len=length), 5, SamplingParams(), tokenizer)
    assert len(reqs) == 5 and len({r.prompt for r in reqs}) == 5
    for r in reqs:
        assert r.prompt_tokens == length and len(r.prompt_token_ids or ()) == length
        assert len(tokenizer.encode(r.prompt, add_special_tokens=False)) == length  # type: ignore[attr-defined]


def test_random_prompts_are_reproducible_by_seed(tokenizer: object) -> None:
    a = build_requests(WorkloadSpec(seed=3), 3, SamplingParams(), tokenizer)
    b = build_requests(WorkloadSpec(seed=3), 3, SamplingParams(), tokenizer)
    assert [r.prompt for r in a] == [r.prompt for r in b]


def test_builtin_prompts_include_the_seed_prompt_and_cycle(tokenizer: object) -> None:
    reqs = build_requests(WorkloadSpec(source="builtin"), 20, SamplingParams(max_tokens=4), tokenizer)
    assert reqs[0].prompt == SEED_PROMPT and len(reqs) == 20
    assert reqs[8].prompt == SEED_PROMPT  # cycled after the 8 built-ins


def test_jsonl_workload_with_per_prompt_output_len(tmp_path: Path, tokenizer: object) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello there"}\n\n{"prompt": "second", "output_len": 3}\n', encoding="utf-8")
    reqs = build_requests(WorkloadSpec(source="jsonl", path=str(f)), 4, SamplingParams(max_tokens=9), tokenizer)
    assert [r.sampling.max_tokens for r in reqs] == [9, 3, 9, 3]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"prompt": "ok"}\nnot json\n', "line 2: not valid JSON"),
        ('["a list"]\n', "line 1: expected an object"),
        ('{"prompt": ""}\n', "line 1: 'prompt' must be a non-empty string"),
        ('{"prompt": "x", "output_len": 0}\n', "line 1: 'output_len' must be a positive integer"),
        ("\n\n", "holds no prompts"),
    ],
)
def test_bad_jsonl_names_the_line(text: str, reason: str) -> None:
    with pytest.raises(WorkloadError, match=reason):
        parse_jsonl(text.encode(), origin="upload.jsonl")


def test_non_utf8_upload_is_rejected() -> None:
    with pytest.raises(WorkloadError, match="not UTF-8"):
        parse_jsonl(b"\xff\xfe\x00", origin="x")


def test_random_needs_a_tokenizer() -> None:
    with pytest.raises(WorkloadError, match="need a local tokenizer"):
        build_requests(WorkloadSpec(source="random"), 1, SamplingParams(), None)

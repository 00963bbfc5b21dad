"""Prompt sources with the real tiny tokenizer."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from bench.cli.workload_args import add_workload_arguments, workload_overrides
from bench.workloads import (
    SEED_PROMPT,
    WORKLOAD_SOURCES,
    WorkloadSource,
    WorkloadSpec,
    build_requests,
    multi_turn_position,
    parse_jsonl,
    parse_sharegpt,
)
from engines.base import GenerationRequest, SamplingParams
from engines.errors import WorkloadError

SHAREGPT_SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sharegpt_sample.json"


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


# --- helpers ------------------------------------------------------------------------------


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _assert_exact(tokenizer: Any, reqs: list[GenerationRequest]) -> None:
    """Every prompt re-encodes to exactly its ids, and prompt_tokens is their count."""
    for r in reqs:
        ids = list(r.prompt_token_ids or ())
        assert _encode(tokenizer, r.prompt) == ids, r.request_id
        assert r.prompt_tokens == len(ids) > 0


# --- the spec -----------------------------------------------------------------------------


def test_workload_sources_tuple_matches_the_field_in_the_cli_order() -> None:
    assert WORKLOAD_SOURCES == get_args(WorkloadSource)
    assert WORKLOAD_SOURCES[:3] == ("random", "builtin", "jsonl")  # cli.py's existing choices first
    assert set(WORKLOAD_SOURCES[3:]) == {"sharegpt", "shared_prefix", "multi_turn", "trace"}


def test_a_stored_config_without_the_new_fields_still_loads() -> None:
    old = {"source": "random", "input_len": 64, "output_len": 8, "path": None, "seed": 5}
    spec = WorkloadSpec.model_validate(old)
    assert spec.input_dist == "fixed" and spec.output_dist == "fixed" and spec.sharegpt_output_len == "dataset"
    assert WorkloadSpec.model_validate(spec.model_dump()) == spec  # and the new shape round-trips


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"input_dist": "uniform", "input_min": 8}, "a uniform input length needs input_min and input_max"),
        ({"output_dist": "uniform", "output_max": 8}, "a uniform output length needs output_min and output_max"),
        ({"input_dist": "normal"}, "a normal input length needs input_std"),
        ({"output_dist": "normal", "output_min": 4}, "a normal output length needs output_std"),
        ({"input_dist": "uniform", "input_min": 9, "input_max": 3}, r"input_min \(9\) is above input_max \(3\)"),
        ({"output_min": 9, "output_max": 3}, r"output_min \(9\) is above output_max \(3\)"),
        ({"source": "trace"}, "a trace workload needs a path"),  # (sharegpt without one: the package's file)
        ({"source": "jsonl"}, "a jsonl workload needs a path"),
    ],
)
def test_bad_length_options_give_one_line_reasons(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        WorkloadSpec(**fields)


@pytest.mark.parametrize(
    "fields",
    [{"input_dist": "normal", "input_std": -1.0}, {"output_std": -0.5}, {"input_min": 0}, {"prefix_groups": 0}],
)
def test_out_of_range_options_are_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec(**fields)


# --- length distributions -----------------------------------------------------------------


def test_uniform_lengths_stay_in_bounds_reach_both_ends_and_set_max_tokens(tokenizer: object) -> None:
    spec = WorkloadSpec(
        input_dist="uniform", input_min=3, input_max=12, output_dist="uniform", output_min=5, output_max=9, seed=1
    )
    reqs = build_requests(spec, 500, SamplingParams(max_tokens=16), tokenizer)
    ins = [r.prompt_tokens for r in reqs]
    outs = [r.sampling.max_tokens for r in reqs]
    assert set(ins) == set(range(3, 13))  # every length in 3..12, ends included, nothing outside
    assert set(outs) == set(range(5, 10))
    _assert_exact(tokenizer, reqs)


def test_normal_lengths_have_the_mean_and_spread_and_are_clipped(tokenizer: object) -> None:
    spec = WorkloadSpec(
        input_len=40, input_dist="normal", input_std=6.0, output_len=20, output_dist="normal", output_std=30.0,
        output_min=4, output_max=40,
    )  # fmt: skip
    reqs = build_requests(spec, 500, SamplingParams(max_tokens=20), tokenizer)
    ins = [r.prompt_tokens or 0 for r in reqs]
    assert abs(statistics.mean(ins) - 40) < 1.5 and 4.5 < statistics.stdev(ins) < 7.5
    outs = [r.sampling.max_tokens for r in reqs]
    assert min(outs) == 4 and max(outs) == 40  # std 30 around 20: both clips are hit
    _assert_exact(tokenizer, reqs)


def test_normal_lengths_without_bounds_never_go_below_one(tokenizer: object) -> None:
    spec = WorkloadSpec(input_len=2, input_dist="normal", input_std=5.0)
    reqs = build_requests(spec, 200, SamplingParams(), tokenizer)
    assert min(r.prompt_tokens or 0 for r in reqs) == 1
    _assert_exact(tokenizer, reqs)


def test_drawn_lengths_are_reproducible_by_seed(tokenizer: object) -> None:
    def shape(seed: int) -> list[tuple[str, int | None, int]]:
        spec = WorkloadSpec(
            input_dist="uniform", input_min=1, input_max=50, output_dist="normal", output_std=4.0, seed=seed
        )
        return [
            (r.prompt, r.prompt_tokens, r.sampling.max_tokens)
            for r in build_requests(spec, 30, SamplingParams(), tokenizer)
        ]

    assert shape(7) == shape(7)
    assert shape(7) != shape(8)


def test_fixed_lengths_keep_the_prompts_of_existing_runs(tokenizer: object) -> None:
    import random

    from bench.workloads import random_prompt

    rng = random.Random(4)
    expected = [random_prompt(tokenizer, 24, rng)[0] for _ in range(3)]  # what build_requests always did
    sp = SamplingParams(max_tokens=7)
    reqs = build_requests(WorkloadSpec(input_len=24, seed=4), 3, sp, tokenizer)
    assert [r.prompt for r in reqs] == expected
    assert all(r.sampling is sp for r in reqs)


def test_ten_thousand_random_requests_build_in_a_few_seconds(tokenizer: object) -> None:
    build_requests(WorkloadSpec(), 1, SamplingParams(), tokenizer)  # the word-token cache
    start = time.perf_counter()
    reqs = build_requests(WorkloadSpec(input_len=32), 10_000, SamplingParams(), tokenizer)
    assert len(reqs) == 10_000 and time.perf_counter() - start < 10.0


# --- shared prefixes ----------------------------------------------------------------------


def test_shared_prefix_groups_share_exactly_their_prefix(tokenizer: object) -> None:
    spec = WorkloadSpec(source="shared_prefix", prefix_groups=3, prefix_len=20, input_len=7)
    reqs = build_requests(spec, 12, SamplingParams(), tokenizer)
    _assert_exact(tokenizer, reqs)
    assert all(r.prompt_tokens == 27 for r in reqs)
    ids = [list(r.prompt_token_ids or ()) for r in reqs]
    for i, r in enumerate(reqs):
        assert ids[i][:20] == ids[i % 3][:20]  # round-robin groups
        assert r.prompt.startswith(reqs[i % 3].prompt[: len(tokenizer.decode(ids[i][:20]))])  # type: ignore[attr-defined]
    assert len({tuple(x[:20]) for x in ids}) == 3  # the groups differ
    assert len({tuple(x[20:]) for x in ids}) == 12  # every suffix is its own


def test_shared_prefix_suffix_follows_the_input_distribution(tokenizer: object) -> None:
    spec = WorkloadSpec(
        source="shared_prefix", prefix_groups=2, prefix_len=5, input_dist="uniform", input_min=1, input_max=6,
        output_dist="uniform", output_min=2, output_max=3,
    )  # fmt: skip
    reqs = build_requests(spec, 200, SamplingParams(), tokenizer)
    _assert_exact(tokenizer, reqs)
    assert {(r.prompt_tokens or 0) - 5 for r in reqs} == set(range(1, 7))
    assert {r.sampling.max_tokens for r in reqs} == {2, 3}


def test_shared_prefix_joins_are_checked_and_redrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer that merges the tokens either side of the prefix boundary now and then:
    joined prompts must still re-encode exactly (failed joins are drawn again)."""
    import bench.workloads as workloads

    rounds: list[int] = []
    encode_many = workloads._encode_many

    def counted(tokenizer: Any, texts: list[str]) -> list[list[int]]:
        rounds.append(len(texts))
        return encode_many(tokenizer, texts)

    monkeypatch.setattr(workloads, "_encode_many", counted)
    tok = _MergingTokenizer()
    spec = WorkloadSpec(source="shared_prefix", prefix_groups=2, prefix_len=3, input_len=2)
    reqs = build_requests(spec, 200, SamplingParams(), tok)
    for r in reqs:
        assert tok.encode(r.prompt) == list(r.prompt_token_ids or ()) and r.prompt_tokens == 5
    assert rounds[0] == 200 and len(rounds) >= 2  # some joins merged at the boundary and were drawn again


class _MergingTokenizer:
    """Letters a..j are tokens 0..9; "ab" (a then b) is one token, 10."""

    def __init__(self) -> None:
        self.all_special_ids: list[int] = []

    def __len__(self) -> int:
        return 11

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("ab" if i == 10 else "abcdefghij"[i] for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out: list[int] = []
        k = 0
        while k < len(text):
            if text.startswith("ab", k):
                out.append(10)
                k += 2
            else:
                out.append("abcdefghij".index(text[k]))
                k += 1
        return out


# --- multi-turn sessions ------------------------------------------------------------------


def test_multi_turn_prompts_resend_the_history_turn_major(tokenizer: object) -> None:
    spec = WorkloadSpec(source="multi_turn", sessions=3, turns=4, input_len=6, output_len=5)
    reqs = build_requests(spec, 12, SamplingParams(max_tokens=5), tokenizer)
    _assert_exact(tokenizer, reqs)
    assert [r.request_id for r in reqs] == [f"r{i}" for i in range(12)]
    for i, r in enumerate(reqs):
        session, turn = multi_turn_position(spec, i)
        assert (session, turn) == (i % 3, i // 3)
        assert r.prompt.count("User:") == turn + 1 and r.prompt.endswith("\nAssistant:")
        if turn == 0:
            assert r.prompt.startswith("User:")
            continue
        prev = reqs[i - 3]  # the same session's previous turn
        ids, prev_ids = list(r.prompt_token_ids or ()), list(prev.prompt_token_ids or ())
        assert r.prompt.startswith(prev.prompt) and ids[: len(prev_ids)] == prev_ids  # a prefix-cache hit
        reply = r.prompt[len(prev.prompt) :].split("\nUser:")[0]
        assert len(_encode(tokenizer, reply)) == 5  # the synthetic reply has the turn's output length
        assert (r.prompt_tokens or 0) > (prev.prompt_tokens or 0)
    assert len({r.prompt for r in reqs[:3]}) == 3  # sessions differ


def test_multi_turn_token_counts_grow_by_reply_user_turn_and_markers(tokenizer: object) -> None:
    spec = WorkloadSpec(source="multi_turn", sessions=1, turns=3, input_len=10, output_len=4)
    reqs = build_requests(spec, 3, SamplingParams(max_tokens=4), tokenizer)
    user0, user, assistant = (len(_encode(tokenizer, m)) for m in ("User:", "\nUser:", "\nAssistant:"))
    counts = [r.prompt_tokens for r in reqs]
    step = 4 + user + 10 + assistant
    assert counts == [user0 + 10 + assistant, user0 + 10 + assistant + step, user0 + 10 + assistant + 2 * step]


def test_multi_turn_output_distribution_sets_max_tokens_and_reply_length(tokenizer: object) -> None:
    spec = WorkloadSpec(source="multi_turn", sessions=2, turns=2, output_dist="uniform", output_min=3, output_max=9)
    reqs = build_requests(spec, 4, SamplingParams(), tokenizer)
    for first, second in ((reqs[0], reqs[2]), (reqs[1], reqs[3])):
        reply = second.prompt[len(first.prompt) :].split("\nUser:")[0]
        assert len(_encode(tokenizer, reply)) == first.sampling.max_tokens


def test_multi_turn_count_truncates_or_starts_new_sessions(tokenizer: object) -> None:
    spec = WorkloadSpec(source="multi_turn", sessions=2, turns=2, input_len=3, output_len=2)
    short = build_requests(spec, 3, SamplingParams(max_tokens=2), tokenizer)
    assert [multi_turn_position(spec, i) for i in range(3)] == [(0, 0), (1, 0), (0, 1)]
    assert short[2].prompt.startswith(short[0].prompt)
    long = build_requests(spec, 6, SamplingParams(max_tokens=2), tokenizer)
    assert [multi_turn_position(spec, i) for i in range(4, 6)] == [(2, 0), (3, 0)]
    assert long[4].prompt.count("User:") == 1 and long[4].prompt not in {long[0].prompt, long[1].prompt}
    assert [r.prompt for r in long[:3]] == [r.prompt for r in short]  # same seed, same first requests
    _assert_exact(tokenizer, long)


@pytest.mark.parametrize("source", ["shared_prefix", "multi_turn"])
def test_generated_sources_need_a_local_tokenizer(source: str) -> None:
    with pytest.raises(WorkloadError, match="need a local tokenizer"):
        build_requests(WorkloadSpec(source=source), 1, SamplingParams(), None)  # type: ignore[arg-type]


# --- ShareGPT -----------------------------------------------------------------------------

# The sample's usable (prompt, reply) pairs; the rest must be skipped (see tests/data/README.md).
_USABLE = {
    "moebench_0": 0,
    "moebench_5": 1,  # the first human turn is the second turn
    "moebench_8": 0,
    "moebench_9": 1,  # after a system turn
    "moebench_10": 0,  # only the first exchange
    "moebench_12": 0,  # long: 600+ tokens in all
}


def _sample_pairs() -> dict[str, tuple[str, str]]:
    data = json.loads(SHAREGPT_SAMPLE.read_text(encoding="utf-8"))
    out = {}
    for entry in data:
        if entry["id"] in _USABLE:
            turns = entry["conversations"]
            k = _USABLE[entry["id"]]
            out[entry["id"]] = (turns[k]["value"], turns[k + 1]["value"])
    return out


def test_sharegpt_sample_gives_the_usable_prompts_with_their_reply_lengths(tokenizer: object) -> None:
    spec = WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE))
    reqs = build_requests(spec, 6, SamplingParams(max_tokens=16), tokenizer)
    pairs = _sample_pairs()
    assert sorted(r.prompt for r in reqs) == sorted(p for p, _ in pairs.values())  # each once, the rest skipped
    replies = dict(pairs.values())
    for r in reqs:
        assert r.sampling.max_tokens == len(_encode(tokenizer, replies[r.prompt]))
        assert r.prompt_tokens == len(tokenizer(r.prompt).input_ids)  # type: ignore[operator]
        assert r.prompt_token_ids is None  # sent as text, as vllm bench does
    assert [r.request_id for r in reqs] == [f"r{i}" for i in range(6)]


def test_sharegpt_is_shuffled_by_seed_and_cycled(tokenizer: object) -> None:
    def prompts(seed: int, n: int) -> list[str]:
        spec = WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE), seed=seed)
        return [r.prompt for r in build_requests(spec, n, SamplingParams(), tokenizer)]

    assert prompts(0, 6) == prompts(0, 6)
    assert any(prompts(0, 6) != prompts(s, 6) for s in (1, 2, 3))
    assert prompts(0, 14) == prompts(0, 6) * 2 + prompts(0, 2)


def test_sharegpt_length_cap_and_fixed_output_len(tokenizer: object) -> None:
    pairs = _sample_pairs()
    long_prompt = pairs["moebench_12"][0]
    capped = WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE), sharegpt_max_len=600)
    reqs = build_requests(capped, 5, SamplingParams(), tokenizer)
    assert long_prompt not in {r.prompt for r in reqs} and len({r.prompt for r in reqs}) == 5
    fixed = WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE), sharegpt_output_len="fixed")
    reqs = build_requests(fixed, 7, SamplingParams(max_tokens=12), tokenizer)
    assert all(r.sampling.max_tokens == 12 for r in reqs)
    # the 3-token reply "Yes." no longer matters: its prompt joins the usable ones
    assert any(r.prompt.startswith("Can you confirm") for r in reqs) and len({r.prompt for r in reqs}) == 7


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json at all", "bad.json is not valid JSON"),
        (b'{"conversations": []}', "bad.json is not a ShareGPT file: expected a JSON list of conversations"),
        (b"\xff\xfe", "bad.json is not UTF-8 text"),
        (b'[{"conversations": [{"from": "human", "value": "only one turn"}]}, 3]', "bad.json holds no conversation"),
        (
            b'[{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}]',
            "bad.json has no usable conversation: prompts and replies need 4\\+ tokens",
        ),
    ],
)
def test_bad_sharegpt_files_give_one_line_reasons(
    tmp_path: Path, tokenizer: object, content: bytes, reason: str
) -> None:
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(WorkloadError, match=reason) as info:
        build_requests(WorkloadSpec(source="sharegpt", path=str(f)), 2, SamplingParams(), tokenizer)
    assert "\n" not in str(info.value)


def test_missing_sharegpt_file_and_size_cap(tmp_path: Path, tokenizer: object, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WorkloadError, match=r"ShareGPT file '.*nope\.json' does not exist"):
        build_requests(
            WorkloadSpec(source="sharegpt", path=str(tmp_path / "nope.json")), 1, SamplingParams(), tokenizer
        )
    monkeypatch.setattr("bench.workloads.MAX_SHAREGPT_BYTES", 10)
    with pytest.raises(WorkloadError, match=r"sharegpt_sample\.json is larger than"):
        build_requests(WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE)), 1, SamplingParams(), tokenizer)
    with pytest.raises(WorkloadError, match="upload is larger than"):
        parse_sharegpt(b"[" + b" " * 20 + b"]")


def test_sharegpt_needs_a_tokenizer() -> None:
    with pytest.raises(WorkloadError, match="need a tokenizer"):
        build_requests(WorkloadSpec(source="sharegpt", path=str(SHAREGPT_SAMPLE)), 1, SamplingParams(), None)


# --- CLI helpers --------------------------------------------------------------------------


def test_workload_flags_give_only_what_was_set_and_take_help_from_the_fields() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    assert workload_overrides(parser.parse_args([])) == {}
    args = parser.parse_args(
        ["--input-dist", "normal", "--input-std", "2.5", "--output-min", "3", "--prefix-len", "9", "--turns", "2",
         "--sharegpt-output-len", "fixed"]
    )  # fmt: skip
    overrides = workload_overrides(args)
    assert overrides == {
        "input_dist": "normal", "input_std": 2.5, "output_min": 3, "prefix_len": 9, "turns": 2,
        "sharegpt_output_len": "fixed",
    }  # fmt: skip
    WorkloadSpec(**overrides)  # merges into a valid spec
    help_text = " ".join(parser.format_help().split())
    for field in ("input_dist", "prefix_groups", "sharegpt_max_len"):
        description = WorkloadSpec.model_fields[field].description or ""
        assert " ".join(description.split()) in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--input-dist", "zipf"])


# --- lazy building and the context check --------------------------------------------------


def test_a_million_requests_start_at_once_and_hold_few_blocks(tokenizer: object) -> None:
    from bench.workloads import REQUEST_BLOCK, RequestSource, request_source

    src = request_source(WorkloadSpec(input_len=32), 1_000_000, SamplingParams(), tokenizer)
    assert list(src._blocks) == [0]  # only the first block is built before the run starts
    assert len(src) == 1_000_000 and src[0].request_id == "r0"
    last = src[999_999]
    assert last.request_id == "r999999" and last.prompt_tokens == 32
    for k in range(0, 40 * REQUEST_BLOCK, REQUEST_BLOCK):
        src[k]
    assert len(src._blocks) <= RequestSource.KEEP_BLOCKS  # memory stays flat as the run reads on
    # Block k is a function of the seed and k alone: a second source agrees, in any order.
    again = request_source(WorkloadSpec(input_len=32), 1_000_000, SamplingParams(), tokenizer)
    assert again[999_999].prompt == last.prompt and again[REQUEST_BLOCK + 3].prompt == src[REQUEST_BLOCK + 3].prompt
    assert src[REQUEST_BLOCK].prompt != src[0].prompt
    head = src[:300]
    assert isinstance(head, RequestSource) and len(head) == 300 and head[299].prompt == src[299].prompt


def test_read_ahead_builds_the_next_block_on_a_thread(tokenizer: object) -> None:
    from bench.workloads import REQUEST_BLOCK, request_source

    src = request_source(WorkloadSpec(input_len=8), 3 * REQUEST_BLOCK, SamplingParams(), tokenizer)
    src.read_ahead = True
    src[REQUEST_BLOCK]  # first read of block 1 starts block 2
    deadline = time.monotonic() + 10
    while 2 not in src._blocks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 2 in src._blocks


@pytest.mark.parametrize(
    ("spec", "needs"),
    [
        (dict(input_len=2000), "2000 tokens plus 100 output tokens need 2100"),
        (dict(input_dist="uniform", input_min=8, input_max=4000), "lower the uniform distribution's maximum"),
        (dict(input_dist="normal", input_std=4.0), "need 131172 tokens"),
        (dict(source="shared_prefix", prefix_len=1500, input_len=500), "(prefix 1500)"),
        (dict(source="multi_turn", turns=20, input_len=64), "20 turns"),
    ],
)
def test_prompts_that_cannot_fit_the_context_are_refused_before_any_request(
    tokenizer: object, spec: dict[str, Any], needs: str
) -> None:
    from bench.workloads import request_source

    with pytest.raises(WorkloadError, match="over the model's context of 2048") as err:
        request_source(WorkloadSpec(**spec), 4, SamplingParams(max_tokens=100), tokenizer, context_len=2048)
    assert needs in str(err.value) and "\n" not in str(err.value)
    request_source(WorkloadSpec(**spec), 4, SamplingParams(max_tokens=100), tokenizer, context_len=1_000_000)


def test_a_prompt_file_line_too_long_for_the_context_is_refused_unread(tmp_path: Path, tokenizer: object) -> None:
    from bench.workloads import request_source

    f = tmp_path / "big.jsonl"
    with f.open("w") as out:
        out.write('{"prompt": "fine"}\n')
        out.write('{"prompt": "' + " a" * 3_000_000 + '"}\n')  # 6 MB: minutes to tokenize
    seen: list[int] = []

    class Counting:  # the tiny tokenizer, recording the length of each text it is given
        def __call__(self, text: str) -> Any:
            seen.append(len(text))
            return tokenizer(text)  # type: ignore[operator]

    with pytest.raises(WorkloadError, match=r"big.jsonl line 2: 6,000,015 bytes is too long for the model's context"):
        request_source(WorkloadSpec(source="jsonl", path=str(f)), 2, SamplingParams(), Counting(), context_len=2048)
    assert max(seen, default=0) < 100  # the long line was refused before anything tokenized it
    f.write_text('{"prompt": "' + " a" * 1500 + '"}\n')  # fits the character limit, not the context
    with pytest.raises(WorkloadError, match=r"prompt 1 .* has 1500 tokens; with 16 output tokens it needs 1516"):
        request_source(WorkloadSpec(source="jsonl", path=str(f)), 2, SamplingParams(), tokenizer, context_len=1024)

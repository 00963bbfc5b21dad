"""The native engine on CPU with the real tiny model."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engines.base import GenerationRequest, SamplingParams, create_engine, engine_class, list_engines, timed_stream
from engines.errors import ConfigError, EngineUnavailable, UnknownEngine
from engines.native import IncrementalDetokenizer

_FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    """The tiny model's real byte-level BPE tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class _CountingTokenizer:
    """The real tokenizer, counting the ids handed to ``decode``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.decoded_ids = 0

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.decoded_ids += len(ids)
        return self.tokenizer.decode(ids, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def _feed(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random, most: int = 3) -> list[str]:
    """Add ``ids`` one to ``most`` at a time, as decode steps do; the deltas."""
    deltas, i = [], 0
    while i < len(ids):
        k = rng.randint(1, most)
        deltas.append(detok.add(ids[i : i + k]))
        i += k
    return deltas


def _req(max_tokens: int, **kw: object) -> GenerationRequest:
    return GenerationRequest("t", "Explain expert routing.", SamplingParams(max_tokens=max_tokens, **kw))


@pytest.mark.parametrize("n", [1, 7, 32])
def test_streams_exactly_the_requested_number_of_tokens(native_engine: object, n: int) -> None:
    res = timed_stream(native_engine, _req(n))  # type: ignore[arg-type]
    assert res.error is None
    assert res.output_tokens == n
    assert len(res.chunks) == n  # one chunk per decode step, each stamped
    times = [c.t for c in res.chunks]
    assert times == sorted(times) and res.start < times[0] <= res.end
    assert res.prompt_tokens and res.prompt_tokens > 0


def test_exact_prompt_token_ids_are_used_as_given(native_engine: object) -> None:
    req = GenerationRequest("ids", "", SamplingParams(max_tokens=4), prompt_token_ids=tuple(range(10, 42)))
    res = timed_stream(native_engine, req)  # type: ignore[arg-type]
    assert res.error is None and res.prompt_tokens == 32 and res.output_tokens == 4


def test_sampling_is_seeded_and_greedy_is_deterministic(native_engine: object) -> None:
    greedy = [timed_stream(native_engine, _req(12)).text for _ in range(2)]  # type: ignore[arg-type]
    assert greedy[0] == greedy[1]
    sampled = [
        timed_stream(native_engine, _req(12, temperature=1.5, top_p=0.95, seed=7)).text  # type: ignore[arg-type]
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    other = timed_stream(native_engine, _req(12, temperature=1.5, top_p=0.95, seed=8)).text  # type: ignore[arg-type]
    assert other != sampled[0] or other != greedy[0]


def test_cancel_stops_generation_within_two_seconds(native_engine: object) -> None:
    cancel = threading.Event()
    out: dict[str, object] = {}

    def run() -> None:
        out["res"] = timed_stream(native_engine, _req(4000), cancel)  # type: ignore[arg-type]

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    t_cancel = time.perf_counter()
    cancel.set()
    t.join(5)
    stopped = time.perf_counter() - t_cancel
    assert not t.is_alive() and stopped < 2.0
    res = out["res"]
    assert 0 < res.output_tokens < 4000 and res.error == "cancelled"  # type: ignore[attr-defined]


def test_describe_and_memory(native_engine: object) -> None:
    info = native_engine.describe()  # type: ignore[attr-defined]
    assert info["engine"] == "native" and info["model"] == "tiny-deepseek-v3"
    assert info["parameters"] > 1_000_000 and info["dtype"] == "float32"
    assert "torch" in info["versions"] and "transformers" in info["versions"]
    mem = native_engine.memory()  # type: ignore[attr-defined]
    assert mem is not None and mem.peak_bytes >= mem.allocated_bytes > 0


def test_registry_lists_native_and_rejects_unknown_kinds() -> None:
    kinds = {k for k, _label, _a in list_engines()}
    assert "native" in kinds
    assert engine_class("native").kind == "native"
    with pytest.raises(UnknownEngine, match=r"unknown engine 'tgi'; known engines: .*native"):
        create_engine({"kind": "tgi"})
    with pytest.raises(ConfigError, match="accelerator: unknown accelerator 'tpu'"):
        create_engine({"kind": "native", "accelerator": "tpu"})


def test_stream_before_start_is_a_clear_error(tiny_model: object) -> None:
    engine = create_engine({"kind": "native"})
    res = timed_stream(engine, _req(2))
    assert res.error is not None and "not started" in res.error
    with pytest.raises(EngineUnavailable):
        next(iter(engine.stream(_req(2))))


@pytest.mark.parametrize("hold_limit", [3, 8])
def test_detokenizer_deltas_join_to_the_full_decode_of_random_ids(tokenizer: Any, hold_limit: int) -> None:
    # Any vocab id, special ones and the ids past the tokenizer's vocabulary that the tiny
    # model emits included, with half of them single bytes that split UTF-8 characters.
    rng = random.Random(0)
    vocab = len(tokenizer)
    byte_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("Ã", "ä", "ð", "¸", "Ń", "ł")]
    for trial in range(20):
        ids = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(vocab + 32) for _ in range(2000)]
        detok = IncrementalDetokenizer(tokenizer, hold_limit=hold_limit)
        deltas = _feed(detok, ids, rng)
        assert "".join(deltas) + detok.flush() == tokenizer.decode(ids, skip_special_tokens=True), trial


def test_detokenizer_holds_split_characters_back_until_they_complete(tokenizer: Any) -> None:
    text = "Experts 路由 🙂 déjà vu, 量化 🚀👩‍💻 𝄞 ok. " * 20
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert sum(tokenizer.decode([i]).endswith(_FFFD) for i in ids) > 100  # byte tokens split characters
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert full == text and _FFFD not in full
    for most in (1, 3):
        detok = IncrementalDetokenizer(tokenizer)
        deltas = _feed(detok, ids, random.Random(most), most)
        assert not [d for d in deltas if _FFFD in d]
        assert "".join(deltas) == full and detok.flush() == ""


def test_detokenizer_emits_an_unfinished_character_at_the_end_of_the_stream(tokenizer: Any) -> None:
    detok = IncrementalDetokenizer(tokenizer)
    lead = tokenizer.convert_tokens_to_ids("ä")  # byte 0xE4: the first of three
    assert detok.add(tokenizer("ok", add_special_tokens=False).input_ids) == "ok"
    assert detok.add([lead, tokenizer.eos_token_id]) == ""
    assert detok.flush() == _FFFD and detok.flush() == ""


@pytest.mark.parametrize("source", ["text", "random", "never-valid"])
def test_detokenizer_decodes_a_bounded_number_of_ids_per_token(tokenizer: Any, source: str) -> None:
    n = 4000
    rng = random.Random(1)
    if source == "text":
        ids = tokenizer("Routing 路由 🙂 tokens to experts. " * 400, add_special_tokens=False).input_ids[:n]
    elif source == "random":
        ids = [rng.randrange(len(tokenizer)) for _ in range(n)]
    else:  # one lead byte over and over: the text always ends in U+FFFD
        ids = [tokenizer.convert_tokens_to_ids("ä")] * n
    assert len(ids) == n
    counting = _CountingTokenizer(tokenizer)
    detok = IncrementalDetokenizer(counting)
    text = "".join(detok.add([i]) for i in ids) + detok.flush()
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    # Re-decoding every id on every token would pass n * (n + 1) / 2 (8 million) ids.
    assert counting.decoded_ids < 20 * n


def test_streamed_text_is_the_decode_of_the_generated_ids(native_engine: Any) -> None:
    import torch

    n = 32
    res = timed_stream(native_engine, _req(n))
    assert res.error is None and res.output_tokens == n
    tok = native_engine.tokenizer()
    prompt = torch.tensor([tok("Explain expert routing.", add_special_tokens=True).input_ids])
    with torch.inference_mode():
        out = native_engine.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=tok.pad_token_id,
        )
    full = tok.decode(out[0, prompt.shape[1] :].tolist(), skip_special_tokens=True)
    assert res.text, "the tiny model's greedy output should hold some text"
    # The stream does not send an unfinished last character (U+FFFD); all else matches.
    rest = full[len(res.text) :]
    assert full.startswith(res.text) and (rest == "" or rest.endswith(_FFFD))

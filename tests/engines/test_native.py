"""The native engine on CPU with the real tiny model."""

from __future__ import annotations

import threading
import time

import pytest

from engines.base import GenerationRequest, SamplingParams, create_engine, engine_class, list_engines, timed_stream
from engines.errors import ConfigError, EngineUnavailable, UnknownEngine


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

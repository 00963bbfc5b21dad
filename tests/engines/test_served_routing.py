"""Routing from a served engine's own answers (OpenAIOptions.routed_experts / routing_pass), end to
end through the real stub server, the real runner and a real SQLite store.

The stub plants expert ids as SGLang and vLLM encode them (bench.stub_server.planted_ids /
encode_routed: slot 0 always expert 0, so each MoE layer's hot expert carries E/K = 4 times the
mean load on the tiny model's 8 experts, top-2). The expected counts here are built from the stub's
ids per request with numpy, independently of the client's decoder (engines.routing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.stub_server import ROUTING_SHAPE, planted_ids, start_stub_server
from engines.errors import ConfigError
from engines.sse import OVERSIZE_EVENT, SSEDecoder, SSEError

EXPERTS, TOP_K = ROUTING_SHAPE[2], ROUTING_SHAPE[3]


def _expected(records: list[Any]) -> np.ndarray:
    """[2, layers, experts] from the stub's ids for each request's prompt and output tokens."""
    total = np.zeros((2, ROUTING_SHAPE[0] - ROUTING_SHAPE[1], EXPERTS), dtype=np.int64)
    for rec in records:
        ids = planted_ids(rec.prompt_tokens + rec.output_tokens - 1)
        for layer in range(ids.shape[1]):
            total[0, layer] += np.bincount(ids[: rec.prompt_tokens, layer].reshape(-1), minlength=EXPERTS)
            total[1, layer] += np.bincount(ids[rec.prompt_tokens :, layer].reshape(-1), minlength=EXPERTS)
    return total


def _config(url: str, **opts: Any) -> RunConfig:
    return RunConfig.build(
        engine={"kind": "openai", "model": "tiny-deepseek-v3", "base_url": url, **opts},
        mode="concurrency",
        workload={"source": "builtin", "output_len": 5},
        requests=12,
        concurrency=4,
        server_metrics=False,
        warmup=1,
    )


@pytest.fixture(scope="module")
def sglang_stub() -> Any:
    url, proc = start_stub_server(routed_experts="sglang")
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def vllm_stub() -> Any:
    url, proc = start_stub_server(routed_experts="vllm")
    yield url
    proc.stop()


@pytest.mark.parametrize("async_client", [True, False])
def test_streamed_sglang_routing_is_the_servers_ids_counted(
    sglang_stub: str, store: Any, tiny_model: Any, async_client: bool
) -> None:
    job = start_run(_config(sglang_stub, routed_experts=True, async_client=async_client), store)
    snap = job.wait(60)
    assert snap.status == "completed" and snap.failed == 0, snap.error
    records = store.records(snap.run_id)
    routing = store.artifact(snap.run_id, "expert_routing")
    assert routing is not None and "error" not in routing, routing
    expected = _expected(records)
    assert routing["phases"]["prefill"] == expected[0].tolist()
    assert routing["phases"]["decode"] == expected[1].tolist()
    assert routing["counts"] == expected.sum(axis=0).tolist()
    assert routing["layers"] == ["layer 1", "layer 2"]  # the dense layer 0's columns dropped
    assert routing["requests"] == 12 and routing["windows"] and "sent with each request" in routing["source"]
    assert routing["imbalance"] == [EXPERTS / TOP_K] * 2  # the planted hot expert
    summary = store.get_run(snap.run_id).summary
    assert summary.moe_imbalance_max == pytest.approx(EXPERTS / TOP_K)
    assert all(r.ok and r.output_tokens == 5 for r in records)


def test_the_vllm_routing_pass_counts_the_runs_first_requests(vllm_stub: str, store: Any, tiny_model: Any) -> None:
    job = start_run(_config(vllm_stub, routing_pass=5), store)
    snap = job.wait(60)
    assert snap.status == "completed" and snap.failed == 0, snap.error
    records = sorted(store.records(snap.run_id), key=lambda r: int(r.request_id[1:]))
    routing = store.artifact(snap.run_id, "expert_routing")
    assert routing is not None and "error" not in routing, routing
    assert routing["pass_requests"] == 5 and "non-streamed pass" in routing["source"]
    expected = _expected(records[:5])
    assert routing["phases"]["prefill"] == expected[0].tolist()
    assert routing["phases"]["decode"] == expected[1].tolist()
    assert routing["windows"] == []  # the pass is not on the run's timeline


def test_a_server_that_sends_no_routing_is_said_so_and_the_run_kept(
    vllm_stub: str, store: Any, tiny_model: Any
) -> None:
    """vLLM (0.32) streams no routed_experts: asking for them on a stream gives one line, no counts."""
    job = start_run(_config(vllm_stub, routed_experts=True), store)
    snap = job.wait(60)
    assert snap.status == "completed" and snap.failed == 0, snap.error
    assert store.artifact(snap.run_id, "expert_routing") is None
    why = store.artifact(snap.run_id, "expert_routing_error")["error"]
    assert "the server sent no routed_experts (is it started with --enable-return-routed-experts?)" in why
    assert "\n" not in why


def test_routing_needs_the_models_layout(sglang_stub: str, store: Any) -> None:
    """A model name with no local config: refused at start in one line, before any request."""
    cfg = RunConfig.build(
        engine={"kind": "openai", "model": "remote-only-model", "base_url": sglang_stub, "routed_experts": True,
                "check_model": False},
        mode="latency", requests=1, server_metrics=False, warmup=0,
    )  # fmt: skip
    snap = start_run(cfg, store).wait(60)
    assert snap.status == "failed" and "need the model's config.json" in (snap.error or ""), snap.error


def test_the_vllm_engine_refuses_what_its_server_cannot_do() -> None:
    from engines.vllm import VLLMOptions, check_deployment, server_argv

    with pytest.raises(ConfigError, match="only on non-streamed responses"):
        check_deployment(VLLMOptions(model="m", routed_experts=True), None, None)
    with pytest.raises(ConfigError, match="Triton with a CPU backend"):
        check_deployment(VLLMOptions(model="m", accelerator="cpu", routing_pass=8), None, None)
    opts = VLLMOptions(model="m", accelerator="cuda", routing_pass=8)
    check_deployment(opts, None, 1)
    assert "--enable-return-routed-experts" in server_argv("python", "/m", "m", "127.0.0.1", 8000, opts)


def test_the_sse_decoder_skips_an_oversize_event_only_when_asked() -> None:
    event = b'data: {"x": 1}\n\n'
    big = b"data: " + b"A" * 150 + b"\n\n"
    for cut in range(1, len(big)):  # the oversize event split anywhere, even inside its line
        dec = SSEDecoder(max_event_bytes=100, skip_oversize=True)
        out = dec.feed(event) + dec.feed(big[:cut]) + dec.feed(big[cut:]) + dec.feed(event + b"data: [DONE]\n\n")
        assert out == ['{"x": 1}', OVERSIZE_EVENT, '{"x": 1}', "[DONE]"], cut
    many_lines = SSEDecoder(max_event_bytes=100, skip_oversize=True)
    lines = b"".join(b"data: " + b"B" * 40 + b"\n" for _ in range(6)) + b"\n"
    assert many_lines.feed(lines + event) == [OVERSIZE_EVENT, '{"x": 1}']
    with pytest.raises(SSEError, match="over 100 bytes"):
        SSEDecoder(max_event_bytes=100).feed(big)
    endless = SSEDecoder(max_event_bytes=100, skip_oversize=True)
    with pytest.raises(SSEError, match="even to skip it"):
        for _ in range(100):  # an event that never ends is not read for ever
            endless.feed(b"data: " + b"C" * 90 + b"\n")

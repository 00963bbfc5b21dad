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

"""Accelerator backends: CPU for real; CUDA/NPU/MLU report why they are missing here."""

from __future__ import annotations

import pytest

from engines.accelerators import (
    ACCELERATORS,
    GIB,
    DeviceModuleAccelerator,
    canonical_dtype,
    get_accelerator,
    list_accelerators,
)
from engines.errors import AcceleratorUnavailable, ConfigError


def test_every_backend_is_listed_with_a_reason_when_unavailable() -> None:
    rows = {name: avail for name, _label, avail in list_accelerators()}
    assert set(rows) == {"cpu", "cuda", "npu", "mlu"}
    assert rows["cpu"].ok
    for name, avail in rows.items():
        assert avail.ok or (avail.reason and "\n" not in avail.reason), name


def test_cpu_memory_is_process_rss_with_a_resettable_peak() -> None:
    cpu = get_accelerator("cpu")
    cpu.reset_peak()
    before = cpu.memory()
    assert before.source == "process RSS" and before.allocated_bytes > 10 * 2**20
    block = bytearray(300 * 2**20)  # 300 MiB, touched
    block[::4096] = b"x" * len(block[::4096])
    during = cpu.memory()
    assert during.peak_bytes >= before.allocated_bytes + 250 * 2**20
    del block
    cpu.reset_peak()
    after = cpu.memory()
    assert after.peak_bytes < during.peak_bytes - 200 * 2**20
    report = cpu.analyze_memory_usage()
    assert set(report) == {"current_allocated", "current_reserved", "peak_allocated"}
    assert report["current_allocated"].endswith(" GB")
    assert abs(float(report["current_allocated"].split()[0]) - after.allocated_bytes / GIB) < 0.01


def test_cuda_on_a_cpu_build_of_torch_says_so() -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("torch here is a CUDA build")
    avail = get_accelerator("cuda").availability()
    assert not avail.ok and "built without CUDA" in avail.reason
    with pytest.raises(AcceleratorUnavailable, match="accelerator 'cuda' is unavailable"):
        get_accelerator("cuda").require()


@pytest.mark.parametrize(("name", "package"), [("npu", "torch_npu"), ("mlu", "torch_mlu")])
def test_vendor_plugins_missing_give_install_reason(name: str, package: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    avail = get_accelerator(name).availability()
    assert not avail.ok and f"{package} is not installed" in avail.reason


def test_default_dtypes_follow_the_seed() -> None:
    import torch

    assert get_accelerator("cpu").default_dtype() == torch.float32
    assert get_accelerator("npu").default_dtype() == torch.float16  # seed 8.3.1 casts to fp16 on Ascend
    assert get_accelerator("cuda").resolve_dtype("bf16") == torch.bfloat16
    with pytest.raises(ConfigError, match="unknown dtype"):
        get_accelerator("cpu").resolve_dtype("int3")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("auto", "auto"), ("", "auto"), ("fp16", "float16"), ("half", "float16"), ("BF16", "bfloat16"),
     ("bfloat16", "bfloat16"), ("fp32", "float32"), ("float", "float32"), ("float16", "float16")],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["native", "vllm", "triton", "lmdeploy", "openai"])
def test_dtype_is_made_canonical_once_in_the_options(kind: str, given: str, canonical: str) -> None:
    from engines.base import parse_options

    assert canonical_dtype(given) == canonical
    assert parse_options({"kind": kind, "dtype": given}).dtype == canonical


@pytest.mark.parametrize("kind", ["native", "vllm", "triton"])
def test_unknown_dtype_is_a_one_line_config_error(kind: str) -> None:
    from engines.base import parse_options

    with pytest.raises(ConfigError, match=r"^dtype: unknown dtype 'int8'; use auto, float16, bfloat16 or float32$"):
        parse_options({"kind": kind, "dtype": "int8"})


def test_unknown_accelerator_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known accelerators: cpu, cuda, npu, mlu"):
        get_accelerator("tpu")
    assert list(ACCELERATORS) == ["cpu", "cuda", "npu", "mlu"]


class _DeviceModule:
    """A stand-in for torch.npu / torch.mlu (the seam where a vendor plug-in attaches)."""

    def __init__(self) -> None:
        self.peak = 3 * GIB
        self.synced = 0

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def memory_allocated(self) -> int:
        return 1 * GIB

    def memory_reserved(self) -> int:
        return 2 * GIB

    def max_memory_allocated(self) -> int:
        return self.peak

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.memory_allocated()

    def synchronize(self) -> None:
        self.synced += 1

    def get_device_name(self, index: int) -> str:
        return "Ascend910B"


def test_device_module_backend_reads_allocator_stats_through_its_module() -> None:
    from engines.accelerators import NPUAccelerator

    mod = _DeviceModule()
    acc = NPUAccelerator(module=mod)
    assert acc.availability().ok
    m = acc.memory()
    assert (m.allocated_bytes, m.reserved_bytes, m.peak_bytes) == (GIB, 2 * GIB, 3 * GIB)
    assert m.source == "device allocator"
    acc.reset_peak()
    assert acc.memory().peak_bytes == GIB
    acc.synchronize()
    assert mod.synced == 1
    assert acc.analyze_memory_usage() == {
        "current_allocated": "1.00 GB",
        "current_reserved": "2.00 GB",
        "peak_allocated": "1.00 GB",
    }
    assert isinstance(acc, DeviceModuleAccelerator) and acc.device_name() == "Ascend910B"


@pytest.mark.cuda
def test_cuda_for_real_when_present() -> None:
    acc = get_accelerator("cuda")
    avail = acc.availability()
    if not avail.ok:
        pytest.skip(f"no CUDA here: {avail.reason}")
    import torch

    acc.reset_peak()
    x = torch.ones(1024, 1024, 64, device=acc.device())
    acc.synchronize()
    m = acc.memory()
    assert m.allocated_bytes >= x.numel() * 4 and m.peak_bytes >= m.allocated_bytes

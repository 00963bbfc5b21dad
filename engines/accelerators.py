"""Accelerator backends: cpu, cuda, npu (Ascend via torch_npu), mlu (Cambricon via torch_mlu).

Each backend says whether it is available and, if not, why; places a model; picks a
default dtype; synchronizes; and reports memory (allocated, reserved, peak) with a
peak reset. CPU memory is the process's resident set size (RSS); its peak is the
kernel's high-water mark (VmHWM), which Linux lets a process reset.

torch_npu / torch_mlu are imported only when their backend is asked for.
"""

from __future__ import annotations

import importlib
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

from engines.errors import AcceleratorUnavailable, ConfigError

GIB = 1024**3

DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16", "float32")
_DTYPE_ALIASES: dict[str, str] = {
    "": "auto",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
}


def canonical_dtype(name: str | None) -> str:
    """``name`` or one of its aliases (fp16, half, bf16, fp32, float; None or empty: auto) as
    one of :data:`DTYPES`; :class:`ValueError` with a one-line reason for anything else.
    Engine options validate their ``dtype`` with it once, so engines read canonical names."""
    key = (name or "").strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; use auto, float16, bfloat16 or float32")
    return key


@dataclass(frozen=True)
class Availability:
    """Whether something can be used here, and the one-line reason when it cannot."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class MemoryStats:
    """Memory of one device in bytes. ``source`` says what was measured."""

    allocated_bytes: int
    reserved_bytes: int
    peak_bytes: int
    source: str  # "device allocator" or "process RSS"

    def gib(self) -> dict[str, float]:
        """The three figures in GiB, keyed ``allocated_gib`` / ``reserved_gib`` / ``peak_gib``."""
        return {
            "allocated_gib": self.allocated_bytes / GIB,
            "reserved_gib": self.reserved_bytes / GIB,
            "peak_gib": self.peak_bytes / GIB,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Accelerator:
    """Common interface; subclasses fill in the device-specific parts."""

    name: str = ""
    label: str = ""
    default_dtype_name: str = "float32"

    def availability(self) -> Availability:
        raise NotImplementedError

    def require(self) -> None:
        """Raise :class:`AcceleratorUnavailable` with the reason when unavailable."""
        avail = self.availability()
        if not avail.ok:
            raise AcceleratorUnavailable(f"accelerator '{self.name}' is unavailable: {avail.reason}")

    def device(self, index: int = 0) -> Any:
        raise NotImplementedError

    def default_dtype(self) -> Any:
        import torch

        return getattr(torch, self.default_dtype_name)

    def resolve_dtype(self, name: str | None) -> Any:
        """``"auto"``/None -> this backend's default; else the torch dtype of that name
        (:func:`canonical_dtype`'s names; options hold them already)."""
        import torch

        try:
            canonical = canonical_dtype(name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if canonical == "auto":
            return self.default_dtype()
        return getattr(torch, canonical)

    def place(self, model: Any) -> Any:
        """Move a module to this device."""
        return model.to(self.device())

    def synchronize(self) -> None:
        raise NotImplementedError

    def memory(self) -> MemoryStats:
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def device_name(self) -> str:
        raise NotImplementedError

    def analyze_memory_usage(self) -> dict[str, str]:
        """The seed's ``analyze_memory_usage`` output (GB strings), for any device."""
        m = self.memory()
        return {
            "current_allocated": f"{m.allocated_bytes / GIB:.2f} GB",
            "current_reserved": f"{m.reserved_bytes / GIB:.2f} GB",
            "peak_allocated": f"{m.peak_bytes / GIB:.2f} GB",
        }


def _read_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class CPUAccelerator(Accelerator):
    """The host CPU. Memory is the whole process's RSS (model, activations and Python)."""

    name = "cpu"
    label = "CPU"
    default_dtype_name = "float32"

    def __init__(self) -> None:
        self._sampled_peak = 0

    def availability(self) -> Availability:
        return Availability(True)

    def device(self, index: int = 0) -> Any:
        import torch

        return torch.device("cpu")

    def synchronize(self) -> None:
        return None

    def memory(self) -> MemoryStats:
        import psutil

        rss = psutil.Process().memory_info().rss
        hwm_kib = _read_status_kib("VmHWM")
        self._sampled_peak = max(self._sampled_peak, rss)
        peak = hwm_kib * 1024 if hwm_kib is not None else self._sampled_peak
        return MemoryStats(rss, rss, max(peak, rss), "process RSS")

    def reset_peak(self) -> None:
        # Writing 5 to clear_refs resets the kernel's peak RSS (VmHWM) to the current RSS.
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
        except OSError:
            pass
        self._sampled_peak = 0

    def device_name(self) -> str:
        return platform.processor() or platform.machine() or "cpu"


class DeviceModuleAccelerator(Accelerator):
    """A device whose torch module follows torch.cuda's API (torch.cuda, torch.npu, torch.mlu)."""

    package: str | None = None  # the plug-in package to import first (torch_npu, torch_mlu)
    install_hint: str = ""

    def __init__(self, module: Any | None = None) -> None:
        self._module = module  # injectable for tests

    def _torch_module(self) -> Any:
        if self._module is not None:
            return self._module
        import torch

        if self.package:
            importlib.import_module(self.package)
        return getattr(torch, self.name)

    def availability(self) -> Availability:
        if self._module is None and self.package:
            try:
                importlib.import_module(self.package)
            except ImportError as exc:
                return Availability(False, f"{self.package} is not installed ({self.install_hint}); {exc.msg}")
            except Exception as exc:  # noqa: BLE001 - vendor plug-ins fail in many ways at import
                return Availability(False, f"{self.package} failed to import: {type(exc).__name__}: {exc}")
        try:
            mod = self._torch_module()
        except Exception as exc:  # noqa: BLE001
            return Availability(False, f"torch.{self.name} is unusable: {type(exc).__name__}: {exc}")
        reason = self._missing_build_reason()
        if reason:
            return Availability(False, reason)
        try:
            if not mod.is_available() or mod.device_count() < 1:
                return Availability(False, f"no {self.label} device is visible to this process")
        except Exception as exc:  # noqa: BLE001
            return Availability(False, f"{self.label} runtime error: {type(exc).__name__}: {exc}")
        return Availability(True)

    def _missing_build_reason(self) -> str:
        return ""

    def device(self, index: int = 0) -> Any:
        import torch

        return torch.device(self.name, index)

    def synchronize(self) -> None:
        self._torch_module().synchronize()

    def memory(self) -> MemoryStats:
        mod = self._torch_module()
        return MemoryStats(
            int(mod.memory_allocated()),
            int(mod.memory_reserved()),
            int(mod.max_memory_allocated()),
            "device allocator",
        )

    def reset_peak(self) -> None:
        self._torch_module().reset_peak_memory_stats()

    def device_name(self) -> str:
        return str(self._torch_module().get_device_name(0))


class CUDAAccelerator(DeviceModuleAccelerator):
    name = "cuda"
    label = "NVIDIA CUDA"
    default_dtype_name = "bfloat16"
    install_hint = "install a CUDA build of torch"

    def _missing_build_reason(self) -> str:
        if self._module is not None:
            return ""
        import torch

        if torch.version.cuda is None:
            return f"torch {torch.__version__} was built without CUDA (a CPU build); install a CUDA build of torch"
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
            return "CUDA_VISIBLE_DEVICES is empty"
        return ""


class NPUAccelerator(DeviceModuleAccelerator):
    name = "npu"
    label = "Huawei Ascend NPU"
    default_dtype_name = "float16"  # the seed (8.3.1) runs Ascend in fp16
    package = "torch_npu"
    install_hint = "pip install torch-npu, with the Ascend CANN toolkit installed and sourced"


class MLUAccelerator(DeviceModuleAccelerator):
    name = "mlu"
    label = "Cambricon MLU"
    default_dtype_name = "float16"
    package = "torch_mlu"
    install_hint = "torch_mlu ships with Cambricon's PyTorch release and is not on PyPI"


ACCELERATORS: dict[str, type[Accelerator]] = {
    "cpu": CPUAccelerator,
    "cuda": CUDAAccelerator,
    "npu": NPUAccelerator,
    "mlu": MLUAccelerator,
}

_instances: dict[str, Accelerator] = {}


def get_accelerator(name: str) -> Accelerator:
    """The backend for ``name`` (no availability check; call ``require()`` for that)."""
    cls = ACCELERATORS.get(name)
    if cls is None:
        raise ConfigError(f"unknown accelerator '{name}'; known accelerators: {', '.join(ACCELERATORS)}")
    if name not in _instances:
        _instances[name] = cls()
    return _instances[name]


def list_accelerators() -> list[tuple[str, str, Availability]]:
    """(name, label, availability) for every backend, in a stable order."""
    out = []
    for name in ACCELERATORS:
        acc = get_accelerator(name)
        out.append((name, acc.label, acc.availability()))
    return out

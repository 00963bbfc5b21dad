"""The CPU as an accelerator spec, measured on this machine (numpy bandwidth and matmul rounds),
with the measurement cached in the data folder per CPU fingerprint."""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.metrics.accelerator_specs import AcceleratorSpec, Figure, require_positive

# ---------------------------------------------------------------------------------------
# The CPU, measured
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """Median, min and max of a few rounds."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class CpuMeasurement:
    """This machine's memory bandwidth and float32 matmul throughput, measured with numpy.

    ``copy_gb_s`` counts bytes read plus bytes written (STREAM's convention; write-allocate
    traffic is not counted); ``read_gb_s`` is a sum over the array (bytes read). Weights
    are read, so the roofline uses ``read_gb_s``'s median.
    """

    copy_gb_s: Stat
    read_gb_s: Stat
    matmul_gflops: Stat
    array_mib: int
    matmul_n: int
    rounds: int
    threads_note: str
    seconds: float

    def describe(self) -> str:
        return (
            f"CPU (measured, numpy, {self.rounds} rounds): read {self.read_gb_s.median:.1f} GB/s "
            f"(min {self.read_gb_s.min:.1f}, max {self.read_gb_s.max:.1f}), copy {self.copy_gb_s.median:.1f} GB/s, "
            f"float32 matmul {self.matmul_gflops.median:.0f} GFLOP/s (n={self.matmul_n})"
        )


def _bandwidth_rounds(array_mib: int, rounds: int) -> tuple[list[float], list[float]]:
    import numpy as np

    n = max(1, array_mib * 2**20 // 4)
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    float(src.sum())
    copy, read = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        copy.append(2 * src.nbytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        float(src.sum())
        read.append(src.nbytes / (time.perf_counter() - t) / 1e9)
    return copy, read


def _matmul_rounds(n: int, rounds: int) -> list[float]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS threads start
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        a @ b
        out.append(2 * n**3 / (time.perf_counter() - t) / 1e9)
    return out


def measure_cpu_uncached(rounds: int = 5, array_mib: int = 128, matmul_n: int = 1536) -> CpuMeasurement:
    """Measure now (about 1 s with the defaults): large-array copy and read, and a float32 matmul."""
    import os

    if rounds < 1 or array_mib < 1 or matmul_n < 16:
        raise ValueError("rounds >= 1, array_mib >= 1 and matmul_n >= 16 please")
    start = time.perf_counter()
    copy, read = _bandwidth_rounds(array_mib, rounds)
    gflops = _matmul_rounds(matmul_n, rounds)
    return CpuMeasurement(
        copy_gb_s=Stat.of(copy),
        read_gb_s=Stat.of(read),
        matmul_gflops=Stat.of(gflops),
        array_mib=array_mib,
        matmul_n=matmul_n,
        rounds=rounds,
        threads_note=f"{os.cpu_count()} logical CPUs; numpy's BLAS picks its own thread count",
        seconds=time.perf_counter() - start,
    )


_cpu_lock = threading.Lock()
_cpu_cached: CpuMeasurement | None = None


CPU_CACHE_FILE = "cpu_limits.json"  # in the data folder (MOEBENCH_DATA_DIR)
CPU_CACHE_MAX_AGE_S = 7 * 24 * 3600


def _cpu_fingerprint() -> str:
    """This host as the cache knows it: host name, logical CPUs and the CPU's model name."""
    import os
    import platform
    import socket

    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{socket.gethostname()}|{os.cpu_count()}|{model}"


def _cpu_cache_path() -> Path:
    from engines.settings import get_settings

    return get_settings().data_dir / CPU_CACHE_FILE


def _read_cpu_cache() -> CpuMeasurement | None:
    """The measurement saved for this host within :data:`CPU_CACHE_MAX_AGE_S`, else None."""
    try:
        saved = json.loads(_cpu_cache_path().read_text(encoding="utf-8"))
        if saved.get("host") != _cpu_fingerprint() or time.time() - float(saved["measured_at"]) > CPU_CACHE_MAX_AGE_S:
            return None
        m = dict(saved["measurement"])
        for k in ("copy_gb_s", "read_gb_s", "matmul_gflops"):
            m[k] = Stat(**m[k])
        return CpuMeasurement(**m)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cpu_cache(m: CpuMeasurement) -> None:
    path = _cpu_cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"host": _cpu_fingerprint(), "measured_at": time.time(), "measurement": asdict(m)}),
            encoding="utf-8",
        )
        tmp.replace(path)


def cpu_measured() -> CpuMeasurement | None:
    """This machine's CPU figures if already measured (in this process or kept in the data
    folder), without measuring: for callers that must not load the CPU (a page during a run)."""
    global _cpu_cached
    with _cpu_lock:
        if _cpu_cached is None:
            _cpu_cached = _read_cpu_cache()
        return _cpu_cached


def forget_measurement() -> None:
    """Drop this process's kept figures, so the next :func:`measure_cpu` reads the file or measures
    again (as a new process would)."""
    global _cpu_cached
    with _cpu_lock:
        _cpu_cached = None


def measure_cpu(refresh: bool = False) -> CpuMeasurement:
    """This machine's CPU figures: measured once (about 1 s) and kept for a week in the data
    folder (``cpu_limits.json``, for this host only), so runs do not each measure again.
    ``refresh=True`` measures now and replaces what was kept."""
    global _cpu_cached
    with _cpu_lock:
        if _cpu_cached is None or refresh:
            cached = None if refresh else _read_cpu_cache()
            if cached is None:
                cached = measure_cpu_uncached()
                _write_cpu_cache(cached)
            _cpu_cached = cached
        return _cpu_cached


def cpu_spec(
    measurement: CpuMeasurement | None = None, bandwidth_gb_s: float | None = None, peak_gflops: float | None = None
) -> AcceleratorSpec:
    """The ``cpu`` entry: figures passed in, else from ``measurement``, else measured now (cached)."""
    if bandwidth_gb_s is None or peak_gflops is None:
        measurement = measurement or measure_cpu()
    src = (
        f"measured on this machine by bench.metrics.cpu_limits.measure_cpu (numpy; {measurement.describe()})"
        if measurement is not None
        else ""
    )
    if bandwidth_gb_s is not None:
        require_positive("bandwidth_gb_s", bandwidth_gb_s)
        bw = Figure(bandwidth_gb_s, "GB/s", "passed in by the caller", "measured")
    else:
        assert measurement is not None
        bw = Figure(measurement.read_gb_s.median, "GB/s", f"read median, {src}", "measured")
    if peak_gflops is not None:
        require_positive("peak_gflops", peak_gflops)
        pk = Figure(peak_gflops / 1000, "TFLOP/s", "passed in by the caller", "measured")
    else:
        assert measurement is not None
        pk = Figure(measurement.matmul_gflops.median / 1000, "TFLOP/s", f"float32 matmul median, {src}", "measured")
    return AcceleratorSpec(
        key="cpu",
        name="this machine's CPU",
        accelerator="cpu",
        memory_gb=None,
        bandwidth_gb_s=bw,
        peak_tflops_16=pk,
        note="measured, not a spec; the peak is float32 matmul whatever the model's dtype",
    )

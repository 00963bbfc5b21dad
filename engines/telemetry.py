"""Device telemetry: what each accelerator is doing, read about once a second.

A run's sampler calls :meth:`TelemetrySource.read` on every source once a second and
stores :func:`series_points` of the readings beside the server's own series. One source
class per way of reading a device:

- :class:`NvmlSource`: NVIDIA GPUs through NVML (``pynvml``, from the ``nvidia-ml-py``
  package), handles opened once.
- :class:`AscendSmiSource`: Ascend NPUs through ``npu-smi info`` (its table, parsed by
  :func:`parse_npu_smi_info`); :func:`parse_npu_smi_usages` reads ``npu-smi info -t usages``.
- :class:`CambriconSource`: Cambricon MLUs through ``cnmon info -e -m -u -j`` (JSON, parsed
  by :func:`parse_cnmon_json`).
- :class:`RaplSource`: the CPU packages' energy counters (Linux RAPL, ``/sys/class/powercap``).
- :class:`ExporterSource`: a Prometheus endpoint of NVIDIA's dcgm-exporter, Ascend's
  MindCluster npu-exporter or Cambricon's mlu-exporter, on this host or another
  (:func:`parse_exporter_text`, over :func:`engines.prometheus.parse_prometheus_samples`).

:func:`detect` says which sources an accelerator has here and, for each one missing, why.

Every ``read()`` is bounded and never raises: a tool that hangs past its timeout, exits
non-zero or prints something unreadable, or an endpoint that does not answer, gives ``[]``
and a one-line :attr:`TelemetrySource.last_error`; a single field a device does not report
is ``None`` in its :class:`DeviceReading`.

Units: memory in bytes (the vendors' "MB" and "MiB" are both 2**20 bytes), power in watts,
clocks in MHz, temperature in degrees Celsius, utilization in percent. ``index`` is the
device's number in its own tool (the NVML index, npu-smi's logical ``Device`` id where its
table has one and the ``NPU`` id otherwise, cnmon's card number, the exporter's ``gpu`` /
``id`` / ``mlu`` label), not the framework's ordinal under ``CUDA_VISIBLE_DEVICES`` or
``ASCEND_RT_VISIBLE_DEVICES``.

Series names (:func:`series_points`), one float per name per second::

    dev{i}_util_pct  dev{i}_mem_used_gib  dev{i}_mem_total_gib
    dev{i}_power_w   dev{i}_sm_clock_mhz  dev{i}_temp_c   dev{i}_energy_j

A reading from an exporter carries its URL's host and its names are prefixed
``h{host}_`` (``h10_0_0_7_dev0_util_pct``, ``hnode3_dev1_power_w``): the host lower-cased,
an IP address with its separators as ``_``, a DNS name cut to its first label, anything
else outside ``[a-z0-9]`` as ``_``. A field that is ``None`` has no point that second.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engines.errors import MoEBenchError, RequestFailed, one_line
from engines.http_errors import METRICS_BODY_MAX, http_errors, http_get, httpx_client, redacted
from engines.prometheus import PromSample as PromSample  # re-exported: the exporter parsers' sample
from engines.prometheus import parse_prometheus_samples

VENDORS: tuple[str, ...] = ("nvidia", "ascend", "cambricon")
MIB = 1 << 20
GIB = 1 << 30
TOOL_TIMEOUT_S = 3.0
SCRAPE_TIMEOUT_S = 2.0


class TelemetryUnavailable(MoEBenchError):
    """A telemetry source cannot be opened here (no library, no tool, no device)."""


@dataclass
class DeviceReading:
    """One device at one moment; a field the source cannot read is ``None``.

    ``process_mem_bytes`` maps a process id to the device memory it holds (bytes), where
    the source can see processes; ``None`` where it cannot (``{}``: it can, and none runs).
    """

    vendor: str
    index: int
    name: str = ""
    util_pct: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    health: str | None = None
    host: str | None = None
    # the device's own cumulative energy counter, J (NVML total energy since the driver loaded,
    # DCGM's total energy, RAPL): a run's energy is its last value less its first
    energy_j: float | None = None
    process_mem_bytes: dict[int, int] | None = field(default=None)


class TelemetrySource(ABC):
    """One way of reading devices. ``read()`` is cheap, bounded and never raises."""

    name: str = "telemetry"

    def __init__(self) -> None:
        self.last_error = ""
        """One line on why the last ``read()`` came back empty or partial; ``""`` when it did not."""

    @abstractmethod
    def read(self) -> list[DeviceReading]:
        """The devices' readings now (``[]`` with :attr:`last_error` set when they cannot be read)."""

    def close(self) -> None:  # noqa: B027 - a no-op unless the source holds something
        """Release what the source holds (library handles, a scratch folder, a client)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# --- shared helpers -------------------------------------------------------------------

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)")
_BYTE_UNITS = {
    "b": 1,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "k": 1 << 10,
    "mb": MIB,
    "mib": MIB,
    "m": MIB,
    "gb": GIB,
    "gib": GIB,
    "g": GIB,
}


def _number(value: Any) -> float | None:
    """A number from a number or a string such as ``"45 C"``, ``"35 %"``, ``"75.0 W"``; ``None``
    for anything else (``"N/A"``, ``"NA"``, ``"-"``, a missing key, NaN)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    match = _NUMBER.match(str(value))
    return float(match.group(1)) if match else None


def _bytes(value: Any, default_unit: str = "MiB") -> float | None:
    """Bytes from a number in ``default_unit`` or a string with its own unit (``"24576 MiB"``)."""
    number = _number(value)
    if number is None:
        return None
    match = _NUMBER.match(str(value)) if isinstance(value, str) else None
    unit = (match.group(2) if match and match.group(2) else default_unit).lower()
    scale = _BYTE_UNITS.get(unit)
    return number * scale if scale is not None else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _run_tool(argv: Sequence[str], timeout: float, cwd: str | None = None) -> tuple[str | None, str]:
    """Run a vendor tool: ``(stdout, "")``, or ``(None, one-line reason)`` when it cannot be
    started, runs past ``timeout`` (it and its children are killed) or exits non-zero."""
    tool = os.path.basename(argv[0])
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group, so a timeout kills its children too
        )
    except OSError as exc:
        return None, f"could not run {tool}: {one_line(exc, 200)}"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return None, f"{tool} did not answer within {timeout:g} s (killed)"
    if proc.returncode != 0:
        said = next((line for line in (err or "").splitlines() + (out or "").splitlines() if line.strip()), "")
        detail = f": {one_line(said, 200)}" if said else ""
        return None, f"{tool} exited with status {proc.returncode}{detail}"
    return out, ""


def _kill_group(proc: subprocess.Popen[str]) -> None:
    killpg = getattr(os, "killpg", None)
    if killpg is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


# --- NVIDIA: NVML ------------------------------------------------------------------------


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise TelemetryUnavailable(
            "NVML unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        ) from exc
    return pynvml


class NvmlSource(TelemetrySource):
    """NVIDIA GPUs through NVML. Opening initializes NVML and caches one handle per chosen
    GPU (``devices``: NVML indices, all when ``None``); :class:`TelemetryUnavailable` when
    NVML or the GPUs are not there. A field NVML does not support on a GPU is ``None``."""

    name = "nvml"

    def __init__(self, devices: list[int] | None = None) -> None:
        super().__init__()
        nvml = _import_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise TelemetryUnavailable(f"NVML unavailable: {one_line(exc, 200)}") from exc
        self._nvml = nvml
        self._lock = threading.Lock()
        self._closed = False
        try:
            count = nvml.nvmlDeviceGetCount()
            chosen = list(range(count)) if devices is None else list(devices)
            if not chosen:
                raise TelemetryUnavailable("NVML unavailable: no NVIDIA GPU is visible")
            missing = [i for i in chosen if not 0 <= i < count]
            if missing:
                raise TelemetryUnavailable(f"NVML has no GPU {missing[0]} (it sees {count})")
            self._devices: list[tuple[int, Any, str]] = []
            for index in chosen:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                self._devices.append((index, handle, name.decode() if isinstance(name, bytes) else str(name)))
        except nvml.NVMLError as exc:
            self._shutdown()
            raise TelemetryUnavailable(f"NVML unavailable: {one_line(exc, 200)}") from exc
        except TelemetryUnavailable:
            self._shutdown()
            raise

    @property
    def indices(self) -> list[int]:
        """The NVML indices this source reads."""
        return [index for index, _, _ in self._devices]

    @property
    def names(self) -> list[str]:
        """NVML's name of each GPU this source reads (``NVIDIA H100 80GB HBM3``)."""
        return [name for _, _, name in self._devices]

    def _field(self, errors: list[str], index: int, fn: Callable[..., Any], *args: Any) -> Any:
        nvml = self._nvml
        try:
            return fn(*args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission):
            return None
        except nvml.NVMLError as exc:
            errors.append(f"GPU {index}: {getattr(fn, '__name__', 'nvml')}: {one_line(exc, 120)}")
            return None

    def read(self) -> list[DeviceReading]:
        nvml = self._nvml
        with self._lock:
            if self._closed:
                self.last_error = "the NVML source is closed"
                return []
            errors: list[str] = []
            out = []
            for index, handle, name in self._devices:
                util = self._field(errors, index, nvml.nvmlDeviceGetUtilizationRates, handle)
                mem = self._field(errors, index, nvml.nvmlDeviceGetMemoryInfo, handle)
                power_mw = self._field(errors, index, nvml.nvmlDeviceGetPowerUsage, handle)
                clock = self._field(errors, index, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
                temp = self._field(errors, index, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
                procs = self._field(errors, index, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
                energy_fn = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # nvidia-ml-py 7.352+
                energy_mj = self._field(errors, index, energy_fn, handle) if energy_fn is not None else None
                out.append(
                    DeviceReading(
                        vendor="nvidia",
                        index=index,
                        name=name,
                        util_pct=_number(getattr(util, "gpu", None)),
                        mem_used_bytes=_number(getattr(mem, "used", None)),
                        mem_total_bytes=_number(getattr(mem, "total", None)),
                        power_w=power_mw / 1000.0 if power_mw is not None else None,
                        sm_clock_mhz=_number(clock),
                        temp_c=_number(temp),
                        process_mem_bytes=_nvml_processes(procs),
                        energy_j=energy_mj / 1000.0 if _number(energy_mj) is not None else None,
                    )
                )
            self.last_error = "; ".join(errors)
            return out

    def _shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown()


def _nvml_processes(procs: Any) -> dict[int, int] | None:
    """pid -> bytes; ``None`` when NVML cannot say (no list, or a process's memory is not
    reported, as under MIG or without permission: a partial sum would read as a real one)."""
    if procs is None:
        return None
    out: dict[int, int] = {}
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        if used is None:
            return None
        pid = int(proc.pid)
        out[pid] = out.get(pid, 0) + int(used)
    return out


# --- Ascend: npu-smi -------------------------------------------------------------------

# a PCI address; x: a digit masked (as people mask them in the outputs they post)
_BUS_ID = re.compile(r"^[0-9A-Fa-fxX]{4}:[0-9A-Fa-fxX]{2}:[0-9A-Fa-fxX]{2}\.[0-9A-Fa-fxX]+$")
_PAIR = re.compile(r"(\S+)\s*/\s*(\S+)")


def _table_cells(line: str) -> list[str] | None:
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")) or len(line) < 2:
        return None
    return [cell.strip() for cell in line[1:-1].split("|")]


def parse_npu_smi_info(text: str) -> list[DeviceReading]:
    """The chips in ``npu-smi info``'s table (``[]`` for anything else).

    Each chip is two rows: ``NPU Name | Health | Power(W) Temp(C) Hugepages-Usage`` then
    ``Chip [Device|Phy-ID] | Bus-Id | AICore(%) Memory-Usage(MB) [HBM-Usage(MB)]``. Memory is
    the HBM pair where the table has one with a non-zero total (Atlas 800 / 910B), else
    Memory-Usage (DDR, 310P). The process table below it (``NPU Chip | Process id | Process
    name | Process memory(MB)``), when printed, fills ``process_mem_bytes``.
    """
    readings: list[DeviceReading] = []
    by_chip: dict[tuple[int, int], DeviceReading] = {}
    section = ""
    pending: tuple[int, str, str, list[str]] | None = None
    has_second_id = False
    saw_process_table = False
    for line in text.splitlines():
        cells = _table_cells(line)
        if not cells or not cells[0]:
            continue
        head = cells[0].split()
        if len(cells) >= 3 and "Process id" in cells[1]:
            section, saw_process_table = "processes", True
            continue
        if head[:1] == ["NPU"] and len(cells) >= 3 and "Health" in cells[1]:
            section = "devices"
            continue
        if head[:1] == ["Chip"] and len(cells) >= 3 and "Bus-Id" in cells[1]:
            has_second_id = len(head) >= 2
            continue
        if section == "devices" and len(cells) >= 3:
            if pending is None:
                if not head[0].isdigit():
                    continue
                pending = (int(head[0]), " ".join(head[1:]), cells[1], cells[2].split())
                continue
            ids = [int(tok) for tok in head if tok.isdigit()]
            npu_id, name, health, first = pending
            pending = None
            if not ids or not (_BUS_ID.match(cells[1]) or cells[1] in ("NA", "-")):
                continue  # not a chip row: the table is not what this parser knows
            reading = _npu_chip_reading(npu_id, name, health, first, ids, cells[2], has_second_id)
            readings.append(reading)
            by_chip[(npu_id, ids[0])] = reading
        elif section == "processes" and len(cells) >= 4:
            ids = [int(tok) for tok in head if tok.isdigit()]
            pid, mem_mb = _int(cells[1]), _number(cells[3])
            reading = by_chip.get((ids[0], ids[1])) if len(ids) >= 2 else None
            if reading is None or pid is None or mem_mb is None:
                continue
            procs = reading.process_mem_bytes if reading.process_mem_bytes is not None else {}
            procs[pid] = procs.get(pid, 0) + int(mem_mb * MIB)
            reading.process_mem_bytes = procs
    if saw_process_table:
        for reading in readings:
            if reading.process_mem_bytes is None:
                reading.process_mem_bytes = {}
    return readings


def _npu_chip_reading(
    npu_id: int, name: str, health: str, first: list[str], ids: list[int], usage: str, has_second_id: bool
) -> DeviceReading:
    pairs = _PAIR.findall(usage)
    memory = next(
        ((used, total) for used, total in reversed(pairs[:2]) if (_number(total) or 0) > 0),
        None,
    )
    aicore = usage.split()[0] if usage.split() else None
    return DeviceReading(
        vendor="ascend",
        index=ids[1] if has_second_id and len(ids) >= 2 else npu_id,
        name=name,
        util_pct=_number(aicore),
        mem_used_bytes=_bytes(memory[0], "MiB") if memory else None,
        mem_total_bytes=_bytes(memory[1], "MiB") if memory else None,
        power_w=_number(first[0]) if first else None,
        temp_c=_number(first[1]) if len(first) > 1 else None,
        health=health or None,
    )


def parse_npu_smi_usages(text: str) -> list[dict[str, float]]:
    """``npu-smi info -t usages -i N``: one ``{key: value}`` per chip, keys as printed
    (``"HBM Capacity(MB)"``, ``"HBM Usage Rate(%)"``, ``"Aicore Usage Rate(%)"``, ``"Chip ID"``,
    ...); a key seen again starts the next chip. Values that are not numbers are left out."""
    chips: list[dict[str, float]] = []
    current: dict[str, float] = {}
    seen: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key:
            continue
        if key in seen and key not in ("NPU ID", "Chip Count"):
            chips.append(current)
            current, seen = {}, set()
        seen.add(key)
        number = _number(value)
        if number is not None:
            current[key] = number
    if any(k not in ("NPU ID", "Chip Count") for k in current):
        chips.append(current)
    for chip in chips[1:]:
        for key in ("NPU ID", "Chip Count"):
            if key in chips[0] and key not in chip:
                chip[key] = chips[0][key]
    return chips


class AscendSmiSource(TelemetrySource):
    """Ascend NPUs through ``npu-smi info`` (one run per read, killed after ``timeout`` s)."""

    name = "npu-smi"

    def __init__(
        self, executable: str = "npu-smi", devices: list[int] | None = None, timeout: float = TOOL_TIMEOUT_S
    ) -> None:
        super().__init__()
        self.executable = executable
        self.devices = None if devices is None else set(devices)
        self.timeout = timeout

    def read(self) -> list[DeviceReading]:
        out, error = _run_tool([self.executable, "info"], self.timeout)
        if out is None:
            self.last_error = error
            return []
        readings = parse_npu_smi_info(out)
        if not readings:
            self.last_error = f"npu-smi info printed no device table: {one_line(out, 120)!r}"
            return []
        self.last_error = ""
        return [r for r in readings if self.devices is None or r.index in self.devices]


# --- Cambricon: cnmon ------------------------------------------------------------------

CNMON_JSON = "cnmon_info.json"


def parse_cnmon_json(text: str) -> list[DeviceReading]:
    """The cards in ``cnmon info -j``'s JSON (``{"CnmonInfo": [...]}``; ``[]`` for anything else).

    Read per entry: ``CardNum``, ``ProductName``, ``Utilization.MLUAverage`` (%),
    ``PhysicalMemUsage.{Used,Total}`` (MiB when a bare number, else the unit given, as in
    ``"24576 MiB"``), ``Temperature.Chip`` (C), ``Power.Usage`` (W). A missing key is ``None``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return []
    entries = data.get("CnmonInfo") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    out = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        util = _dict(entry.get("Utilization"))
        memory = _dict(entry.get("PhysicalMemUsage"))
        temperature = _dict(entry.get("Temperature"))
        power = entry.get("Power")
        card = _int(entry.get("CardNum"))
        out.append(
            DeviceReading(
                vendor="cambricon",
                index=card if card is not None else position,
                name=str(entry.get("ProductName") or ""),
                util_pct=_number(util.get("MLUAverage")),
                mem_used_bytes=_bytes(memory.get("Used"), "MiB"),
                mem_total_bytes=_bytes(memory.get("Total"), "MiB"),
                power_w=_number(_dict(power).get("Usage") if isinstance(power, dict) else power),
                temp_c=_number(temperature.get("Chip")),
            )
        )
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


_CNMON_CARD = re.compile(r"^(\d+)\s+(\S+)\s+(\S+)(?:\s+(\S+))?$")  # Card  VF  Name  [Firmware]
_CNMON_TEMP = re.compile(r"(-?\d+(?:\.\d+)?)\s*C\b")
_CNMON_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*W\s*/")
_CNMON_MEM = re.compile(r"(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)\s*/\s*(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)")


def parse_cnmon_table(text: str) -> list[DeviceReading]:
    """The cards in plain ``cnmon``'s table (``[]`` for anything else): two rows per card,
    ``Card VF Name Firmware | Bus-Id (or Inited Driver) | Util Ecc-Error`` then
    ``Fan Temp Pwr:Usage/Cap | Memory-Usage | ...``, as CNMON v4 and v5 print them
    (tests/data/telemetry/real: MLU370-X8 and -X4 captures)."""
    readings: list[DeviceReading] = []
    pending: tuple[int, str, str] | None = None
    in_cards = False
    for line in text.splitlines():
        if line.startswith("|=") and not in_cards:
            in_cards = True
            continue
        if "Processes:" in line:
            break
        cells = _table_cells(line)
        if not in_cards or not cells or len(cells) < 3:
            continue
        if pending is None:
            m = _CNMON_CARD.match(cells[0])
            if m:
                pending = (int(m.group(1)), m.group(3), cells[2].split()[0] if cells[2].split() else "")
            continue
        index, name, util = pending
        pending = None
        temp, power, mem = _CNMON_TEMP.search(cells[0]), _CNMON_POWER.search(cells[0]), _CNMON_MEM.search(cells[1])
        readings.append(
            DeviceReading(
                vendor="cambricon",
                index=index,
                name=name,
                util_pct=_number(util.rstrip("%")),
                mem_used_bytes=_bytes(mem.group(1), mem.group(2)) if mem else None,
                mem_total_bytes=_bytes(mem.group(3), mem.group(4)) if mem else None,
                power_w=float(power.group(1)) if power else None,
                temp_c=float(temp.group(1)) if temp else None,
            )
        )
    return readings


class CambriconSource(TelemetrySource):
    """Cambricon MLUs through ``cnmon info -e -m -u -j``. cnmon writes its JSON to
    ``cnmon_info.json`` in its working folder, so each run gets a private scratch folder
    (removed by :meth:`close`); JSON printed on stdout is read too. Without JSON, plain
    ``cnmon``'s card table is read (:func:`parse_cnmon_table`)."""

    name = "cnmon"

    def __init__(
        self, executable: str = "cnmon", devices: list[int] | None = None, timeout: float = TOOL_TIMEOUT_S
    ) -> None:
        super().__init__()
        self.executable = executable
        self.devices = None if devices is None else set(devices)
        self.timeout = timeout
        self._scratch: str | None = None

    def read(self) -> list[DeviceReading]:
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="moebench-cnmon-")
        target = Path(self._scratch) / CNMON_JSON
        target.unlink(missing_ok=True)  # never read the previous second's file
        out, error = _run_tool([self.executable, "info", "-e", "-m", "-u", "-j"], self.timeout, cwd=self._scratch)
        if out is None:
            self.last_error = error
            return []
        text = target.read_text(encoding="utf-8", errors="replace") if target.exists() else out
        readings = parse_cnmon_json(text)
        if not readings:
            # The JSON's layout is known only from the code that reads it (no real file is public);
            # plain cnmon's table is known from real captures: read that instead.
            table, _ = _run_tool([self.executable], self.timeout, cwd=self._scratch)
            readings = parse_cnmon_table(table or "")
        if not readings:
            self.last_error = f"cnmon wrote no CnmonInfo JSON and printed no card table: {one_line(text, 120)!r}"
            return []
        self.last_error = ""
        return [r for r in readings if self.devices is None or r.index in self.devices]

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


# --- Prometheus exporters --------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    """How one exporter's metrics map onto :class:`DeviceReading` fields (first metric present wins)."""

    vendor: str
    index_labels: tuple[str, ...]
    name_labels: tuple[str, ...]
    fields: dict[str, tuple[tuple[str, float], ...]]
    process: tuple[str, str, float] | None = None  # (metric, pid label, scale to bytes)
    process_seen: tuple[str, ...] = ()  # metrics whose presence means processes are visible
    blank_at: float | None = None  # values at or above this are "no data" sentinels
    wide: tuple[str, ...] = ()  # int64 fields: their sentinel is DCGM_FT_INT64_BLANK, not blank_at

    skip_label: str | None = None  # samples with this label non-empty are not the whole device
    health: dict[float, str] = field(default_factory=dict)


_HEALTH = {1.0: "OK", 0.0: "Unhealthy"}
INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)  # DCGM_FT_INT64_BLANK

EXPORTER_FAMILIES: tuple[_Family, ...] = (
    # NVIDIA dcgm-exporter (default counters): FB_USED and FB_FREE in MiB, power W, clock MHz, temp C.
    _Family(
        vendor="nvidia",
        index_labels=("gpu",),
        name_labels=("modelName",),
        fields={
            "util_pct": (("DCGM_FI_DEV_GPU_UTIL", 1.0),),
            "mem_used_bytes": (("DCGM_FI_DEV_FB_USED", MIB),),
            "mem_free_bytes": (("DCGM_FI_DEV_FB_FREE", MIB),),
            "power_w": (("DCGM_FI_DEV_POWER_USAGE", 1.0),),
            "energy_j": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),),  # mJ since boot
            "sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", 1.0),),
            "temp_c": (("DCGM_FI_DEV_GPU_TEMP", 1.0),),
        },
        blank_at=2147483632.0,  # DCGM_FT_INT32_BLANK; the int64 and fp64 blanks are larger still
        wide=("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),  # mJ since boot: past 2**31 after ~2 h at 300 W
    ),
    # Ascend MindCluster npu-exporter: memory in MB, power W, temperature C, health 1/0/-1.
    _Family(
        vendor="ascend",
        index_labels=("id", "npuID"),
        name_labels=("model_name", "modelName"),
        fields={
            "util_pct": (("npu_chip_info_utilization", 1.0),),
            "mem_used_bytes": (("npu_chip_info_hbm_used_memory", MIB), ("npu_chip_info_used_memory", MIB)),
            "mem_total_bytes": (("npu_chip_info_hbm_total_memory", MIB), ("npu_chip_info_total_memory", MIB)),
            "power_w": (("npu_chip_info_power", 1.0),),
            "sm_clock_mhz": (("npu_chip_info_aicore_current_freq", 1.0),),
            "temp_c": (("npu_chip_info_temperature", 1.0),),
            "health": (("npu_chip_info_health_status", 1.0),),
        },
        process=("npu_chip_info_process_info", "process_id", MIB),
        process_seen=("npu_chip_info_process_info_num", "npu_chip_info_process_info"),
        health=_HEALTH,
    ),
    # Cambricon mlu-exporter (prefix "mlu"): memory in bytes, power W, temperature C, health 1/0;
    # the v1 names (label "slot") as fallbacks.
    _Family(
        vendor="cambricon",
        index_labels=("mlu", "slot"),
        name_labels=("model",),
        fields={
            "util_pct": (("mlu_utilization", 1.0), ("mlu_board_utilization", 1.0)),
            "mem_used_bytes": (("mlu_memory_used", 1.0), ("mlu_mem_used_bytes", 1.0)),
            "mem_total_bytes": (("mlu_memory_total", 1.0), ("mlu_mem_total_bytes", 1.0)),
            "power_w": (("mlu_power_usage", 1.0), ("mlu_board_power", 1.0)),
            "sm_clock_mhz": (("mlu_frequency", 1.0),),
            "temp_c": (("mlu_chip_temperature", 1.0), ("mlu_temperature", 1.0), ("mlu_temperature_celsius", 1.0)),
            "health": (("mlu_health", 1.0),),
        },
        process=("mlu_process_physical_memory_used", "pid", 1.0),
        process_seen=("mlu_process_physical_memory_used",),
        skip_label="vf",  # utilization and power are repeated per virtual function
        health=_HEALTH,
    ),
)


MAX_DEVICES = 64  # devices read from one exporter page (a node holds 8-16)


def parse_exporter_text(text: str, host: str | None = None) -> list[DeviceReading]:
    """The devices in a dcgm-exporter, npu-exporter or mlu-exporter scrape (any mix of the
    three; ``[]`` when none of their metrics is there), each carrying ``host``."""
    samples = parse_prometheus_samples(text)
    names = {s.name for s in samples}
    out: list[DeviceReading] = []
    for fam in EXPORTER_FAMILIES:
        metric_field = {m: f for f, metrics in fam.fields.items() for m, _ in metrics}
        values: dict[int, dict[str, float]] = {}
        device_names: dict[int, str] = {}
        procs: dict[int, dict[int, int]] = {}
        for s in samples:
            is_proc = fam.process is not None and s.name == fam.process[0]
            if s.name not in metric_field and not is_proc:
                continue
            index = next((_int(s.labels[k]) for k in fam.index_labels if k in s.labels), None)
            if index is None or (fam.skip_label and s.labels.get(fam.skip_label)):
                continue
            blank = INT64_BLANK if s.name in fam.wide else fam.blank_at
            if not math.isfinite(s.value) or (blank is not None and abs(s.value) >= blank):
                values.setdefault(index, {})
                continue
            if is_proc and fam.process is not None:
                pid = _int(s.labels.get(fam.process[1]))
                if pid is not None:
                    per = procs.setdefault(index, {})
                    per[pid] = per.get(pid, 0) + int(s.value * fam.process[2])
                continue
            values.setdefault(index, {}).setdefault(s.name, s.value)
            if index not in device_names:
                device_names[index] = next((s.labels[k] for k in fam.name_labels if s.labels.get(k)), "")
        visible = any(m in names for m in fam.process_seen)
        for index in sorted(values)[:MAX_DEVICES]:  # a page cannot make more devices than a host holds
            out.append(
                _family_reading(
                    fam,
                    index,
                    values[index],
                    device_names.get(index, ""),
                    host,
                    procs.get(index, {}) if visible else None,
                )
            )
    return out


def _family_reading(
    fam: _Family, index: int, got: dict[str, float], name: str, host: str | None, procs: dict[int, int] | None
) -> DeviceReading:
    def pick(field_name: str) -> float | None:
        for metric, scale in fam.fields.get(field_name, ()):
            if metric in got:
                return got[metric] * scale
        return None

    # The first (used, total) pair with a non-zero total: npu-exporter reports HBM as 0/0 on
    # cards without it (310P) and DDR as 0/0 on cards with it (910B).
    used = total = None
    pairs = zip(fam.fields.get("mem_used_bytes", ()), fam.fields.get("mem_total_bytes", ()), strict=False)
    for (used_metric, used_scale), (total_metric, total_scale) in pairs:
        if got.get(total_metric, 0.0) > 0:
            total = got[total_metric] * total_scale
            used = got[used_metric] * used_scale if used_metric in got else None
            break
    if total is None and "mem_free_bytes" in fam.fields:  # dcgm-exporter's defaults have no total
        used, free = pick("mem_used_bytes"), pick("mem_free_bytes")
        total = used + free if used is not None and free is not None else None
    health_value = pick("health")
    return DeviceReading(
        vendor=fam.vendor,
        index=index,
        name=name,
        util_pct=pick("util_pct"),
        mem_used_bytes=used,
        mem_total_bytes=total,
        power_w=pick("power_w"),
        sm_clock_mhz=pick("sm_clock_mhz"),
        temp_c=pick("temp_c"),
        energy_j=pick("energy_j"),
        health=fam.health.get(health_value) if health_value is not None else None,
        host=host,
        process_mem_bytes=procs,
    )


class ExporterSource(TelemetrySource):
    """Scrapes one exporter URL (``http://host:9400/metrics`` and the like) with a short
    timeout; each reading carries the URL's host. A scrape that fails gives ``[]``."""

    def __init__(self, url: str, timeout: float = SCRAPE_TIMEOUT_S) -> None:
        super().__init__()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TelemetryUnavailable(f"exporter URL {url!r} is not an http(s) URL with a host")
        self.url = url
        self.host = parts.hostname
        self.timeout = timeout
        self._client: Any = None
        self.shown_url = redacted(url)
        self.name = f"exporter {self.shown_url}"

    def _scrape(self) -> str:

        if self._client is None:
            self._client = httpx_client(timeout=self.timeout, follow_redirects=False)
        with http_errors(self.shown_url, who="the exporter"):
            resp = http_get(self._client, self.url, METRICS_BODY_MAX, timeout=self.timeout)
        if resp.status_code != 200:
            raise RequestFailed(f"HTTP {resp.status_code} from {self.shown_url}")
        return str(resp.text)

    def read(self) -> list[DeviceReading]:
        try:
            text = self._scrape()
        except RequestFailed as exc:
            self.last_error = str(exc)
            return []
        readings = parse_exporter_text(text, host=self.host)
        if not readings:
            self.last_error = f"no DCGM_FI_DEV_*, npu_chip_info_* or mlu_* device metrics at {self.shown_url}"
            return []
        self.last_error = ""
        return readings

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


POWERCAP = Path("/sys/class/powercap")


class RaplSource(TelemetrySource):
    """The CPU packages' energy through Linux RAPL (``/sys/class/powercap/intel-rapl:N``, AMD's
    too): each package's ``energy_uj`` counter, as ``energy_j`` (wraps at ``max_energy_range_uj``
    are unwound) and the power since the last read. Sub-domains (``intel-rapl:N:M``: cores,
    DRAM) are inside their package's figure and not read. :class:`TelemetryUnavailable` when
    no package's counter can be read (a VM usually hides RAPL; reading it may need root)."""

    name = "rapl"

    def __init__(self, root: Path = POWERCAP) -> None:
        super().__init__()
        zones = sorted(p for p in root.glob("*rapl:*") if p.name.count(":") == 1) if root.is_dir() else []
        self._zones: list[tuple[int, Path, str, float]] = []
        why = f"{root} is absent (a virtual machine usually hides RAPL)" if not root.is_dir() else ""
        for zone in zones:
            try:
                int((zone / "energy_uj").read_text())
                top = (
                    float((zone / "max_energy_range_uj").read_text()) if (zone / "max_energy_range_uj").exists() else 0
                )
                label = (zone / "name").read_text().strip() if (zone / "name").exists() else zone.name
            except (OSError, ValueError) as exc:
                why = f"{zone / 'energy_uj'}: {getattr(exc, 'strerror', None) or exc}"
                continue
            index = _int(zone.name.rsplit(":", 1)[1])
            self._zones.append((index if index is not None else len(self._zones), zone, label, top))
        if not self._zones:
            raise TelemetryUnavailable(f"no CPU energy counter (RAPL): {why or 'no package zone under ' + str(root)}")
        self._last: dict[int, tuple[float, float, float]] = {}  # index -> (raw uj, unwound J, monotonic s)

    def read(self) -> list[DeviceReading]:
        import time

        out: list[DeviceReading] = []
        errors: list[str] = []
        now = time.monotonic()
        for index, zone, label, top in self._zones:
            try:
                raw = float((zone / "energy_uj").read_text())
            except (OSError, ValueError) as exc:
                errors.append(f"{zone.name}: {one_line(exc, 100)}")
                continue
            last = self._last.get(index)
            if last is None:
                total = raw / 1e6
                power = None
            else:
                step = raw - last[0]
                if step < 0 and top > 0:
                    step += top  # the counter wrapped
                total = last[1] + max(step, 0.0) / 1e6
                dt = now - last[2]
                power = (total - last[1]) / dt if dt > 0 else None
            self._last[index] = (raw, total, now)
            out.append(DeviceReading(vendor="cpu", index=index, name=f"CPU {label}", power_w=power, energy_j=total))
        self.last_error = "; ".join(errors)
        return out


# --- detection and series ----------------------------------------------------------------

ACCELERATOR_TOOLS: dict[str, tuple[str, type[AscendSmiSource] | type[CambriconSource]]] = {
    "npu": ("npu-smi", AscendSmiSource),
    "mlu": ("cnmon", CambriconSource),
}


def detect(
    accelerator: str, urls: Iterable[str] = (), devices: list[int] | None = None, local: bool = True
) -> tuple[list[TelemetrySource], list[str]]:
    """The telemetry sources for ``accelerator`` here (``cuda``: NVML; ``npu``: npu-smi;
    ``mlu``: cnmon; ``cpu``: RAPL's energy counters) plus one :class:`ExporterSource` per URL,
    and a one-line reason for each source that is missing. ``devices`` narrows the local source;
    ``local=False``: the exporters only. Never raises."""
    sources: list[TelemetrySource] = []
    reasons: list[str] = []
    try:
        if not local:
            pass
        elif accelerator == "cuda":
            sources.append(NvmlSource(devices))
        elif accelerator in ACCELERATOR_TOOLS:
            tool, cls = ACCELERATOR_TOOLS[accelerator]
            path = shutil.which(tool)
            if path is None:
                reasons.append(f"{tool} not found on PATH")
            else:
                sources.append(cls(path, devices=devices))
        elif accelerator == "cpu":
            sources.append(RaplSource())
        else:
            reasons.append(f"no device telemetry for accelerator {accelerator!r} (known: cpu, cuda, npu, mlu)")
    except TelemetryUnavailable as exc:
        reasons.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - detect never raises: an odd driver state becomes a reason
        reasons.append(f"{accelerator} telemetry unavailable: {type(exc).__name__}: {one_line(exc, 200)}")
    for url in urls:
        try:
            sources.append(ExporterSource(url))
        except TelemetryUnavailable as exc:
            reasons.append(str(exc))
    return sources, reasons


_SERIES_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("util_pct", "util_pct", 1.0),
    ("mem_used_bytes", "mem_used_gib", 1.0 / GIB),
    ("mem_total_bytes", "mem_total_gib", 1.0 / GIB),
    ("power_w", "power_w", 1.0),
    ("sm_clock_mhz", "sm_clock_mhz", 1.0),
    ("temp_c", "temp_c", 1.0),
    ("energy_j", "energy_j", 1.0),
)
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")


def host_tag(host: str) -> str:
    """``host`` as it appears in series names (see the module docstring)."""
    host = host.strip("[]").lower()
    if not (_IPV4.match(host) or ":" in host):
        host = host.split(".", 1)[0]
    return re.sub(r"[^a-z0-9]+", "_", host).strip("_") or "host"


def device_prefix(r: DeviceReading) -> str:
    """The series-name prefix of one device: ``dev0``, or ``h{host}_dev0`` for an exporter's."""
    return f"h{host_tag(r.host)}_dev{r.index}" if r.host else f"dev{r.index}"


def series_points(readings: Iterable[DeviceReading]) -> dict[str, float]:
    """This second's points: ``dev{i}_<field>`` per reading, ``h{host}_dev{i}_<field>`` for
    an exporter's; fields that are ``None`` are left out."""
    out: dict[str, float] = {}
    for r in readings:
        prefix = device_prefix(r) + "_"
        for attr, suffix, scale in _SERIES_FIELDS:
            value = getattr(r, attr)
            if value is not None:
                out[prefix + suffix] = float(value) * scale
    return out


def process_tree_device_bytes(readings: Iterable[DeviceReading], pids: Iterable[int]) -> int | None:
    """Device memory held by ``pids`` (a server and its children), summed over this host's
    devices; ``None`` when no local reading can see processes. Exporter readings (another
    host's pids) are not counted. NVML in a container reports host pids, which do not
    match the container's own."""
    wanted = set(pids)
    total: int | None = None
    for r in readings:
        if r.host is not None or r.process_mem_bytes is None:
            continue
        total = (total or 0) + sum(used for pid, used in r.process_mem_bytes.items() if pid in wanted)
    return total


def cuda_device_name() -> str | None:
    """NVML's name of the first GPU a process started here may use (CUDA_VISIBLE_DEVICES' first
    index), without initializing CUDA in this process; None when it cannot tell."""
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    return _nvml_name(int(first)) if first.isdigit() else None


@functools.lru_cache(maxsize=8)
def _nvml_name(index: int) -> str | None:
    """NVML's name of GPU ``index`` (read once a process: a card keeps its name)."""
    try:
        source = NvmlSource([index])
        try:
            return source.names[0]
        finally:
            source.close()
    except Exception:  # noqa: BLE001 - no NVML here: the kind alone names the device
        return None


def visible_devices(accelerator: str) -> int | None:
    """Devices of ``accelerator`` this node shows (NVML for CUDA, honouring CUDA_VISIBLE_DEVICES;
    npu-smi for Ascend); None when it cannot tell."""
    if accelerator == "cuda":
        limit = os.environ.get("CUDA_VISIBLE_DEVICES")
        if limit is not None:
            return len([d for d in limit.split(",") if d.strip() and d.strip() != "-1"])
        try:
            source = NvmlSource()
            try:
                return len(source.indices)
            finally:
                source.close()
        except Exception:  # noqa: BLE001 - no NVML: cannot tell
            return None
    if accelerator == "npu":
        try:
            sources, _ = detect("npu")
            return len(sources[0].read()) if sources else None
        except Exception:  # noqa: BLE001
            return None
    return None

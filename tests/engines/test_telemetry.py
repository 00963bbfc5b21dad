"""Device telemetry: the vendor parsers on sample outputs (tests/data/telemetry, formats in
tests/data/README.md), the tools run for real as fake executables on PATH, exporters scraped
from a real local HTTP server, NVML's absence here, and real NVML where a GPU is."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engines.telemetry import (
    MIB,
    AscendSmiSource,
    CambriconSource,
    DeviceReading,
    ExporterSource,
    NvmlSource,
    TelemetryUnavailable,
    detect,
    host_tag,
    parse_cnmon_json,
    parse_exporter_text,
    parse_npu_smi_info,
    parse_npu_smi_usages,
    parse_prometheus_samples,
    process_tree_device_bytes,
    series_points,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "telemetry"
GIB = 1 << 30


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --- npu-smi -------------------------------------------------------------------------------


def test_npu_smi_910b_table_every_field_in_units() -> None:
    r0, r1, r2 = parse_npu_smi_info(sample("npu_smi_info_910b.txt"))
    assert (r0.vendor, r0.index, r0.name, r0.health) == ("ascend", 0, "910B3", "OK")
    assert r0.util_pct == 37.0 and r0.power_w == 96.5 and r0.temp_c == 43.0
    # HBM-Usage(MB) "28611/ 65536" (no space when the number fills its column), MB -> bytes
    assert r0.mem_used_bytes == 28611 * MIB and r0.mem_total_bytes == 65536 * MIB
    assert r0.sm_clock_mhz is None and r0.host is None  # npu-smi's table has no clock
    assert r0.process_mem_bytes == {2101: 27540 * MIB, 2188: 512 * MIB}
    assert (r1.index, r1.health, r1.util_pct, r1.power_w, r1.temp_c) == (1, "Warning", 0.0, 71.2, 38.0)
    assert r1.mem_used_bytes == 3380 * MIB and r1.process_mem_bytes == {}  # "No running processes found"
    assert (r2.index, r2.util_pct, r2.mem_used_bytes) == (2, 91.0, 61440 * MIB)
    assert r2.process_mem_bytes == {3301: 60012 * MIB}


def test_npu_smi_310p_duo_uses_the_device_id_ddr_memory_and_na_power() -> None:
    chip0, chip1 = parse_npu_smi_info(sample("npu_smi_info_310p.txt"))
    # one card (NPU 8), two chips: the index is each chip's logical Device id
    assert [chip0.index, chip1.index] == [4, 5] and chip0.name == chip1.name == "310P3"
    assert chip0.power_w is None and chip1.power_w is None  # "NA"
    assert (chip0.temp_c, chip1.temp_c, chip0.util_pct, chip1.util_pct) == (52.0, 57.0, 3.0, 58.0)
    assert chip0.mem_used_bytes == 1716 * MIB and chip0.mem_total_bytes == 44280 * MIB  # no HBM: DDR
    assert chip1.mem_used_bytes == 9216 * MIB and chip1.mem_total_bytes == 43693 * MIB
    assert chip0.process_mem_bytes == {}  # the processes are on chip 1 of NPU 8
    assert chip1.process_mem_bytes == {77001: 3021 * MIB, 77002: 101 * MIB}


def test_npu_smi_without_its_process_table_cannot_see_processes() -> None:
    text = sample("npu_smi_info_910b.txt")
    table_only = text[: text.index("| NPU     Chip")]
    readings = parse_npu_smi_info(table_only)
    assert len(readings) == 3 and all(r.process_mem_bytes is None for r in readings)
    assert process_tree_device_bytes(readings, {2101}) is None


def test_npu_smi_usages_per_chip() -> None:
    (chip,) = parse_npu_smi_usages(sample("npu_smi_usages_910b.txt"))
    assert chip["HBM Capacity(MB)"] == 65536 and chip["HBM Usage Rate(%)"] == 44
    assert chip["Aicore Usage Rate(%)"] == 37 and chip["HBM Bandwidth Usage Rate(%)"] == 21
    assert chip["NPU ID"] == 0 and chip["Chip ID"] == 0
    # a card with two chips repeats the block; a key seen again starts the next chip
    second = sample("npu_smi_usages_910b.txt").split("\n", 2)[2]
    second = second.replace(": 44", ": 9").replace("Chip ID                        : 0", "Chip ID : 1")
    first, other = parse_npu_smi_usages(sample("npu_smi_usages_910b.txt") + second)
    assert (first["Chip ID"], first["HBM Usage Rate(%)"]) == (0, 44)
    assert (other["Chip ID"], other["HBM Usage Rate(%)"], other["NPU ID"]) == (1, 9, 0)


@pytest.mark.parametrize(
    "text",
    ["", "garbage\nmore garbage", "| a | b | c |\n| d | e | f |", "dcmi module initialize failed. ret is -8005"],
)
def test_unreadable_tool_output_gives_nothing(text: str) -> None:
    assert parse_npu_smi_info(text) == []
    assert parse_npu_smi_usages(text) == []
    assert parse_cnmon_json(text) == []
    assert parse_exporter_text(text) == []


# --- cnmon -----------------------------------------------------------------------------------


def test_cnmon_json_numbers_strings_with_units_and_missing_keys() -> None:
    c0, c1, c2 = parse_cnmon_json(sample("cnmon_info.json"))
    assert (c0.vendor, c0.index, c0.name) == ("cambricon", 0, "MLU370-X8")
    assert c0.util_pct == 63 and c0.temp_c == 53 and c0.power_w == 142
    assert c0.mem_used_bytes == 18342 * MIB and c0.mem_total_bytes == 24576 * MIB  # bare numbers: MiB
    assert c1.index == 1  # CardNum given as a string
    assert c1.util_pct == 7 and c1.temp_c == 47  # "7 %", "47 C"
    assert c1.mem_used_bytes == 1024 * MIB and c1.mem_total_bytes == 24576 * MIB  # "1024 MiB"
    assert c1.power_w is None  # "N/A"
    assert (c2.index, c2.name) == (2, "MLU370-S4")
    assert [c2.util_pct, c2.mem_used_bytes, c2.mem_total_bytes, c2.temp_c, c2.power_w] == [None] * 5
    assert parse_cnmon_json('{"CnmonInfo": "none"}') == [] and parse_cnmon_json("[1, 2]") == []


# --- the tools run for real, as fake executables on PATH --------------------------------------


@pytest.fixture
def tool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder put first on PATH, for fake vendor tools."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return folder


def write_tool(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_detect_npu_runs_npu_smi_info_from_path(tool_dir: Path) -> None:
    table = DATA / "npu_smi_info_910b.txt"
    # the fake answers only the argv the source must send
    write_tool(tool_dir, "npu-smi", f'[ "$*" = "info" ] || {{ echo "bad args: $*" >&2; exit 2; }}\ncat "{table}"')
    sources, reasons = detect("npu")
    assert reasons == [] and len(sources) == 1 and isinstance(sources[0], AscendSmiSource)
    readings = sources[0].read()
    assert sources[0].last_error == ""
    assert [r.index for r in readings] == [0, 1, 2] and readings[0].mem_used_bytes == 28611 * MIB
    (only,) = detect("npu", devices=[2])[0]
    assert [r.index for r in only.read()] == [2]


def test_npu_smi_missing_hung_failing_or_talking_nonsense(tool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tool_dir))  # nothing else on PATH: no real npu-smi either
    assert detect("npu") == ([], ["npu-smi not found on PATH"])
    assert detect("mlu") == ([], ["cnmon not found on PATH"])

    # a tool that hangs: killed with its children (the sleep holds the pipe) at the timeout
    hung = AscendSmiSource(str(write_tool(tool_dir, "npu-smi-hung", "/bin/sleep 30")), timeout=0.5)
    started = time.monotonic()
    assert hung.read() == []
    assert time.monotonic() - started < 5.0
    assert hung.last_error == "npu-smi-hung did not answer within 0.5 s (killed)"

    failing = write_tool(tool_dir, "npu-smi-fail", "echo 'dcmi module initialize failed. ret is -8005' >&2\nexit 1")
    source = AscendSmiSource(str(failing))
    assert source.read() == []
    assert source.last_error == "npu-smi-fail exited with status 1: dcmi module initialize failed. ret is -8005"

    nonsense = AscendSmiSource(str(write_tool(tool_dir, "npu-smi-odd", "echo 'Usage: npu-smi [info]'")))
    assert nonsense.read() == []
    assert nonsense.last_error.startswith("npu-smi info printed no device table: 'Usage: npu-smi [info]'")

    gone = AscendSmiSource(str(tool_dir / "no-such-tool"))
    assert gone.read() == [] and gone.last_error.startswith("could not run no-such-tool: ")
    assert "\n" not in hung.last_error + source.last_error + nonsense.last_error + gone.last_error


def test_detect_mlu_runs_cnmon_which_writes_its_json_file(tool_dir: Path) -> None:
    body = (
        '[ "$*" = "info -e -m -u -j" ] || { echo "bad args: $*" >&2; exit 2; }\n'
        f'cp "{DATA / "cnmon_info.json"}" cnmon_info.json\n'
        'echo "Writing JSON file: cnmon_info.json"'
    )
    write_tool(tool_dir, "cnmon", body)
    sources, reasons = detect("mlu", devices=[0, 1])
    assert reasons == [] and len(sources) == 1 and isinstance(sources[0], CambriconSource)
    source = sources[0]
    r0, r1 = source.read()
    assert source.last_error == "" and (r0.index, r0.util_pct, r1.index, r1.temp_c) == (0, 63, 1, 47)
    scratch = source._scratch
    assert scratch is not None and Path(scratch, "cnmon_info.json").exists()

    # a run that writes no file must not read the previous second's file again
    write_tool(tool_dir, "cnmon", 'echo "MLU driver not loaded"')
    assert source.read() == []
    assert source.last_error == "cnmon wrote no CnmonInfo JSON and printed no card table: 'MLU driver not loaded'"

    # JSON on stdout is read too
    write_tool(tool_dir, "cnmon", f'cat "{DATA / "cnmon_info.json"}"')
    assert [r.index for r in source.read()] == [0, 1]
    source.close()
    assert not Path(scratch).exists()


# --- exporters, from a real local HTTP server ----------------------------------------------


@pytest.fixture
def exporter() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving the sample exporter texts; yields its base URL."""
    pages = {
        "/dcgm": sample("dcgm_exporter.txt"),
        "/npu": sample("npu_exporter.txt"),
        "/mlu": sample("mlu_exporter.txt"),
        "/other": '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3\n',
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            data = (body or "not found").encode()
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_dcgm_exporter_scraped(exporter: str) -> None:
    source = ExporterSource(exporter + "/dcgm")
    g0, g1 = source.read()
    assert source.last_error == ""
    assert (g0.vendor, g0.index, g0.name, g0.host) == ("nvidia", 0, "NVIDIA H100 80GB HBM3", "127.0.0.1")
    assert g0.util_pct == 87 and g0.power_w == pytest.approx(512.347) and g0.sm_clock_mhz == 1980
    assert g0.temp_c == 61
    assert g0.mem_used_bytes == 62633 * MIB and g0.mem_total_bytes == (62633 + 18000) * MIB  # FB used + free
    assert g0.process_mem_bytes is None and g0.health is None  # dcgm-exporter has neither
    # label lists with spaces after the commas; a not-supported temperature is DCGM's blank value
    assert (g1.index, g1.util_pct, g1.sm_clock_mhz, g1.mem_used_bytes) == (1, 0, 345, 0)
    assert g1.temp_c is None
    points = series_points([g0, g1])
    assert points["h127_0_0_1_dev0_util_pct"] == 87
    assert points["h127_0_0_1_dev0_mem_used_gib"] == pytest.approx(62633 / 1024)
    assert points["h127_0_0_1_dev1_power_w"] == pytest.approx(71.052)
    assert "h127_0_0_1_dev1_temp_c" not in points and not any(k.startswith("dev") for k in points)
    source.close()


def test_npu_exporter_scraped(exporter: str) -> None:
    n0, n1 = ExporterSource(exporter + "/npu").read()
    assert (n0.vendor, n0.index, n0.name, n0.health) == ("ascend", 0, "Ascend910B3", "OK")
    assert n0.util_pct == 37 and n0.power_w == 96.5 and n0.temp_c == 43 and n0.sm_clock_mhz == 1800
    # the HBM pair (MB -> bytes), not the DDR pair that reads 0 / 0 on a 910B
    assert n0.mem_used_bytes == 28611 * MIB and n0.mem_total_bytes == 65536 * MIB
    assert n0.process_mem_bytes == {2101: 27540 * MIB, 2188: 512 * MIB}
    assert (n1.index, n1.health, n1.process_mem_bytes) == (1, "Unhealthy", {})  # health_status 0
    assert n1.power_w == pytest.approx(71.2, abs=1e-5)


def test_mlu_exporter_scraped(exporter: str) -> None:
    m0, m1 = ExporterSource(exporter + "/mlu").read()
    assert (m0.vendor, m0.index, m0.name, m0.health) == ("cambricon", 0, "MLU370-X8", "OK")
    assert m0.util_pct == 63 and m0.power_w == 142  # the whole device (vf=""), not virtual function 1
    assert m0.mem_used_bytes == 18342 * MIB and m0.mem_total_bytes == 24576 * MIB  # already bytes
    assert m0.temp_c == 53 and m0.sm_clock_mhz == 1300  # the chip's temperature, not the board's
    assert m0.process_mem_bytes == {4242: 16 * GIB}
    assert (m1.index, m1.util_pct, m1.power_w, m1.health, m1.process_mem_bytes) == (1, 7, 75, "Unhealthy", {})


def test_exporter_failures_are_one_line_reasons(exporter: str) -> None:
    missing = ExporterSource(exporter + "/missing")
    assert missing.read() == [] and missing.last_error == f"HTTP 404 from {exporter}/missing"
    other = ExporterSource(exporter + "/other")
    assert other.read() == []
    assert other.last_error == f"no DCGM_FI_DEV_*, npu_chip_info_* or mlu_* device metrics at {exporter}/other"

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = ExporterSource(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
    assert refused.read() == []
    assert refused.last_error.startswith(f"could not connect to http://127.0.0.1:{port}/metrics: ")
    assert "\n" not in refused.last_error

    # the same source recovers once the endpoint answers
    flaky = ExporterSource(exporter + "/dcgm")
    flaky.url = exporter + "/missing"
    assert flaky.read() == [] and flaky.last_error
    flaky.url = exporter + "/dcgm"
    assert len(flaky.read()) == 2 and flaky.last_error == ""


def test_detect_adds_one_exporter_per_url_and_reasons_for_bad_ones(exporter: str) -> None:
    sources, reasons = detect("cpu", [exporter + "/dcgm", "localhost:9400/metrics", exporter + "/npu"], local=False)
    assert [s.name for s in sources] == [f"exporter {exporter}/dcgm", f"exporter {exporter}/npu"]
    assert reasons == ["exporter URL 'localhost:9400/metrics' is not an http(s) URL with a host"]
    assert detect("cpu", local=False) == ([], [])
    # on cpu the local source is RAPL's energy counter; this machine says why when it has none
    local, why = detect("cpu")
    if Path("/sys/class/powercap").is_dir() and local:
        assert [s.name for s in local] == ["rapl"] and why == []
    else:
        assert local == [] and len(why) == 1 and why[0].startswith("no CPU energy counter (RAPL): "), why
    assert detect("tpu") == ([], ["no device telemetry for accelerator 'tpu' (known: cpu, cuda, npu, mlu)"])
    with pytest.raises(TelemetryUnavailable, match="not an http"):
        ExporterSource("ftp://10.0.0.1/metrics")


def test_prometheus_samples_keep_labels_escapes_and_skip_bad_lines() -> None:
    text = (
        'a{x="1",y="q\\"uote, comma} brace"} 2.5 1700000000000\n'
        'b{ gpu = "0" , modelName="x, y"} NaN\n'
        "c 7\n"
        'd{gpu="0" 5\n'
        'e{gpu="0"}\n'
        "f{gpu=0} 1\n"
        "# TYPE g gauge\n"
    )
    samples = parse_prometheus_samples(text)
    assert [(s.name, s.labels) for s in samples] == [
        ("a", {"x": "1", "y": 'q"uote, comma} brace'}),
        ("b", {"gpu": "0", "modelName": "x, y"}),
        ("c", {}),
    ]
    assert samples[0].value == 2.5 and samples[2].value == 7
    assert parse_exporter_text('DCGM_FI_DEV_GPU_UTIL{gpu="0"} NaN\n')[0].util_pct is None
    # a virtual function's sample is never the device's, whatever the order
    vf_first = 'mlu_utilization{mlu="0",vf="1"} 20\nmlu_utilization{mlu="0",vf=""} 63\n'
    assert parse_exporter_text(vf_first)[0].util_pct == 63


# --- series and process memory ------------------------------------------------------------


def test_series_points_names_and_units() -> None:
    local = DeviceReading("nvidia", 3, "H200", util_pct=50.0, mem_used_bytes=3 * GIB, mem_total_bytes=141 * GIB)
    local.power_w, local.sm_clock_mhz, local.temp_c = 700.0, 1980.0, 70.0
    remote = DeviceReading("ascend", 0, "910B3", util_pct=10.0, host="gpu-node-3.example.com")
    assert series_points([local, remote]) == {
        "dev3_util_pct": 50.0,
        "dev3_mem_used_gib": 3.0,
        "dev3_mem_total_gib": 141.0,
        "dev3_power_w": 700.0,
        "dev3_sm_clock_mhz": 1980.0,
        "dev3_temp_c": 70.0,
        "hgpu_node_3_dev0_util_pct": 10.0,
    }
    assert [host_tag(h) for h in ("10.0.0.7", "Node-A.cluster.local", "[fe80::1]", "localhost")] == [
        "10_0_0_7",
        "node_a",
        "fe80_1",
        "localhost",
    ]


def test_process_tree_device_bytes() -> None:
    a = DeviceReading("nvidia", 0, process_mem_bytes={100: 4 * GIB, 101: GIB, 999: 7 * GIB})
    b = DeviceReading("nvidia", 1, process_mem_bytes={101: 2 * GIB})
    blind = DeviceReading("nvidia", 2, process_mem_bytes=None)
    remote = DeviceReading("ascend", 0, host="10.0.0.9", process_mem_bytes={100: 50 * GIB})
    assert process_tree_device_bytes([a, b, blind, remote], {100, 101}) == 7 * GIB  # 4 + 1 + 2, not the remote 100
    assert process_tree_device_bytes([a, b], {12345}) == 0  # visible, and not using the device
    assert process_tree_device_bytes([blind, remote], {100}) is None  # nothing local can see processes


# --- NVML ---------------------------------------------------------------------------------------


def _nvml_works() -> bool:
    try:
        NvmlSource().close()
    except TelemetryUnavailable:
        return False
    return True


def test_detect_cuda_without_nvml_gives_one_reason() -> None:
    if _nvml_works():
        pytest.skip("NVML works on this machine; the cuda-marked test covers it")
    sources, reasons = detect("cuda", ["http://10.0.0.5:9400/metrics"])
    assert [type(s) for s in sources] == [ExporterSource]  # the exporter still comes
    assert len(reasons) == 1 and reasons[0].startswith("NVML unavailable: ") and "\n" not in reasons[0]
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert reasons == ["NVML unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"]


class _NotSupported(Exception):
    pass


def fake_pynvml() -> SimpleNamespace:
    """A stand-in for pynvml with two GPUs: GPU 1 lacks power and temperature, reports
    processes without their memory (as under MIG), and loses its clock read."""

    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    class NoPermission(NVMLError):
        pass

    calls = {"init": 0, "shutdown": 0}

    def unsupported(*_: Any) -> Any:
        raise NotSupported("Not Supported")

    def by_gpu(name: str, zero: Any, one: Any) -> Any:
        def fn(handle: int, *_: Any) -> Any:
            value = zero if handle == 0 else one
            return value(handle) if callable(value) else value

        fn.__name__ = name
        return fn

    def lost(_: int) -> Any:
        raise NVMLError("GPU is lost")

    procs0 = [SimpleNamespace(pid=100, usedGpuMemory=2 * GIB), SimpleNamespace(pid=101, usedGpuMemory=GIB)]
    procs1 = [SimpleNamespace(pid=100, usedGpuMemory=None)]
    return SimpleNamespace(
        calls=calls,
        NVMLError=NVMLError,
        NVMLError_NotSupported=NotSupported,
        NVMLError_NoPermission=NoPermission,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: calls.__setitem__("init", calls["init"] + 1),
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=by_gpu("nvmlDeviceGetName", b"NVIDIA H200", "NVIDIA H200"),
        nvmlDeviceGetUtilizationRates=by_gpu(
            "nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=55, memory=30), SimpleNamespace(gpu=0, memory=0)
        ),
        nvmlDeviceGetMemoryInfo=by_gpu(
            "nvmlDeviceGetMemoryInfo",
            SimpleNamespace(used=3 * GIB, total=141 * GIB, free=138 * GIB),
            SimpleNamespace(used=GIB, total=141 * GIB, free=140 * GIB),
        ),
        nvmlDeviceGetPowerUsage=by_gpu("nvmlDeviceGetPowerUsage", 123456, unsupported),  # milliwatts
        nvmlDeviceGetClockInfo=by_gpu("nvmlDeviceGetClockInfo", 1980, lost),
        nvmlDeviceGetTemperature=by_gpu("nvmlDeviceGetTemperature", 47, unsupported),
        nvmlDeviceGetComputeRunningProcesses=by_gpu("nvmlDeviceGetComputeRunningProcesses", procs0, procs1),
        # mJ since the driver loaded (Volta and later); GPU 1 does not support it
        nvmlDeviceGetTotalEnergyConsumption=by_gpu("nvmlDeviceGetTotalEnergyConsumption", 5_123_456, unsupported),
    )


def test_nvml_fields_units_and_unsupported_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sources, reasons = detect("cuda")
    assert reasons == [] and len(sources) == 1
    source = sources[0]
    assert isinstance(source, NvmlSource) and source.indices == [0, 1]
    g0, g1 = source.read()
    assert (g0.vendor, g0.index, g0.name) == ("nvidia", 0, "NVIDIA H200")  # bytes name decoded
    assert (g0.util_pct, g0.mem_used_bytes, g0.mem_total_bytes) == (55, 3 * GIB, 141 * GIB)
    assert g0.power_w == pytest.approx(123.456) and g0.sm_clock_mhz == 1980 and g0.temp_c == 47  # mW -> W
    assert g0.process_mem_bytes == {100: 2 * GIB, 101: GIB}
    assert g1.name == "NVIDIA H200" and g1.util_pct == 0 and g1.mem_used_bytes == GIB
    assert (g1.power_w, g1.temp_c, g1.sm_clock_mhz) == (None, None, None)  # not supported / lost
    assert g1.process_mem_bytes is None  # processes without their memory: cannot say
    assert g0.energy_j == pytest.approx(5123.456) and g1.energy_j is None  # mJ -> J; unsupported: none
    assert source.last_error == "GPU 1: nvmlDeviceGetClockInfo: GPU is lost"  # the unexpected error, and only it
    assert process_tree_device_bytes([g0, g1], {100}) == 2 * GIB

    source.close()
    source.close()
    assert fake.calls == {"init": 1, "shutdown": 1}
    assert source.read() == [] and source.last_error == "the NVML source is closed"

    with pytest.raises(TelemetryUnavailable, match=r"^NVML has no GPU 5 \(it sees 2\)$"):
        NvmlSource([5])
    assert fake.calls == {"init": 2, "shutdown": 2}  # a failed open shuts NVML down again
    assert [s.indices for s in detect("cuda", devices=[1])[0]] == [[1]]  # type: ignore[attr-defined]


def test_nvml_init_failure_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml()

    def no_driver() -> None:
        raise fake.NVMLError("Driver Not Loaded")

    fake.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert detect("cuda") == ([], ["NVML unavailable: Driver Not Loaded"])


def test_nvml_not_installed_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert detect("cuda") == ([], ["NVML unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"])


@pytest.mark.cuda
def test_nvml_for_real_when_present() -> None:
    try:
        source = NvmlSource()
    except TelemetryUnavailable as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        readings = source.read()
        assert readings and [r.index for r in readings] == source.indices
        for r in readings:
            assert r.vendor == "nvidia" and r.name
            assert r.mem_total_bytes is not None and r.mem_total_bytes > GIB
            assert r.mem_used_bytes is not None and 0 <= r.mem_used_bytes <= r.mem_total_bytes
            assert r.util_pct is not None and 0 <= r.util_pct <= 100
            assert r.power_w is not None and 10 < r.power_w < 2000  # watts, not milliwatts
            assert r.sm_clock_mhz is not None and 100 < r.sm_clock_mhz < 4000
            assert r.temp_c is not None and 0 < r.temp_c < 120
        points = series_points(readings)
        assert points["dev0_mem_total_gib"] == pytest.approx(readings[0].mem_total_bytes / GIB)
        started = time.monotonic()
        for _ in range(10):
            source.read()
        assert (time.monotonic() - started) / 10 < 0.25  # cheap enough for a once-a-second sampler
    finally:
        source.close()


@pytest.mark.cuda
def test_nvml_sees_this_process_device_memory_for_real() -> None:
    try:
        source = NvmlSource([0])
    except TelemetryUnavailable as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available() or "CUDA_VISIBLE_DEVICES" in os.environ:
            pytest.skip("torch has no CUDA here, or its GPU 0 need not be NVML's")
        held = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        readings = source.read()
        procs = readings[0].process_mem_bytes
        if procs is None:
            pytest.skip("NVML does not report per-process memory here (MIG or no permission)")
        if os.getpid() not in procs and procs:
            pytest.skip(f"NVML lists pids of another pid namespace: {sorted(procs)}")
        assert process_tree_device_bytes(readings, {os.getpid()}) >= held.numel()  # type: ignore[operator]
        assert readings[0].mem_used_bytes is not None and readings[0].mem_used_bytes >= held.numel()
    finally:
        source.close()

"""Device telemetry in real runs: the CLI reads exporters from a real local HTTP server, an
Ascend host's npu-smi (a fake executable on PATH printing the documented table) during a
run against a real streaming server, and says in one line what it could not read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.run.artifacts import ARTIFACT_DEVICE_TELEMETRY
from bench.store import Store
from bench.store.rows import SUMMARY_CSV_COLUMNS
from engines.telemetry import GIB, parse_exporter_text, parse_npu_smi_info
from tests.bench.test_cli import cli
from tests.engines.test_telemetry import DATA, exporter, sample, write_tool  # noqa: F401 - exporter is a fixture


def _series(store: Store, run_id: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for _, name, value in store.timeseries(run_id):
        if value is not None:
            out.setdefault(name, []).append(value)
    return out


RAPL_ABSENT = "no CPU energy counter (RAPL): /sys/class/powercap is absent (a virtual machine usually hides RAPL)"


@pytest.mark.slow
def test_a_run_reads_exporters_and_says_which_one_it_could_not_read(
    tmp_path: Path,
    tiny_model: Path,
    exporter: str,  # noqa: F811 - the fixture
) -> None:
    db = tmp_path / "db.sqlite"
    p = cli(
        "run", "--engine", "native", "--model", "tiny-deepseek-v3", "--accelerator", "cpu",
        "--mode", "latency", "--requests", "6", "--input-len", "16", "--output-len", "8",
        "--telemetry-url", exporter + "/dcgm", "--telemetry-url", exporter + "/missing",
        "--summary-csv", str(tmp_path / "sum.csv"), db=db,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    store = Store(db)
    run = store.list_runs(limit=1)[0]
    g0, g1 = parse_exporter_text(sample("dcgm_exporter.txt"), host="127.0.0.1")
    s = run.summary
    assert s is not None and s.completed == 6
    # a static exporter page: every sample is the same, so the run's figures are exactly the page's
    assert s.device_util_pct == pytest.approx((g0.util_pct + g1.util_pct) / 2)
    assert s.device_power_w == pytest.approx(g0.power_w + g1.power_w)
    assert s.device_mem_used_gib == pytest.approx((g0.mem_used_bytes + g1.mem_used_bytes) / GIB)
    series = _series(store, run.id)
    assert set(series["h127_0_0_1_dev0_util_pct"]) == {87.0}
    assert len(series["h127_0_0_1_dev1_power_w"]) >= 2  # t = 0 and the closing point at least
    found = store.artifact(run.id, ARTIFACT_DEVICE_TELEMETRY)
    assert [s["name"] for s in found["sources"]] == [f"exporter {exporter}/dcgm", f"exporter {exporter}/missing"]
    unread = f"exporter {exporter}/missing: HTTP 404 from {exporter}/missing"
    assert found["missing"] in ([unread], [RAPL_ABSENT, unread])  # this host's CPU energy counter, where hidden
    # energy: the page's power, constant, over the window its samples span; its DCGM energy counter does
    # not move on a static page, so the power samples are integrated and the artifact says why
    power = sorted((t, v) for t, n, v in store.timeseries(run.id) if n.endswith("_power_w") and n.startswith("h127"))
    times = sorted({t for t, _ in power})
    assert s.energy_j == pytest.approx((g0.power_w + g1.power_w) * (times[-1] - times[0]))
    assert s.joules_per_output_token == pytest.approx(s.energy_j / s.output_tokens)
    methods = {d["device"]: d["method"] for d in store.artifact(run.id, "energy")["devices"]}
    assert methods == {  # GPU 0 has a DCGM energy counter on the page, GPU 1 none
        "h127_0_0_1_dev0": "power samples (trapezoid; the energy counter did not advance)",
        "h127_0_0_1_dev1": "power samples (trapezoid)",
    }
    # The devices read are named (the sidebar shows them during a run).
    assert found["devices"] == [
        f"h127_0_0_1_dev{g.index}: {g.name or g.vendor} (exporter {exporter}/dcgm)" for g in (g0, g1)
    ]
    assert g0.name  # the exporter's modelName label
    assert f"note          device telemetry: exporter {exporter}/missing: HTTP 404" in p.stdout
    assert "device        utilisation 44% (mean)" in p.stdout
    header, row = (tmp_path / "sum.csv").read_text().splitlines()[:2]
    assert {"device_util_pct", "device_power_w", "device_mem_used_gib"} <= set(header.split(","))
    assert set(SUMMARY_CSV_COLUMNS) >= {"device_util_pct", "device_power_w", "device_mem_used_gib"}
    assert "43.5" in row


@pytest.fixture
def stub() -> Iterator[str]:
    from bench.stub_server import start_stub_server

    url, server = start_stub_server(itl_ms=2.0)
    yield url
    server.stop()


@pytest.mark.slow
def test_an_ascend_host_is_read_through_npu_smi_during_a_served_run(
    tmp_path: Path, stub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    table = DATA / "npu_smi_info_910b.txt"
    write_tool(tools, "npu-smi", f'[ "$*" = "info" ] || {{ echo "bad args: $*" >&2; exit 2; }}\ncat "{table}"')
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    db = tmp_path / "db.sqlite"
    # A server on an Ascend host (here the stub) measured from that host: --accelerator npu reads npu-smi.
    p = cli(
        "run", "--engine", "openai", "--base-url", stub, "--engine-opt", "check_model=false",
        "--accelerator", "npu", "--mode", "concurrency", "--concurrency", "4", "--requests", "40",
        "--output-len", "16", "--input-len", "16", db=db,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    store = Store(db)
    run = store.list_runs(limit=1)[0]
    chips = parse_npu_smi_info(table.read_text())
    assert run.summary.device_util_pct == pytest.approx(sum(c.util_pct for c in chips) / len(chips))
    assert run.summary.device_mem_used_gib == pytest.approx(sum(c.mem_used_bytes for c in chips) / GIB)
    series = _series(store, run.id)
    assert set(series["dev2_util_pct"]) == {91.0} and set(series["dev0_temp_c"]) == {43.0}
    found = store.artifact(run.id, ARTIFACT_DEVICE_TELEMETRY)
    assert found["missing"] == [] and found["sources"][0]["source"] == "AscendSmiSource"
    # without the tool the run still completes and says why there is no device telemetry
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != str(tools)))
    p = cli(
        "run", "--engine", "openai", "--base-url", stub, "--engine-opt", "check_model=false",
        "--accelerator", "npu", "--requests", "3", "--output-len", "4", db=db,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "note          device telemetry: npu-smi not found on PATH" in p.stdout
    assert store.list_runs(limit=1)[0].summary.device_util_pct is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://10.0.0.1/metrics", "must be http(s)://host[:port]/path"),
        ("localhost:9400/metrics", "must be http(s)://host[:port]/path"),
        ("http://user:secret@10.0.0.1:9400/metrics", "carries credentials"),
    ],
)
def test_a_bad_telemetry_url_is_refused_in_one_line(tmp_path: Path, url: str, reason: str) -> None:
    p = cli("run", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--telemetry-url", url,
            db=tmp_path / "db.sqlite")  # fmt: skip
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and "secret" not in p.stderr

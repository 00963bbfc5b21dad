"""A launched server's own device memory: the device memory its process tree holds, as device
telemetry that sees processes reports it (here npu-smi's process table, printed by a fake
npu-smi on PATH naming the real pids of a real process tree MoE Bench launched)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from bench.run.recorder import SERIES_SERVER_DEVICE_MEM, Sampler
from bench.store import Store
from engines.base import create_engine
from engines.launch import ManagedProcess
from engines.telemetry import GIB, MIB, detect
from tests.engines.test_telemetry import DATA, write_tool

# A "server" that starts one worker and waits, like vLLM's API server and its engine core.
TREE = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); " \
    "time.sleep(120)"  # fmt: skip


def test_a_launched_servers_device_memory_is_its_process_trees(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine({"kind": "vllm", "model": "tiny-deepseek-v3", "accelerator": "cpu"})
    assert engine.server_pids() == []  # nothing launched: nothing to count
    engine.server = ManagedProcess(["python3", "-c", TREE], name="tree", log_path=tmp_path / "tree.log").start()
    try:
        root = psutil.Process(engine.server.proc.pid)
        worker_cmd = "import time; time.sleep(120)"
        deadline = time.monotonic() + 20
        while not (workers := [p.pid for p in root.children(recursive=True) if p.cmdline()[-1:] == [worker_cmd]]):
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
        (worker,) = workers
        pids = engine.server_pids()
        assert pids[0] == root.pid and len(pids) >= 3  # trampoline, server, worker
        assert worker in pids
        # npu-smi's process table names the server's worker (27540 MB) and another process (512 MB).
        table = (DATA / "npu_smi_info_910b.txt").read_text().replace("2101", str(worker)).replace("2188", "1")
        (tmp_path / "table.txt").write_text(table)
        tools = tmp_path / "bin"
        tools.mkdir()
        write_tool(tools, "npu-smi", f'cat "{tmp_path / "table.txt"}"')
        monkeypatch.setenv("PATH", f"{tools}:{Path('/usr/bin')}:{Path('/bin')}")
        sources, missing = detect("npu")
        assert missing == []
        run_id = store.create_run(mode="latency", engine="vllm", model="m", accelerator="npu", config={})
        sampler = Sampler(
            engine, store, run_id, 1.0, live=lambda: (0, 0), recorder=None,  # type: ignore[arg-type]
            server_metrics=False, on_tick=lambda t: None, on_unhealthy=lambda r: None, devices=sources,
        )  # fmt: skip
        points = dict((name, v) for _, name, v in sampler._device_points(1.0))
        assert points[SERIES_SERVER_DEVICE_MEM] == pytest.approx(27540 * MIB / GIB)
        assert sampler.server_device_peak_gib == pytest.approx(27540 * MIB / GIB)
        assert sampler.device_names["dev0"].endswith("(npu-smi)")
        # The other process on the chip is not the server's: device memory in use counts it, this does not.
        assert points["dev0_mem_used_gib"] > points[SERIES_SERVER_DEVICE_MEM]
    finally:
        engine.server.stop()
    assert engine.server_pids() == []  # the tree is gone

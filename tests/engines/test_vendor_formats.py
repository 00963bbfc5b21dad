"""The vendor tools' parsers on real outputs, as people posted them from real machines (sources in
tests/data/README.md, "real/"): not samples this project wrote."""

from __future__ import annotations

from pathlib import Path

from engines.telemetry import parse_npu_smi_info

REAL = Path(__file__).resolve().parents[1] / "data" / "telemetry" / "real"
MIB = 2**20


def test_npu_smi_info_of_a_910b4_server() -> None:
    """npu-smi 25.2.0, two 910B4-1 NPUs, one chip each (no Phy-ID column), the poster masked the
    bus ids (0000:xx:00.0)."""
    chips = parse_npu_smi_info((REAL / "npu_smi_info_910b4_hami47.txt").read_text())
    assert [(c.index, c.name, c.health) for c in chips] == [(0, "910B4-1", "OK"), (1, "910B4-1", "OK")]
    assert [(c.power_w, c.temp_c, c.util_pct) for c in chips] == [(91.3, 33.0, 0.0), (88.1, 32.0, 0.0)]
    assert all(c.mem_used_bytes == 3197 * MIB and c.mem_total_bytes == 65536 * MIB for c in chips)  # HBM


def test_npu_smi_info_of_an_a3_server_with_two_chips_per_npu() -> None:
    """npu-smi 26.0.rc2 on an A3 (Ascend910, 2 chips per NPU, Phy-ID column; the second chip's
    power is "-"): each chip is a device, indexed by its physical id."""
    chips = parse_npu_smi_info((REAL / "npu_smi_info_a3_vllm_ascend_12980.txt").read_text())
    assert [(c.index, c.name) for c in chips] == [(0, "Ascend910"), (1, "Ascend910")]
    assert [c.power_w for c in chips] == [162.6, None] and [c.temp_c for c in chips] == [34.0, 34.0]
    assert [c.mem_used_bytes for c in chips] == [3419 * MIB, 2874 * MIB]
    assert all(c.mem_total_bytes == 65536 * MIB for c in chips)


def test_npu_smi_usages_of_910b_servers_old_and_new_drivers() -> None:
    """``npu-smi info -t usages -i 0``: a 910B1 (npu-smi 23.0.rc2) and a 910B on driver 25.5.1,
    which adds NPU Utilization and Aicube Usage Rate lines."""
    from engines.telemetry import parse_npu_smi_usages

    (old,) = parse_npu_smi_usages((REAL / "npu_smi_usages_910b1_arthurchiao.txt").read_text())
    (new,) = parse_npu_smi_usages((REAL / "npu_smi_usages_910b_25_5_telegraf.txt").read_text())
    for chip, rate in ((old, 4.0), (new, 5.0)):
        assert chip["HBM Capacity(MB)"] == 65536 and chip["HBM Usage Rate(%)"] == rate and chip["Chip ID"] == 0
        assert chip["NPU ID"] == 0 and chip["Chip Count"] == 1
    assert new["NPU Utilization(%)"] == 0 and new["Aicube Usage Rate(%)"] == 0 and "Aicube Usage Rate(%)" not in old


def test_plain_cnmon_tables_of_mlu370_cards() -> None:
    """``cnmon`` (v5.10.13, two MLU370-X8; v4.20.11, three MLU370-X4 with the older header)."""
    from engines.telemetry import parse_cnmon_table

    x8 = parse_cnmon_table((REAL / "cnmon_mlu370_x8_paddle.txt").read_text())
    assert [(c.index, c.name, c.temp_c, c.power_w, c.util_pct) for c in x8] == [
        (0, "MLU370-X8", 32.0, 106.0, 0.0), (1, "MLU370-X8", 39.0, 106.0, 0.0)
    ]  # fmt: skip
    assert all(c.mem_used_bytes == 0 and c.mem_total_bytes == 23374 * MIB for c in x8)
    x4 = parse_cnmon_table((REAL / "cnmon_mlu370_x4_paddle.txt").read_text())
    assert [(c.index, c.power_w, c.temp_c) for c in x4] == [(0, 30.0, 32.0), (1, 25.0, 33.0), (2, 26.0, 30.0)]
    assert all(c.mem_total_bytes == 23308 * MIB for c in x4)  # Memory-Usage, not the vMemory column

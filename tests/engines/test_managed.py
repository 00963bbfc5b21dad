"""The interpreter probe the server engines share (vLLM, Triton, LMDeploy environments)."""

from __future__ import annotations

import sys
from pathlib import Path

from engines.managed import probe_interpreter

SCRIPT = 'import json, sys; print("noise"); print(json.dumps({"version": sys.version_info[0]}))'


def test_probe_returns_the_last_json_line_and_is_cached() -> None:
    assert probe_interpreter(sys.executable, SCRIPT) == {"version": 3}
    first = probe_interpreter(sys.executable, SCRIPT)
    first["version"] = 0  # callers get a copy: the cached answer stays
    assert probe_interpreter(sys.executable, SCRIPT) == {"version": 3}


def test_probe_failures_are_one_line_reasons(tmp_path: Path) -> None:
    missing = probe_interpreter(str(tmp_path / "python"), SCRIPT, missing=" (set MOEBENCH_X_PYTHON)")
    assert missing["error"].endswith("does not exist (set MOEBENCH_X_PYTHON)")
    assert "failed: ZeroDivisionError" in probe_interpreter(sys.executable, "1/0")["error"]
    assert "printed no probe result" in probe_interpreter(sys.executable, "print('hi')")["error"]
    slow = probe_interpreter(sys.executable, "import time; time.sleep(5)", timeout=0.5)
    assert slow["error"].endswith("did not answer the probe within 0.5 s")

"""Running the real CLI (``python -m bench``) as a user does, for the hostile tests.

:func:`bench` starts it as a subprocess with a clean environment (no ``MOEBENCH_*`` or API
key of the caller's, ``MOEBENCH_DATA_DIR`` set to the test's folder), samples its resident
memory (with its children's) while it runs, and returns what it printed and its exit code.
The timeout is only a hang guard: no test asserts on elapsed time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300.0
_SAMPLE_EVERY_S = 0.02


@dataclass(frozen=True)
class CLIResult:
    """What one CLI run printed, its exit code, and its peak resident memory in bytes."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss: int

    @property
    def error_lines(self) -> list[str]:
        """The ``error: ...`` lines of stderr (the CLI prints exactly one on failure)."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    def one_error(self) -> str:
        """The single ``error:`` line; fails the test if there is not exactly one, or a traceback."""
        assert "Traceback" not in self.stderr, self.stderr
        lines = self.error_lines
        assert len(lines) == 1, self.stderr
        return lines[0]


def _rss(proc: psutil.Process) -> int:
    """Resident bytes of ``proc`` and all its children (sender processes, a managed server)."""
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue  # it ended between the listing and the reading
    return total


def cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without any MoE Bench setting or API key, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MOEBENCH_") and k not in ("OPENAI_API_KEY", "HF_TOKEN")
    }
    env["MOEBENCH_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


def bench(*args: str, data_dir: Path, env: dict[str, str] | None = None) -> CLIResult:
    """Run ``python -m bench ARGS`` in the project root; ``env`` adds variables to :func:`cli_env`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        env=cli_env(data_dir, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watched = psutil.Process(proc.pid)
    peak, waited = 0, 0.0
    while True:
        peak = max(peak, _rss(watched))
        try:
            out, err = proc.communicate(timeout=_SAMPLE_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            waited += _SAMPLE_EVERY_S
            if waited > HANG_GUARD_S:
                proc.kill()  # our own child, by its handle
                out, err = proc.communicate()
                raise AssertionError(f"the CLI hung (killed after {HANG_GUARD_S:g} s); stderr: {err[-2000:]}") from None
    return CLIResult(proc.returncode, out, err, peak)


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    """A prompt file with one ``{"prompt": ...}`` line per prompt."""
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return path

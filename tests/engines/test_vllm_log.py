"""What a launched vLLM server's log says about the measured window (engines.vllm.VLLMEngine
.window_warning), read from a real vLLM 0.25.0 log of an H100 run (tests/data/vllm)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from engines.vllm import VLLMEngine, VLLMOptions

LOG = Path(__file__).resolve().parents[1] / "data" / "vllm" / "h100-0.25.0-serve.log"


def _engine(log: Path) -> VLLMEngine:
    engine = VLLMEngine(VLLMOptions(model="tiny"))
    engine.server = SimpleNamespace(log_path=str(log))  # type: ignore[assignment]
    return engine


def test_a_kernel_compiled_in_the_measured_window_is_named(tmp_path: Path) -> None:
    lines = LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "during inference: fused_moe_kernel" in line)
    log = tmp_path / "server.log"
    log.write_text("".join(lines[:cut]), encoding="utf-8")  # the server's start and its own warm-up
    engine = _engine(log)
    engine.begin_window()
    assert engine.window_warning() is None  # "JIT monitor activated ... during inference will use" is no compile
    with log.open("a", encoding="utf-8") as f:
        f.write("".join(lines[cut:]))  # the measured window
    warning = engine.window_warning()
    assert warning is not None and "fused_moe_kernel" in warning and "--warmup" in warning


def test_a_compile_before_the_window_is_not_the_runs(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG.read_text(encoding="utf-8"), encoding="utf-8")  # compiled in the warm-up
    engine = _engine(log)
    engine.begin_window()
    with log.open("a", encoding="utf-8") as f:
        f.write("(APIServer pid=1) INFO 12-08 00:21:04 [loggers.py:259] Engine 000: Avg prompt throughput: 1.0\n")
    assert engine.window_warning() is None


def test_no_launched_server_no_warning() -> None:
    engine = VLLMEngine(VLLMOptions(model="tiny", base_url="http://127.0.0.1:9/v1"))
    engine.begin_window()
    assert engine.window_warning() is None

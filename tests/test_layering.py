"""engines/ and bench/ never import streamlit (CONVENTIONS rule 1)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_streamlit_import_in_engines_or_bench_source() -> None:
    offenders = []
    files = [*ROOT.joinpath("engines").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]
    assert len(files) > 8
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "streamlit" or n.startswith(("streamlit.", "dashboard")) for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_importing_the_core_loads_neither_streamlit_nor_heavy_engines() -> None:
    code = (
        "import sys, bench.cli, bench.runner, bench.store, engines.base, engines.native, engines.accelerators;"
        "from engines.base import list_engines; list_engines();"
        "print(sorted(m for m in ('streamlit','vllm','torch_npu','torch_mlu','tritonclient','lmdeploy') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""The house rules of the import graph (CONVENTIONS rules 1, 19 and 20), checked on the code itself.

- ``engines/`` and ``bench/`` never import streamlit; only ``dashboard/`` does.
- Floors: ``engines`` < ``bench`` < ``dashboard`` < ``studies``; a floor imports only floors below it,
  and nothing in the product imports ``studies`` or ``tests``.
- Wings of ``bench``, bottom to top (:data:`BENCH_WINGS`): a wing imports only wings below it.
- No import cycle anywhere in ``engines``, ``bench``, ``dashboard`` or ``studies`` (lazy imports inside
  functions count: an import moved into a function to dodge a cycle is still a cycle).
- No module imports another module's ``_private`` name (tests included, for names of the product
  and the studies): what two modules share is public API of the lower one.

Each guard is a pure function over a tree of files; the ``planted`` tests show each one fails on
a tree with the violation it looks for.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engines", "bench", "dashboard", "studies")
FLOORS = ("engines", "bench", "dashboard", "studies")  # bottom to top
# The wings of bench/, bottom to top: a module imports only modules of its own wing or below.
BENCH_WINGS = (
    "bench.metrics",
    "bench.trace",
    "bench.peers",
    "bench.workloads",
    "bench.config",
    "bench.store",
    "bench.bundle",
    "bench.stub_server",
    "bench.send",
    "bench.run",
    "bench.sweep",
    "bench.analysis",
    "bench.report",
    "bench.cli",
    "bench.__main__",
)

Graph = dict[str, set[str]]


def module_files(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Module name -> file for every .py under the packages (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path) -> Iterable[tuple[str, list[str]]]:
    """(module, names) of every absolute import in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """Module -> the project modules it imports (``from pkg import mod`` points at ``pkg.mod``)."""
    mods = module_files(root, packages)
    graph: Graph = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, names in _imports(path):
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            if (target in mods and len(hits) < len(names)) or (not names and target in mods):
                hits.append(target)
            graph[mod].update(h for h in hits if h != mod)
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _rank(module: str, order: tuple[str, ...]) -> int | None:
    """The position of the longest prefix of ``module`` in ``order`` (None: not in any)."""
    best = None
    for i, prefix in enumerate(order):
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(order[best])):
            best = i
    return best


def upward_imports(graph: Graph, order: tuple[str, ...]) -> list[str]:
    """Arrows from a layer of ``order`` (bottom to top) to a layer above it; modules outside ``order``
    are not judged."""
    bad = []
    for src, targets in sorted(graph.items()):
        a = _rank(src, order)
        for dst in sorted(targets):
            b = _rank(dst, order)
            if a is not None and b is not None and b > a:
                bad.append(f"{src} -> {dst} ({order[a]} imports {order[b]}, above it)")
    return bad


def private_imports(root: Path, files: Iterable[Path], packages: Iterable[str] = PACKAGES) -> list[str]:
    """``from project.module import _name`` anywhere in ``files`` (the name another module keeps to itself)."""
    roots = tuple(packages)
    bad = []
    for path in files:
        for target, names in _imports(path):
            if target.split(".")[0] not in roots:
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(root)}: from {target} import {n}")
    return sorted(bad)


def streamlit_imports(root: Path) -> list[str]:
    """Files of engines/ and bench/ that import streamlit or the dashboard."""
    offenders = []
    for pkg in ("engines", "bench"):
        for path in (root / pkg).rglob("*.py"):
            for target, _ in _imports(path):
                if target == "streamlit" or target.startswith(("streamlit.", "dashboard")):
                    offenders.append(str(path.relative_to(root)))
    return sorted(offenders)


# --- the repository --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    g = import_graph(ROOT)
    assert len(g) > 60 and "bench.run.manager" in g and "bench.metrics.summary" in g
    return g


def test_no_streamlit_import_in_engines_or_bench_source() -> None:
    assert len(list(ROOT.joinpath("bench").rglob("*.py"))) > 8
    assert streamlit_imports(ROOT) == []


def test_no_import_cycle_anywhere(graph: Graph) -> None:
    assert find_cycles(graph) == []


def test_floors_import_only_floors_below(graph: Graph) -> None:
    assert upward_imports(graph, FLOORS) == []


def test_bench_wings_import_only_wings_below(graph: Graph) -> None:
    modules = [m for m in graph if m.startswith("bench.")]
    unplaced = [m for m in modules if _rank(m, BENCH_WINGS) is None]
    assert unplaced == [], "every bench module belongs to a wing of BENCH_WINGS"
    assert upward_imports(graph, BENCH_WINGS) == []


def test_no_module_imports_another_modules_private_name() -> None:
    files = [*module_files(ROOT).values(), *ROOT.joinpath("tests").rglob("*.py")]
    assert private_imports(ROOT, files) == []


def test_importing_the_core_loads_neither_streamlit_nor_heavy_engines() -> None:
    code = (
        "import sys, bench.cli.main, bench.run.manager, bench.store;"
        "import engines.base, engines.native, engines.accelerators;"
        "from engines.base import list_engines; list_engines();"
        "print(sorted(m for m in ('streamlit','vllm','torch_npu','torch_mlu','tritonclient','lmdeploy') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- each guard fails on a planted violation ------------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_planted_cycle_is_found_even_through_a_lazy_import(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/a.py": "from bench.b import g\n",
            "bench/b.py": "def g():\n    from bench import a\n",
            "bench/c.py": "from bench.a import g\n",
        },
    )
    assert find_cycles(import_graph(root, ("bench",))) == [["bench.a", "bench.b"]]


def test_planted_upward_import_between_wings_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/metrics/__init__.py": "",
            "bench/metrics/summary.py": "from bench.run.job import Job\n",
            "bench/run/__init__.py": "",
            "bench/run/job.py": "from bench.metrics.summary import x\n",
            "bench/cli/__init__.py": "",
            "bench/cli/main.py": "from bench.run import job\n",
        },
    )
    found = upward_imports(import_graph(root, ("bench",)), BENCH_WINGS)
    assert found == ["bench.metrics.summary -> bench.run.job (bench.metrics imports bench.run, above it)"]


def test_planted_floor_violation_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "engines/__init__.py": "",
            "engines/base.py": "import bench.store\n",
            "bench/__init__.py": "",
            "bench/store/__init__.py": "from studies import tool\n",
            "studies/__init__.py": "",
            "studies/tool.py": "from bench.store import Store\n",
        },
    )
    found = upward_imports(import_graph(root, ("engines", "bench", "studies")), FLOORS)
    assert found == [
        "bench.store -> studies.tool (bench imports studies, above it)",
        "engines.base -> bench.store (engines imports bench, above it)",
    ]


def test_planted_private_import_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/a.py": "def _helper():\n    pass\n",
            "bench/b.py": "from __future__ import annotations\nfrom bench.a import _helper\nfrom os import _exit\n",
        },
    )
    files = list(module_files(root, ("bench",)).values())
    assert private_imports(root, files) == ["bench/b.py: from bench.a import _helper"]


def test_planted_streamlit_import_is_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {"engines/x.py": "import streamlit as st\n", "bench/y.py": "from dashboard import ui\n"})
    assert streamlit_imports(root) == ["bench/y.py", "engines/x.py"]

"""Dashboard render benchmark: time to build the Results page's and the live fragment's charts
for runs of 1k, 10k and 100k requests (synthetic requests written through the real store).

Not a test; it prints a table. The measuring code is :mod:`dashboard.render_benchmark`,
next to the code it measures: ``bench`` never imports ``dashboard`` (the UI is the layer
above; tests/test_layering.py), so this entry point runs it in a child process.

Usage: ``python -m bench.benchmarks.dashboard_render [--sizes 1000 10000 100000] [--repeat 3]``
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dashboard.render_benchmark`` with the same arguments; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    return subprocess.call([sys.executable, "-m", "dashboard.render_benchmark", *args], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())

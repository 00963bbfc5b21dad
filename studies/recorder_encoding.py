"""What storing chunk times compactly buys the recorder: the same finished requests through the
real recorder and store, chunk times written as the JSON list of seconds MoE Bench stored until
2026-12-07 (A) and as packed microseconds (B, :func:`bench.store.pack_times`), ABBA over rounds.

Prints requests/s per round and the B/A ratio of each AB pair. Not a test. Usage::

    python -m studies.recorder_encoding [--requests 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import bench.store as store_module
from bench.store import Store
from studies.dashboard_render import recorder_rate

PACKED = store_module.pack_times


def as_json(start_s: float, times: Sequence[float]) -> str:  # the old encoding
    return json.dumps([round(t, 6) for t in times])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.recorder_encoding", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    rates: dict[str, list[float]] = {"json": [], "packed": []}
    with tempfile.TemporaryDirectory(prefix="moebench-rec-") as tmp:
        store = Store(Path(tmp) / "rec.sqlite")
        for r in range(a.rounds):
            for kind in ("json", "packed", "packed", "json"):
                store_module.pack_times = as_json if kind == "json" else PACKED  # type: ignore[assignment]
                try:
                    rates[kind].append(recorder_rate(store, a.requests, seed=r))
                finally:
                    store_module.pack_times = PACKED
                print(f"round {r + 1} {kind:6s} {rates[kind][-1]:>9,.0f} req/s", flush=True)
        store.close()
    pairs = [b / j for j, b in zip(rates["json"], rates["packed"], strict=True)]
    print(
        f"\njson   median {statistics.median(rates['json']):,.0f} req/s (range {min(rates['json']):,.0f}-"
        f"{max(rates['json']):,.0f})\npacked median {statistics.median(rates['packed']):,.0f} req/s (range "
        f"{min(rates['packed']):,.0f}-{max(rates['packed']):,.0f})\npacked/json per pair: "
        + ", ".join(f"{x:.2f}" for x in pairs)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

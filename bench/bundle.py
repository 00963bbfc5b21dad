"""Bundle files: one run as JSON (``moebench-run/1``: its config, summary, records, series and
artifacts), written by ``python -m bench export RUN --bundle`` and read back here, with a profile
trace kept beside it (``NAME.trace.json[.gz]``); or a sweep with its runs (``moebench-sweep/1``,
``python -m bench export SWEEP --sweep --bundle``). Other tools' result files (``vllm bench serve``,
AIPerf, guidellm: :mod:`bench.peers`) are read as run bundles too, so ``bench import`` and the
dashboard take them as they take ours."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.peers import PEER_TOOLS, peer_bundle
from bench.store import Store
from engines.errors import MoEBenchError

RUN_FORMAT = "moebench-run/1"
BUNDLE_MAX_BYTES = 512 * 2**20  # a bundle file larger than this is refused before it is read
SWEEP_FORMAT = "moebench-sweep/1"


def read_bundle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A bundle file's JSON document (a run's or a sweep's; another tool's result file comes back
    as the run bundle :func:`bench.peers.peer_bundle` makes of it), or one line saying why not."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > BUNDLE_MAX_BYTES:
            cap = BUNDLE_MAX_BYTES >> 20
            raise MoEBenchError(f"cannot read bundle {path}: {size / 2**20:,.0f} MiB, over the {cap} MiB allowed")
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MoEBenchError(f"cannot read bundle {path}: {exc}") from exc
    except RecursionError as exc:
        raise MoEBenchError(f"cannot read bundle {path}: JSON nested too deeply") from exc
    if isinstance(bundle, dict) and bundle.get("format") in (RUN_FORMAT, SWEEP_FORMAT):
        return bundle
    peer = peer_bundle(bundle, path, BUNDLE_MAX_BYTES)
    if peer is None:
        raise MoEBenchError(
            f"{path.name} is not a MoE Bench bundle (format {RUN_FORMAT} or {SWEEP_FORMAT}) nor a result file of "
            f"{PEER_TOOLS}"
        )
    return peer


def bundle_name(bundle: dict[str, Any]) -> str:
    """The name of the run or sweep a bundle holds ('' when it has none)."""
    inner = bundle.get("sweep" if bundle.get("format") == SWEEP_FORMAT else "run")
    return str(inner.get("name") or "") if isinstance(inner, dict) else ""


def import_file(store: Store, path: str | os.PathLike[str]) -> tuple[str, int]:
    """Import a run or a sweep bundle: ("run", run id) or ("sweep", sweep id)."""
    bundle = read_bundle(path)
    if bundle["format"] == SWEEP_FORMAT:
        return "sweep", store.import_sweep_bundle(bundle)
    return "run", import_bundle_file(store, path, bundle)


def import_bundle_file(store: Store, path: str | os.PathLike[str], bundle: dict[str, Any] | None = None) -> int:
    """Import a run bundle file; a trace beside it (``NAME.trace.json[.gz]``) becomes the run's trace."""
    path = Path(path)
    if bundle is None:
        bundle = read_bundle(path)
    if bundle.get("format") != RUN_FORMAT:
        raise MoEBenchError(f"{path.name} is not a MoE Bench run bundle (format moebench-run/1)")
    if not isinstance(bundle.get("artifacts", {}), dict):
        raise MoEBenchError("run bundle: 'artifacts' must be an object")
    run_id = store.import_bundle(bundle)  # drops any trace path the bundle names
    for suffix in (".trace.json.gz", ".trace.json"):
        trace = path.with_name(path.name.removesuffix(".json") + suffix)
        if trace.is_file():
            store.adopt_trace(run_id, trace)  # copied into the store's traces folder
            break
    return run_id

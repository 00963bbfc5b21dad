"""Run bundle files: one run as JSON (``moebench-run/1``: its config, summary, records, series and
artifacts), written by ``python -m bench export RUN --bundle`` and read back here, with a profile
trace kept beside it (``NAME.trace.json[.gz]``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.store import Store
from engines.errors import MoEBenchError


def import_bundle_file(store: Store, path: str | os.PathLike[str]) -> int:
    """Import a bundle file; a trace beside it (``NAME.trace.json[.gz]``) becomes the run's trace."""
    path = Path(path)
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MoEBenchError(f"cannot read run bundle {path}: {exc}") from exc
    except RecursionError as exc:
        raise MoEBenchError(f"cannot read run bundle {path}: JSON nested too deeply") from exc
    if not isinstance(bundle, dict) or bundle.get("format") != "moebench-run/1":
        raise MoEBenchError(f"{path.name} is not a MoE Bench run bundle (format moebench-run/1)")
    if not isinstance(bundle.get("artifacts", {}), dict):
        raise MoEBenchError("run bundle: 'artifacts' must be an object")
    for suffix in (".trace.json.gz", ".trace.json"):
        trace = path.with_name(path.name.removesuffix(".json") + suffix)
        if trace.exists():
            bundle.setdefault("artifacts", {})["profile_trace"] = {"path": str(trace.resolve())}
            break
    else:
        old = bundle.get("artifacts", {}).get("profile_trace")
        if old and not Path(old.get("path", "")).exists():
            bundle["artifacts"].pop("profile_trace")  # recorded on another machine; not here
    return store.import_bundle(bundle)

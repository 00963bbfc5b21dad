"""Bundle files: one run as JSON (``moebench-run/1``: its config, summary, records, series and
artifacts), written by ``python -m bench export RUN --bundle`` and read back here, with a profile
trace kept beside it (``NAME.trace.json[.gz]``); or a sweep with its runs (``moebench-sweep/1``,
``python -m bench export SWEEP --sweep --bundle``). Other tools' result files (``vllm bench serve``,
AIPerf, guidellm: :mod:`bench.peers`) are read as run bundles too, so ``bench import`` and the
dashboard take them as they take ours.

An import is checked field by field against what the store writes (types, finite numbers, times
in a sane range, JSON columns parsed and shaped like the store's, the routing record's shape)
before anything is written: a bad field refuses the whole file with one line naming the field.
Then it is written in one SQLite transaction (a sweep with all its runs, or nothing), under a
content hash, so importing the same file again finds the run or sweep it made the first time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.config import RunConfig
from bench.metrics.summary import RunSummary
from bench.peers import PEER_TOOLS, peer_bundle, sglang_jsonl_bundle
from bench.store import Store
from bench.store.layout import ARTIFACT_ROUTING, ARTIFACT_TRACE, ROLLUP_UPSERT, STATUSES, SWEEP_STATUSES, rollup_rows
from engines.errors import MoEBenchError

RUN_FORMAT = "moebench-run/1"
SWEEP_FORMAT = "moebench-sweep/1"
BUNDLE_MAX_BYTES = 512 * 2**20  # a bundle file larger than this is refused; reading stops there
EPOCH_MAX = 4_102_444_800.0  # 2100-01-01: a run's or sweep's time past this is not a time
COUNT_MAX = 10**12  # a stored count (tokens, requests) above this is not one
REAL_MAX = 1e15  # a stored number (times in s or ms, series values) beyond +-this is not one
TEXT_FIELD_MAX = 10_000  # longest text column (name, model, error) an import keeps
ROUTING_MAX_CELLS = 10_000_000  # layers x experts of a routing record at most

_RUN_TEXT = ("mode", "engine", "model", "accelerator")  # required text columns of a run
_SAMPLE_REALS = ("start_s", "end_s", "e2e_ms")  # numbers
_SAMPLE_OPTIONAL_REALS = (  # numbers or null
    "ttft_ms", "tpot_ms", "itl_mean_ms", "ttft_any_ms", "send_lag_ms", "itl_token_mean_ms", "reasoning_ms",
)  # fmt: skip
_SAMPLE_OPTIONAL_COUNTS = ("usage_output_tokens", "reasoning_tokens", "answer_tokens", "usage_reasoning_tokens",
                           "reasoning_chunks")  # fmt: skip
_SAMPLE_COUNTS = ("seq", "prompt_tokens", "output_tokens")  # whole numbers >= 0
_NOT_IMPORTED = ("id", "pid", "pid_started", "host", "sweep_id", "content_hash")  # this store's own columns


# --- reading a file ------------------------------------------------------------------------------


def read_capped(path: Path, cap: int, what: str) -> bytes:
    """A regular file's bytes, at most ``cap`` of them (read with that hard limit, whatever its size
    says: a link to /dev/zero or a growing file stops there); a FIFO or device is refused unopened."""
    try:
        st = path.stat()
    except OSError as exc:
        raise MoEBenchError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise MoEBenchError(f"cannot read {what} {path}: not a regular file (a folder, a device or a pipe)")
    if st.st_size > cap:
        mib = st.st_size / 2**20
        raise MoEBenchError(f"cannot read {what} {path}: {mib:,.0f} MiB, over the {cap >> 20} MiB allowed")
    try:
        with path.open("rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped between the check and the open
                raise MoEBenchError(f"cannot read {what} {path}: not a regular file")
            data = fh.read(cap + 1)
    except OSError as exc:
        raise MoEBenchError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > cap:
        raise MoEBenchError(f"cannot read {what} {path}: over the {cap >> 20} MiB allowed")
    return data


def read_bundle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A bundle file's JSON document (a run's or a sweep's; another tool's result file comes back
    as the run bundle :func:`bench.peers.peer_bundle` makes of it), or one line saying why not."""
    path = Path(path)
    data = read_capped(path, BUNDLE_MAX_BYTES, "bundle")
    try:
        bundle = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        # SGLang's bench_serving appends a run a line: the last line's run, every line checked
        several = sglang_jsonl_bundle(data.decode("utf-8", "replace"), path) if isinstance(exc, ValueError) else None
        if several is not None:
            return several
        raise MoEBenchError(f"cannot read bundle {path}: {str(exc)[:120]}") from exc
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


def content_hash(bundle: dict[str, Any]) -> str:
    """The bundle's identity: SHA-256 of its canonical JSON (keys sorted), what a second import of
    the same file finds."""
    text = json.dumps(bundle, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- checking fields ------------------------------------------------------------------------------


def _finite(v: Any, low: float = -REAL_MAX, high: float = REAL_MAX) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= high


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= COUNT_MAX


def _shown(v: Any) -> str:
    return repr(str(v)[:40])


def _parsed(value: Any, where: str, kind: type | tuple[type, ...], what: str) -> Any:
    """A JSON text column parsed, holding a ``kind``; one line naming ``where`` if not."""
    if not isinstance(value, str):
        raise MoEBenchError(f"{where} is not JSON text ({what})")
    try:
        out = json.loads(value)
    except (ValueError, RecursionError):
        raise MoEBenchError(f"{where} is not JSON ({what})") from None
    if not isinstance(out, kind):
        raise MoEBenchError(f"{where} is not {what}")
    return out


def _check_time(v: Any, where: str, optional: bool = False) -> None:
    if v is None and optional:
        return
    if not _finite(v, 0.0, EPOCH_MAX):
        raise MoEBenchError(f"{where} is {_shown(v)}, not a time (seconds since 1970, before 2100)")


def _check_text(v: Any, where: str, optional: bool = False) -> None:
    if v is None and optional:
        return
    if not isinstance(v, str) or len(v) > TEXT_FIELD_MAX:
        raise MoEBenchError(f"{where} is not text of at most {TEXT_FIELD_MAX:,} characters")


def _check_scalars(v: Any, where: str, depth: int = 0) -> None:
    """JSON values as a stored config holds them: finite numbers, text, booleans, null, and lists or
    objects of those (a few levels deep)."""
    if v is None or isinstance(v, str | bool):
        return
    if isinstance(v, int | float):
        if not _finite(v, -1e300, 1e300):
            raise MoEBenchError(f"{where} holds {_shown(v)}, not a finite number")
        return
    if depth < 4 and isinstance(v, list):
        for i, x in enumerate(v):
            _check_scalars(x, f"{where}[{i}]", depth + 1)
        return
    if depth < 4 and isinstance(v, dict):
        for k, x in v.items():
            _check_scalars(x, f"{where}.{k}", depth + 1)
        return
    raise MoEBenchError(f"{where} is nested deeper than a stored config")


def _check_like(v: Any, like: Any, where: str) -> None:
    """``v`` has the JSON kind of ``like`` (a RunConfig default): an object, a list, text, a boolean
    or a number (null always fits: the store writes null for an unset option)."""
    if v is None or like is None:
        return
    kinds: list[tuple[type | tuple[type, ...], str]] = [
        (dict, "an object"), (list, "a list"), (str, "text"), (bool, "true or false"), ((int, float), "a number")
    ]  # fmt: skip
    for kind, name in kinds:
        if isinstance(like, kind):
            if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
                raise MoEBenchError(f"{where} is {_shown(v)}, not {name}")
            break
    if isinstance(like, dict):
        for k, x in v.items():
            if k in like:
                _check_like(x, like[k], f"{where}.{k}")


def check_run_config(cfg: dict[str, Any], where: str) -> None:
    """A stored run config: plain JSON values, and each field :class:`bench.config.RunConfig` knows
    of the kind RunConfig writes there (an object, a list, text, a number; a peer tool's own keys
    and fields RunConfig no longer knows are kept as they are)."""
    _check_scalars(cfg, where)
    like = RunConfig().model_dump()
    for k, v in cfg.items():
        if k in like:
            _check_like(v, like[k], f"{where}: {k}")


def check_sweep_point(point: Any, where: str) -> None:
    """A run's swept values: one value per axis (text, a finite number, a boolean or null) and its
    ``repeat``, a count."""
    if not isinstance(point, dict):
        raise MoEBenchError(f"{where} is not an object")
    for k, v in point.items():
        if k == "repeat":
            if not _is_count(v):
                raise MoEBenchError(f"{where}: repeat is {_shown(v)}, not a count")
        elif not (v is None or isinstance(v, str | bool) or _finite(v)):
            raise MoEBenchError(f"{where}: {str(k)[:40]} is {_shown(v)}, not one value of an axis")


def check_sweep_config(cfg: dict[str, Any], where: str) -> None:
    """A stored sweep or capacity config: ``base`` a run config, ``repeats`` a count, the rest
    plain values or lists of them."""
    base = cfg.get("base")
    if base is not None:
        if not isinstance(base, dict):
            raise MoEBenchError(f"{where}: base is not a run config (an object)")
        check_run_config(base, f"{where}: base")
    if cfg.get("repeats") is not None and not _is_count(cfg["repeats"]):
        raise MoEBenchError(f"{where}: repeats is {_shown(cfg['repeats'])}, not a count")
    if cfg.get("name") is not None:
        _check_text(cfg["name"], f"{where}: name")
    _check_scalars({k: v for k, v in cfg.items() if k != "base"}, where)


def summary_problem(text: Any) -> str | None:
    """Why a bundle's summary_json would not load as a summary, or None (null is fine)."""
    import dataclasses
    import typing

    try:
        data = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return "is not JSON"
    if data is None:
        return None
    try:
        summary = RunSummary.from_dict(data)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        return f"is not a run summary ({type(exc).__name__}: {str(exc)[:80]})"
    hints = typing.get_type_hints(RunSummary)
    for f in dataclasses.fields(summary):
        v, hint = getattr(summary, f.name), str(hints.get(f.name, ""))
        if dataclasses.is_dataclass(v):
            for g in dataclasses.fields(v):
                w = getattr(v, g.name)
                if w is not None and not _finite(w, -1e300, 1e300):
                    return f"has {f.name}.{g.name} {str(w)[:40]!r}, not a number"
        elif v is not None and ("float" in hint or "int" in hint) and "str" not in hint and "dict" not in hint:
            if not _finite(v, -1e300, 1e300) and not isinstance(v, tuple | list):
                return f"has {f.name} {str(v)[:40]!r}, not a number"
    return None


def sample_problem(x: dict[str, Any]) -> str | None:
    """Why a bundle's sample is not one (wrong types or values), or None."""
    for columns, ok, what in (
        ((*_SAMPLE_REALS, *_SAMPLE_OPTIONAL_REALS), _finite, "a number"),
        (_SAMPLE_COUNTS, _is_count, "a count"),
    ):
        for c in columns:
            optional = c in _SAMPLE_OPTIONAL_REALS
            if c in x and not (optional and x[c] is None) and not ok(x[c]):
                return f"has {c} {str(x[c])[:40]!r}, not {what}"
    for c in _SAMPLE_OPTIONAL_COUNTS:
        if x.get(c) is not None and not _is_count(x[c]):
            return f"has a {c} that is not a count"
    tokens = x.get("chunk_tokens_json")
    if tokens is not None:
        try:
            parsed = json.loads(tokens) if isinstance(tokens, str) else None
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, list) or not all(_is_count(n) for n in parsed):
            return "has chunk_tokens_json that is not a JSON list of counts"
    if not isinstance(x["request_id"], str) or not isinstance(x.get("error", ""), str):
        return "has a request_id or error that is not text"
    chunks = x.get("chunk_times_json", "[]")
    if not isinstance(chunks, str):
        return "has chunk_times_json that is not JSON text"
    try:
        times = json.loads(chunks)
    except (ValueError, RecursionError):
        return "has chunk_times_json that is not JSON"
    if not isinstance(times, list) or not all(_finite(t) for t in times):
        return "has chunk_times_json that is not a list of numbers"
    return None


def routing_problem(r: Any) -> str | None:
    """Why an ``expert_routing`` artifact is not shaped like the one the store writes, or None:
    ``counts[layer][expert]`` finite counts >= 0 of one width, ``num_experts`` that width, ``top_k``
    and ``n_group`` whole numbers >= 1 (``n_group`` dividing the experts), ``layers`` one label per
    row, and the per-layer lists (``tokens``, ``imbalance``, ``group_counts``) one entry per row."""
    if not isinstance(r, dict):
        return "is not an object"
    counts = r.get("counts")
    if not isinstance(counts, list) or not counts or not all(isinstance(row, list) for row in counts):
        return "has counts that are not a list of rows [layer][expert]"
    width = len(counts[0])
    if width == 0 or any(len(row) != width for row in counts) or len(counts) * width > ROUTING_MAX_CELLS:
        return f"has counts whose rows are not all {width} experts wide (or over {ROUTING_MAX_CELLS:,} cells)"
    if not all(_finite(v, 0.0) for row in counts for v in row):
        return "has counts that are not finite numbers >= 0"
    for key in ("num_experts", "top_k", "n_group"):
        v = r.get(key)
        if v is not None and not (_is_count(v) and v >= 1):
            return f"has {key} {_shown(v)}, not a whole number >= 1"
    if r.get("num_experts") is not None and r["num_experts"] != width:
        return f"has num_experts {r['num_experts']} for rows of {width} experts"
    if r.get("n_group") is not None and width % r["n_group"]:
        return f"has n_group {r['n_group']}, which does not divide its {width} experts"
    layers = r.get("layers")
    if layers is not None and (
        not isinstance(layers, list) or len(layers) != len(counts) or not all(isinstance(x, str) for x in layers)
    ):
        return f"has layers that are not {len(counts)} labels (one per row of counts)"
    for key in ("tokens", "imbalance", "group_counts"):
        v = r.get(key)
        if v is None:
            continue
        if not isinstance(v, list) or len(v) != len(counts):
            return f"has {key} that is not a list of {len(counts)} entries (one per layer)"
        flat = [y for x in v for y in (x if isinstance(x, list) else [x])]
        if not all(y is None or _finite(y, 0.0) for y in flat):
            return f"has {key} that are not finite numbers >= 0"
    return None


@dataclass(frozen=True)
class CheckedRun:
    """A run bundle's rows, checked and ready to write."""

    run: dict[str, Any]
    samples: list[dict[str, Any]]
    series: list[tuple[float, str, float | None]]
    artifacts: dict[str, Any]


def check_run(bundle: Any, run_cols: list[str], sample_cols: list[str], where: str = "run bundle") -> CheckedRun:
    """A run bundle checked against the store's columns and what it writes in them; one
    :class:`MoEBenchError` line naming the first bad field."""
    if not isinstance(bundle, dict) or bundle.get("format") != RUN_FORMAT:
        raise MoEBenchError(f"{where}: not a MoE Bench run bundle (format {RUN_FORMAT})")
    if not isinstance(bundle.get("run"), dict):
        raise MoEBenchError(f"{where}: 'run' must be an object")
    # Columns come from this file's own tables, never from the bundle's keys.
    run = {c: bundle["run"][c] for c in run_cols if c in bundle["run"] and c not in _NOT_IMPORTED}
    missing = [c for c in ("created_at", "status", *_RUN_TEXT, "config_json") if run.get(c) is None]
    if missing:
        raise MoEBenchError(f"{where}: the run lacks {', '.join(missing)}")
    if run.get("status") == "running":
        run["status"] = "interrupted"
    if run["status"] not in STATUSES:
        raise MoEBenchError(f"{where}: the run's status {_shown(run['status'])} is not one of {', '.join(STATUSES)}")
    for c in _RUN_TEXT:
        _check_text(run[c], f"{where}: the run's {c}")
    _check_text(run.get("name", ""), f"{where}: the run's name")
    _check_text(run.get("error"), f"{where}: the run's error", optional=True)
    _check_time(run["created_at"], f"{where}: the run's created_at")
    _check_time(run.get("finished_at"), f"{where}: the run's finished_at", optional=True)
    if run.get("concurrency") is not None and not _is_count(run["concurrency"]):
        raise MoEBenchError(f"{where}: the run's concurrency {_shown(run['concurrency'])} is not a whole number")
    cfg = _parsed(run["config_json"], f"{where}: the run's config_json", dict, "a JSON object")
    check_run_config(cfg, f"{where}: the run's config_json")
    if run.get("engine_json") is not None:
        _check_scalars(_parsed(run["engine_json"], f"{where}: the run's engine_json", dict, "a JSON object"),
                       f"{where}: the run's engine_json")  # fmt: skip
    if run.get("sweep_point") is not None:
        point = _parsed(run["sweep_point"], f"{where}: the run's sweep_point", dict, "a JSON object")
        check_sweep_point(point, f"{where}: the run's sweep_point")
    if run.get("summary_json") is not None:
        why = summary_problem(run["summary_json"])
        if why:
            raise MoEBenchError(f"{where}: the run's summary_json {why}")
    samples, series = bundle.get("samples", []), bundle.get("timeseries", [])
    artifacts = bundle.get("artifacts", {})
    if not isinstance(samples, list) or not isinstance(series, list) or not isinstance(artifacts, dict):
        raise MoEBenchError(f"{where}: 'samples' and 'timeseries' must be lists, 'artifacts' an object")
    # A path from a bundle is never kept: a trace beside the bundle file is copied in
    # (import_bundle_file); a path would let a bundle name any local file.
    artifacts = {k: v for k, v in artifacts.items() if k != ARTIFACT_TRACE}
    for name in artifacts:
        _check_text(name, f"{where}: an artifact's name")
    if ARTIFACT_ROUTING in artifacts and artifacts[ARTIFACT_ROUTING] is not None:
        why = routing_problem(artifacts[ARTIFACT_ROUTING])
        if why:
            raise MoEBenchError(f"{where}: the artifact {ARTIFACT_ROUTING} {why}")
    for n, row in enumerate(series):
        if (
            not isinstance(row, list | tuple)
            or len(row) != 3
            or not _finite(row[0])
            or not isinstance(row[1], str)
            or len(row[1]) > 200
            or (row[2] is not None and not _finite(row[2]))
        ):
            raise MoEBenchError(f"{where}: 'timeseries' row {n} is not [t, name, value] (numbers, a name)")
    out_samples = []
    for n, x in enumerate(samples):
        if not isinstance(x, dict) or any(x.get(c) is None for c in ("seq", "request_id", "start_s")):
            raise MoEBenchError(f"{where}: sample {n} is not a sample (seq, request_id, start_s, ...)")
        why = sample_problem(x)
        if why:
            raise MoEBenchError(f"{where}: sample {n} {why}")
        out_samples.append({c: x[c] for c in sample_cols if c in x})
    run["summary_json"] = with_moe_figures(run.get("summary_json"), artifacts)
    return CheckedRun(run, out_samples, [(t, n, v) for t, n, v in series], artifacts)


def check_sweep(bundle: Any, run_cols: list[str], sample_cols: list[str]) -> tuple[dict[str, Any], list[CheckedRun]]:
    """A sweep bundle checked: the sweep's row and each run's (one line naming the bad field)."""
    if not isinstance(bundle, dict) or bundle.get("format") != SWEEP_FORMAT:
        raise MoEBenchError(f"not a MoE Bench sweep bundle (format {SWEEP_FORMAT})")
    sweep, runs = bundle.get("sweep"), bundle.get("runs")
    if not isinstance(sweep, dict) or not isinstance(runs, list):
        raise MoEBenchError("sweep bundle: 'sweep' must be an object and 'runs' a list")
    row = {c: sweep.get(c) for c in ("kind", "name", "created_at", "finished_at", "status", "config_json",
                                     "result_json", "error")}  # fmt: skip
    if row["kind"] not in ("sweep", "capacity"):
        raise MoEBenchError(f"sweep bundle: the sweep's kind {_shown(row['kind'])} is not sweep or capacity")
    _check_time(row["created_at"], "sweep bundle: the sweep's created_at")
    _check_time(row["finished_at"], "sweep bundle: the sweep's finished_at", optional=True)
    cfg = _parsed(row["config_json"], "sweep bundle: the sweep's config_json", dict, "a JSON object")
    check_sweep_config(cfg, "sweep bundle: the sweep's config_json")
    row["result_json"] = row["result_json"] or "{}"
    result = _parsed(row["result_json"], "sweep bundle: the sweep's result_json", dict, "a JSON object")
    _check_scalars(result, "sweep bundle: the sweep's result_json")
    if row["status"] == "running":
        row["status"] = "interrupted"
    if row["status"] not in SWEEP_STATUSES:
        raise MoEBenchError(f"sweep bundle: the sweep's status {_shown(row['status'])} is not a sweep's")
    row["name"] = row["name"] or ""
    _check_text(row["name"], "sweep bundle: the sweep's name")
    _check_text(row["error"], "sweep bundle: the sweep's error", optional=True)
    checked = [check_run(r, run_cols, sample_cols, f"sweep bundle: run {i}") for i, r in enumerate(runs)]
    return row, checked


def with_moe_figures(summary_json: Any, artifacts: Any) -> Any:
    """A bundle's summary with the MoE figures (:func:`bench.metrics.moe.run_figures`) filled in
    from its routing record when a run from before them lacks them; otherwise as it was."""
    if not isinstance(summary_json, str) or not isinstance(artifacts, dict):
        return summary_json
    routing = artifacts.get(ARTIFACT_ROUTING)
    summary = json.loads(summary_json)
    if not isinstance(routing, dict) or not isinstance(summary, dict) or "moe_imbalance_max" in summary:
        return summary_json
    from bench.metrics.moe import run_figures

    return json.dumps({**summary, **run_figures(routing)})


# --- writing ---------------------------------------------------------------------------------------


_DEVICE_KINDS = ("cuda", "npu", "mlu")


def device_from_telemetry(engine_json: Any, artifacts: dict[str, Any]) -> Any:
    """A run's engine description with its device named from its own device telemetry, where it
    recorded only the accelerator kind (a server MoE Bench launched on CUDA before 2026-12-08 said
    ``cuda``; its NVML telemetry named the card): ``NVIDIA H100 80GB HBM3``, and where the name came
    from. Anything else is returned as it is."""
    try:
        info = json.loads(engine_json) if isinstance(engine_json, str) else None
    except ValueError:
        return engine_json
    devices = (artifacts.get("device_telemetry") or {}).get("devices") if isinstance(artifacts, dict) else None
    if not isinstance(info, dict) or info.get("device") not in _DEVICE_KINDS or not isinstance(devices, list):
        return engine_json
    first = devices[0] if devices and isinstance(devices[0], str) else ""
    name = first.split(": ", 1)[-1].rsplit(" (", 1)[0].strip()  # "dev0: NVIDIA H100 80GB HBM3 (nvml)"
    if not name:
        return engine_json
    return json.dumps({**info, "device": name, "device_named_by": "the run's device telemetry (on import)"})


def _insert_run(conn: Any, checked: CheckedRun, sweep_id: int | None = None, digest: str | None = None) -> int:
    run = {**checked.run, **({"sweep_id": sweep_id} if sweep_id is not None else {}),
           **({"content_hash": digest} if digest else {})}  # fmt: skip
    if "engine_json" in run:
        run["engine_json"] = device_from_telemetry(run["engine_json"], checked.artifacts)
    cols = list(run)
    cur = conn.execute(
        f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [run[c] for c in cols]
    )
    run_id = int(cur.lastrowid or 0)
    for x in checked.samples:
        keys = list(x)
        conn.execute(
            f"INSERT INTO samples (run_id, {', '.join(keys)}) VALUES (?, {', '.join('?' * len(keys))})",
            [run_id, *(x[c] for c in keys)],
        )
    conn.executemany("INSERT INTO timeseries VALUES (?,?,?,?)", [(run_id, t, n, v) for t, n, v in checked.series])
    conn.executemany(ROLLUP_UPSERT, rollup_rows(run_id, checked.series))
    conn.execute(
        "INSERT OR REPLACE INTO sample_counts VALUES (?, (SELECT COUNT(*) FROM samples WHERE run_id=?))",
        (run_id, run_id),
    )
    for name, content in checked.artifacts.items():
        conn.execute("INSERT INTO artifacts VALUES (?,?,?)", (run_id, name, json.dumps(content)))
    return run_id


def _columns(store: Store) -> tuple[list[str], list[str]]:
    return store.columns("runs"), [c for c in store.columns("samples") if c != "run_id"]


def import_run(store: Store, bundle: dict[str, Any], digest: str | None = None) -> int:
    """Add a run from :meth:`Store.export_bundle`'s document (checked first, written in one
    transaction); returns its new id. ``digest`` is kept as its content hash."""
    checked = check_run(bundle, *_columns(store))
    with store.transaction() as conn:
        return _insert_run(conn, checked, digest=digest)


def import_sweep(store: Store, bundle: dict[str, Any], digest: str | None = None) -> int:
    """Add a sweep and its runs from :meth:`Store.export_sweep_bundle`'s document: all checked
    first, then written in one transaction (a kill mid-way leaves nothing); the sweep's new id."""
    row, runs = check_sweep(bundle, *_columns(store))
    if digest:
        row["content_hash"] = digest
    cols = list(row)
    with store.transaction() as conn:
        cur = conn.execute(
            f"INSERT INTO sweeps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [row[c] for c in cols]
        )
        sweep_id = int(cur.lastrowid or 0)
        for checked in runs:
            _insert_run(conn, checked, sweep_id=sweep_id)
    return sweep_id


@dataclass(frozen=True)
class Imported:
    """What an import made: ``kind`` ("run" or "sweep"), its id, and whether the same content was
    already in the store (``new`` False: nothing was written, ``id`` is the earlier import's)."""

    kind: str
    id: int
    new: bool = True


def _iter_trace_beside(path: Path) -> Iterator[Path]:
    for suffix in (".trace.json.gz", ".trace.json"):
        yield path.with_name(path.name.removesuffix(".json") + suffix)


def import_path(store: Store, path: str | os.PathLike[str], bundle: dict[str, Any] | None = None) -> Imported:
    """Import a run or sweep bundle file (or another tool's result file) once: a file whose content
    was imported before gives back that run or sweep."""
    path = Path(path)
    if bundle is None:
        bundle = read_bundle(path)
    digest = content_hash(bundle)
    kind = "sweep" if bundle.get("format") == SWEEP_FORMAT else "run"
    earlier = store.find_imported(kind, digest)
    if earlier is not None:
        return Imported(kind, earlier, new=False)
    if kind == "sweep":
        return Imported(kind, import_sweep(store, bundle, digest))
    if bundle.get("format") != RUN_FORMAT:
        raise MoEBenchError(f"{path.name} is not a MoE Bench run bundle (format {RUN_FORMAT})")
    run_id = import_run(store, bundle, digest)  # drops any trace path the bundle names
    for trace in _iter_trace_beside(path):
        if trace.is_file():
            store.adopt_trace(run_id, trace)  # copied into the store's traces folder
            break
    return Imported(kind, run_id)


def import_file(store: Store, path: str | os.PathLike[str]) -> tuple[str, int]:
    """Import a run or a sweep bundle: ("run", run id) or ("sweep", sweep id) (the earlier one's
    when the same content was imported before)."""
    done = import_path(store, path)
    return done.kind, done.id


def import_bundle_file(store: Store, path: str | os.PathLike[str], bundle: dict[str, Any] | None = None) -> int:
    """Import a run bundle file; a trace beside it (``NAME.trace.json[.gz]``) becomes the run's trace."""
    path = Path(path)
    if bundle is None:
        bundle = read_bundle(path)
    if bundle.get("format") != RUN_FORMAT:
        raise MoEBenchError(f"{path.name} is not a MoE Bench run bundle (format {RUN_FORMAT})")
    return import_path(store, path, bundle).id

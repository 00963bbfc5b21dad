"""Operator profiling of an in-process model: torch.profiler sessions, scopes, breakdown.

A session profiles every thread (the native engine generates in worker threads) with
CPU plus the accelerator's activities, ``record_shapes``, ``profile_memory`` and
``with_stack`` (seed 8.1.1 ``profile_inference``). While it runs, forward hooks wrap
the model's modules in named ``record_function`` scopes (``moe_bench::<category>``),
so the time of generic ops such as ``aten::mm`` can be attributed to attention,
routing, routed experts, ... (seed 8.1.2's bottlenecks).

The classification lives in one table, :data:`CATEGORY_RULES`:

- a *module* rule puts a module's whole forward (its ops and kernels) in a category;
- an *op* rule moves matching ops (quantization, collectives) out of whatever module
  category encloses them into their own category;
- ``generate`` scopes wrap each request; time inside them that no rule claims is
  ``other`` (embeddings, norms, cache bookkeeping, Python overhead).

So the categories always add up to the total: the sum over requests of their
``generate`` scope CPU time, and of the kernel time of their ops on a device.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCOPE_PREFIX = "moe_bench::"
GENERATE_SCOPE = SCOPE_PREFIX + "generate"


@dataclass(frozen=True)
class CategoryRule:
    """One classification rule. ``target`` is 'module' (class name or module path regex) or 'op'."""

    category: str
    target: str  # "module_name" | "module_class" | "op" | "op_outside"
    pattern: str
    why: str


# Order matters: the first matching module rule wins; op rules apply inside any scope.
CATEGORY_RULES: tuple[CategoryRule, ...] = (
    CategoryRule("attention_kv", "module_class", r"Attention$", "MLA / MHA attention incl. KV cache read and write"),
    CategoryRule("moe_routing", "module_name", r"mlp\.gate$", "gate: router logits, scoring, group-limited top-k"),
    CategoryRule("routed_experts", "module_name", r"mlp\.experts$", "the routed experts' matmuls and dispatch"),
    CategoryRule("shared_experts", "module_name", r"mlp\.shared_experts$", "DeepSeek's always-on shared experts"),
    CategoryRule("dense_mlp", "module_class", r"MLP$", "the dense FFN of the first_k_dense_replace layers"),
    CategoryRule("sampling", "module_name", r"^lm_head$", "LM head (logits)"),
    CategoryRule(
        "sampling",
        "op_outside",
        r"argmax|multinomial|softmax|topk|sort|cumsum|where|div",
        "logits processing and token choice in the generate loop (ops outside any module scope)",
    ),
    CategoryRule("quantization", "op", r"quant|fp8|float8|_scaled_mm", "quantize / dequantize ops (FP8, int8)"),
    CategoryRule(
        "communication",
        "op",
        r"all_?reduce|all_?gather|all_?to_?all|reduce_?scatter|broadcast|nccl|hccl|cncl",
        "collectives (tensor / expert parallel)",
    ),
)
CATEGORIES: tuple[str, ...] = (
    "attention_kv",
    "moe_routing",
    "routed_experts",
    "shared_experts",
    "dense_mlp",
    "quantization",
    "communication",
    "sampling",
    "other",
)


def classify_module(name: str, module: Any) -> str | None:
    """The category of a module by the module rules, or None."""
    cls = type(module).__name__
    for rule in CATEGORY_RULES:
        if rule.target == "module_class" and re.search(rule.pattern, cls):
            return rule.category
        if rule.target == "module_name" and re.search(rule.pattern, name):
            return rule.category
    return None


def classify_op(op_name: str, inside_module: bool = True) -> str | None:
    """The category of an op by the op rules (``op_outside`` rules only outside module scopes)."""
    for rule in CATEGORY_RULES:
        applies = rule.target == "op" or (rule.target == "op_outside" and not inside_module)
        if applies and re.search(rule.pattern, op_name, re.IGNORECASE):
            return rule.category
    return None


def classified_modules(model: Any) -> list[tuple[str, str, Any]]:
    """(name, category, module) for the outermost classified modules: a module inside an
    already classified one (an expert MLP inside ``mlp.experts``) is not scoped again, so
    category scopes never nest."""
    out: list[tuple[str, str, Any]] = []
    claimed: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in claimed):
            continue
        cat = classify_module(name, module)
        if cat is not None:
            out.append((name, cat, module))
            claimed.append(name)
    return out


class ModuleScopes:
    """Forward hooks that wrap classified modules in ``moe_bench::<category>`` scopes."""

    def __init__(self, model: Any) -> None:
        self._handles: list[Any] = []
        self._local = threading.local()
        for _name, cat, module in classified_modules(model):
            self._handles.append(module.register_forward_pre_hook(self._enter(cat)))
            self._handles.append(module.register_forward_hook(self._exit()))

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _enter(self, category: str) -> Any:
        def pre(module: Any, args: Any) -> None:
            import torch

            rf = torch.autograd.profiler.record_function(SCOPE_PREFIX + category)
            rf.__enter__()
            self._stack().append(rf)

        return pre

    def _exit(self) -> Any:
        def post(module: Any, args: Any, output: Any) -> None:
            stack = self._stack()
            if stack:
                stack.pop().__exit__(None, None, None)

        return post

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _profiler(accelerator: str, with_stack: bool = True) -> Any:
    """A torch profiler for CPU plus the accelerator's activities, all threads."""
    from torch.profiler import ProfilerActivity

    kwargs: dict[str, Any] = {"record_shapes": True, "profile_memory": True, "with_stack": with_stack}
    try:
        from torch._C._profiler import _ExperimentalConfig

        kwargs["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        pass  # older torch: only the calling thread is profiled
    if accelerator == "npu":
        import torch_npu

        prof_mod = torch_npu.profiler
        acts = [prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.NPU]
        kwargs.pop("experimental_config", None)
        return prof_mod.profile(activities=acts, **kwargs)
    acts = [ProfilerActivity.CPU]
    if accelerator == "cuda":
        acts.append(ProfilerActivity.CUDA)
    elif accelerator == "mlu":
        import torch_mlu  # noqa: F401

        acts.append(getattr(ProfilerActivity, "MLU", ProfilerActivity.PrivateUse1))
    return torch_profile(acts, kwargs)


def torch_profile(activities: list[Any], kwargs: dict[str, Any]) -> Any:
    from torch.profiler import profile

    try:
        return profile(activities=activities, **kwargs)
    except TypeError:
        kwargs.pop("experimental_config", None)
        return profile(activities=activities, **kwargs)


@dataclass
class ProfileResult:
    """What a profile produced: the operator table, the breakdown and the trace file."""

    operators: list[dict[str, Any]]
    breakdown: list[dict[str, Any]]
    trace_path: str | None
    time_basis: str  # "device" or "cpu"
    total_ms: float


class ProfileSession:
    """Context manager: profile a model while requests run; ``result`` afterwards."""

    def __init__(self, model: Any, accelerator: str, trace_path: Path | None, with_stack: bool = True) -> None:
        self.model = model
        self.with_stack = with_stack
        self.accelerator = accelerator
        self.trace_path = trace_path
        self.result: ProfileResult | None = None
        self._prof: Any = None
        self._scopes: ModuleScopes | None = None
        self.on_step: Callable[[str], None] = lambda step: None  # the analysis's progress, step by step

    def __enter__(self) -> ProfileSession:
        self._scopes = ModuleScopes(self.model)
        self._prof = _profiler(self.accelerator, self.with_stack)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.on_step("1/4 stopping the profiler (it collects every event)")
        try:
            self._prof.__exit__(None, None, None)
        finally:
            if self._scopes is not None:
                self._scopes.close()
        trace = None
        if self.trace_path is not None:
            self.on_step("2/4 writing the trace file")
            self.trace_path.parent.mkdir(parents=True, exist_ok=True)
            self._prof.export_chrome_trace(str(self.trace_path))
            trace = str(self.trace_path)
        self.on_step("3/4 the bottleneck breakdown")
        events = list(self._prof.events())
        breakdown, basis, total = compute_breakdown(events)
        self.on_step("4/4 the operator table")
        self.result = ProfileResult(operator_table(self._prof), breakdown, trace, basis, total)


def _dev_total(ev: Any) -> float:
    name = "device_time_total" if hasattr(ev, "device_time_total") else "cuda_time_total"
    return float(getattr(ev, name, 0.0) or 0.0)


def _dev_self(ev: Any) -> float:
    name = "self_device_time_total" if hasattr(ev, "self_device_time_total") else "self_cuda_time_total"
    return float(getattr(ev, name, 0.0) or 0.0)


# Python-function events that with_stack adds (``file.py(12): f``, ``<built-in method ...>``):
# kept in the trace and the breakdown, left out of the operator table.
_PYTHON_EVENT = re.compile(r"\.py\(\d+\)|^<built-in|^<method")


def operator_table(prof: Any) -> list[dict[str, Any]]:
    """``key_averages(group_by_input_shape=True)`` as rows (times in ms, memory in MiB)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key.startswith(SCOPE_PREFIX) or _PYTHON_EVENT.search(e.key):
            continue
        rows.append(
            {
                "operator": e.key,
                "input_shapes": str(e.input_shapes) if e.input_shapes else "",
                "calls": int(e.count),
                "self_cpu_ms": e.self_cpu_time_total / 1000.0,
                "cpu_total_ms": e.cpu_time_total / 1000.0,
                "self_device_ms": _dev_self(e) / 1000.0,
                "device_total_ms": _dev_total(e) / 1000.0,
                "cpu_memory_mib": float(getattr(e, "self_cpu_memory_usage", 0) or 0) / 2**20,
                "device_memory_mib": float(
                    getattr(e, "self_device_memory_usage", 0) or getattr(e, "self_cuda_memory_usage", 0) or 0
                )
                / 2**20,
            }
        )
    rows.sort(key=lambda r: (r["self_device_ms"], r["self_cpu_ms"]), reverse=True)
    return rows


# Chrome-trace categories torch's profiler writes: host operators and annotations (a server's
# ``record_function`` scopes, e.g. vLLM's per-step ones), device work, and the runtime calls
# that launch device work (their ``correlation`` names the work they launched).
_HOST_OPS = frozenset({"cpu_op", "user_annotation", "overhead"})
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCHES = frozenset({"cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver"})


def operator_table_from_trace(path: str | Path) -> list[dict[str, Any]]:
    """The operator table of a torch profiler trace file (Chrome JSON, gzipped or not) that
    another process wrote, e.g. a vLLM server's: rows as :func:`operator_table`'s, built the
    way torch builds its own table from the same events.

    Host events (operators, and the runtime calls that launch device work) nest by time on
    their thread, except that a launch belongs to the operator its ``External id`` names.
    Self CPU time is an event's time minus its children's; an operator's device time is that
    of the work its launches started (``correlation``); total: its own and its descendants'.
    An operator nested in one of the same name as its only child is merged into it, as torch
    does. Device work (kernels, copies) has rows of its own, as in torch's table. Grouped by
    name only (input shapes are in a trace only when the server recorded them); memory is not
    in such a trace: None.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        if name not in rows:
            rows[name] = {
                "operator": name,
                "input_shapes": "",
                "calls": 0,
                "self_cpu_ms": 0.0,
                "cpu_total_ms": 0.0,
                "self_device_ms": 0.0,
                "device_total_ms": 0.0,
                "cpu_memory_mib": None,
                "device_memory_mib": None,
            }
        return rows[name]

    device_by_launch: dict[Any, float] = {}
    host: list[dict[str, Any]] = []  # nodes: name, start, end, ms, launch, ext, corr, parent, children, dev
    for e in spans:
        cat, args = e.get("cat"), e.get("args") or {}
        if cat in _DEVICE_WORK:
            ms = float(e["dur"]) / 1000.0
            r = row(str(e.get("name", "")))
            r["calls"] += 1
            r["self_device_ms"] += ms
            r["device_total_ms"] += ms
            if (corr := args.get("correlation")) is not None:
                device_by_launch[corr] = device_by_launch.get(corr, 0.0) + ms
        elif cat in _HOST_OPS or cat in _LAUNCHES:
            t0 = float(e["ts"])
            host.append(
                {
                    "name": str(e.get("name", "")),
                    "thread": (e.get("pid"), e.get("tid")),
                    "start": t0,
                    "end": t0 + float(e["dur"]),
                    "ms": float(e["dur"]) / 1000.0,
                    "launch": cat in _LAUNCHES,
                    "ext": args.get("External id"),
                    "corr": args.get("correlation"),
                    "parent": None,
                    "children": [],
                    "dev": 0.0,
                    "gone": False,
                }
            )
    host.sort(key=lambda n: (n["start"], -n["end"]))
    op_by_ext = {n["ext"]: n for n in host if not n["launch"] and n["ext"] is not None}
    stacks: dict[Any, list[dict[str, Any]]] = {}
    for n in host:
        stack = stacks.setdefault(n["thread"], [])
        while stack and stack[-1]["end"] + 0.01 < n["end"]:  # times in µs, rounded to ns
            stack.pop()
        parent = stack[-1] if stack else None
        if n["launch"]:
            parent = op_by_ext.get(n["ext"], parent)
            if parent is not None:
                parent["dev"] += device_by_launch.get(n["corr"], 0.0)
        else:
            stack.append(n)
        if parent is not None:
            n["parent"] = parent
            parent["children"].append(n)
    changed = True
    while changed:  # torch's _remove_dup_nodes: an only child of the same name is its parent
        changed = False
        for n in host:
            p = n["parent"]
            if not n["gone"] and p is not None and p["name"] == n["name"] and len(p["children"]) == 1:
                p["children"], p["dev"] = n["children"], p["dev"] + n["dev"]
                for child in n["children"]:
                    child["parent"] = p
                n["gone"] = changed = True
    live = [n for n in host if not n["gone"]]
    for n in reversed(live):  # children before their parents
        n["dev_total"] = n["dev"] + sum(c.get("dev_total", c["dev"]) for c in n["children"])
    for n in live:
        r = row(n["name"])
        r["calls"] += 1
        r["self_cpu_ms"] += n["ms"] - sum(c["ms"] for c in n["children"])
        r["cpu_total_ms"] += n["ms"]
        r["self_device_ms"] += n["dev"]
        r["device_total_ms"] += n["dev_total"]
    out = [
        r for r in rows.values() if not (r["operator"].startswith(SCOPE_PREFIX) or _PYTHON_EVENT.search(r["operator"]))
    ]
    out.sort(key=lambda r: (r["self_device_ms"], r["self_cpu_ms"]), reverse=True)
    return out


NO_BREAKDOWN_NOTE = (
    "no bottleneck breakdown: no operator time fell inside the per-module scopes it classifies. The engine "
    "ran its steps as a captured CUDA graph or compiled code (cuda_graphs, compile), where those scopes are "
    "not recorded; the operator table and the trace still hold every kernel and its time"
)


def compute_breakdown(events: list[Any]) -> tuple[list[dict[str, Any]], str, float]:
    """Split the time of the ``generate`` scopes into :data:`CATEGORIES`; rows sum to the total.

    Two bases, both reported per row: CPU time (``cpu_ms``: the self CPU time of every event
    under a generate scope, so the total is the generate scopes' CPU time) and device time
    (``device_ms``: the kernel time of the ops under them; None when no device reported
    kernels). ``share_pct`` uses device time when there is any, else CPU time. Scope events'
    own device "time" is the span of a GPU annotation, idle gaps included, so only ops count
    there. Category scopes never nest; op rules move matching ops (with everything under
    them) out of the enclosing category.
    """
    gens = [e for e in events if e.name == GENERATE_SCOPE]
    cpu = dict.fromkeys(CATEGORIES, 0.0)
    dev = dict.fromkeys(CATEGORIES, 0.0)

    def subtree(ev: Any) -> tuple[float, float]:
        """(cpu, device) of an op and everything under it."""
        c, d = float(ev.self_cpu_time_total), (0.0 if ev.name.startswith(SCOPE_PREFIX) else _dev_self(ev))
        for child in ev.cpu_children:
            cc, dd = subtree(child)
            c, d = c + cc, d + dd
        return c, d

    def walk(ev: Any, current: str | None) -> None:
        name = ev.name
        is_scope = name.startswith(SCOPE_PREFIX)
        cat = name[len(SCOPE_PREFIX) :] if is_scope and name != GENERATE_SCOPE else current
        if not is_scope:
            op_cat = classify_op(name, inside_module=cat is not None)
            if op_cat is not None:
                c, d = subtree(ev)
                cpu[op_cat] += c
                dev[op_cat] += d
                return
        key = cat if cat in cpu else "other"
        cpu[key] += float(ev.self_cpu_time_total)
        if not is_scope:
            dev[key] += _dev_self(ev)
        for child in ev.cpu_children:
            walk(child, cat)

    for g in gens:
        walk(g, None)
    total_cpu, total_dev = sum(cpu.values()), sum(dev.values())
    use_device = total_dev > 0
    basis_total = total_dev if use_device else total_cpu
    basis = dev if use_device else cpu
    rows = [
        {
            "category": c,
            "cpu_ms": cpu[c] / 1000.0,
            "device_ms": dev[c] / 1000.0 if use_device else None,
            "time_ms": basis[c] / 1000.0,
            "share_pct": 100.0 * basis[c] / basis_total if basis_total else 0.0,
        }
        for c in CATEGORIES
    ]
    return rows, ("device" if use_device else "cpu"), basis_total / 1000.0


@contextlib.contextmanager
def generate_scope() -> Iterator[None]:
    """Wrap one request's generation; the breakdown's total is the sum of these scopes."""
    import torch

    with torch.autograd.profiler.record_function(GENERATE_SCOPE):
        yield

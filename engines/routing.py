"""Expert routing counts: hooks on the MoE gates of an in-process model.

For every MoE layer the recorder counts how many tokens were sent to each routed
expert (each token counts once per expert of its top-k), how many tokens went
through the gate, and how often each expert group was selected (group-limited
routing: a token "selects" a group when any of its top-k experts lies in it). This
is what an operator needs to reason about expert parallelism and load imbalance.

A gate is any module whose forward returns a tuple holding an integer tensor of
shape (tokens, top_k): DeepSeek-V3's ``DeepseekV3TopkRouter`` returns
``(router_logits, topk_weights, topk_indices)``.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from typing import Any, NamedTuple

_LAYER_RE = re.compile(r"layers\.(\d+)\.")


class RoutingRecorder:
    """Counts tokens per expert per MoE layer; thread-safe; cheap (one bincount per layer per step)."""

    def __init__(self, model: Any) -> None:
        cfg = getattr(model, "config", None)
        self.num_experts = int(getattr(cfg, "n_routed_experts", 0) or getattr(cfg, "num_experts", 0) or 0)
        self.top_k = int(getattr(cfg, "num_experts_per_tok", 0) or 0)
        self.n_group = int(getattr(cfg, "n_group", 1) or 1)
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self.layers: list[str] = []
        self._counts: dict[str, list[int]] = {}
        self._groups: dict[str, list[int]] = {}
        self._tokens: dict[str, int] = {}
        self.enabled = True
        if self.num_experts <= 0:
            return
        for name, module in model.named_modules():
            if name.endswith("mlp.gate") and type(module).__name__.endswith(("Router", "Gate", "MoEGate")):
                self._handles.append(module.register_forward_hook(self._make_hook(name)))
                self.layers.append(name)
        self.reset()

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def _make_hook(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if not self.enabled:
                return
            idx = _find_indices(output, self.top_k)
            if idx is None:
                return
            import torch

            flat = idx.reshape(-1).to("cpu")
            counts = torch.bincount(flat, minlength=self.num_experts).tolist()
            per_group = max(self.num_experts // self.n_group, 1)
            groups_of_token = (idx.to("cpu") // per_group).sort(dim=-1).values
            # a group is selected by a token when any of its top-k experts lies in it
            first = torch.ones_like(groups_of_token, dtype=torch.bool)
            first[:, 1:] = groups_of_token[:, 1:] != groups_of_token[:, :-1]
            group_counts = torch.bincount(groups_of_token[first], minlength=self.n_group).tolist()
            with self._lock:
                c = self._counts[name]
                for i, v in enumerate(counts[: self.num_experts]):
                    c[i] += int(v)
                g = self._groups[name]
                for i, v in enumerate(group_counts[: self.n_group]):
                    g[i] += int(v)
                self._tokens[name] += int(idx.shape[0])

        return hook

    def reset(self) -> None:
        with self._lock:
            self._counts = {n: [0] * self.num_experts for n in self.layers}
            self._groups = {n: [0] * self.n_group for n in self.layers}
            self._tokens = {n: 0 for n in self.layers}

    def snapshot(self) -> dict[str, Any] | None:
        """Counts so far as plain data (JSON-ready), or None when the model has no gates."""
        if not self.active:
            return None
        with self._lock:
            layers = list(self.layers)
            counts = [list(self._counts[n]) for n in layers]
            groups = [list(self._groups[n]) for n in layers]
            tokens = [self._tokens[n] for n in layers]
        imbalance = []
        for row in counts:
            mean = sum(row) / len(row) if row else 0.0
            imbalance.append(max(row) / mean if mean > 0 else None)
        return {
            "layers": [_layer_label(n) for n in layers],
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "n_group": self.n_group,
            "counts": counts,
            "group_counts": groups,
            "tokens": tokens,
            "imbalance": imbalance,
        }

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


ROUTING_WINDOW_S = 10.0  # the time windows of a served run's routing (the heat map's time slider)
MAX_WINDOWS = 120  # more than this many windows: neighbours merged (a long run's record stays small)


def served_record(
    phases: Any, layout: dict[str, Any], windows: dict[int, Any] | None = None, requests: int = 0
) -> dict[str, Any]:
    """The per-run routing record, as the native engine's :meth:`RoutingRecorder.snapshot`, from
    a server's per-request counts summed over the run: ``phases`` [2, layers, experts] (prompt,
    generated tokens), ``windows`` {window index: [layers, experts]} by the request's end time.
    Adds ``phases`` (the split), ``windows`` (``t_s`` and counts, each ``window_s`` long) and
    ``source``."""
    import numpy as np

    arr = np.asarray(phases, dtype=np.int64)
    counts = arr.sum(axis=0)
    experts = counts.shape[1]
    groups = max(1, int(layout.get("n_group") or 1))
    top_k = int(layout.get("top_k") or 0)
    group_counts = (
        counts.reshape(len(counts), groups, experts // groups).sum(axis=-1) if experts % groups == 0 else None
    )
    labels = list(layout.get("layers") or [f"layer {i}" for i in range(len(counts))])
    step = ROUTING_WINDOW_S
    merged: dict[int, Any] = dict(windows or {})
    while len(merged) > MAX_WINDOWS:  # halve the resolution until it fits
        step *= 2
        halved: dict[int, Any] = {}
        for k, v in merged.items():
            halved[k // 2] = halved[k // 2] + v if k // 2 in halved else v
        merged = halved
    tokens = [int(row.sum()) // top_k if top_k else int(row.sum()) for row in counts]
    return {
        "layers": labels[: len(counts)],
        "num_experts": experts,
        "top_k": top_k,
        "n_group": groups,
        "counts": counts.tolist(),
        "group_counts": group_counts.tolist() if group_counts is not None else [[0] * groups for _ in counts],
        "tokens": tokens,
        "imbalance": [float(row.max() / row.mean()) if row.mean() > 0 else None for row in counts],
        "phases": {"prefill": arr[0].tolist(), "decode": arr[1].tolist()},
        "window_s": step,
        "windows": [{"t_s": k * step, "counts": np.asarray(v).tolist()} for k, v in sorted(merged.items())],
        "requests": requests,
        "source": layout.get("source") or "reported by the server with each request",
    }


def check_routing(value: Any, shape: tuple[int, ...] | None) -> tuple[Any, str | None]:
    """A request's routing counts as an int array [2, layers, experts], or (None, one-line reason):
    a wrong shape (or one unlike the run's earlier requests), negative or non-integer counts.
    A str is the engine's own reason why the request's routing could not be read."""
    import numpy as np

    if isinstance(value, str):
        return None, value

    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        return None, f"not an array ({type(exc).__name__})"
    if arr.dtype.kind not in "iu":
        return None, f"counts of dtype {arr.dtype}, not integers"
    if arr.ndim != 3 or arr.shape[0] != 2 or arr.size == 0:
        return None, f"shape {arr.shape}, not [2 phases, layers, experts]"
    if shape is not None and arr.shape != shape:
        return None, f"shape {arr.shape}, unlike the run's earlier requests' {shape}"
    if (arr < 0).any():
        return None, "negative counts"
    return arr.astype(np.int64), None


def _layer_label(name: str) -> str:
    m = _LAYER_RE.search(name)
    return f"layer {m.group(1)}" if m else name


def _find_indices(output: Any, top_k: int) -> Any | None:
    import torch

    items = output if isinstance(output, tuple | list) else (output,)
    for item in items:
        if (
            isinstance(item, torch.Tensor)
            and not item.is_floating_point()
            and item.dim() == 2
            and (top_k <= 0 or item.shape[-1] == top_k)
        ):
            return item
    return None


ROUTED_EXPERTS_MAX_B64 = 64 * 1024 * 1024  # a routed_experts field larger than this is refused, not decoded
NPY_MAGIC = b"\x93NUMPY"
# Rows of a request's routed_experts beyond its prompt + max_tokens that are still taken: vLLM and
# SGLang send tokens - 1 rows (none extra), but the prompt's count may be the workload's, without
# the tokens a chat template adds (DeepSeek's: under 20) until the server's usage says.
ROUTED_ROWS_SLACK = 64


def routed_rows_max(prompt_tokens: int | None, max_tokens: int | None) -> int | None:
    """The most rows a request's ``routed_experts`` may hold (one a token it forwarded): its
    prompt and its ``max_tokens`` plus :data:`ROUTED_ROWS_SLACK`; None when either is unknown."""
    if prompt_tokens is None or max_tokens is None:
        return None
    return prompt_tokens + max_tokens + ROUTED_ROWS_SLACK


def layout_from_config(cfg: dict[str, Any], source: str) -> dict[str, Any] | None:
    """A DeepSeek MoE model's routing layout from its ``config.json``: the MoE layers' labels
    and indices among all hidden layers, experts, top-k, groups; None for a model without
    routed experts."""
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    total = int(cfg.get("num_hidden_layers") or 0)
    if experts <= 0 or top_k <= 0 or total <= 0:
        return None
    first, freq = int(cfg.get("first_k_dense_replace") or 0), max(1, int(cfg.get("moe_layer_freq") or 1))
    moe = [i for i in range(total) if i >= first and i % freq == 0]
    return {
        "layers": [f"layer {i}" for i in moe],
        "moe_layers": moe,
        "hidden_layers": total,
        "num_experts": experts,
        "top_k": top_k,
        "n_group": int(cfg.get("n_group") or 1),
        "source": source,
    }


def _decoded(b64: Any) -> tuple[bytes | None, str | None]:
    """A ``routed_experts`` field's bytes, or (None, one-line reason): not text, over the cap, not base64."""
    import binascii

    if not isinstance(b64, str):
        return None, f"routed_experts is a {type(b64).__name__}, not base64 text"
    if len(b64) > ROUTED_EXPERTS_MAX_B64:
        mib = f"{len(b64) / 2**20:.0f} MiB"
        return None, f"routed_experts is {mib} of base64, over the {ROUTED_EXPERTS_MAX_B64 >> 20} MiB cap"
    try:
        return _b64decode(b64), None
    except (binascii.Error, ValueError) as exc:
        return None, f"routed_experts is not base64 ({type(exc).__name__}: {str(exc)[:80]})"


def _outside(low: int, high: int, experts: int) -> str | None:
    """Why ids from ``low`` to ``high`` are not the model's experts (-1: a placeholder), or None."""
    if low < -1 or high >= experts:
        return f"routed_experts names expert {high if high >= experts else low}, outside the model's {experts}"
    return None


def _read_ids(b64: Any, layout: dict[str, Any], max_rows: int | None = None) -> tuple[Any, tuple[int, ...], str | None]:
    """(ids [rows, layers, top-k], the MoE layers' indices on the array's layer axis, None) or
    (None, (), one-line reason); see :func:`decode_routed_experts`."""
    raw, why = _decoded(b64)
    return (None, (), why) if raw is None else _ids_of(raw, layout, max_rows)


def _npy_ids(raw: bytes) -> tuple[Any, str | None]:
    """An ``.npy`` payload as an integer array [tokens, layers, top-k] viewing ``raw``, or (None,
    one-line reason). The header is checked against the bytes that follow it before any array is
    made: a header may declare any shape (2**40 rows behind a few bytes was a MemoryError)."""
    import io

    import numpy as np

    fmt = np.lib.format
    buf = io.BytesIO(raw)
    try:
        version = fmt.read_magic(buf)
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(buf, max_header_size=4096)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        return None, f"routed_experts is not a readable .npy array ({type(exc).__name__}: {str(exc)[:80]})"
    if dtype.kind not in "iu" or dtype.hasobject or len(shape) != 3:
        return None, f"routed_experts holds {dtype} of shape {shape}, not integer ids [tokens, layers, top-k]"
    body = len(raw) - buf.tell()
    if math.prod(shape) * dtype.itemsize != body:
        return None, f"routed_experts' .npy header says shape {shape} of {dtype}; {body} bytes follow it"
    ids = np.frombuffer(raw, dtype=dtype, offset=buf.tell()).reshape(shape, order="F" if fortran else "C")
    return ids, None


def _ids_of(raw: bytes, layout: dict[str, Any], max_rows: int | None = None) -> tuple[Any, tuple[int, ...], str | None]:
    """:func:`_read_ids` for the field's decoded bytes. ``max_rows``: the most rows the request
    may have (:func:`routed_rows_max`); more is a reason, not a count. The ids come back as int32
    (a uint64 array was a TypeError when counted)."""
    import numpy as np

    experts, top_k = int(layout.get("num_experts") or 0), int(layout.get("top_k") or 0)
    moe = tuple(layout.get("moe_layers") or ())
    hidden = int(layout.get("hidden_layers") or len(moe))
    if raw.startswith(NPY_MAGIC):
        ids, why = _npy_ids(raw)
        if ids is None:
            return None, (), why
        if top_k and ids.shape[2] != top_k:
            return None, (), f"routed_experts has top-{ids.shape[2]} ids a token; the model routes to {top_k}"
    elif not moe or not top_k or not hidden:
        return None, (), f"routed_experts is {len(raw)} bytes, not a base64 .npy array"
    elif len(raw) % 4 or (len(raw) // 4) % (hidden * top_k):
        return (
            None,
            (),
            (
                f"routed_experts is {len(raw)} bytes: neither an .npy array nor int32 ids "
                f"[tokens, {hidden} layers, top-{top_k}]"
            ),
        )
    else:
        ids = np.frombuffer(raw, dtype=np.int32).reshape(-1, hidden, top_k)
    if (why := _too_many_rows(ids.shape[0], max_rows)) is not None:
        return None, (), why
    layers = ids.shape[1]
    if moe and layers == hidden:
        keep = moe
    elif not moe or layers == len(moe):
        keep = tuple(range(layers))
    else:
        return None, (), f"routed_experts has {layers} layers; the model has {len(moe)} MoE layers of {hidden}"
    if keep and max(keep) >= layers:  # a layout at odds with itself (MoE layer indices past its layer count)
        return None, (), f"routed_experts has {layers} layers; the model's MoE layers go up to index {max(keep)}"
    if ids.size and (why := _outside(int(ids.min()), int(ids.max()), experts)):
        return None, (), why
    return ids.astype(np.int32, copy=False), keep, None


def _too_many_rows(rows: int, max_rows: int | None) -> str | None:
    """Why ``rows`` of routed ids cannot be one request's (more than ``max_rows``), or None."""
    if max_rows is not None and rows > max_rows:
        return (
            f"routed_experts has {rows:,} rows (tokens); the request has at most {max_rows:,} "
            f"(prompt + max_tokens + {ROUTED_ROWS_SLACK})"
        )
    return None


def decode_routed_experts(b64: Any, layout: dict[str, Any]) -> tuple[Any, str | None]:
    """A server's per-request routed expert ids as an int array [rows, MoE layers, top-k], or
    (None, one-line reason). Two encodings, told apart by the ``.npy`` magic:

    - vLLM (``--enable-return-routed-experts``, field ``routed_experts`` of a choice): base64 of
      an ``.npy`` array [tokens - 1, MoE layers, top-k];
    - SGLang (``--enable-return-routed-experts`` and ``return_routed_experts`` in the request,
      ``sglext.routed_experts``): base64 of raw int32, [tokens - 1, hidden layers, top-k]
      flattened; the dense layers' columns are dropped here (only the MoE layers route).

    ``layout``: :func:`layout_from_config`'s; one with only ``num_experts`` takes an .npy
    array's layers as they are. An id of -1 is a placeholder (no routed expert in that slot)
    and is not counted."""
    ids, keep, why = _read_ids(b64, layout)
    if ids is None:
        return None, why
    return (ids if len(keep) == ids.shape[1] else ids[:, list(keep), :]), None


def _b64decode(text: str) -> bytes:
    """Strict base64 decoding; pybase64 (SIMD) where installed: 0.01 ms against the standard
    library's 0.46 ms for one 95-token request of a DeepSeek-V3-shaped payload (247 kB) here."""
    try:
        import pybase64
    except ImportError:
        import base64

        return base64.b64decode(text, validate=True)
    return pybase64.b64decode(text, validate=True)


@functools.lru_cache(maxsize=64)
def _layer_plan(layers: int, keep: tuple[int, ...], experts: int) -> Any:
    """Per layer of the array, what to add to an id for its cell in a flat count: layer ``i`` owns
    cells ``i * (experts + 1) ...``, its cell 0 taking the -1 placeholders (dropped after)."""
    import numpy as np

    return (np.arange(layers, dtype=np.int32) * (experts + 1) + 1).reshape(1, -1, 1), np.asarray(keep, dtype=np.intp)


def routed_counts(
    b64: Any, layout: dict[str, Any], prompt_tokens: int | None, prompt_start: int = 0, max_rows: int | None = None
) -> tuple[Any, str | None]:
    """One request's routed experts (either encoding, see :func:`decode_routed_experts`) straight
    to counts [2, MoE layers, experts] (uint16, or uint32 past 65,535 rows: small to pass from a
    sender process): one bincount over the raw array (the decode rows' cells shifted past the
    prompt's), the dense layers' and placeholder cells
    dropped after, no per-layer copies. What the client does per request; equal to a per-layer
    count of :func:`decode_routed_experts`' ids (tests/engines/test_routed_experts.py).
    ``max_rows``: :func:`routed_rows_max` of the request (None: not checked)."""
    ids, keep, why = _read_ids(b64, layout, max_rows)
    if ids is None:
        return None, why
    return _count_ids(ids, keep, int(layout.get("num_experts") or 0), prompt_tokens, prompt_start), None


def _prompt_rows(rows: int, prompt_tokens: int | None, prompt_start: int) -> int:
    """How many of a request's ``rows`` are its prompt's (the server left out ``prompt_start``)."""
    return rows if prompt_tokens is None else max(0, min(rows, prompt_tokens - prompt_start))


def _count_ids(ids: Any, keep: tuple[int, ...], experts: int, prompt_tokens: int | None, prompt_start: int) -> Any:
    """:func:`routed_counts` of checked ids [rows, layers, top-k]."""
    import numpy as np

    rows, layers = ids.shape[0], ids.shape[1]
    shift, keep_idx = _layer_plan(layers, keep, experts)
    cells = layers * (experts + 1)
    cell = ids + shift  # int32, one temporary; the decode rows' cells moved past the prompt's
    cell[_prompt_rows(rows, prompt_tokens, prompt_start) :] += cells
    counts = np.bincount(cell.reshape(-1), minlength=2 * cells)  # one bincount for both phases
    kept = counts.reshape(2, layers, experts + 1)[:, keep_idx, 1:]
    return kept.astype(np.uint16 if rows < 65536 else np.uint32)


class RoutedIds(NamedTuple):
    """One request's routed expert ids as the server sent them (SGLang's raw int32 encoding),
    checked for shape but not yet counted: :func:`count_routed` counts many at once.

    Why not count each request as it ends (:func:`routed_counts`): a client running flat out
    pays numpy's per-call cost a dozen times a request, cold between requests: ~50 µs of a ~600 µs
    request measured in a sender process (the tiny model's 95 x 3 x 2 ids; 10 µs in a hot
    loop), 6-7 % of the client's rate; raw bytes pass to the recorder, which counts a batch with
    the same dozen calls (studies/routing_overhead.py)."""

    raw: bytes  # int32 ids [rows, layers, top-k], C order
    prompt_rows: int  # the first rows are the prompt's (phase 0), the rest generated tokens' (phase 1)
    plan: tuple[int, tuple[int, ...], int, int]  # (layers on the array, the MoE layers kept, experts, top-k)


DEFER_MAX_BYTES = 32 * 1024  # ids up to this size are passed on uncounted (RoutedIds); larger ones counted at once


def read_routed(
    b64: Any, layout: dict[str, Any], prompt_tokens: int | None, prompt_start: int = 0, max_rows: int | None = None
) -> tuple[Any, str | None]:
    """One request's ``routed_experts``, read as cheaply as its encoding allows: SGLang's raw
    int32 up to :data:`DEFER_MAX_BYTES` as :class:`RoutedIds` (base64-decoded, its length
    checked; the expert range is checked when counted); vLLM's ``.npy``, and larger ids (a
    DeepSeek-V3 request: ~2 kB a token), as counts [2, MoE layers, experts] at once
    (:func:`routed_counts`). (value, None) or (None, one-line reason)."""
    raw, why = _decoded(b64)
    if raw is None:
        return None, why
    moe = tuple(layout.get("moe_layers") or ())
    hidden = int(layout.get("hidden_layers") or len(moe))
    experts, top_k = int(layout.get("num_experts") or 0), int(layout.get("top_k") or 0)
    row = hidden * top_k * 4
    deferred = (
        moe and row and experts and max(moe) < hidden  # SGLang's raw ids of a layout at one with itself,
        and not raw.startswith(NPY_MAGIC) and not len(raw) % row  # not an .npy, whole rows,
        and len(raw) <= DEFER_MAX_BYTES  # small: numpy's per-call cost would outweigh counting them here
    )  # fmt: skip
    if deferred:
        if (why := _too_many_rows(len(raw) // row, max_rows)) is not None:
            return None, why
        prompt_rows = _prompt_rows(len(raw) // row, prompt_tokens, prompt_start)
        return RoutedIds(raw, prompt_rows, (hidden, moe, experts, top_k)), None
    ids, keep, why = _ids_of(raw, layout, max_rows)  # counted here (the counts pass on smaller), or its reason
    return (None, why) if ids is None else (_count_ids(ids, keep, experts, prompt_tokens, prompt_start), None)


def count_routed(items: list[RoutedIds]) -> tuple[Any, list[tuple[int, str]]]:
    """The summed counts [2, MoE layers, experts] (int64) of ``items`` (one plan), and the
    (index, one-line reason) of each item left out: one naming an expert outside the model.
    A dozen numpy calls for the whole batch, whatever its size (see :class:`RoutedIds`)."""
    import numpy as np

    layers, keep, experts, top_k = items[0].plan
    cells, row = layers * (experts + 1), 4 * layers * top_k
    # the prompts' rows together, the generated tokens' together: one bincount a phase
    phases = [
        np.frombuffer(b"".join(it.raw[: it.prompt_rows * row] for it in items), dtype=np.int32),
        np.frombuffer(b"".join(it.raw[it.prompt_rows * row :] for it in items), dtype=np.int32),
    ]
    bad: list[tuple[int, str]] = []
    if any(ids.size and (int(ids.min()) < -1 or int(ids.max()) >= experts) for ids in phases):
        good = []
        for i, it in enumerate(items):  # find the culprits; the rest are counted
            own = np.frombuffer(it.raw, dtype=np.int32)
            if own.size and (why := _outside(int(own.min()), int(own.max()), experts)):
                bad.append((i, why))
            else:
                good.append(it)
        if not good:
            return np.zeros((2, len(keep), experts), dtype=np.int64), bad
        return count_routed(good)[0], bad
    shift, keep_idx = _layer_plan(layers, keep, experts)
    counts = np.empty((2, cells), dtype=np.int64)
    for phase, ids in enumerate(phases):
        counts[phase] = np.bincount((ids.reshape(-1, layers, top_k) + shift).reshape(-1), minlength=cells)
    return counts.reshape(2, layers, experts + 1)[:, keep_idx, 1:], bad


def counts_from_routed_experts(
    b64: Any, prompt_tokens: int, num_experts: int, prompt_start: int = 0, layout: dict[str, Any] | None = None
) -> tuple[Any, str | None]:
    """One request's ``routed_experts`` (vLLM's .npy or SGLang's raw int32, see
    :func:`decode_routed_experts`) as routing counts [2, layers, experts]: phase 0 the prompt's
    rows, 1 the generated tokens' (the first ``prompt_start`` prompt tokens left out by the
    server, vLLM's ``routed_experts_prompt_start``). (counts, None) or (None, one-line reason).
    Without ``layout``, only an .npy array is read, its layers taken as the MoE layers."""
    return routed_counts(b64, {**(layout or {}), "num_experts": num_experts}, prompt_tokens, prompt_start)

"""What an SGLang server tells about itself, for the ``openai`` engine in connect mode.

- Its deployment shape: ``GET /get_server_info`` (``/server_info`` on newer servers) returns
  the server's arguments, among them ``tp_size``, ``dp_size``, ``pp_size``, ``ep_size`` and
  ``enable_dp_attention``; the run records them as ``engine_info["deployment"]``.
- Its expert distribution recorder: with ``--expert-distribution-recorder-mode stat`` the
  server counts, per MoE layer, the tokens routed to each logical expert between
  ``POST /start_expert_distribution_record`` and ``/stop_expert_distribution_record``;
  ``/dump_expert_distribution_record`` writes them (``logical_count``: steps x layers x
  experts, summed over the ranks) to a ``.pt`` file in the server's
  ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``. MoE Bench reads that file where this machine
  can (the folder given as ``sglang_expert_distribution_dir``: the same host or a shared
  mount) and turns it into the run's ``expert_routing`` artifact, the same layers x experts
  counts the native engine records, so the two views sit side by side.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engines.errors import EngineUnavailable, one_line
from engines.http_errors import http_get

INFO_PATHS = ("/get_server_info", "/server_info")
DUMP_GLOB = "expert_distribution_recorder_*.pt"
DUMP_WAIT_S = 30.0


def server_info(client: Any, root: str) -> dict[str, Any] | None:
    """The server's own description where it gives one with its parallel sizes (SGLang), else None."""
    for path in INFO_PATHS:
        try:
            resp = http_get(client, f"{root}{path}", timeout=5.0)
        except Exception:  # noqa: BLE001 - not every server has it
            continue
        if resp.status_code != 200:
            continue
        try:
            data = resp.json()
        except ValueError:
            continue
        if isinstance(data, dict) and "tp_size" in data:
            return data
    return None


def deployment_from_info(info: dict[str, Any]) -> dict[str, Any]:
    """engine_info["deployment"] from SGLang's server arguments (what the server reports)."""

    def size(key: str) -> int:
        value = info.get(key)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    tp, dp, pp = size("tp_size"), size("dp_size"), size("pp_size")
    return {
        "tensor_parallel_size": tp,
        "data_parallel_size": dp,
        "pipeline_parallel_size": pp,
        "expert_parallel_size": size("ep_size"),
        "dp_attention": bool(info.get("enable_dp_attention")),
        "nodes": size("nnodes"),
        "devices": tp * pp,  # SGLang's dp splits the TP group (DP attention), it does not multiply it
        "source": "reported by the server (SGLang server_info)",
    }


def routing_from_counts(counts: list[list[int]], top_k: int | None) -> dict[str, Any]:
    """The ``expert_routing`` artifact (engines.routing's layout) from layers x experts counts."""
    imbalance = []
    for row in counts:
        mean = sum(row) / len(row) if row else 0.0
        imbalance.append(max(row) / mean if mean > 0 else None)
    return {
        "layers": [f"layer {i}" for i in range(len(counts))],
        "num_experts": len(counts[0]) if counts else 0,
        "top_k": top_k,
        "n_group": 1,
        "counts": counts,
        "group_counts": [],
        "tokens": [sum(row) // top_k if top_k else sum(row) for row in counts],
        "imbalance": imbalance,
        "source": "SGLang expert distribution recorder (stat)",
    }


class ExpertDistribution:
    """Start, stop and read an SGLang server's expert distribution recorder around a run."""

    def __init__(self, client: Any, root: str, folder: str, top_k: int | None = None) -> None:
        self.client, self.root, self.folder, self.top_k = client, root, Path(folder), top_k
        self._since: float | None = None

    def _post(self, path: str) -> None:
        try:
            resp = http_get(self.client, f"{self.root}{path}", method="POST", timeout=60.0)
        except Exception as exc:
            raise EngineUnavailable(f"SGLang {path}: {type(exc).__name__}: {one_line(exc, 200)}") from exc
        if resp.status_code != 200:
            raise EngineUnavailable(f"SGLang {path} answered HTTP {resp.status_code}: {one_line(resp.text, 200)}")

    def start(self) -> None:
        """Reset and start the recorder (the warm-up's routing is not the run's)."""
        self._since = time.time()
        self._post("/start_expert_distribution_record")

    def collect(self) -> dict[str, Any] | None:
        """Stop, dump and read the newest dump written since :meth:`start`; None if not started."""
        if self._since is None:
            return None
        since, self._since = self._since, None
        self._post("/stop_expert_distribution_record")
        self._post("/dump_expert_distribution_record")
        deadline = time.monotonic() + DUMP_WAIT_S
        while True:
            dumps = [p for p in self.folder.glob(DUMP_GLOB) if p.stat().st_mtime >= since - 1.0]
            if dumps:
                break
            if time.monotonic() > deadline:
                raise EngineUnavailable(
                    f"SGLang wrote no {DUMP_GLOB} into {self.folder} within {DUMP_WAIT_S:.0f} s: is it the "
                    "server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR, reachable from here?"
                )
            time.sleep(0.2)
        newest = max(dumps, key=lambda p: p.stat().st_mtime)
        return routing_from_counts(read_dump(newest), self.top_k)


def read_dump(path: Path) -> list[list[int]]:
    """Layers x experts token counts of a ``stat`` dump (its ``logical_count`` summed over steps)."""
    import torch

    data = torch.load(path, map_location="cpu", weights_only=True)
    count = data.get("logical_count") if isinstance(data, dict) else None
    if count is None:
        raise EngineUnavailable(
            f"{path.name} holds no logical_count: start SGLang with --expert-distribution-recorder-mode stat"
        )
    if count.dim() == 3:
        count = count.sum(dim=0)
    return [[int(v) for v in row] for row in count.tolist()]

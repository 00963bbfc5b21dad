"""Expert parallelism for the native engine's DeepSeek MoE layers: each rank holds 1/N of the routed
experts, tokens go to the rank of their expert and come back by all-to-all (torch.distributed:
NCCL on GPUs, gloo on CPU).

Layout (expert parallel + data parallel, as vLLM's and SGLang's wide-EP deployments): every rank
holds the dense weights (attention, dense MLPs, shared experts, the router, the head) and the
experts ``[r*E/N, (r+1)*E/N)`` of each MoE layer; rank ``r`` runs its own rows of the batch. In
each MoE layer the router runs on the rank's own tokens; the (token, expert) pairs, sorted by
expert (so by owner), go to the owners with ``all_to_all_single`` (the counts first, then the
hidden rows); each owner runs its experts on what it received; a second ``all_to_all_single``
returns the outputs, which the sender weighs by its routing weights and sums over top-k (the
weights never travel), then adds the shared experts.

Why our own dispatch, not transformers' (5.19: ``DistributedConfig(tp_size=N, ep_size=N)`` with
DeepseekV3's ``base_model_ep_plan``), tried first on this CPU with gloo and 2 ranks: it gives the
single process's logits (within 3e-7) but needs the ``accelerate`` package, and accepts only
``ep_size == tp_size``: it also tensor-slices the dense layers and shared experts and wraps the
model in FSDP2, adding an all-reduce per dense layer, an all-gather per MoE layer and one of the
logits (12 collectives per forward on the tiny model, against 6 all-to-alls here), and ran the
tiny model's forward 3-4x slower than this dispatch. Pure expert parallelism with data parallel
ranks (``tp_size=1, ep_size=2``) it refuses ("All-reduce expert parallelism requires ep_size=tp_size").

Serving (the engine option ``expert_parallel=N``, :class:`ServingGroup`): the process that loads
the engine is rank 0 and serves every request; N-1 followers started by it hold only their share
of the routed experts and take part in each MoE layer's exchange with no tokens of their own
(:func:`follow`). The counts each exchange begins with carry, in a last column, the layer index
or a command of rank 0's (stop, report counters), so the followers need no other channel.

Each all-to-all is counted (:data:`STATS`: calls, bytes to and from the other ranks, seconds
inside, seconds in the experts), so a run can say how many bytes a step moved and at what rate.

    python -m torch.distributed.run --nproc-per-node 2 -m engines.expert_parallel --check MODEL_DIR
    python -m torch.distributed.run --nproc-per-node 2 -m engines.expert_parallel --sweep
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import types
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """What the expert all-to-alls of this rank moved so far, and the time its experts ran."""

    calls: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    seconds: float = 0.0  # inside all_to_all_single (waiting for the peers included)
    expert_seconds: float = 0.0  # this rank's routed experts on what it received
    layers: int = 0  # MoE layer exchanges (one per MoE layer per forward)

    def add(self, sent: int, recv: int, seconds: float) -> None:
        self.calls += 1
        self.sent_bytes += sent
        self.recv_bytes += recv
        self.seconds += seconds

    def as_row(self) -> list[float]:
        return [float(getattr(self, f)) for f in STATS_FIELDS]


STATS_FIELDS = ("calls", "sent_bytes", "recv_bytes", "seconds", "expert_seconds", "layers")
STATS = CommStats()
# One MoE layer's exchange at a time: rank 0 serves requests from several threads (one generate
# per request, or the batcher's), and the peers take the exchanges in the order they come.
EXCHANGE_LOCK = threading.Lock()
# Set once an exchange failed half-way (a peer gone, an error inside gloo): the ranks no longer
# agree on what the next message is, so rank 0 begins no further collective (one would wait forever).
BROKEN: list[str] = []
LOCK_WAIT_S = 10.0  # how long stats or stop wait for an exchange in progress before giving up on it
# The last column of the counts each exchange begins with says what the exchange is: a layer
# index (>= 0), or one of these commands from rank 0 to the ranks that only follow.
CMD_STOP, CMD_STATS, CMD_NONE = -1, -2, -3
A2A_SCOPE = "moe_bench_ep::all_to_all"  # the profiler's name for one exchange's all-to-all, waits included


def _sync(t: torch.Tensor) -> None:
    if t.device.type == "cuda":  # NCCL returns before the transfer ends: time the transfer itself
        torch.cuda.synchronize(t.device)


def _peer_bytes(t: torch.Tensor, sizes: list[int] | None) -> int:
    """Bytes of ``t`` bound for (or come from) the other ranks: the rows this rank keeps do not travel."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if t.shape[0] == 0:
        return 0
    row = t[0].numel() * t.element_size()
    mine = sizes[rank] if sizes is not None else t.shape[0] // world
    return (t.shape[0] - mine) * row


def _a2a(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_sizes: list[int] | None = None,
    in_sizes: list[int] | None = None,
) -> None:
    """One all-to-all, counted: bytes to and from the other ranks, and its time. The profiler sees it
    as one annotation whose name the communication rule matches (engines.profiling): the c10d op
    returns before gloo's wait, which would otherwise land outside it, in *other*."""
    t0 = time.perf_counter()
    with torch.profiler.record_function(A2A_SCOPE):
        dist.all_to_all_single(out, inp, out_sizes, in_sizes)
        _sync(out)
    STATS.add(_peer_bytes(inp, in_sizes), _peer_bytes(out, out_sizes), time.perf_counter() - t0)


def moe_layers(model: Any) -> list[int]:
    """The layers whose MLP has DeepSeek-V3's routed experts as 3-D weights (``gate_up_proj``)."""
    return [
        i
        for i, layer in enumerate(model.model.layers)
        if getattr(getattr(layer.mlp, "experts", None), "gate_up_proj", None) is not None
    ]


def unsupported(model: Any, world: int) -> str | None:
    """Why this model's experts cannot spread over ``world`` ranks (one line), or None."""
    layers = moe_layers(model) if hasattr(getattr(model, "model", None), "layers") else []
    if not layers:
        return (
            f"expert_parallel={world}: {type(model).__name__} has no DeepSeek-V3 MoE layers (experts with 3-D "
            "weights) to spread over ranks"
        )
    total = int(model.model.layers[layers[0]].mlp.experts.num_experts)
    if total % world:
        return f"expert_parallel={world}: the model's {total} routed experts do not split evenly over {world} ranks"
    return None


def shard_experts(model: Any, rank: int, world: int) -> list[int]:
    """Keep this rank's routed experts of every MoE layer and route its MoE forwards through
    :func:`ep_moe_forward`; returns the layers sharded. Experts must divide by the ranks."""
    done = []
    for i in moe_layers(model):
        mlp = model.model.layers[i].mlp
        experts = mlp.experts
        total = int(experts.num_experts)
        if total % world:
            raise ValueError(f"{total} routed experts do not split over {world} ranks")
        per = total // world
        lo = rank * per
        experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.data[lo : lo + per].clone(), requires_grad=False)
        experts.down_proj = torch.nn.Parameter(experts.down_proj.data[lo : lo + per].clone(), requires_grad=False)
        experts.num_experts, experts.num_global = per, total  # the experts' own forward sees its local ones
        mlp._ep_layer = i
        mlp.forward = types.MethodType(ep_moe_forward, mlp)
        done.append(i)
    return done


def _run_local(experts: Any, rows: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
    """The rows received (grouped by sender, then by local expert) through this rank's experts,
    unweighted: the experts module's own forward (eager, grouped_mm, lean ...) with top-1 and weight 1."""
    world, per = recv_counts.shape
    local = torch.arange(per, device=rows.device).repeat(world).repeat_interleave(recv_counts.reshape(-1))
    ones = torch.ones(rows.shape[0], 1, dtype=rows.dtype, device=rows.device)
    t0 = time.perf_counter()
    out = experts(rows, local.unsqueeze(1), ones)
    _sync(out)
    STATS.expert_seconds += time.perf_counter() - t0
    return out


def ep_moe_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """A DeepseekV3MoE forward with its routed experts spread over the ranks (see the module docstring)."""
    world = dist.get_world_size()
    experts = self.experts
    shape = hidden_states.shape
    hidden = shape[-1]
    per = int(experts.num_experts)
    _, weights, ids = self.gate(hidden_states)  # [T, k]: this rank's tokens
    x = hidden_states.reshape(-1, hidden)
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs by expert, so by owner
    send = x.index_select(0, order // k).contiguous()
    counts = torch.empty(world, per + 1, dtype=torch.int64, device=x.device)
    counts[:, :per] = torch.bincount(flat, minlength=experts.num_global).view(world, per)
    counts[:, per] = self._ep_layer
    with EXCHANGE_LOCK:
        if BROKEN:
            raise RuntimeError(f"the expert-parallel exchange broke earlier: {BROKEN[0]}")
        try:
            recv_counts = torch.empty_like(counts)
            _a2a(recv_counts, counts)
            send_sizes = counts[:, :per].sum(1).tolist()
            recv_sizes = recv_counts[:, :per].sum(1).tolist()
            recv = x.new_empty(sum(recv_sizes), hidden)
            _a2a(recv, send, recv_sizes, send_sizes)
            done = _run_local(experts, recv, recv_counts[:, :per])
            back = x.new_empty(tokens * k, hidden)
            _a2a(back, done, send_sizes, recv_sizes)
        except BaseException as exc:
            text = str(exc).strip()
            BROKEN.append(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300])
            raise
        STATS.layers += 1
    pairs = torch.empty_like(back)
    pairs[order] = back
    routed = (pairs.view(tokens, k, hidden) * weights.unsqueeze(-1).to(pairs.dtype)).sum(1)
    return routed.view(shape) + self.shared_experts(hidden_states)


def follow(experts: dict[int, Any], hidden: int, dtype: torch.dtype, device: torch.device) -> None:
    """A rank without requests of its own: take part in every MoE layer exchange rank 0 begins,
    running its experts on the pairs it is sent, until rank 0 says stop."""
    world = dist.get_world_size()
    per = int(next(iter(experts.values())).num_experts)
    nothing = torch.empty(0, hidden, dtype=dtype, device=device)
    zeros = [0] * world
    with torch.inference_mode():
        while True:
            counts = torch.zeros(world, per + 1, dtype=torch.int64, device=device)
            counts[:, per] = CMD_NONE
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)  # waits, idle, for rank 0's next exchange
            cmd = int(recv_counts[0, per])
            if cmd == CMD_STOP:
                return
            if cmd == CMD_STATS:
                rows = torch.zeros(world, len(STATS_FIELDS), dtype=torch.float64, device=device)
                rows[0] = torch.tensor(STATS.as_row(), dtype=torch.float64)
                dist.all_to_all_single(torch.empty_like(rows), rows)
                continue
            if cmd not in experts:
                raise RuntimeError(f"rank 0 began an exchange for layer {cmd}, which has no routed experts here")
            STATS.add(_peer_bytes(counts, None), _peer_bytes(recv_counts, None), 0.0)  # a layer's counts: counted
            recv_sizes = recv_counts[:, :per].sum(1).tolist()
            recv = torch.empty(sum(recv_sizes), hidden, dtype=dtype, device=device)
            _a2a(recv, nothing, recv_sizes, zeros)
            done = _run_local(experts[cmd], recv, recv_counts[:, :per])
            _a2a(torch.empty(0, hidden, dtype=dtype, device=device), done, zeros, recv_sizes)
            STATS.layers += 1


def _command(cmd: int, per: int, device: Any) -> None:
    """Rank 0 (holding the lock) begins an exchange that is a command, not a layer."""
    world = dist.get_world_size()
    counts = torch.zeros(world, per + 1, dtype=torch.int64, device=device)
    counts[:, per] = cmd
    dist.all_to_all_single(torch.empty_like(counts), counts)


class ServingGroup:
    """Rank 0's side of an expert-parallel native engine: this process holds the model with
    its share of the experts and serves the requests; ``world - 1`` follower processes, started
    here, each hold one share of every MoE layer's routed experts (nothing else) and run them on
    the pairs rank 0 sends (:func:`follow`).

    The followers are started by MoE Bench, one :class:`~engines.launch.ManagedProcess` each (own
    log, killed with their process group, and by a watchdog if this process dies), with the same
    environment contract as torch's launcher (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, ``LOCAL_RANK``). ``torch.distributed.run`` itself cannot start them: rank 0 is
    this process (its generate, streams, batcher, routing hooks and profiler stay as they are), and
    the launcher starts every rank of its node itself."""

    def __init__(self, spec: str, world: int, accelerator: str, dtype: str, experts_impl: str | None = None,
                 trust_remote_code: bool = False) -> None:  # fmt: skip
        self.spec, self.world, self.accelerator, self.dtype = spec, world, accelerator, dtype
        self.experts_impl, self.trust_remote_code = experts_impl, trust_remote_code
        self.procs: list[Any] = []
        self.backend = "nccl" if accelerator == "cuda" else "gloo"
        self.per = 0
        self.device: Any = None
        self._open = False
        self._base: list[list[float]] | None = None

    def start(self, model: Any, progress: Any = None, timeout: float = 600.0) -> None:
        from datetime import timedelta

        from engines.errors import ConfigError, EngineUnavailable
        from engines.launch import ManagedProcess, free_port

        say = progress or (lambda msg, frac: None)
        if dist.is_initialized():
            raise ConfigError(
                "expert_parallel: this process already belongs to a torch.distributed group (another "
                "expert-parallel engine is running here); stop it first"
            )
        if reason := unsupported(model, self.world):
            raise ConfigError(reason)
        if self.accelerator == "cuda" and torch.cuda.device_count() < self.world:
            raise ConfigError(
                f"expert_parallel={self.world} on cuda needs {self.world} GPUs (one rank each); this machine has "
                f"{torch.cuda.device_count()}"
            )
        self.device = next(model.parameters()).device
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, self.world, is_master=True, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)  # fmt: skip
        for r in range(1, self.world):
            argv = [sys.executable, "-m", "engines.expert_parallel", "--follow", self.spec, "--dtype", self.dtype,
                    "--accelerator", self.accelerator]  # fmt: skip
            if self.experts_impl:
                argv += ["--experts-impl", self.experts_impl]
            if self.trust_remote_code:
                argv.append("--trust-remote-code")
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(self.world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MOEBENCH_EP_OWNER=str(os.getpid()))  # fmt: skip
            env.setdefault("OMP_NUM_THREADS", "1")
            self.procs.append(ManagedProcess(argv, name=f"ep-rank{r}", env=env).start())
        try:
            deadline = time.monotonic() + timeout
            waiting = set(range(1, self.world))
            said = 0
            while waiting:
                if said != len(waiting):
                    said = len(waiting)
                    say(f"expert parallel: waiting for {said} rank(s) to load their experts", 0.6)
                for r in sorted(waiting):
                    key = f"ready/{r}"
                    if store.check([key]):
                        value = store.get(key).decode()
                        if value != "ok":
                            raise EngineUnavailable(f"expert-parallel rank {r} failed: {value}")
                        waiting.discard(r)
                    elif (gone := _gone(r, self.procs[r - 1])) is not None:
                        raise EngineUnavailable(gone)
                if waiting and time.monotonic() > deadline:
                    raise EngineUnavailable(f"expert-parallel ranks {sorted(waiting)} not ready after {timeout:.0f} s")
                if waiting:
                    time.sleep(0.1)
            # Followers wait for work between runs for as long as the engine lives: no collective timeout
            # that an idle dashboard would run into; a rank that dies closes its sockets, which the peers see.
            dist.init_process_group(self.backend, store=store, rank=0, world_size=self.world,
                                    timeout=timedelta(days=7))  # fmt: skip
            self._open = True
            shard_experts(model, 0, self.world)
            self.per = int(model.model.layers[moe_layers(model)[0]].mlp.experts.num_experts)
        except BaseException:
            self.stop()
            raise

    def health(self) -> str | None:
        return next((gone for r, p in enumerate(self.procs, start=1) if (gone := _gone(r, p)) is not None), None)

    def stats(self) -> list[list[float]]:
        """Every rank's counters (rows in :data:`STATS_FIELDS` order; rank 0 first); [] where they
        cannot be asked for (the group closed or broken, an exchange still running after LOCK_WAIT_S)."""
        if not self._open or BROKEN or not EXCHANGE_LOCK.acquire(timeout=LOCK_WAIT_S):
            return []
        try:
            if BROKEN:
                return []
            _command(CMD_STATS, self.per, self.device)
            rows = torch.zeros(self.world, len(STATS_FIELDS), dtype=torch.float64, device=self.device)
            got = torch.empty_like(rows)
            dist.all_to_all_single(got, rows)
        except Exception as exc:  # noqa: BLE001 - a peer gone mid-command: no more collectives
            BROKEN.append(f"{type(exc).__name__} while reading the ranks' counters")
            return []
        finally:
            EXCHANGE_LOCK.release()
        got[0] = torch.tensor(STATS.as_row(), dtype=torch.float64)
        return got.cpu().tolist()

    def reset(self) -> None:
        """From now on :meth:`communication` counts (a run's measured window)."""
        self._base = self.stats() if self.health() is None else None

    def communication(self) -> dict[str, Any] | None:
        """What the ranks moved and how long it took since :meth:`reset`: per rank and in all."""
        if not self._open or self.health() is not None:
            return None
        now = self.stats()
        if not now:
            return None
        base = self._base or [[0.0] * len(STATS_FIELDS) for _ in now]
        ranks = []
        for r, (a, b) in enumerate(zip(now, base, strict=True)):
            d = dict(zip(STATS_FIELDS, (x - y for x, y in zip(a, b, strict=True)), strict=True))
            d = {"rank": r, **{f: int(d[f]) if f in ("calls", "sent_bytes", "recv_bytes", "layers") else d[f]
                               for f in STATS_FIELDS}}  # fmt: skip
            d["a2a_gbps"] = (d["sent_bytes"] + d["recv_bytes"]) / d["seconds"] / 1e9 if d["seconds"] > 0 else None
            ranks.append(d)
        zero = ranks[0]
        return {
            "world": self.world,
            "backend": self.backend,
            "layout": "rank 0 serves every request; ranks 1.. hold only their share of the routed experts",
            "moe_layer_exchanges": zero["layers"],
            "bytes": sum(r["sent_bytes"] for r in ranks),
            "bytes_per_exchange": (sum(r["sent_bytes"] for r in ranks) / zero["layers"]) if zero["layers"] else None,
            "rank0_comm_seconds": zero["seconds"],
            "ranks": ranks,
        }

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the followers (each ManagedProcess stop ends its whole process group) and leave the group."""
        if self._open:
            # An exchange still running (a request's generate past its cancel) gets LOCK_WAIT_S to end;
            # past that, or with the protocol broken or a rank gone, the followers are killed without a
            # word first, which ends any collective still waiting on them.
            told = False
            if self.health() is None and not BROKEN and EXCHANGE_LOCK.acquire(timeout=LOCK_WAIT_S):
                try:
                    if not BROKEN:
                        _command(CMD_STOP, self.per, self.device)
                        told = True
                except Exception:  # noqa: BLE001 - a peer already gone: the processes are killed below
                    pass
                finally:
                    EXCHANGE_LOCK.release()
            if not told:
                for p in self.procs:
                    p.stop()
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
            self._open = False
        deadline = time.monotonic() + timeout
        for p in self.procs:
            while p.exit_reason() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            p.stop()
        self.procs = []
        STATS.__init__()  # type: ignore[misc]
        BROKEN.clear()


def _gone(rank: int, proc: Any) -> str | None:
    """None while follower ``rank`` runs; else one line: how it ended and the last lines it wrote
    (not the command line its log begins with)."""
    if (why := proc.exit_reason()) is None:
        return None
    lines = [x for x in proc.tail(4) if x.strip() and not x.startswith("$ ")]
    said = ": " + " | ".join(lines)[-400:] if lines else ""
    return f"expert-parallel rank {rank}: {why.removeprefix(proc.name + ' ')}{said}"


def _follower_main(args: argparse.Namespace) -> int:
    """A follower rank (started by :class:`ServingGroup`): load, keep this rank's experts, follow."""
    from datetime import timedelta

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=600))
    try:
        from transformers.utils import logging as hf_logging

        from engines.accelerators import get_accelerator
        from engines.models import load_spec

        hf_logging.disable_progress_bar()
        acc = get_accelerator(args.accelerator)
        device = torch.device("cuda", rank) if args.accelerator == "cuda" else acc.device()
        dtype = acc.resolve_dtype(args.dtype)
        _, _, model, _ = load_spec(args.follow, device, dtype, trust_remote_code=args.trust_remote_code)
        if args.experts_impl:
            from engines import experts as lean

            if args.experts_impl == lean.NAME and (reason := lean.register()):
                raise RuntimeError(reason)
            model.set_experts_implementation(args.experts_impl)
        shard_experts(model, rank, world)
        mine = {i: model.model.layers[i].mlp.experts for i in moe_layers(model)}
        hidden = int(model.config.hidden_size)
        del model  # attention, dense layers, the head: rank 0's work
    except Exception as exc:  # noqa: BLE001 - rank 0 reports it in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        store.set(f"ready/{rank}", f"{type(exc).__name__}: {first}"[:500])
        return 1
    store.set(f"ready/{rank}", "ok")
    dist.init_process_group(args.backend or ("nccl" if args.accelerator == "cuda" else "gloo"), store=store,
                            rank=rank, world_size=world, timeout=timedelta(days=7))  # fmt: skip
    try:
        follow(mine, hidden, dtype, device)
    finally:
        dist.destroy_process_group()
    return 0


def _greedy(model: Any, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` greedy tokens (no cache: every rank runs the same number of forwards) and the
    first step's logits."""
    first = None
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids).logits
            first = logits if first is None else first
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert first is not None
    return ids, first


def check(model_dir: str, batch: int, seq: int, steps: int, seed: int) -> dict[str, Any] | None:
    """Under torchrun: the EP model's greedy tokens and logits against one process's (rank 0 returns
    the comparison, the others None)."""
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo")  # the check runs on the CPU (float32): exact within rounding
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        vocab = int(model.config.vocab_size)
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
        if batch % world:
            raise ValueError(f"batch {batch} does not split over {world} ranks")
        layers = shard_experts(model, rank, world)
        local = [int(model.model.layers[i].mlp.experts.gate_up_proj.shape[0]) for i in layers]
        t0 = time.perf_counter()
        tokens, logits = _greedy(model, ids[rank::world], steps)
        seconds = time.perf_counter() - t0
        parts = [torch.empty_like(logits) for _ in range(world)]
        dist.all_gather(parts, logits.contiguous())
        token_parts = [torch.empty_like(tokens) for _ in range(world)]
        dist.all_gather(token_parts, tokens.contiguous())
        stats = [None] * world
        dist.all_gather_object(stats, asdict(STATS))
        if rank != 0:
            return None
        full = torch.empty(batch, seq, vocab)
        full_tokens = torch.empty(batch, seq + steps, dtype=tokens.dtype)
        for r in range(world):
            full[r::world] = parts[r]
            full_tokens[r::world] = token_parts[r]
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        cross = [0]  # (token, expert) pairs whose expert lives on another rank than the token, by the reference

        def count(module: Any, args: Any, out: Any) -> None:
            b, s = args[0].shape[:2]
            owner = out[2] // (int(module.num_experts) // world)  # [b*s, k]
            token_rank = (torch.arange(b * s) // s % world).unsqueeze(1)
            cross[0] += int((owner != token_rank).sum())

        hooks = [ref.model.layers[i].mlp.gate.register_forward_hook(count) for i in layers]
        ref_tokens, ref_logits = _greedy(ref, ids, steps)
        for h in hooks:
            h.remove()
        return {
            "world": world,
            "batch": [batch, seq],
            "steps": steps,
            "moe_layers": layers,
            "experts_per_rank": local,
            "max_abs_diff": float((full - ref_logits).abs().max()),
            "max_abs_logit": float(ref_logits.abs().max()),
            "same_greedy_tokens": bool(torch.equal(full_tokens, ref_tokens)),
            "seconds": seconds,
            "cross_rank_pairs": cross[0],
            "comm": stats,
        }
    finally:
        dist.barrier()
        dist.destroy_process_group()


SWEEP_MIN_BYTES = 4096  # the sweep's first (smallest) message to each peer; it grows 4x a step


def sweep(accelerator: str, max_bytes: int, iters: int) -> list[dict[str, Any]] | None:
    """Under torchrun: ``all_to_all_single`` of growing sizes between the ranks (each rank sends
    ``size`` bytes to every other rank), timed between barriers. Rank 0 returns one row per size;
    algbw = bytes one rank sends to the others / time, busbw = algbw x n/(n-1)... as nccl-tests
    define it for all-to-all (busbw = algbw x (n-1)/n of what each rank moves, itself included)."""
    from datetime import timedelta

    backend = "nccl" if accelerator == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if accelerator == "cuda" else None
    if device is not None:
        torch.cuda.set_device(device)
    rows = []
    try:
        size = SWEEP_MIN_BYTES
        while size <= max_bytes:
            per = size // 4  # float32 values per destination
            inp = torch.ones(world * per, dtype=torch.float32, device=device)
            out = torch.empty_like(inp)
            for _ in range(2):  # warm-up: connections, buffers
                dist.all_to_all_single(out, inp)
            _sync(out)
            dist.barrier()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.all_to_all_single(out, inp)
                _sync(out)
                times.append(time.perf_counter() - t0)
            t = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's median
            seconds = float(t.item())
            peer = size * (world - 1)  # bytes one rank sends to the others (and receives from them)
            rows.append({
                "bytes_per_peer": size,
                "median_us": seconds * 1e6,
                "algbw_gb_s": size * world / seconds / 1e9,  # nccl-tests: the rank's whole buffer / time
                "busbw_gb_s": size * world / seconds / 1e9 * (world - 1) / world,
                "peer_gb_s_both_ways": 2 * peer / seconds / 1e9,  # sent + received, as a link's datasheet counts
            })  # fmt: skip
            size *= 4
        device_name = torch.cuda.get_device_name(device) if device is not None else "cpu"
        return [{"world": world, "backend": backend, "device": device_name, **r} for r in rows] if rank == 0 else None
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", metavar="MODEL_DIR", help="compare EP with one process on this checkpoint")
    mode.add_argument("--follow", metavar="MODEL", help="(started by the engine) a follower rank of this model")
    mode.add_argument("--sweep", action="store_true", help="all-to-all bandwidth between the ranks, by size")
    ap.add_argument("--max-mib", type=float, default=16.0, help="--sweep: the largest message to each peer (MiB)")
    ap.add_argument("--iters", type=int, default=10, help="--sweep: timed repetitions per size")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--experts-impl", default=None)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--trust-remote-code", action="store_true")
    args = ap.parse_args(argv)
    if args.follow:
        return _follower_main(args)
    if args.sweep:
        rows = sweep(args.accelerator, int(args.max_mib * 2**20), args.iters)
        for row in rows or []:
            print("EP-SWEEP " + json.dumps(row), flush=True)
        return 0
    torch.set_num_threads(1)
    out = check(args.check, args.batch, args.seq, args.steps, args.seed)
    if out is not None:
        print("EP-CHECK " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

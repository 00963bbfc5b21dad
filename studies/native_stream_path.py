"""Does the native engine's streaming path keep up with a fast GPU step? (No GPU needed.)

With ``cuda_graphs`` the native engine's decode step is one graph replay; what remains on the
host each step is streaming that step's tokens: each row's token to its own queue, each
request's consumer thread turning it into a chunk, the runner timing it. This benchmark puts a
stand-in decoder in place of :class:`engines.graphs.GraphedDecoder` whose "GPU step" takes a
fixed ``step_ms`` (a wait, during which the host is free, as while a real graph replays), and
measures, through the CLI's own runner (``start_run``, concurrency = batch, 128 in / 64 out),
the ms per step the requests saw (ITL p50 / p90 / p99) and output tok/s against the ideal
``batch x 1000 / step_ms``.

Two loops, as the real decoder has them:
- ``sync`` (``pipeline=False``): the step's tokens are streamed, then the next step is
  launched: each step costs ``step_ms`` + the host's streaming.
- ``pipelined`` (the default): the next step is launched before this step's tokens are
  streamed, so the streaming overlaps it: a step costs max(``step_ms``, host).

Rounds alternate the order (ABBA). ``host ms`` is the decoder thread's own time in
``on_step`` per step (the consumers' work runs on their threads, beside it). Figures, not a
test: the exit status is 0 whatever they are. Usage::

    python studies/native_stream_path.py [--batches 1,32,128] [--step-ms 0,5,10,20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine

OUTPUT_LEN = 64


class StandInDecoder:
    """``GraphedDecoder.decode``'s contract with a fixed-time "GPU step" and no model."""

    captures = 0
    capture_s = 0.0
    compile_mode = "off"  # nothing compiled, so no shape past torch's recompile limit
    uncompiled: frozenset[tuple[int, int]] = frozenset()

    def __init__(self, step_ms: float, pipeline: bool) -> None:
        self.step_s = step_ms / 1000.0
        self.pipeline = pipeline
        self.host_s: list[float] = []  # time in on_step, per step

    def prepare(self, sizes: Iterable[int], width: int, max_new: int, progress: Any = None) -> None:
        """Nothing to compile or capture: a stand-in step takes its fixed time from the first call."""

    def decode(
        self,
        prompts: list[list[int]],
        pad: int,
        max_new: int,
        on_step: Callable[[list[int]], Any],
        done: Callable[[], bool] = lambda: False,
        suppress: Iterable[int] = (),
        temperature: float = 0.0,
        top_p: float = 1.0,
        keep_logits: bool = False,
    ) -> list[Any]:
        tokens = [100 + i for i in range(len(prompts))]

        def launch(after: float) -> float:
            """Queue a step behind the one ending at ``after``: when it will end. The GIL is let go
            once, as a real replay lets it go (the consumers' threads may take it then)."""
            time.sleep(0)
            return max(time.perf_counter(), after) + self.step_s

        ready = time.perf_counter()  # step 0's tokens come from the prompt's forward
        for k in range(max_new):
            ahead = launch(ready) if self.pipeline and k + 1 < max_new else None
            wait = ready - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            t = time.perf_counter()
            on_step(tokens)
            self.host_s.append(time.perf_counter() - t)
            if done() or k + 1 == max_new:
                break
            ready = ahead if ahead is not None else launch(time.perf_counter())
        return []


def measure(engine: Any, store: Store, batch: int, step_ms: float, pipeline: bool) -> dict[str, Any]:
    dec = StandInDecoder(step_ms, pipeline)
    engine._graphed = dec
    cfg = RunConfig.build(
        engine={"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "batch_size": batch},
        mode="concurrency",
        workload={"source": "random", "input_len": 128, "output_len": OUTPUT_LEN},
        requests=batch,
        concurrency=batch,
        warmup=0,
        name=f"stream-path-b{batch}-{step_ms}ms-{'pipelined' if pipeline else 'sync'}",
    )
    snap = start_run(cfg, store, engine=engine).wait(600)
    s = snap.summary
    if snap.status != "completed" or s is None:
        raise RuntimeError(f"run {snap.status}: {snap.error}")
    if s.completed != batch or s.output_tokens != batch * OUTPUT_LEN:
        raise RuntimeError(f"{s.completed}/{batch} requests, {s.output_tokens} tokens: the stream lost some")
    return {
        "itl_p50": s.itl_ms.p50,
        "itl_p90": s.itl_ms.p90,
        "itl_p99": s.itl_ms.p99,
        "tok_s": s.output_throughput_tok_s,
        "host_ms": 1000 * statistics.median(dec.host_s) if dec.host_s else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--step-ms", default="0,5,10,20")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    steps = [float(s) for s in args.step_ms.split(",")]
    engine = create_engine(
        {"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu", "batch_size": max(batches),
         "batch_wait_ms": 200, "record_routing": False}
    )  # fmt: skip
    engine.start()
    tmp = tempfile.TemporaryDirectory(prefix="stream-path-")  # the runs are not kept
    store = Store(Path(tmp.name) / "runs.sqlite")
    got: dict[tuple[int, float, bool], list[dict[str, Any]]] = {}
    try:
        for r in range(args.rounds):
            for batch in batches:
                engine._batcher.batch_size = batch
                for step_ms in steps:
                    order = (False, True) if r % 2 == 0 else (True, False)  # ABBA
                    for pipeline in order:
                        m = measure(engine, store, batch, step_ms, pipeline)
                        got.setdefault((batch, step_ms, pipeline), []).append(m)
                        print(f"round {r + 1} b={batch} step {step_ms:g} ms {'pipelined' if pipeline else 'sync'}: "
                              f"ITL p50 {m['itl_p50']:.2f} p99 {m['itl_p99']:.2f} ms, {m['tok_s']:,.0f} tok/s, "
                              f"host {m['host_ms']:.2f} ms/step", flush=True)  # fmt: skip
    finally:
        engine.stop()
        tmp.cleanup()
    print(f"\n{args.rounds} rounds, ABBA; figures: median over rounds [min-max]\n")
    print("| batch | GPU step ms | loop | ITL p50 ms | ITL p90 | ITL p99 | output tok/s | of ideal | host ms/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (batch, step_ms, pipeline), ms in sorted(got.items()):

        def med(key: str, ms: list[dict[str, Any]] = ms) -> str:
            vals = [m[key] for m in ms]
            return f"{statistics.median(vals):,.2f} [{min(vals):,.2f}-{max(vals):,.2f}]"

        tok = [m["tok_s"] for m in ms]
        ideal = f"{statistics.median(tok) / (batch * 1000 / step_ms):.0%}" if step_ms else "-"
        loop = "pipelined" if pipeline else "sync"
        print(
            f"| {batch} | {step_ms:g} | {loop} | {med('itl_p50')} | {med('itl_p90')} | {med('itl_p99')} | "
            f"{statistics.median(tok):,.0f} [{min(tok):,.0f}-{max(tok):,.0f}] | {ideal} | {med('host_ms')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The openai engine against an SGLang server: its reported deployment shape and its expert
distribution recorder.

SGLang does not run on this machine (it needs a GPU build), so the server here is a stand-in
that keeps SGLang's contract as its source defines it (python/sglang/srt/eplb/expert_distribution.py,
http_server.py): ``/get_server_info`` with the server arguments, the three recorder endpoints,
and a ``stat`` dump written with ``torch.save`` as ``expert_distribution_recorder_<time>.pt``
holding ``logical_count`` (steps x layers x experts) into its recorder folder. It streams
completions with the zero-compute stub's own application. Its "routing" is arithmetic (each
token of a recorded request goes to experts (seq + j) % E), so the test knows every count.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.config import RunConfig
from bench.run.manager import start_run
from bench.store import Store
from engines.base import create_engine
from engines.errors import EngineUnavailable
from engines.launch import free_port

LAYERS, EXPERTS, TOP_K = 3, 8, 2


class SGLangStandIn:
    def __init__(self, folder: Path, recorder_mode: str | None = "stat") -> None:
        self.folder, self.mode = folder, recorder_mode
        self.recording = False
        self.steps: list[list[list[int]]] = []  # one layers x experts matrix per recorded request
        self.seq = 0

    def app(self) -> Any:
        from aiohttp import web

        from bench.stub_server import make_app

        app = make_app(model="tiny-deepseek-v3")

        @web.middleware
        async def count(request: web.Request, handler: Any) -> Any:
            if request.path.startswith("/v1/") and request.method == "POST" and self.recording:
                body = await request.json()
                tokens = len(str(body.get("prompt", "")).split()) + int(body.get("max_tokens", 0))
                step = [[0] * EXPERTS for _ in range(LAYERS)]
                for layer in range(LAYERS):
                    for j in range(tokens * TOP_K):
                        step[layer][(self.seq + j) % EXPERTS] += 1
                self.steps.append(step)
                self.seq += 1
            return await handler(request)

        app.middlewares.append(count)

        async def info(request: web.Request) -> web.Response:
            return web.json_response(
                {"tp_size": 4, "dp_size": 2, "pp_size": 1, "ep_size": 4, "enable_dp_attention": True, "nnodes": 1,
                 "expert_distribution_recorder_mode": self.mode, "version": "stand-in"}
            )  # fmt: skip

        async def start(request: web.Request) -> web.Response:
            self.recording, self.steps = True, []
            return web.Response(text="Start recording the expert distribution.")

        async def stop(request: web.Request) -> web.Response:
            self.recording = False
            return web.Response(text="Stop recording the expert distribution.")

        async def dump(request: web.Request) -> web.Response:
            import torch

            count = torch.tensor(self.steps or [[[0] * EXPERTS] * LAYERS], dtype=torch.int32)
            torch.save({"rank": 0, "logical_count": count, "average_utilization_rate_over_window": None},
                       self.folder / f"expert_distribution_recorder_{time.time()}.pt")  # fmt: skip
            return web.Response(text="Dump expert distribution record.")

        app.router.add_get("/get_server_info", info)
        app.router.add_post("/start_expert_distribution_record", start)
        app.router.add_post("/stop_expert_distribution_record", stop)
        app.router.add_post("/dump_expert_distribution_record", dump)
        return app


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start a stand-in on a free port in a thread: ``serve(stand_in) -> base_url``."""
    from aiohttp import web

    stops: list[Any] = []

    def start(stand_in: SGLangStandIn) -> str:
        port = free_port()
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def main() -> None:
            runner = web.AppRunner(stand_in.app())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            stops.append((loop, runner))
            ready.set()

        threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True).start()
        assert ready.wait(10)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for loop, runner in stops:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


def test_a_run_records_the_servers_shape_and_its_expert_distribution(
    serve: Any, tmp_path: Path, store: Store, tiny_model: Path
) -> None:
    stand_in = SGLangStandIn(tmp_path)
    url = serve(stand_in)
    cfg = RunConfig.build(
        engine={"kind": "openai", "base_url": url, "model": "tiny-deepseek-v3", "tokenizer": str(tiny_model),
                "sglang_expert_distribution_dir": str(tmp_path)},
        mode="concurrency", requests=12, concurrency=3, warmup=2, device_telemetry=False, server_metrics=False,
        workload={"source": "random", "input_len": 16, "output_len": 8},
    )  # fmt: skip
    snap = start_run(cfg, store).wait(120)
    assert snap.status == "completed", snap.error
    run = store.get_run(snap.run_id)  # type: ignore[arg-type]
    shape = run.engine_info["deployment"]  # type: ignore[union-attr]
    assert (shape["tensor_parallel_size"], shape["data_parallel_size"], shape["expert_parallel_size"]) == (4, 2, 4)
    assert shape["dp_attention"] is True and "SGLang" in shape["source"]
    routing = store.artifact(snap.run_id, "expert_routing")  # type: ignore[arg-type]
    assert routing is not None and routing["num_experts"] == EXPERTS and len(routing["counts"]) == LAYERS
    # the measured requests only (the 2 warm-up requests went before the recorder started)
    assert len(stand_in.steps) == 12
    expected = [[sum(step[layer][e] for step in stand_in.steps) for e in range(EXPERTS)] for layer in range(LAYERS)]
    assert routing["counts"] == expected
    assert routing["top_k"] == TOP_K == 2  # from the tokenizer folder's config.json (num_experts_per_tok)
    assert routing["tokens"][0] == sum(expected[0]) // TOP_K
    assert all(v is not None and v >= 1.0 for v in routing["imbalance"])


def test_what_cannot_record_is_refused_in_one_line(serve: Any, tmp_path: Path) -> None:
    from bench.stub_server import start_stub_server

    plain_url, stub = start_stub_server()
    try:
        engine = create_engine(
            {"kind": "openai", "base_url": plain_url, "sglang_expert_distribution_dir": str(tmp_path)}
        )
        with pytest.raises(EngineUnavailable, match="is not an SGLang server"):
            engine.start()
        plain = create_engine({"kind": "openai", "base_url": plain_url})
        plain.start()
        assert "deployment" not in plain.describe()  # a server that reports no shape: none recorded
    finally:
        stub.stop()
    off = serve(SGLangStandIn(tmp_path, recorder_mode=None))
    engine = create_engine({"kind": "openai", "base_url": off, "sglang_expert_distribution_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="--expert-distribution-recorder-mode stat") as err:
        engine.start()
    assert "\n" not in str(err.value)
    on = serve(SGLangStandIn(tmp_path))
    engine = create_engine({"kind": "openai", "base_url": on, "sglang_expert_distribution_dir": str(tmp_path / "no")})
    with pytest.raises(EngineUnavailable, match="is not a folder on this machine"):
        engine.start()

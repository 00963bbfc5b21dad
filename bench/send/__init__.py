"""Sending: schedules (:mod:`~bench.send.schedule`, pure and fake-clock tested), the asyncio sending
core (:mod:`~bench.send.core`), the processes it runs in (:mod:`~bench.send.processes`) and Ray actors
on a cluster (:mod:`~bench.send.ray`). :func:`make_sender` picks one for an engine; the run wing
(:mod:`bench.run`) is its only caller."""

from __future__ import annotations

from typing import Any

from bench.send.processes import InProcessSender, ProcessSender
from engines.base import Engine
from engines.errors import MoEBenchError


def make_sender(engine: Engine, workers: int, ray_address: str | None = None) -> Any:
    """Sender processes for engines that can be reached from another process, else in-process;
    Ray actors on the cluster at ``ray_address`` where one is given (:mod:`bench.send.ray`)."""
    spec = engine.sender_spec()
    if ray_address:
        if spec is None:
            raise MoEBenchError(
                f"ray_address: the {engine.kind} engine sends from the process that loaded the model; "
                "Ray load generation applies to engines reached over HTTP"
            )
        from bench.send.ray import RaySender

        return RaySender(spec, workers, ray_address)
    if spec is None:
        if workers > 1:
            raise MoEBenchError(
                f"the {engine.kind} engine sends from the process that loaded the model; "
                "workers > 1 applies to HTTP engines"
            )
        return InProcessSender(engine)
    return ProcessSender(spec, workers)

"""The names of the artifacts a run stores beside its records (:meth:`bench.store.Store.put_artifact`)."""

from bench.store import ARTIFACT_TRACE  # defined beside the store, which guards the trace's path

__all__ = ["ARTIFACT_TRACE"]

# Artifact names in the store
ARTIFACT_OPERATORS = "profile_operators"
ARTIFACT_BREAKDOWN = "profile_breakdown"
ARTIFACT_ROUTING = "expert_routing"
ARTIFACT_ROUTING_ERROR = "expert_routing_error"  # {"error": why} when a server's routing could not be read
# {"sources": [{"source", "name"}], "missing": [reason, ...], "devices": ["dev0: NVIDIA H200 (nvml)", ...]}
ARTIFACT_DEVICE_TELEMETRY = "device_telemetry"
ARTIFACT_LOAD_GENERATORS = "load_generators"  # Ray runs: each sender actor's node, pid, clock offset
ARTIFACT_LIMITS = "limits"  # bench.metrics.run_limits.RunLimits.as_dict(), or {"reason": why there is none}
ARTIFACT_GC = "gc_pauses"  # bench.run.gc_watch.GcWatch.as_dict(): this process's GC pauses during the run
ARTIFACT_ENERGY = "energy"  # bench.metrics.energy.energy_of_run: per device, or {"reason": why there is none}
ARTIFACT_PREPARE = "engine_prepare"  # {"text", "seconds"}: what the engine did before the clock (graphs captured)
ARTIFACT_COMMUNICATION = "communication"  # engines.expert_parallel.ServingGroup.communication(): per rank, over the run
ARTIFACT_CLIENT_CPU = "client_cpu"  # bench.send.cpu_wait.combine: the sending loops' CPU and run-queue wait

"""The names of the artifacts a run stores beside its records (:meth:`bench.store.Store.put_artifact`),
declared with the store's file layout (bench/store/layout.py) and read here by the run wing."""

from bench.store.layout import (
    ARTIFACT_BREAKDOWN,
    ARTIFACT_CLIENT_CPU,
    ARTIFACT_COMMUNICATION,
    ARTIFACT_DEVICE_TELEMETRY,
    ARTIFACT_ENERGY,
    ARTIFACT_GC,
    ARTIFACT_LIMITS,
    ARTIFACT_LOAD_GENERATORS,
    ARTIFACT_OPERATORS,
    ARTIFACT_PREPARE,
    ARTIFACT_ROUTING,
    ARTIFACT_ROUTING_ERROR,
    ARTIFACT_TRACE,
)

__all__ = [
    "ARTIFACT_BREAKDOWN",
    "ARTIFACT_CLIENT_CPU",
    "ARTIFACT_COMMUNICATION",
    "ARTIFACT_DEVICE_TELEMETRY",
    "ARTIFACT_ENERGY",
    "ARTIFACT_GC",
    "ARTIFACT_LIMITS",
    "ARTIFACT_LOAD_GENERATORS",
    "ARTIFACT_OPERATORS",
    "ARTIFACT_PREPARE",
    "ARTIFACT_ROUTING",
    "ARTIFACT_ROUTING_ERROR",
    "ARTIFACT_TRACE",
]

"""The project's exception family: every error a user can cause carries a one-line reason.

Pages show ``str(exc)`` with ``st.error``; the CLI prints it and exits non-zero.
"""

from __future__ import annotations


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` (a string, or an exception's ``str``) on one line, whitespace runs collapsed;
    cut to ``limit`` characters with a trailing ``...`` when longer."""
    flat = " ".join(str(text).split())
    if limit is not None and len(flat) > limit:
        return flat[: max(limit - 3, 0)] + "..."
    return flat


class MoEBenchError(Exception):
    """Base class: ``str(exc)`` is a one-line reason fit to show a user."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(MoEBenchError):
    """A run or engine configuration is invalid (bad number, unknown kind, ...)."""


class UnknownEngine(ConfigError):
    """An engine kind that is not registered."""


class EngineUnavailable(MoEBenchError):
    """The engine's package or server is not there (e.g. vLLM not installed)."""


class AcceleratorUnavailable(MoEBenchError):
    """The requested accelerator is missing on this machine."""


class ModelLoadError(MoEBenchError):
    """The model could not be found or loaded."""


class RequestFailed(MoEBenchError):
    """One request failed; the run records it and goes on."""


class ServerUnreachable(RequestFailed):
    """A request could not connect to its server at all (refused, no route, name not found)."""


class WorkloadError(MoEBenchError):
    """A workload (prompt set, uploaded JSONL) is invalid."""

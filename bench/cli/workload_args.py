"""Command-line flags for the workload shapes: length distributions, shared prefixes,
multi-turn sessions and ShareGPT options.

``bench.cli`` adds them to a run parser with :func:`add_workload_arguments` and merges
:func:`workload_overrides` into the run's ``workload``. Help texts and choices come
from :class:`bench.workloads.WorkloadSpec`'s fields, so they are stated once.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from bench.workloads import WorkloadSpec

# (flag, WorkloadSpec field, argparse type); choices come from the field's Literal
_FLAGS: tuple[tuple[str, str, type], ...] = (
    ("--input-dist", "input_dist", str),
    ("--input-min", "input_min", int),
    ("--input-max", "input_max", int),
    ("--input-std", "input_std", float),
    ("--output-dist", "output_dist", str),
    ("--output-min", "output_min", int),
    ("--output-max", "output_max", int),
    ("--output-std", "output_std", float),
    ("--prefix-groups", "prefix_groups", int),
    ("--prefix-len", "prefix_len", int),
    ("--sessions", "sessions", int),
    ("--turns", "turns", int),
    ("--sharegpt-output-len", "sharegpt_output_len", str),
    ("--sharegpt-max-len", "sharegpt_max_len", int),
    ("--trace-format", "trace_format", str),
    ("--time-scale", "time_scale", float),
)


def _help(field: str) -> str:
    """The field's description (argparse's % escaped) and its default, if it has one."""
    info = WorkloadSpec.model_fields[field]
    text = (info.description or "").replace("%", "%%")
    return text if info.default is None else f"{text} (default {info.default})"


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the workload-shape flags (each defaults to unset: the field's own default applies)."""
    group = parser.add_argument_group(
        "workload shape",
        "length distributions (random, shared_prefix, multi_turn), prefixes, sessions, ShareGPT, traces",
    )
    for flag, field, kind in _FLAGS:
        choices = get_args(WorkloadSpec.model_fields[field].annotation) if kind is str else None
        group.add_argument(flag, dest=field, type=kind, default=None, choices=choices or None, help=_help(field))


def workload_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The WorkloadSpec fields whose flags were given, to merge into the run's workload."""
    return {field: getattr(args, field) for _, field, _ in _FLAGS if getattr(args, field, None) is not None}

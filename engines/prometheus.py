"""Prometheus text-format parsing for server telemetry (vLLM, Triton, LMDeploy)."""

from __future__ import annotations


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over their labels: ``{name: value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.rpartition("}") if "}" in line else ("", "", line)
        if name_part:
            name = name_part.split("{", 1)[0]
            fields = rest.split()
        else:
            parts = line.split()
            name, fields = parts[0], parts[1:]
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out

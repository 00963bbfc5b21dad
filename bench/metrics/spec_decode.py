"""Speculative decoding (MTP, EAGLE, n-gram) figures of a run, from the server's own counters.

vLLM counts, cumulatively since it started, the drafts it proposed, the draft tokens in them,
the draft tokens the target model accepted, and the accepted tokens at each draft position
(``vllm:spec_decode_*``; :data:`engines.base.SERIES_SPEC_DRAFTS` and its neighbours name them
in a run's series). A run reads them just before its first request and after its last
(:class:`bench.run.recorder.Sampler`'s first and closing points), so the figures are the
run's own deltas, as ``vllm bench serve`` computes them after a run:

- acceptance rate = accepted / draft tokens;
- acceptance length = 1 + accepted / drafts (the verified token and the accepted ones);
- acceptance at position k = accepted at k / drafts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engines.base import SERIES_SPEC_ACCEPTED, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_DRAFTS, SERIES_SPEC_POS

MAX_POSITIONS = 64


def spec_series_names() -> list[str]:
    """The series a run's speculative-decoding figures are read from."""
    return [SERIES_SPEC_DRAFTS, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_ACCEPTED] + [
        f"{SERIES_SPEC_POS}{k}" for k in range(MAX_POSITIONS)
    ]


def spec_fields(points: Iterable[tuple[float, str, float | None]]) -> dict[str, Any]:
    """The summary's ``spec_*`` fields from a run's series points (t, name, value), in time order:
    each counter's last value less its first. Empty when the server reports no drafts, or none
    proposed during the run (a counter that went down: the server restarted, no figure)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for _, name, value in points:
        if value is None:
            continue
        first.setdefault(name, value)
        last[name] = value

    def delta(name: str) -> float | None:
        if name not in first:
            return None
        d = last[name] - first[name]
        return d if d >= 0 else None

    drafts, tokens, accepted = (delta(n) for n in (SERIES_SPEC_DRAFTS, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_ACCEPTED))
    if drafts is None or tokens is None or accepted is None or tokens <= 0 or drafts <= 0:
        return {}
    per_pos: list[float] = []
    for k in range(MAX_POSITIONS):
        d = delta(f"{SERIES_SPEC_POS}{k}")
        if d is None:
            break
        per_pos.append(d / drafts)
    return {
        "spec_drafts": drafts,
        "spec_draft_tokens": tokens,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / tokens,
        "spec_acceptance_length": 1.0 + accepted / drafts,
        "spec_accepted_per_pos": tuple(per_pos) or None,
    }

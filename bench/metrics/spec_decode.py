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

The counters are the server's word, so they are checked before any figure is made
(:func:`spec_refusal`): a counter that is not a finite count under :data:`SPEC_COUNTER_MAX`,
more accepted tokens than draft tokens, fewer draft tokens than drafts, or more accepted at a
position than drafts leaves every figure out (None), with a one-line reason.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from engines.base import SERIES_SPEC_ACCEPTED, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_DRAFTS, SERIES_SPEC_POS

MAX_POSITIONS = 64
# A speculative-decoding counter above this is not a count: 2**53, the largest a float counts
# exactly (a server running 10 M tokens/s reaches it after 28 years); 1e308 printed 300 digits.
SPEC_COUNTER_MAX = 2.0**53

log = logging.getLogger(__name__)


def spec_series_names() -> list[str]:
    """The series a run's speculative-decoding figures are read from."""
    return [SERIES_SPEC_DRAFTS, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_ACCEPTED] + [
        f"{SERIES_SPEC_POS}{k}" for k in range(MAX_POSITIONS)
    ]


def spec_fields(points: Iterable[tuple[float, str, float | None]]) -> dict[str, Any]:
    """The summary's ``spec_*`` fields from a run's series points (t, name, value), in time order:
    each counter's last value less its first. Empty when the server reports no drafts, or none
    proposed during the run (a counter that went down: the server restarted, no figure), or when
    its counters are refused (:func:`spec_figures` says why; the reason is logged here)."""
    fields, why = spec_figures(points)
    if why is not None:
        log.warning("speculative-decoding figures left out: %s", why)
    return fields


def spec_figures(points: Iterable[tuple[float, str, float | None]]) -> tuple[dict[str, Any], str | None]:
    """(:func:`spec_fields`' fields, None), or ({}, one-line reason) when the server's counters
    cannot be believed (:func:`spec_refusal`)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for _, name, value in points:
        if value is None:
            continue
        if not math.isfinite(value) or abs(value) > SPEC_COUNTER_MAX:
            return {}, f"the server's counter {name} reads {value:.3g}, not a count (over {SPEC_COUNTER_MAX:.3g})"
        first.setdefault(name, value)
        last[name] = value

    def delta(name: str) -> float | None:
        if name not in first:
            return None
        d = last[name] - first[name]
        return d if d >= 0 else None

    drafts, tokens, accepted = (delta(n) for n in (SERIES_SPEC_DRAFTS, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_ACCEPTED))
    if drafts is None or tokens is None or accepted is None or tokens <= 0 or drafts <= 0:
        return {}, None
    per_pos: list[float] = []
    for k in range(MAX_POSITIONS):
        d = delta(f"{SERIES_SPEC_POS}{k}")
        if d is None:
            break
        per_pos.append(d)
    why = spec_refusal(drafts, tokens, accepted, per_pos)
    if why is not None:
        return {}, why
    return {
        "spec_drafts": drafts,
        "spec_draft_tokens": tokens,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / tokens,
        "spec_acceptance_length": 1.0 + accepted / drafts,
        "spec_accepted_per_pos": tuple(d / drafts for d in per_pos) or None,
    }, None


def spec_refusal(drafts: float, tokens: float, accepted: float, per_pos: list[float]) -> str | None:
    """Why a run's counter deltas (drafts, draft tokens, accepted tokens, accepted at each
    position) cannot be speculative decoding, or None: a draft proposes at least one token and
    no more can be accepted than were proposed, overall or at a position."""
    if accepted > tokens:
        return f"the server counts {accepted:.0f} accepted of {tokens:.0f} draft tokens: more accepted than proposed"
    if tokens < drafts:
        return f"the server counts {tokens:.0f} draft tokens in {drafts:.0f} drafts: fewer than one a draft"
    for k, d in enumerate(per_pos):
        if d > drafts:
            return f"the server counts {d:.0f} accepted at draft position {k} of {drafts:.0f} drafts: more than drafted"
    return None

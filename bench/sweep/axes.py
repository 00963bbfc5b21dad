"""Parsing the values of a sweep axis: number lists (``1,2,4``, ``1..32``, ``8..64+8``) and
input:output length pairs. Used by the CLI's flags (as argparse types) and the dashboard's Sweep page."""

from __future__ import annotations

import argparse
from typing import Any


def number_list(kind: type, name: str) -> Any:
    """A list flag: ``1,2,4``; ``1..32`` (doubling: 1,2,4,...,32); ``8..64+8`` (8,16,...,64)."""

    def parse(text: str) -> list[Any]:
        out: list[Any] = []
        try:
            for part in text.split(","):
                part = part.strip()
                if ".." in part:
                    lo_s, _, rest = part.partition("..")
                    hi_s, plus, step_s = rest.partition("+")
                    lo, hi = kind(lo_s), kind(hi_s)
                    if not 0 < lo <= hi:
                        raise ValueError
                    x = lo
                    while x <= hi * (1 + 1e-9):
                        out.append(x)
                        x = x + kind(step_s) if plus else x * 2
                        if plus and kind(step_s) <= 0:
                            raise ValueError
                    if len(out) > 1000:
                        raise ValueError
                else:
                    out.append(kind(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--{name} takes numbers above 0 like 1,2,4 or 1..32 or 8..64+8, got '{text}'"
            ) from None
        if not out or any(x <= 0 for x in out):
            raise argparse.ArgumentTypeError(f"--{name} takes numbers above 0, got '{text}'")
        return sorted(set(out))

    return parse


def length_pairs(text: str) -> list[tuple[int, int]]:
    """``128:64,512:128`` -> [(128, 64), (512, 128)] (``--lengths``)."""
    out = []
    for part in text.split(","):
        a, sep, b = part.strip().partition(":")
        try:
            pair = (int(a), int(b))
        except ValueError:
            pair = (0, 0)
        if not sep or min(pair) < 1:
            raise argparse.ArgumentTypeError(f"--lengths takes IN:OUT token pairs like 128:64,512:128, got '{text}'")
        out.append(pair)
    return out

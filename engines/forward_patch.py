"""Swapping a module's ``forward`` for one of MoE Bench's and back (``mla=absorbed``,
``router=lean``): the instance attribute shadows the class's forward, a marker attribute says
it is ours, and deleting the attribute restores the class's."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any


def wrapped_by_others(module: Any, marker: str) -> bool:
    """The module's forward is already replaced by someone else (e.g. accelerate's offloading
    hooks): setting ours would skip theirs."""
    return "forward" in module.__dict__ and not getattr(module, marker, False)


def set_forward(modules: Iterable[Any], forward: Callable[..., Any], marker: str, on: bool) -> int:
    """``forward`` on (bound to each module) or off (the class's again); how many were changed."""
    changed = 0
    for m in modules:
        if on and not getattr(m, marker, False):  # callers refuse a forward wrapped by others first
            m.forward = types.MethodType(forward, m)
            setattr(m, marker, True)
            changed += 1
        elif not on and getattr(m, marker, False):
            del m.forward
            setattr(m, marker, False)
            changed += 1
    return changed


def is_set(modules: Iterable[Any], marker: str) -> bool:
    return any(getattr(m, marker, False) for m in modules)

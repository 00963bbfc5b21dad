"""Fixtures shared by the native engine's option tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def alone3(tiny_model: Path) -> Iterator[list[Any]]:
    """The first three prompts of ``test_native_tuning.PROMPTS``, each generated on its own by the
    default engine (eager, transformers' MLA and experts): the reference the options must give."""
    from tests.engines.test_native_tuning import PROMPTS, _generate, _start

    engine = _start()
    out: list[Any] = [None] * len(PROMPTS)
    for i in range(3):
        _generate(engine, i, out)
    engine.stop()
    yield out

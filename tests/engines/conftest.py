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
    from tests.engines.test_native_tuning import _first_three, _start

    engine = _start()
    out = _first_three(engine, batched=False)
    engine.stop()
    yield out

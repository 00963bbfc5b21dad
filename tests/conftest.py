"""Shared fixtures: an isolated data folder, the real tiny model built once, a started native engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def moebench_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test session gets its own MOEBENCH_DATA_DIR (models, databases)."""
    root = tmp_path_factory.mktemp("moebench-data")
    old = os.environ.get("MOEBENCH_DATA_DIR")
    os.environ["MOEBENCH_DATA_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("MOEBENCH_DATA_DIR", None)
    else:
        os.environ["MOEBENCH_DATA_DIR"] = old


@pytest.fixture(scope="session")
def tiny_model(moebench_data: Path) -> Path:
    """The real tiny DeepSeek-V3 checkpoint, built once per session."""
    from engines.models import tiny_path

    return tiny_path()


@pytest.fixture(scope="session")
def native_engine(tiny_model: Path) -> Iterator[object]:
    """A started native engine on CPU with the tiny model (shared; do not stop it in tests)."""
    from engines.base import create_engine

    engine = create_engine({"kind": "native", "model": "tiny-deepseek-v3", "accelerator": "cpu"})
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture
def store(tmp_path: Path) -> object:
    """A fresh real SQLite store in a temp folder."""
    from bench.store import Store

    return Store(tmp_path / "moebench.sqlite")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return _ROOT


@pytest.fixture
def fake_engine_kind(monkeypatch: pytest.MonkeyPatch) -> str:
    """Register the fake engine (tests/fakes.py) under kind ``fake`` for this test."""
    from engines import base

    monkeypatch.setitem(base.ENGINE_MODULES, "fake", "tests.fakes")
    return "fake"

"""Fixtures of the hostile suite: a hostile server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hostile.hostile_server import HostileServer


@pytest.fixture
def server() -> Iterator[HostileServer]:
    """A started :class:`HostileServer` on a free port (good unless a prompt or the URL says otherwise)."""
    with HostileServer() as s:
        yield s


from tests.dashboard.conftest import app_test, fresh_data_dir  # noqa: E402,F401  (the dashboard's fixtures, for its probes)

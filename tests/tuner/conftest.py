"""Fixtures shared by the tuner's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tuner.client_helpers import FakeService, fake_config_service


@pytest.fixture
def config_service() -> Iterator[tuple[str, FakeService]]:
    """A config service on loopback (GET /api/v1/configs/<fingerprint>) whose answers the test
    sets: its URL and the fake."""
    with fake_config_service() as live:
        yield live

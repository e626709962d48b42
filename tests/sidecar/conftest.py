"""Fixtures of the sidecar's in-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.standins.engine import StandinEngine


@pytest.fixture
def engine(shm_dir: str) -> Iterator[StandinEngine]:
    """An engine stand-in that answers the handshake and records calls into `shm_dir` (no torch)."""
    standin = StandinEngine(shm_dir)
    yield standin
    standin.close()

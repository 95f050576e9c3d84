"""A ledger server (a real OpenEnv MCP tool environment) shared by the base_url tests. It is spawned
when the session starts, so its slow start (openenv imports gradio) overlaps the tests that start
their own servers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import LedgerServer  # noqa: E402

_LEDGER: list[LedgerServer] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _LEDGER.append(LedgerServer())


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in _LEDGER:
        server.stop()


@pytest.fixture(scope="session")
def ledger() -> Iterator[LedgerServer]:
    server = _LEDGER[0]
    server.wait()
    yield server

"""A ledger server (a real OpenEnv MCP tool environment) shared by the base_url tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import LedgerServer  # noqa: E402


@pytest.fixture(scope="session")
def ledger() -> Iterator[LedgerServer]:
    server = LedgerServer()
    try:
        server.wait()
        yield server
    finally:
        server.stop()

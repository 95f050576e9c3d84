"""Fixtures: demo MCP servers over HTTP and SSE, each in a subprocess on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp_support import HTTPServer


@pytest.fixture
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer("http")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def sse_server() -> Iterator[HTTPServer]:
    server = HTTPServer("sse")
    server.start()
    yield server
    server.kill()

"""Fixtures: demo MCP servers over HTTP and SSE, each in a subprocess on a free loopback port."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from mcp_support import SERVERS, HTTPServer

# The served sample tools are imported by the tests too.
sys.path.insert(0, str(SERVERS))


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

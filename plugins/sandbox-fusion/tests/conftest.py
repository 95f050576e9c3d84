from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_support import ServerProcess, serve_apps, start_server, stop_server
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig


@pytest.fixture(scope="session")
def sandbox() -> Iterator[EmbeddedSandbox]:
    """The default embedded sandbox (bubblewrap when usable, as the tool gets it)."""
    with EmbeddedSandbox(SandboxConfig(pool_size=2, max_concurrency=8)) as sb:
        sb.start()
        yield sb


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """``toolrl sandbox serve`` in a subprocess, stopped at the end of the session."""
    srv = start_server("--pool-size", "2")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
def serve_app() -> Iterator:
    """``serve_app(app) -> base URL``: an ASGI stand-in served on loopback until the test ends."""
    yield from serve_apps()


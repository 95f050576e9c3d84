"""A real server on loopback for the tests: ``toolrl tinker serve``'s own coroutine in a thread of its
own, its state in a temporary directory; the official SDK talks to it over HTTP."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

KEY = "tml-test-key-one"
OTHER_KEY = "tml-test-key-two"
BASE = "tiny-qwen3"


@dataclass
class Served:
    url: str
    service: Any
    server: Any
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(state_dir: Path, max_batch_tokens: int = 4096, **limits: Any) -> Served:
    """``limits``: more of the service's :class:`~toolrl_tinker.service.Limits` (the sampler's engine...)."""
    from toolrl_tinker import server as server_module
    from toolrl_tinker.service import Limits

    box: dict[str, Any] = {}
    real = server_module.Service

    class Kept(real):  # the test reads the served models (weights, gradients) directly
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            box["service"] = self

    def run() -> None:
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        server_module.Service = Kept
        try:
            loop.run_until_complete(server_module.serve_async(
                [BASE], state_dir, [KEY, OTHER_KEY], "127.0.0.1", 0, Limits(max_batch_tokens=max_batch_tokens, **limits),
                announce=lambda line: None, started=lambda s: box.setdefault("server", s)))
        finally:
            server_module.Service = real

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.time() + 120
    while "server" not in box:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError("the tinker server did not start")
        time.sleep(0.05)
    port = box["server"].servers[0].sockets[0].getsockname()[1]
    return Served(f"http://127.0.0.1:{port}", box["service"], box["server"], box["loop"], thread)


def held(served: Served, model_id: str) -> tuple[Any, Any]:
    """A training client's run as the server holds it, and the trainer its adapter is on."""
    run = served.service.runs[model_id]
    return run, served.service.bases[run.base].trainer


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    os.environ["TINKER_API_KEY"] = KEY
    s = start_server(tmp_path_factory.mktemp("tinker-state"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(served: Served) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=served.url, api_key=KEY)

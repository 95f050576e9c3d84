"""A real server on loopback for the tests: ``toolrl tinker serve``'s own coroutine in a thread of its
own, its state in a temporary directory; the official SDK talks to it over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
# A hosted model's name offered on the tiny model (it speaks ChatML over the real Qwen3 tokenizer, as
# this model of tinker-cookbook's table does: its renderer is qwen3_instruct).
HOSTED = "Qwen/Qwen3-4B-Instruct-2507"
# The team server's other keys: one that floods it, one whose client is killed.
FLOOD_KEY = "tml-test-key-flood"
GONE_KEY = "tml-test-key-gone"
# The team server's limits: small quotas, the latest 2 checkpoints per run and kind.
TEAM = {"max_batch_tokens": 4096, "max_futures_per_client": 16, "max_tokens_per_client": 8192, "keep_checkpoints": 2,
        "max_request_bytes": 1 << 20}


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


def start_server(state_dir: Path, max_batch_tokens: int = 4096, ranks: Any = None, limits: Any = None,
                 bases: tuple[str, ...] = (BASE,), keys: tuple[str, ...] = (KEY, OTHER_KEY), port: int = 0,
                 **changes: Any) -> Served:
    """A server on ``state_dir`` (``limits``: a :class:`toolrl_tinker.limits.Limits`, else the default's with
    ``max_batch_tokens`` and room for every test's models; ``changes``: more of its fields, the sampler's
    engine...)."""
    from toolrl_tinker import server as server_module
    from toolrl_tinker.limits import Limits

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
                list(bases), state_dir, list(keys), "127.0.0.1", port,
                # one key serves every test of the session: room for all their models
                dataclasses.replace(limits or Limits(max_batch_tokens=max_batch_tokens, max_runs_per_client=256),
                                    **changes),
                announce=lambda line: None, started=lambda s: box.setdefault("server", s), ranks=ranks))
        finally:
            server_module.Service = real

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.time() + 240
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


@pytest.fixture(scope="session")
def served_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The service with its trainer on two ranks on a local Ray (gloo, the base sharded), holding one
    adapter in its model at once (every switch of client moves adapters out and back): its results must be
    ``served``'s all the same."""
    ray = pytest.importorskip("ray")
    from toolrl.config import RayConfig
    from toolrl.processes.step_group import StepGroup
    from toolrl_tinker.trainer import Ranks

    os.environ["TINKER_API_KEY"] = KEY
    placed = RayConfig(address="local")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        StepGroup.connect(placed, 2)  # here: the server's thread is not the main one
        try:
            s = start_server(tmp_path_factory.mktemp("tinker-two-ranks"), ranks=Ranks(2, placed, slots=1))
            yield s
            s.stop()
        finally:
            ray.shutdown()


@pytest.fixture(scope="session")
def client_two(served_two: Served) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=served_two.url, api_key=KEY)


@pytest.fixture(params=["1 rank", "2 ranks"])
def service(request: pytest.FixtureRequest) -> tuple[Served, Any]:
    """The service on one rank (in process) and on two (``served_two``), and a client of it."""
    one = request.param == "1 rank"
    return (request.getfixturevalue("served" if one else "served_two"),
            request.getfixturevalue("client" if one else "client_two"))


@pytest.fixture(scope="session")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server as a team runs it: quotas (:data:`TEAM`), the tiny model also under a hosted model's name,
    four keys."""
    from toolrl_tinker.limits import Limits

    s = start_server(tmp_path_factory.mktemp("tinker-team"), limits=Limits(**TEAM), bases=(BASE, f"{HOSTED}={BASE}"),
                     keys=(KEY, OTHER_KEY, FLOOD_KEY, GONE_KEY))
    yield s
    s.stop()


@contextlib.contextmanager
def limited(served: Served, **changes: Any) -> Iterator[None]:
    """The server's limits changed in place while the block runs (every part of the service reads them at
    each request)."""
    limits = served.service.limits
    before = dataclasses.replace(limits)
    for name, value in changes.items():
        setattr(limits, name, value)
    try:
        yield
    finally:
        for name in changes:
            setattr(limits, name, getattr(before, name))


def on_loop(served: Served, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` run on the server's event loop (a coroutine function's awaited); its result."""
    async def call() -> Any:
        out = fn(*args)
        return await out if asyncio.iscoroutine(out) else out

    return asyncio.run_coroutine_threadsafe(call(), served.loop).result(60)

"""Test helpers: the ledger server (tests/envs/ledger_env.py) in a subprocess, and trajectories run by
toolrl's own rollout loop (routes built from the ``openenv`` environment, as ``toolrl train`` builds
them) with a scripted engine standing in for the model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from toolrl.testing import ScriptedEngine

HERE = Path(__file__).parent
ENVS = HERE / "envs"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LedgerServer:
    """``uvicorn ledger_env:app`` on a free loopback port, for ``base_url`` tests."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "ledger_env:app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning"], cwd=ENVS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the ledger server exited"
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.25)
        raise TimeoutError("the ledger server did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def tokenizer() -> Any:
    from toolrl import model_sources

    return model_sources.qwen_tokenizer("qwen3")


def samples(rows: list[dict[str, Any]]) -> list[Any]:
    from toolrl.schemas import Sample

    return [Sample.model_validate({"prompt": "Reach the target.", **row, "index": i, "env": "openenv"})
            for i, row in enumerate(rows)]


async def routes(options: dict[str, Any], base_dir: Path | None = None) -> tuple[dict, list]:
    """The ``openenv`` environment's routes (its session kind prepared: the server started or reached)."""
    from toolrl.config import load_config
    from toolrl.rollout.routes import build_routes

    data = {"env": "openenv", "env_options": options, **({"base_dir": str(base_dir)} if base_dir else {})}
    return await build_routes(load_config(None, data=data))


async def rollout(options: dict[str, Any], rows: list[dict[str, Any]], scripts: Mapping[str, list[str]],
                  base_dir: Path | None = None, max_turns: int = 6, built: tuple[dict, list] | None = None,
                  engine: ScriptedEngine | None = None) -> list[Any]:
    """Each row (``extra_info.reset_kwargs``: the reset's kwargs) rolled out once with ``scripts`` (by
    ``s<row index>-``; or by ``engine``), through toolrl's loop; the routes are closed afterwards
    unless ``built`` (routes already built, and kept)."""
    from toolrl.config import RolloutConfig
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, run_rollouts

    tok = tokenizer()
    routes_, parts = built if built is not None else await routes(options, base_dir)
    for route in routes_.values():
        route.max_turns = max_turns
    try:
        if engine is not None:
            engine.script = dict(scripts)
        ctx = RolloutContext(engine=engine or ScriptedEngine(tok, scripts), renderer_factory=lambda s: ChatRenderer(tok, s),
                             config=RolloutConfig(max_response_tokens=8192, max_concurrent_trajectories=256),
                             routes=routes_)
        return await run_rollouts(ctx, samples(rows), 1, seed=0)
    finally:
        if built is None:
            await close(parts)


async def close(parts: list[Any]) -> None:
    for part in parts:
        await part.close()

"""Test helpers: the ledger server (tests/envs/ledger_env.py) in a subprocess, and trajectories driven
through toolrl's own ToolSet (the driver rollouts use)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from toolrl.schemas import ToolCall
from toolrl.tools import Tool, ToolSet
from toolrl.tools.verl_config import build_tools, parse_tools_config

HERE = Path(__file__).parent
ENVS = HERE / "envs"
SCRIPTED = HERE / "scripted"


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


async def build(block: dict[str, Any], base_dir: Path | None = None, timeout: float = 30.0) -> dict[str, Tool]:
    return await build_tools(parse_tools_config(
        {"tools": [{"class_name": "openenv", "config": {"type": "native", "timeout": timeout}, "openenv": block}]},
        base_dir))


async def trajectory(tools: dict[str, Tool], calls: list[tuple[str, dict[str, Any]]],
                     create_kwargs: dict[str, Any] | None = None, trajectory_id: str | None = None,
                     lifecycle_timeout: float = 60.0) -> tuple[list, dict[str, float], ToolSet]:
    """One trajectory: create every tool (reset), the calls in order, then calc_reward/release."""
    kwargs = {name: {"create_kwargs": create_kwargs} for name in tools} if create_kwargs else None
    toolset = ToolSet(tools, kwargs, trajectory_id, lifecycle_timeout=lifecycle_timeout)
    await toolset.start()
    results = [await toolset.call(ToolCall(name=n, arguments=a)) for n, a in calls]
    rewards = await toolset.finish()
    return results, rewards, toolset


async def close_all(tools: dict[str, Tool]) -> None:
    for tool in tools.values():
        await tool.close()

"""The openenv package's own template environment (`openenv init`), started by the plugin from its
directory (app from its openenv.yaml), driven over the wire, and stopped when the tools close."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
from support import build, close_all, trajectory


async def test_template_environment_started_by_the_plugin(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    env_dir = tmp_path / "echo_env"
    assert (env_dir / "openenv.yaml").exists()
    # The template allows one session at a time (max_concurrent_envs=1): max_sessions queues the rest.
    tools = await build({"app_dir": "echo_env", "max_sessions": 1}, base_dir=tmp_path)
    step = tools["step"]
    base_url = step.binding.local.base_url
    try:
        assert list(tools) == ["step"]  # not an MCP environment: its action is the one tool
        assert step.tool_schema.function.parameters["required"] == ["message"]
        results, rewards, _ = await trajectory(tools, [("step", {"message": "hello"})])
        assert results[0].status == "ok", results[0]
        assert json.loads(results[0].response.text)["echoed_message"] == "hello"
        assert results[0].metrics == {"done": False, "reward": 0.5}
        assert rewards == {"step": 0.5}  # the template's reward: 0.1 per character, at most 1
        two = [trajectory(tools, [("step", {"message": m})]) for m in ("ab", "abcd")]
        got = await asyncio.gather(*two)
        assert [g[1] for g in got] == [{"step": 0.2}, {"step": 0.4}]
    finally:
        await close_all(tools)
    try:
        httpx.get(f"{base_url}/health", timeout=2)
        raise AssertionError("the server still answers after its tools closed")
    except httpx.HTTPError:
        pass

"""``toolrl mcp serve`` answering plain ``mcp`` clients, over stdio and streamable HTTP.

The served tools come from a test plugin (``servers/sample_plugin.py``) made visible to the server
process through a ``*.dist-info`` directory on its PYTHONPATH, exactly as an installed plugin is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_support import SERVERS, build, call, close_all, free_port, wait_until
from sample_tools import MultiplyTool  # tests/servers is on sys.path (conftest.py)
from toolrl.plugins import get_plugins

SERVE = ["-m", "toolrl", "mcp", "serve"]


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a server process in which the sample plugin is installed."""
    dist = tmp_path / "site" / "toolrl_sample_tools-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toolrl-sample-tools\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[toolrl]\nsampletools = sample_plugin\n")
    return {"PYTHONPATH": os.pathsep.join([str(dist.parent), str(SERVERS)]), "OMP_NUM_THREADS": "1",
            "SAMPLE_TOOLS_CLOSE_LOG": str(tmp_path / "closed.log")}


def closed_count(env: dict[str, str]) -> int:
    path = Path(env["SAMPLE_TOOLS_CLOSE_LOG"])
    return path.read_text().count("closed") if path.exists() else 0


@asynccontextmanager
async def stdio_session(args: list[str], env: dict[str, str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=[*SERVE, *args], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def test_stdio_serves_installed_tools_with_exact_schemas(plugin_env: dict[str, str]) -> None:
    async with stdio_session(["--transport", "stdio"], plugin_env) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert {"multiply", "pixel", "explode"} <= set(listed)
        assert "mcp" not in listed  # needs a servers file; never served by default
        assert listed["multiply"].input_schema == MultiplyTool.schema["function"]["parameters"]
        assert listed["multiply"].description == "Multiply two numbers."

        product = await session.call_tool("multiply", {"x": 6, "y": 7})
        assert (text(product), product.is_error) == ("42", False)
        # create -> execute -> calc_reward ran on one instance: the reward counts its one call.
        assert product.meta["toolrl"] == {"status": "ok", "step_reward": 0.5, "reward": 1.0}

        invalid = await session.call_tool("multiply", {"x": 6})
        assert invalid.is_error and "missing required field 'y'" in text(invalid)
        assert invalid.meta["toolrl"]["status"] == "invalid_arguments"

        exploded = await session.call_tool("explode", {})
        assert exploded.is_error and "RuntimeError: kaboom" in text(exploded)

        pixel = await session.call_tool("pixel", {})
        assert [block.type for block in pixel.content] == ["text", "image"]
        assert pixel.content[1].mime_type == "image/png"

        unknown = await session.call_tool("nope", {})
        assert unknown.is_error and "unknown tool 'nope'" in text(unknown)
        assert closed_count(plugin_env) == 0
    # The client closed stdin: the server closes its tools and exits.
    assert wait_until(lambda: closed_count(plugin_env) == 1, 10)


async def test_stdio_serves_the_tools_of_a_tools_file(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - class_name: sample_tools.MultiplyTool\n    config: {type: native, timeout: 5}\n")
    async with stdio_session(["--tools-config", str(config)], plugin_env) as session:
        assert [tool.name for tool in (await session.list_tools()).tools] == ["multiply"]
        assert text(await session.call_tool("multiply", {"x": 1.5, "y": 4})) == "6"


async def test_http_transport(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, *SERVE, "--transport", "http", "--port", str(port)],
        env={**os.environ, **plugin_env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        import socket

        def accepting() -> bool:
            assert server.poll() is None, server.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        assert wait_until(accepting, 30)
        async with (streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            assert "multiply" in {tool.name for tool in (await session.list_tools()).tools}
            assert text(await session.call_tool("multiply", {"x": 6, "y": 7})) == "42"
    finally:
        server.terminate()
        assert server.wait(15) == 0, "the HTTP server did not shut down cleanly on SIGTERM"
    assert closed_count(plugin_env) == 1, "the tools were not closed on SIGTERM"


async def test_served_tools_round_trip_into_mcp_tools(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    """toolrl tools served over MCP, consumed again by this plugin's client side."""
    servers = {"toolrl": {"command": sys.executable, "args": SERVE, "env": plugin_env, "tools": ["multiply"]}}
    tools = await build(tmp_path, servers)
    try:
        assert tools["multiply"].tool_schema.function.parameters == MultiplyTool.schema["function"]["parameters"]
        result = await call(tools["multiply"], {"x": 3, "y": 14})
        assert (result.status, result.response.text) == ("ok", "42")
    finally:
        await close_all(tools)


def test_serve_reports_config_errors(tmp_path: Path) -> None:
    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - class_name: no_such_tool\n")
    done = subprocess.run([sys.executable, *SERVE, "--tools-config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "no_such_tool" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not get_plugins().registry.has("tools", "calculator"), reason="calculator plugin not installed")
async def test_calculator_over_stdio() -> None:
    """The issue's check: a plain mcp client sees `calculator` and gets 42 for 6*7."""
    async with stdio_session(["--transport", "stdio"], {"OMP_NUM_THREADS": "1"}) as session:
        assert "calculator" in {tool.name for tool in (await session.list_tools()).tools}
        result = await session.call_tool("calculator", {"expression": "6*7"})
        assert not result.is_error and text(result) == "42"


def test_serve_help_lists_options() -> None:
    done = subprocess.run([sys.executable, *SERVE, "--help"], capture_output=True, text=True, timeout=60, check=True)
    for option in ("--tools-config", "--transport", "--host", "--port"):
        assert option in done.stdout

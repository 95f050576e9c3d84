"""Helpers for the MCP plugin's tests. The servers are real: ``servers/demo_server.py`` over stdio
(spawned by the client under test) or over HTTP/SSE (a uvicorn subprocess on a free loopback port,
stopped by the test)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolrl.tools import Tool
from toolrl_mcp.tool import MCPTool

SERVERS = Path(__file__).parent / "servers"
DEMO = SERVERS / "demo_server.py"


def stdio_server(*args: str, **options: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(DEMO), *args], **options}


def write_servers(directory: Path, servers: dict[str, Any], name: str = "servers.json") -> Path:
    path = directory / name
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


async def build(directory: Path, servers: dict[str, Any], config: dict[str, Any] | None = None,
                **block: Any) -> dict[str, Tool]:
    path = write_servers(directory, servers)
    section = {"class_name": "mcp", "mcp": {"mcp_servers_config_path": str(path), **block}}
    tools = await MCPTool.from_config(config or {"type": "mcp"}, None, section)
    return {t.name: t for t in tools}


async def close_all(tools: dict[str, Tool]) -> None:
    for tool in tools.values():
        await tool.close()


async def call(tool: Tool, arguments: dict[str, Any]) -> Any:
    """One lifecycle, as a rollout runs it."""
    instance = await tool.create()
    try:
        return await tool.call(instance, arguments)
    finally:
        await tool.release(instance)


def alive(pid: int) -> bool:
    """Running and not a zombie (a container's init may never reap an orphan)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def child_servers() -> set[int]:
    """Live demo-server processes this process has spawned."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and DEMO.name.encode() in cmdline and alive(int(stat.parent.name)):
            pids.add(int(stat.parent.name))
    return pids


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HTTPServer:
    """demo_server.py over streamable HTTP or SSE in a subprocess; can be killed and restarted on
    the same port."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        path = "mcp" if transport == "http" else "sse"
        self.url = f"http://127.0.0.1:{self.port}/{path}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(DEMO), "--transport", self.transport, "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

        def accepting() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                assert self.process is not None and self.process.poll() is None, "server exited"
                return False

        assert wait_until(accepting, 30), f"{self.transport} server did not start on port {self.port}"

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

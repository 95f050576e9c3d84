"""MCP latency: session start and per-call latency, one shared session against one session per call.

verl's MCP client opens a new session for every call; toolrl's ``mcp`` tool keeps one session per
server open for the whole run. This measures both, side by side in one run, against the demo server
of the plugin's tests (``plugins/mcp/tests/servers/demo_server.py``, tool ``add``):

- session start: spawn (stdio) or connect (HTTP) plus ``initialize`` (closing not included);
- call on a shared session: the raw ``ClientSession.call_tool`` and toolrl's ``MCPTool.call`` (which
  adds JSON-Schema validation of the arguments and the timeout);
- call with a new session per call (verl's way): open, initialize, call, close, all timed.

The stdio session start is mostly the server's Python start-up and imports.

    OMP_NUM_THREADS=1 python benchmarks/mcp_latency.py [--calls 300] [--sessions 10]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator, Awaitable  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import free_port  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

START = "session start (open + initialize)"
RAW = "call, shared session: ClientSession.call_tool"
TOOLRL = "call, shared session: toolrl MCPTool.call"
NEW_SESSION = "call, new session per call (verl)"
LABELS = (START, RAW, TOOLRL, NEW_SESSION)
DEMO = Path(__file__).resolve().parents[1] / "plugins" / "mcp" / "tests" / "servers" / "demo_server.py"
ENV = {"OMP_NUM_THREADS": "1"}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed_ms(call: Awaitable[Any]) -> float:
    start = time.perf_counter()
    await call
    return (time.perf_counter() - start) * 1000


@asynccontextmanager
async def session_for(transport: str, url: str) -> AsyncIterator[ClientSession]:
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, args=[str(DEMO)], env=ENV)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session
    else:
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def measure(transport: str, url: str, calls: int, sessions: int) -> dict[str, list[float]]:
    """The measures are interleaved round by round, so load from other processes hits them alike."""
    from toolrl_mcp.tool import MCPTool

    async def session_start() -> float:
        start = time.perf_counter()
        async with session_for(transport, url):
            return (time.perf_counter() - start) * 1000  # closing is not part of the start

    async def call_with_new_session() -> None:
        async with session_for(transport, url) as session:
            assert (await session.call_tool("add", {"a": 2, "b": 3})).content[0].text == "5"

    samples: dict[str, list[float]] = {label: [] for label in LABELS}
    for _ in range(sessions):
        samples[START].append(await session_start())
        samples[NEW_SESSION].append(await timed_ms(call_with_new_session()))

    entry = {"command": sys.executable, "args": [str(DEMO)], "env": ENV} if transport == "stdio" else {"url": url}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "servers.json"
        path.write_text(json.dumps({"mcpServers": {"demo": entry}}))
        section = {"mcp": {"mcp_servers_config_path": str(path), "tool_selected_list": ["add"]}}
        (tool,) = await MCPTool.from_config({"type": "mcp"}, None, section)
        instance = await tool.create()
        try:
            async with session_for(transport, url) as session:
                for round_ in range(20 + calls):  # 20 warm-up rounds
                    raw = await timed_ms(session.call_tool("add", {"a": 2, "b": 3}))
                    start = time.perf_counter()
                    assert (await tool.call(instance, {"a": 2, "b": 3})).response.text == "5"
                    if round_ >= 20:
                        samples[RAW].append(raw)
                        samples[TOOLRL].append((time.perf_counter() - start) * 1000)
        finally:
            await tool.release(instance)
            await tool.close()
    return samples


def start_http_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(DEMO), "--transport", "http", "--port", str(port)],
                               env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("the HTTP demo server did not start") from None
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls timed on the shared session")
    parser.add_argument("--sessions", type=int, default=10, help="sessions opened (start, new-session calls)")
    args = parser.parse_args()

    print(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}  python {sys.version.split()[0]}  "
          f"calls={args.calls} sessions={args.sessions}")
    print(f"{'transport':<9} {'measure':<46} {'n':>4} {'p50 ms':>9} {'p95 ms':>9}")
    server, url = start_http_server()
    try:
        for transport in ("stdio", "http"):
            samples = asyncio.run(measure(transport, url, args.calls, args.sessions))
            for label in LABELS:
                values = samples[label]
                print(f"{transport:<9} {label:<46} {len(values):>4} "
                      f"{statistics.median(values):>9.2f} {percentile(values, 0.95):>9.2f}")
            ratio = statistics.median(samples[NEW_SESSION]) / statistics.median(samples[TOOLRL])
            print(f"{transport:<9} ratio p50 new-session-per-call / shared-session (MCPTool.call): {ratio:.1f}x")
    finally:
        server.terminate()
        server.wait(15)


if __name__ == "__main__":
    main()

"""An MCP server for the tests and the latency benchmark.

    python demo_server.py [--transport stdio|http|sse] [--port N] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

# A 1x1 PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)


def build(name: str) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def stats(values: list[float]) -> dict[str, float]:
        """Minimum, maximum and mean of a list of numbers."""
        return {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the given message."""
        raise ToolError(message)

    @server.tool()
    def pixel() -> list:
        """A caption and a 1x1 PNG image."""
        return ["one red pixel", Image(data=PIXEL, format="png")]

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then report how long."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def authorization(ctx: Context) -> str:
        """The Authorization header of the HTTP request (empty over stdio)."""
        request = ctx.request_context.request
        return request.headers.get("authorization", "") if request is not None else ""

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["stdio", "http", "sse"], default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", default="demo")
    args = parser.parse_args()
    server = build(args.name)
    if args.transport == "stdio":
        server.run()
    elif args.transport == "http":
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run("sse", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()

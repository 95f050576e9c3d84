"""``toolrl mcp serve``: toolrl tools as an MCP server, so an IDE or another agent framework can use
the very tools a model was trained with.

Each tool is listed with its exact JSON schema as ``inputSchema``. Each call runs the tool's whole
lifecycle (create, execute through ``Tool.call`` with its validation and timeout, calc_reward,
release); failures come back as ``isError`` results, and ``_meta.toolrl`` carries the call's status
and rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server
from toolrl.schemas import ToolCall, ToolResponse
from toolrl.tools import Tool, ToolConfigError, ToolSet

from toolrl_mcp.results import to_call_tool_result

# Built from a servers file, the mcp tool would re-export other MCP servers; it has no default config.
_NOT_SERVED_BY_DEFAULT = {"mcp"}


async def run_call(tool: Tool, arguments: dict[str, Any]) -> types.CallToolResult:
    """One call with the full per-trajectory lifecycle; never raises."""
    toolset = ToolSet({tool.name: tool})
    await toolset.start()
    result = await toolset.call(ToolCall(name=tool.name, arguments=arguments))
    rewards = await toolset.finish()
    meta = {"toolrl": {"status": result.status, "step_reward": result.step_reward,
                       "reward": rewards.get(tool.name)}}
    if toolset.finish_errors:
        meta["toolrl"]["lifecycle_errors"] = toolset.finish_errors
    try:
        return to_call_tool_result(result.response, meta)
    except TypeError as exc:  # an image type MCP cannot carry
        return to_call_tool_result(ToolResponse.error(f"Error: {exc}"), meta)


def build_server(tools: Mapping[str, Tool]) -> Server[Any]:
    import toolrl

    listing = [
        types.Tool(
            name=tool.name,
            description=tool.tool_schema.function.description or None,
            input_schema=tool.tool_schema.function.parameters,
        )
        for tool in tools.values()
    ]

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            return to_call_tool_result(ToolResponse.error(
                f"Error: unknown tool '{params.name}'. Available tools: {', '.join(sorted(tools)) or 'none'}"
            ))
        return await run_call(tool, params.arguments or {})

    def input_schema(name: str) -> dict[str, Any] | None:
        tool = tools.get(name)
        return tool.tool_schema.function.parameters if tool is not None else None

    return Server("toolrl", version=toolrl.__version__, on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=input_schema)


async def load_tools(tools_config: str | None) -> dict[str, Tool]:
    """The tools of a tools file, or every registered tool that builds with its default config."""
    from toolrl.tools.verl_config import build_default_tool, build_tools, load_tools_file

    if tools_config is not None:
        return await build_tools(load_tools_file(tools_config))
    from toolrl.plugins.parts import registered_parts

    tools: dict[str, Tool] = {}
    for part in registered_parts("tools"):
        if part.name in _NOT_SERVED_BY_DEFAULT:
            continue
        try:
            tool = await build_default_tool(part.name)
        except Exception as exc:  # e.g. a tool that needs configuration: serve the others
            print(f"toolrl mcp serve: skipping tool {part.name!r}: {exc}", file=sys.stderr)
            continue
        if tool.name in tools:
            await tool.close()
            continue
        tools[tool.name] = tool
    return tools


async def _serve(tools_config: str | None, transport: str, host: str, port: int) -> None:
    tools = await load_tools(tools_config)
    try:
        if not tools:
            raise ToolConfigError("no tools to serve: install a tool plugin or pass --tools-config")
        server = build_server(tools)
        names = ", ".join(sorted(tools))
        if transport == "stdio":
            from mcp.server.stdio import stdio_server

            print(f"toolrl mcp serve: {len(tools)} tools over stdio: {names}", file=sys.stderr)
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            import uvicorn

            app = server.streamable_http_app(host=host)
            print(f"toolrl mcp serve: {len(tools)} tools at http://{host}:{port}/mcp: {names}", file=sys.stderr)
            await _http_server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
    finally:
        for tool in tools.values():
            await tool.close()


def _http_server(config: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, which would kill the process
        before the tools are closed; here a signal only ends ``serve()``."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    return Server(config)


def serve_tools(tools_config: str | None, transport: str, host: str, port: int) -> None:
    asyncio.run(_serve(tools_config, transport, host, port))

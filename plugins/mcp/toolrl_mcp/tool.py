"""The ``mcp`` tool: each tool of each configured MCP server as a toolrl tool.

Tool-config entry (verl's layout)::

    - class_name: mcp                  # or verl.tools.mcp_base_tool.MCPBaseTool
      config: {type: mcp, timeout: 30}
      mcp:
        mcp_servers_config_path: servers.json
        tool_selected_list: [add]      # optional: tool names as exposed (after rename/prefix)

Tools are listed when the entry is built; every tool of one server shares that server's connection
(see :mod:`toolrl_mcp.client`). ``close()`` on the last tool of a server shuts its session down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

import mcp.types as types
from pydantic import BaseModel, ConfigDict
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool, ToolConfigError

from toolrl_mcp.client import POOL, describe_error
from toolrl_mcp.config import ServerSpec, load_servers, parse_block
from toolrl_mcp.results import to_tool_response


class MCPToolConfig(BaseModel):
    """Options under ``config:`` besides ``type`` and ``timeout`` (none: server options live in the
    servers file, so a misplaced key is reported rather than ignored)."""

    model_config = ConfigDict(extra="forbid")


class MCPTool(Tool):
    """One tool of one MCP server."""

    config_model: ClassVar[type[BaseModel] | None] = MCPToolConfig

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        tool_schema: Mapping[str, Any] | None,
        *,
        server: str,
        spec: ServerSpec,
        mcp_name: str,
    ) -> None:
        super().__init__(config, tool_schema)
        self.server = server
        self.spec = spec
        self.mcp_name = mcp_name
        self._key = spec.connection_key(server)
        self._closed = False
        POOL.lease(self._key)

    @classmethod
    def check_entry(cls, config: Mapping[str, Any], section: Mapping[str, Any]) -> None:
        """The entry's ``mcp:`` block and its servers file, read and checked; no server is started."""
        super().check_entry(config, section)
        load_servers(parse_block(section).mcp_servers_config_path)

    @classmethod
    async def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping | None, section: Mapping[str, Any]
    ) -> list[Tool]:
        if tool_schema is not None:
            raise ToolConfigError("tools[].tool_schema is not used with MCP tools: schemas come from the servers")
        block = parse_block(section)
        servers = load_servers(block.mcp_servers_config_path)
        keys = [spec.connection_key(name) for name, spec in servers.items()]
        tools: list[Tool] = []
        try:
            listings = await asyncio.gather(*(_list(n, s) for n, s in servers.items()), return_exceptions=True)
            errors = [str(e) for e in listings if isinstance(e, BaseException)]
            if errors:
                raise ToolConfigError("; ".join(errors))
            for (name, spec, mcp_tool, exposed) in _select(servers, listings, block.tool_selected_list):
                tool_config = dict(config)
                if spec.timeout is not None:
                    tool_config["timeout"] = spec.timeout
                schema = {
                    "type": "function",
                    "function": {
                        "name": exposed,
                        "description": mcp_tool.description or mcp_tool.title or "",
                        "parameters": mcp_tool.input_schema,
                    },
                }
                try:
                    tools.append(cls(tool_config, schema, server=name, spec=spec, mcp_name=mcp_tool.name))
                except ToolConfigError as exc:
                    raise ToolConfigError(f"MCP server {name!r}, tool {mcp_tool.name!r}: {exc}") from None
        except BaseException:
            for tool in tools:
                await tool.close()
            raise
        finally:
            for key in keys:  # servers none of whose tools were selected
                await POOL.close_unleased(key)
        return tools

    async def execute(
        self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        if self._closed:
            raise RuntimeError(f"tool {self.name!r} was closed")
        self.state(instance_id)  # a released or unknown instance is an error, as for any tool
        connection = POOL.get(self.server, self.spec)
        result = await connection.call_tool(self.mcp_name, arguments, self.timeout)
        response, metrics = to_tool_response(result)
        return response, 0.0, metrics

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await POOL.release(self._key)


async def _list(name: str, spec: ServerSpec) -> list[types.Tool]:
    try:
        return await POOL.get(name, spec).list_tools()
    except Exception as exc:
        raise ToolConfigError(f"MCP server {name!r}: cannot list its tools: {describe_error(exc)}") from None


def _select(
    servers: dict[str, ServerSpec], listings: list[list[types.Tool]], selected: list[str] | None
) -> list[tuple[str, ServerSpec, types.Tool, str]]:
    """Apply per-server ``tools``/``rename``/``prefix`` and the entry's ``tool_selected_list``;
    every name in a selection or rename must exist, and exposed names must be unique."""
    chosen: list[tuple[str, ServerSpec, types.Tool, str]] = []
    owners: dict[str, str] = {}
    matched: set[str] = set()
    for (name, spec), listing in zip(servers.items(), listings, strict=True):
        available = {t.name for t in listing}
        for field, names in (("tools", spec.tools or []), ("rename", list(spec.rename))):
            missing = sorted(set(names) - available)
            if missing:
                raise ToolConfigError(
                    f"mcpServers.{name}.{field} names {', '.join(map(repr, missing))}, which the server does "
                    f"not provide (it has: {', '.join(sorted(available)) or 'no tools'})"
                )
        for mcp_tool in listing:
            exposed = spec.exposed_name(mcp_tool.name)
            if spec.tools is not None and mcp_tool.name not in spec.tools:
                continue
            if selected is not None:
                if exposed not in selected:
                    continue
                matched.add(exposed)
            if exposed in owners:
                raise ToolConfigError(
                    f"MCP tool name {exposed!r} is provided by servers {owners[exposed]!r} and {name!r}; "
                    f"give one a 'prefix' or 'rename' in the servers file, or select with 'tools'"
                )
            owners[exposed] = name
            chosen.append((name, spec, mcp_tool, exposed))
    if selected is not None:
        missing = [n for n in selected if n not in matched]
        if missing:
            offered = sorted(spec.exposed_name(t.name) for spec, listing in zip(servers.values(), listings)
                             for t in listing)
            raise ToolConfigError(
                f"mcp.tool_selected_list names {', '.join(map(repr, missing))}, which no server provides "
                f"(available: {', '.join(offered)})"
            )
    return chosen

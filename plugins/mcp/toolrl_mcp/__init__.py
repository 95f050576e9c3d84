"""toolrl plugin for MCP (Model Context Protocol).

- The ``mcp`` tool: one tool-config entry (``class_name: mcp`` plus a sibling
  ``mcp: {mcp_servers_config_path, tool_selected_list}`` block, verl's layout) becomes one toolrl tool
  per tool of each configured MCP server, all sharing one long-lived session per server.
- ``toolrl mcp serve``: the installed toolrl tools served as an MCP server.

This module is the entry point: it registers lazy references only, so loading the plugin imports
neither ``mcp`` nor ``pydantic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl
from toolrl.hookspecs import Register

if TYPE_CHECKING:
    import click


@hookimpl
def register_tools(register: Register) -> None:
    register(
        "toolrl_mcp.tool:MCPTool",
        name="mcp",
        aliases=("verl.tools.mcp_base_tool.MCPBaseTool", "verl.tools.mcp_search_tool.MCPSearchTool"),
    )


@hookimpl
def register_commands(cli: click.Group) -> None:
    import click

    @cli.group("mcp")
    def mcp_group() -> None:
        """Model Context Protocol: serve toolrl tools to MCP clients."""

    @mcp_group.command("serve")
    @click.option("--tools-config", type=click.Path(exists=True, dir_okay=False),
                  help="A tools YAML file (verl's layout); default: every installed tool that builds "
                       "without configuration.")
    @click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
                  help="stdio, or streamable HTTP at http://HOST:PORT/mcp.")
    @click.option("--host", default="127.0.0.1", show_default=True, help="HTTP bind address.")
    @click.option("--port", type=int, default=8000, show_default=True, help="HTTP port.")
    def serve(tools_config: str | None, transport: str, host: str, port: int) -> None:
        """Serve toolrl tools as an MCP server (each call runs create/execute/calc_reward/release)."""
        from toolrl_mcp.serve import serve_tools

        try:
            serve_tools(tools_config, transport, host, port)
        except ValueError as exc:  # ToolConfigError and friends: a usage problem, not a crash
            raise click.ClickException(str(exc)) from None

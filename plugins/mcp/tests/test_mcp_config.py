"""The servers file, the mcp block, and tool selection/renaming (no servers needed)."""

from __future__ import annotations

import json
from pathlib import Path

import mcp.types as types
import pytest
from toolrl.plugins import get_plugins
from toolrl.tools import ToolConfigError
from toolrl_mcp.config import ServerSpec, load_servers, parse_block
from toolrl_mcp.tool import MCPTool, _select


def test_registered_under_mcp_and_verl_aliases() -> None:
    registry = get_plugins().registry
    for name in ("mcp", "verl.tools.mcp_base_tool.MCPBaseTool", "verl.tools.mcp_search_tool.MCPSearchTool"):
        assert registry.load("tools", name) is MCPTool


def test_entry_point_module_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, toolrl_mcp; print(sorted(m for m in ('mcp', 'pydantic', 'httpx2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("entry", "transport"),
    [
        ({"command": "srv"}, "stdio"),
        ({"url": "http://127.0.0.1:1/mcp"}, "http"),
        ({"url": "http://127.0.0.1:1/sse"}, "sse"),
        ({"url": "http://127.0.0.1:1/sse/"}, "sse"),
        ({"url": "http://127.0.0.1:1/events", "transport": "sse"}, "sse"),
        ({"url": "http://127.0.0.1:1/sse", "type": "streamable-http"}, "http"),
        ({"url": "http://127.0.0.1:1/x", "type": "streamableHttp"}, "http"),
    ],
)
def test_transport_inferred_or_declared(entry: dict, transport: str) -> None:
    assert ServerSpec.model_validate(entry).transport == transport


def test_bearer_token_becomes_an_authorization_header() -> None:
    spec = ServerSpec.model_validate({"url": "http://h/mcp", "auth_token": "t", "headers": {"X-A": "1"}})
    assert spec.http_headers() == {"X-A": "1", "Authorization": "Bearer t"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "exactly one of 'command'"),
        ({"command": "a", "url": "http://h"}, "exactly one of 'command'"),
        ({"command": "a", "headers": {"k": "v"}}, "'url' servers only"),
        ({"url": "http://h/mcp", "args": ["x"]}, "'command' servers only"),
        ({"url": "http://h/mcp", "transport": "stdio"}, "needs 'command'"),
        ({"command": "a", "transport": "carrier-pigeon"}, "transport"),
        ({"command": "a", "timout": 3}, "timout"),
        ({"command": "a", "max_concurrency": 0}, "max_concurrency"),
    ],
)
def test_bad_server_entries_name_the_server_and_field(tmp_path: Path, entry: dict, message: str) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"calc": entry}}))
    with pytest.raises(ToolConfigError, match="mcpServers.calc") as info:
        load_servers(path)
    assert message in str(info.value)


def test_servers_file_list_form_is_merged_and_duplicates_rejected(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps([{"mcpServers": {"a": {"command": "x"}}}, {"mcpServers": {"b": {"command": "y"}}}]))
    assert list(load_servers(path)) == ["a", "b"]
    path.write_text(json.dumps([{"mcpServers": {"a": {"command": "x"}}}, {"mcpServers": {"a": {"command": "y"}}}]))
    with pytest.raises(ToolConfigError, match="'a' is defined twice"):
        load_servers(path)


def test_unreadable_servers_file(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match="cannot read MCP servers file"):
        load_servers(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ToolConfigError, match="cannot read MCP servers file"):
        load_servers(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text('{"servers": {}}')
    with pytest.raises(ToolConfigError, match="mcpServers"):
        load_servers(tmp_path / "empty.json")


def test_mcp_block_is_required_and_validated() -> None:
    with pytest.raises(ToolConfigError, match="needs a sibling 'mcp:' block"):
        parse_block({"class_name": "mcp"})
    with pytest.raises(ToolConfigError, match="mcp.mcp_servers_config_path: Field required"):
        parse_block({"mcp": {}})
    with pytest.raises(ToolConfigError, match="mcp.tool_selection"):
        parse_block({"mcp": {"mcp_servers_config_path": "x", "tool_selection": []}})


async def test_tool_schema_is_rejected(tmp_path: Path) -> None:
    section = {"mcp": {"mcp_servers_config_path": str(tmp_path / "servers.json")}}
    with pytest.raises(ToolConfigError, match="tool_schema is not used"):
        await MCPTool.from_config({"type": "mcp"}, {"type": "function"}, section)


def _listing(*names: str) -> list[types.Tool]:
    return [types.Tool(name=n, input_schema={"type": "object"}) for n in names]


def _servers(**entries: dict) -> dict[str, ServerSpec]:
    return {name: ServerSpec.model_validate({"command": "x", **entry}) for name, entry in entries.items()}


def _names(chosen: list) -> list[tuple[str, str, str]]:
    return [(server, tool.name, exposed) for server, _, tool, exposed in chosen]


def test_collisions_across_servers_name_both_servers() -> None:
    servers = _servers(alpha={}, beta={})
    with pytest.raises(ToolConfigError, match="'add' is provided by servers 'alpha' and 'beta'"):
        _select(servers, [_listing("add", "sub"), _listing("add")], None)


def test_prefix_rename_and_per_server_selection_resolve_collisions() -> None:
    servers = _servers(alpha={"rename": {"add": "plus"}}, beta={"prefix": "b_"}, gamma={"tools": ["mul"]})
    chosen = _select(servers, [_listing("add", "sub"), _listing("add"), _listing("add", "mul")], None)
    assert _names(chosen) == [
        ("alpha", "add", "plus"), ("alpha", "sub", "sub"), ("beta", "add", "b_add"), ("gamma", "mul", "mul")
    ]


def test_tool_selected_list_names_exposed_tools() -> None:
    servers = _servers(alpha={"prefix": "a_"}, beta={})
    chosen = _select(servers, [_listing("add", "sub"), _listing("add", "echo")], ["a_add", "echo"])
    assert _names(chosen) == [("alpha", "add", "a_add"), ("beta", "echo", "echo")]


def test_selections_naming_missing_tools_are_errors() -> None:
    with pytest.raises(ToolConfigError, match=r"tool_selected_list names 'nope'.*available: add, sub"):
        _select(_servers(a={}), [_listing("add", "sub")], ["add", "nope"])
    with pytest.raises(ToolConfigError, match=r"mcpServers.a.tools names 'mul'.*it has: add"):
        _select(_servers(a={"tools": ["mul"]}), [_listing("add")], None)
    with pytest.raises(ToolConfigError, match=r"mcpServers.a.rename names 'mul'"):
        _select(_servers(a={"rename": {"mul": "times"}}), [_listing("add")], None)


async def test_mcp_tools_cannot_run_isolated():
    """MCP tools build their own sessions (a custom from_config): `isolation: process` is refused."""
    from toolrl.tools.isolation import ProcessTool

    with pytest.raises(ToolConfigError, match="not supported by MCPTool"):
        await ProcessTool.start(MCPTool, {"isolation": "process"}, None)

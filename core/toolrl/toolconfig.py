"""Tool configs in verl's YAML layout, loaded unchanged::

    tools:
      - class_name: verl.tools.geo3k_tool.Geo3kTool     # or a toolrl name: calc_geo3k_reward, mcp...
        config: {type: native, timeout: 10}
        tool_schema: {type: function, function: {...}}  # optional: the tool's own schema by default
      - class_name: mcp
        config: {type: mcp}
        mcp: {mcp_servers_config_path: servers.json, tool_selected_list: [add]}

``class_name`` resolves, in order: a registered tool name, a registered alias (plugins alias the verl
class they replace), then an importable ``module.Class`` that subclasses :class:`toolrl.tools.Tool`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolrl.tools import Tool, ToolConfigError, format_validation_error


class ToolEntryConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["native", "mcp"] = "native"


class ToolEntry(BaseModel):
    """One item of ``tools:``."""

    model_config = ConfigDict(extra="allow")

    class_name: str
    config: ToolEntryConfig = Field(default_factory=ToolEntryConfig)
    tool_schema: dict[str, Any] | None = None
    mcp: dict[str, Any] | None = None


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolEntry] = Field(default_factory=list)


def load_tools_file(path: str | Path) -> ToolsFile:
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ToolConfigError(f"cannot read tools config {path}: {exc}") from None
    return parse_tools_config(data, base_dir=path.parent)


def parse_tools_config(data: Mapping[str, Any], base_dir: Path | None = None) -> ToolsFile:
    try:
        parsed = ToolsFile.model_validate(data)
    except ValidationError as exc:
        raise ToolConfigError(f"invalid tools config: {format_validation_error(exc)}") from None
    if base_dir is not None:  # relative MCP server paths are relative to the tools file
        for entry in parsed.tools:
            path = (entry.mcp or {}).get("mcp_servers_config_path")
            if path and not Path(path).is_absolute() and (base_dir / path).exists():
                entry.mcp["mcp_servers_config_path"] = str(base_dir / path)
    return parsed


def resolve_tool_class(class_name: str) -> type[Tool]:
    from toolrl.plugins import get_plugins
    from toolrl.registry import RegistryError

    registry = get_plugins().registry
    if registry.has("tools", class_name):
        return registry.load("tools", class_name)
    if "." in class_name:
        module_name, _, attr = class_name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ToolConfigError(f"tools[].class_name {class_name!r}: cannot import ({exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, Tool)):
            raise ToolConfigError(f"tools[].class_name {class_name!r} is not a toolrl.tools.Tool subclass")
        return cls
    try:
        registry.get("tools", class_name)
    except RegistryError as exc:
        raise ToolConfigError(f"tools[].class_name: {exc}") from None
    raise AssertionError("unreachable")


async def build_tools(tools_file: ToolsFile) -> dict[str, Tool]:
    """Instantiate every entry; names must be unique across entries."""
    tools: dict[str, Tool] = {}
    for entry in tools_file.tools:
        cls = resolve_tool_class(entry.class_name)
        section = entry.model_dump(exclude_none=True)
        for tool in await cls.from_config(entry.config.model_dump(), entry.tool_schema, section):
            if tool.name in tools:
                raise ToolConfigError(f"two tools are named {tool.name!r} (class_name {entry.class_name!r})")
            tools[tool.name] = tool
    return tools


async def build_default_tool(name: str, config: Mapping[str, Any] | None = None) -> Tool:
    """A single registered tool with its own schema, as ``toolrl tool call NAME`` uses without a file."""
    cls = resolve_tool_class(name)
    built = await cls.from_config(dict(config or {}), None, {"class_name": name, "config": dict(config or {})})
    for tool in built:
        if tool.name == name or len(built) == 1:
            return tool
    raise ToolConfigError(f"{name!r} builds several tools: {', '.join(t.name for t in built)}")

"""Tool configs in verl's YAML layout, loaded unchanged (docs/configuration.md, "Tool configs").

``class_name`` resolves, in order: a registered tool name, a registered alias (plugins alias the verl
class they replace), then an importable ``module.Class`` that subclasses :class:`toolrl.tools.Tool`;
the tool is built as every part is (:func:`toolrl.plugins.parts.build_part`).

The core reads only ``class_name``, ``config`` and ``tool_schema``; the rest of an entry (the ``mcp:`` block)
is the tool class's, handed whole to its ``from_config`` as a :class:`ToolSection`, which resolves paths
against the directory the entry was written in.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from toolrl.config import ConfigError, format_errors, read_yaml
from toolrl.plugins.parts import BuildContext, build_part, lookup_part
from toolrl.tools import Tool, ToolConfigError
from toolrl.tools.isolation import ProcessTool


class ToolEntryConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "native"  # verl's tool type; the tool class decides what its values mean


class ToolEntry(BaseModel):
    """One item of ``tools:``. Keys besides these are the tool class's own (``extra``)."""

    model_config = ConfigDict(extra="allow")

    class_name: str
    config: ToolEntryConfig = Field(default_factory=ToolEntryConfig)
    tool_schema: dict[str, Any] | None = None


class ToolSection(dict[str, Any]):
    """A whole tool-config entry as handed to :meth:`Tool.from_config`: a plain mapping of the entry's
    keys, plus ``base_dir``, the directory of the file the entry came from (None when unknown)."""

    def __init__(self, entry: Mapping[str, Any], base_dir: Path | None = None) -> None:
        super().__init__(entry)
        self.base_dir = base_dir

    def path(self, value: str) -> Path:
        """A path written in this entry: relative paths are taken relative to the entry's file when
        the file exists there, else as given (relative to the working directory, as verl does)."""
        path = Path(value)
        if not path.is_absolute() and self.base_dir is not None and (self.base_dir / path).exists():
            return self.base_dir / path
        return path


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolEntry] = Field(default_factory=list)
    _base_dir: Path | None = PrivateAttr(default=None)

    @property
    def base_dir(self) -> Path | None:
        """The directory relative paths in the entries are relative to (the file's, when loaded)."""
        return self._base_dir


def load_tools_file(path: str | Path) -> ToolsFile:
    """A tools YAML file, read as configs are (duplicate keys and runaway aliases are errors)."""
    path = Path(path)
    try:
        _, data = read_yaml(path)
    except ConfigError as exc:
        raise ToolConfigError(f"tools config {exc}") from None
    return parse_tools_config(data or {}, base_dir=path.parent)


def parse_tools_config(data: Mapping[str, Any], base_dir: Path | None = None) -> ToolsFile:
    try:
        parsed = ToolsFile.model_validate(data)
    except ValidationError as exc:
        raise ToolConfigError(f"invalid tools config: {format_errors(exc)}") from None
    parsed._base_dir = base_dir
    return parsed


def resolve_tool_class(class_name: str) -> type[Tool]:
    """The tool class a config entry names: a registered name or alias (verl's class paths are aliases
    of the tools that replace them), else an importable ``package.module.Class``."""
    try:
        return lookup_part("tools", class_name, "tools[].class_name")
    except ConfigError as exc:
        raise ToolConfigError(str(exc)) from None


async def build_entry(entry: ToolEntry, base_dir: Path | None = None) -> list[Tool]:
    """The tools one entry stands for: ``Tool.from_config`` of its class, or with ``isolation:
    process`` the one tool built and run in a worker process of its own."""
    config = entry.config.model_dump()
    if config.get("isolation") == "process":
        return [await ProcessTool.start(resolve_tool_class(entry.class_name), config, entry.tool_schema)]
    section = ToolSection(entry.model_dump(exclude_none=True), base_dir)
    context = BuildContext(f"tools[].class_name {entry.class_name!r}", "tools[].config",
                           inputs={"tool_schema": entry.tool_schema, "section": section})
    try:
        return await build_part("tools", entry.class_name, config, context)
    except ConfigError as exc:
        raise ToolConfigError(str(exc)) from None


async def build_tools(tools_file: ToolsFile) -> dict[str, Tool]:
    """Instantiate every entry; names must be unique across entries."""
    tools: dict[str, Tool] = {}
    for entry in tools_file.tools:
        for tool in await build_entry(entry, tools_file.base_dir):
            if tool.name in tools:
                raise ToolConfigError(f"two tools are named {tool.name!r} (class_name {entry.class_name!r})")
            tools[tool.name] = tool
    return tools


async def build_default_tool(name: str, config: Mapping[str, Any] | None = None) -> Tool:
    """A single registered tool with its own schema, as ``toolrl tool call NAME`` uses without a file."""
    built = await build_entry(ToolEntry.model_validate({"class_name": name, "config": dict(config or {})}))
    for tool in built:
        if tool.name == name or len(built) == 1:
            return tool
    raise ToolConfigError(f"{name!r} builds several tools: {', '.join(t.name for t in built)}")

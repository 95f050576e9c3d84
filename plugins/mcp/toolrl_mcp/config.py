"""The ``mcpServers`` file and the ``mcp:`` block of a tool-config entry.

Servers file (the format MCP clients share; a list of such objects is merged)::

    {"mcpServers": {
        "math":   {"command": "python", "args": ["server.py"], "env": {"K": "v"}, "cwd": "."},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"X-Key": "k"}},
        "legacy": {"url": "http://127.0.0.1:8001/sse", "auth_token": "secret"}
    }}

``url`` servers speak streamable HTTP unless ``transport`` (or ``type``) says ``sse`` or the URL ends
in ``/sse``. toolrl's own per-server options ride along in the same object: ``tools`` (which of the
server's tools to use), ``rename`` (``{mcp_name: toolrl_name}``), ``prefix`` (prepended to names not
renamed), ``timeout`` (per-call seconds), ``connect_timeout``, ``max_concurrency`` (calls in flight on
the shared session) and ``backoff_initial``/``backoff_max`` (reconnect delays after a failure).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from toolrl.config import format_errors
from toolrl.tools import ToolConfigError

Transport = Literal["stdio", "http", "sse"]
_TRANSPORT_SPELLINGS = {
    "stdio": "stdio",
    "http": "http",
    "streamable_http": "http",
    "streamable-http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}
# Fields that identify a connection; the rest only shape how its tools are exposed.
_CONNECTION_FIELDS = (
    "command", "args", "env", "cwd", "url", "transport", "headers", "auth_token",
    "connect_timeout", "max_concurrency", "backoff_initial", "backoff_max",
)


class ServerSpec(BaseModel):
    """One entry of ``mcpServers``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    transport: Transport | None = Field(default=None, validation_alias=AliasChoices("transport", "type"))
    headers: dict[str, str] = Field(default_factory=dict)
    auth_token: str | None = None

    tools: list[str] | None = None
    rename: dict[str, str] = Field(default_factory=dict)
    prefix: str = ""
    timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float = Field(default=30.0, gt=0)
    max_concurrency: int = Field(default=16, ge=1)
    backoff_initial: float = Field(default=0.5, gt=0)
    backoff_max: float = Field(default=30.0, gt=0)

    @field_validator("transport", mode="before")
    @classmethod
    def _spelling(cls, value: Any) -> Any:
        if isinstance(value, str):
            return _TRANSPORT_SPELLINGS.get(value.lower().replace(" ", ""), value)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of 'command' (stdio) and 'url' (HTTP or SSE)")
        if self.transport is None:
            self.transport = "stdio" if self.command else "sse" if self.url.rstrip("/").endswith("/sse") else "http"
        if self.command is not None:
            if self.transport != "stdio":
                raise ValueError(f"transport {self.transport!r} needs 'url', not 'command'")
            if self.headers or self.auth_token:
                raise ValueError("'headers' and 'auth_token' apply to 'url' servers only")
        elif self.transport == "stdio":
            raise ValueError("transport 'stdio' needs 'command', not 'url'")
        elif self.args or self.env is not None or self.cwd is not None:
            raise ValueError("'args', 'env' and 'cwd' apply to 'command' servers only")
        return self

    def http_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.auth_token:
            headers.setdefault("Authorization", f"Bearer {self.auth_token}")
        return headers

    def connection_key(self, name: str) -> str:
        """Identifies the shared connection: servers with the same name and connection settings share it."""
        return json.dumps([name, self.model_dump(include=set(_CONNECTION_FIELDS))], sort_keys=True)

    def exposed_name(self, mcp_name: str) -> str:
        return self.rename.get(mcp_name, self.prefix + mcp_name)


class MCPBlock(BaseModel):
    """The ``mcp:`` block beside ``config:`` in a tool-config entry (verl's keys)."""

    model_config = ConfigDict(extra="forbid")

    mcp_servers_config_path: str
    tool_selected_list: list[str] | None = None


def parse_block(section: Mapping[str, Any]) -> MCPBlock:
    """The entry's ``mcp:`` block; with a :class:`toolrl.tools.verl_config.ToolSection`, a relative
    ``mcp_servers_config_path`` is resolved against the tools file's directory."""
    block = section.get("mcp")
    if block is None:
        raise ToolConfigError(
            f"tools[].class_name {section.get('class_name', 'mcp')!r} needs a sibling 'mcp:' block with "
            "mcp_servers_config_path"
        )
    try:
        parsed = MCPBlock.model_validate(block)
    except ValidationError as exc:
        raise ToolConfigError(f"invalid mcp block: {format_errors(exc, 'mcp')}") from None
    resolve = getattr(section, "path", None)  # a ToolSection: relative to the tools file
    if resolve is not None:
        parsed.mcp_servers_config_path = str(resolve(parsed.mcp_servers_config_path))
    return parsed


def load_servers(path: str | Path) -> dict[str, ServerSpec]:
    """Read an ``mcpServers`` JSON file; errors name the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ToolConfigError(f"cannot read MCP servers file {path}: {exc}") from None
    documents = data if isinstance(data, list) else [data]
    raw: dict[str, Any] = {}
    for document in documents:
        servers = document.get("mcpServers") if isinstance(document, dict) else None
        if not isinstance(servers, dict):
            raise ToolConfigError(f"MCP servers file {path}: expected an object with 'mcpServers'")
        for name in servers:
            if name in raw:
                raise ToolConfigError(f"MCP servers file {path}: server {name!r} is defined twice")
        raw.update(servers)
    if not raw:
        raise ToolConfigError(f"MCP servers file {path}: 'mcpServers' is empty")
    specs: dict[str, ServerSpec] = {}
    for name, entry in raw.items():
        try:
            specs[name] = ServerSpec.model_validate(entry)
        except ValidationError as exc:
            raise ToolConfigError(
                f"MCP servers file {path}: {format_errors(exc, f'mcpServers.{name}')}"
            ) from None
    return specs

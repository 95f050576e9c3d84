"""The ``verifiers`` tool: every ``@vf.tool`` method of a verifiers taskset's toolsets as a toolrl tool.

verifiers serves each toolset as an MCP server in a subprocess and syncs its ``State`` with the rollout
over an HTTP channel. Here each toolset runs in the rollout worker's process behind an in-process MCP
server (the ``mcp`` package's ``MCPServer``, as verifiers serves it), so schemas, argument validation
and the text of results are verifiers' own:

- a task-scoped toolset (``Task.toolsets``) is built fresh for each trajectory: ``setup()`` then
  ``setup_task(task)`` at ``create``, its ``state`` kept on that instance across the trajectory's
  calls, dropped at ``release``; the tools of one toolset share the trajectory's instance;
- a taskset-scoped toolset (``Taskset.toolsets``) is built once, ``setup()`` once, and shared by every
  trajectory, as in verifiers.

Tool names are verifiers' own: ``<server>_<tool>`` (or the bare name under ``TOOL_PREFIX = None``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolrl.schemas import ToolResponse
from toolrl.tools import SharedResources, Tool, trajectory_of

from toolrl_verifiers.loading import Loaded, ToolsetSpec, VerifiersOptions, load


@dataclass
class ToolsetHost:
    """One toolset of the taskset and its live instances: one for all (shared) or one per trajectory."""

    loaded: Loaded
    index: int  # among the loaded toolsets of its scope
    spec: ToolsetSpec
    servers: SharedResources[Any] = field(default_factory=lambda: SharedResources(what="verifiers toolset"))

    async def serve(self, task: Any = None) -> Any:
        """A new toolset instance, set up (for ``task`` when task-scoped), behind an MCP server."""
        from mcp.server.mcpserver import MCPServer

        toolset = self.loaded.new_toolsets(self.spec.shared)[self.index]
        await toolset.setup()
        if task is not None:
            await toolset.setup_task(task)
        server = MCPServer(self.spec.server or type(toolset).__name__)
        for advertised, method in self.spec.tools.items():
            fn = getattr(toolset, method)
            server.add_tool(fn, name=advertised, description=(fn.__doc__ or "").strip() or None)
        return server

    async def open(self, key: str, holder: str, task_data: Mapping[str, Any] | None) -> Any:
        """The trajectory's server (the shared one for a shared toolset); the first of the toolset's
        tools to open it sets it up, the others await that same setup."""
        if self.spec.shared:  # set up once, held for every trajectory until the tools close
            return await self.servers.acquire("", "taskset", self.serve)

        def start() -> Awaitable[Any]:
            if task_data is None:
                raise ValueError("create_kwargs.task is missing: the sample is not one of the verifiers "
                                 "environment's tasks")
            return self.serve(self.loaded.task(dict(task_data)))

        return await self.servers.acquire(key, holder, start)

    async def close(self, key: str, holder: str) -> None:
        if not self.spec.shared:
            await self.servers.release(key, holder)


class VerifiersTool(Tool):
    """One ``@vf.tool`` method. A tool-config entry ``{class_name: verifiers, verifiers: {module, args}}``
    builds every tool of the taskset it names (the ``verifiers`` environment writes that entry)."""

    host: ToolsetHost

    @classmethod
    async def from_config(cls, config: Mapping[str, Any], tool_schema: Mapping | None,
                          section: Mapping[str, Any]) -> list[Tool]:
        options = VerifiersOptions.model_validate({**section.get("verifiers", {})})
        loaded = load(options)
        tools: list[Tool] = []
        for scope in (True, False):
            specs = [s for s in loaded.toolsets if s.shared == scope]
            for index, spec in enumerate(specs):
                host = ToolsetHost(loaded, index, spec)
                prototype = await host.serve()  # only to list the tools: no task set up
                for listed in await prototype.list_tools():
                    schema = {"type": "function", "function": {
                        "name": listed.name, "description": listed.description or "",
                        "parameters": listed.input_schema}}
                    tool = cls(config, schema)
                    tool.host = host
                    tools.append(tool)
        return tools

    async def create(self, instance_id: str | None = None, task: Mapping[str, Any] | None = None,
                     **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id)
        # The tools of one trajectory share its toolset instance: the core names each tool's instance
        # "<trajectory id>:<tool name>", so the trajectory is the id without this tool's suffix.
        key = trajectory_of(instance_id)
        try:
            server = await self.host.open(key, instance_id, task)
        except BaseException:
            await super().release(instance_id)  # the core releases only what was created
            raise
        self.state(instance_id).update(server=server, key=key)
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any],
                      **execute_kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        result = await self.state(instance_id)["server"].call_tool(self.name, arguments)
        text = "\n".join(getattr(block, "text", None) or str(block) for block in result.content)
        return (ToolResponse.error(text) if result.is_error else ToolResponse(text=text)), 0.0, {}

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        try:
            key = self.state(instance_id).get("key")
        except KeyError:  # released already
            key = None
        if key is not None:
            await self.host.close(key, instance_id)
        await super().release(instance_id)

    async def close(self) -> None:
        await self.host.servers.close_all()


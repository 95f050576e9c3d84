"""The ``verifiers`` environment session: one verifiers task per trajectory, its toolsets' tools and its
rubric.

verifiers serves each toolset as an MCP server in a subprocess and keeps the rollout's ``State`` on
its trace, which the servers pull before and push after each call. Here each toolset runs in the
rollout worker's process behind an in-process MCP server (the ``mcp`` package's ``MCPServer``),
registered by the toolset itself (``Toolset.register``: verifiers' names, schemas, argument
validation and state syncing), with the trajectory's state as the channel:

- a task-scoped toolset (``Task.toolsets``) is built fresh for each trajectory: ``setup()`` then
  ``setup_task(task.data)`` (the task's data, as verifiers hands it), dropped at ``close``;
- a taskset-scoped toolset (``Taskset.toolsets``) is built once per route, ``setup()`` once, and shared
  by every trajectory, as in verifiers (each call syncs the calling trajectory's state).

The score is ``Task.score`` of the trajectory as a verifiers ``Trace`` (:mod:`toolrl_verifiers.reward`)
holding the trajectory's state: one part per reward, its score times its weight.
"""

from __future__ import annotations

import contextvars
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from toolrl.schemas import Sample, ToolCall, ToolResponse
from toolrl.sessions import EnvironmentSession, Reset, SessionContext, StepResult
from toolrl.trajectory import Trajectory

from toolrl_verifiers.loading import TASK_KEY, Loaded, VerifiersOptions, load
from toolrl_verifiers.reward import build_trace

# The state of the trajectory whose call runs (a shared toolset serves every trajectory).
_ROLLOUT_STATE: contextvars.ContextVar[Any] = contextvars.ContextVar("toolrl_verifiers_state")


class VerifiersSessionOptions(BaseModel):
    """``session_options`` (the environment writes them from ``env_options``)."""

    model_config = ConfigDict(extra="forbid")
    module: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    parser: str = "hermes"
    parser_options: dict[str, Any] = Field(default_factory=dict)

    def loaded(self) -> Loaded:
        return load(VerifiersOptions(module=self.module, args=self.args))


class VerifiersSession(EnvironmentSession):
    Options = VerifiersSessionOptions

    def __init__(self, options: VerifiersSessionOptions, context: SessionContext) -> None:
        super().__init__(options, context)
        self.loaded = options.loaded()
        self.servers: dict[str, tuple[Any, str]] = {}  # advertised name -> (its MCP server, its name there)

    @classmethod
    async def prepare(cls, options: VerifiersSessionOptions, context: SessionContext) -> None:
        loaded = options.loaded()
        await context.shared.get("toolsets", lambda: serve_all(loaded.new_toolsets(shared=True), None))

    async def reset(self, sample: Sample) -> Reset:
        from verifiers.v1.state import state_cls

        data = sample.extra_info.get(TASK_KEY)
        if data is None:
            raise ValueError("the sample carries no verifiers task (extra_info.verifiers)")
        self.sample, self.task = sample, self.loaded.task(dict(data))
        self.state = state_cls(type(self.task))()
        shared = await self.context.shared.get("toolsets", _unprepared)
        own = await serve_all(self.loaded.new_toolsets(shared=False), self.task)
        tools = []
        for prefix, server, listed in [*shared, *own]:
            for tool in listed:  # advertised as verifiers' clients do: <server>_<tool>, bare without a prefix
                name = f"{prefix}_{tool.name}" if prefix else tool.name
                self.servers[name] = server, tool.name
                tools.append({"type": "function", "function": {"name": name, "description": tool.description or "",
                                                               "parameters": tool.input_schema}})
        return Reset(tools=tools)

    async def step(self, call: ToolCall) -> StepResult:
        token = _ROLLOUT_STATE.set(self)
        server, name = self.servers[call.name]
        try:
            result = await server.call_tool(name, call.arguments)
        finally:
            _ROLLOUT_STATE.reset(token)
        text = "\n".join(getattr(block, "text", None) or str(block) for block in result.content)
        return StepResult(response=ToolResponse.error(text) if result.is_error else ToolResponse(text=text))

    async def score(self, trajectory: Trajectory) -> dict[str, float]:
        from toolrl.plugins.parts import BuildContext, build_part

        parser = build_part("tool_parsers", self.options.parser, self.options.parser_options,
                            BuildContext("session_options.parser", "session_options.parser_options"))
        trace = build_trace(self.task, self.sample.prompt, trajectory.model_text, trajectory.final_response,
                            trajectory.tool_results, parser, self.state)
        await self.task.score(trace)
        unscored = sorted(name for name, reward in trace.rewards.items() if reward is None)
        if unscored:
            raise ValueError(f"unscored: {', '.join(unscored)}")
        return {name: reward.value for name, reward in trace.rewards.items()}

    async def close(self) -> None:
        self.servers.clear()


async def serve_all(toolsets: list[Any], task: Any) -> list[tuple[str, Any, list[Any]]]:
    """Each toolset set up (for ``task``'s data when task-scoped) behind an MCP server it registers
    its tools on, with the trajectory's state as its channel: its name prefix, server, listed tools."""
    from mcp.server.mcpserver import MCPServer

    served = []
    for toolset in toolsets:
        _bind_state(toolset)
        await toolset.setup()
        if task is not None:
            await toolset.setup_task(task.data)
        server = MCPServer(toolset.server_name or type(toolset).__name__)
        toolset.register(server)
        served.append((toolset.server_name, server, await server.list_tools()))
    return served


def _bind_state(toolset: Any) -> None:
    """verifiers syncs a toolset's state with the rollout over an HTTP channel; in process, the channel
    is the calling trajectory's state: pulled as the toolset's state type, pushed back after the call."""

    async def pull() -> Any:
        return toolset._state_adapter.validate_python(_ROLLOUT_STATE.get().state.model_dump())

    async def push(before: bytes) -> None:
        session = _ROLLOUT_STATE.get()
        session.state = type(session.state).model_validate(toolset.state.model_dump())

    toolset._pull_state, toolset._push_state = pull, push


async def _unprepared() -> Any:
    raise RuntimeError("the verifiers session kind was not prepared (its routes were not built)")

"""The ``openenv`` tool: an OpenEnv environment server's tools as toolrl tools.

Tool-config entry (verl's layout)::

    - class_name: openenv
      config: {type: native, timeout: 30}      # per-call deadline
      openenv: {base_url: http://127.0.0.1:8000}   # or {app: "pkg.server.app:app", app_dir: ...}

When the entry is built the server is started (``app``) or reached (``base_url``) and asked what it
offers: an MCP tool environment's tools (listed on a fresh session after ``reset``), each becoming one
toolrl tool with the server's schema; any other environment becomes one tool (``action_tool``,
default ``step``) whose arguments are the server's action model. All tools of one trajectory share
that trajectory's OpenEnv session (:mod:`toolrl_openenv.session`): created at the first tool's
``create`` (``reset`` with the sample's ``create_kwargs``), each call one ``step``, the last
observation's reward as the trajectory's reward (given once, by the first tool), closed at release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool, ToolConfigError, trajectory_of

from toolrl_openenv import server as servers
from toolrl_openenv.config import parse_block
from toolrl_openenv.session import Session, SessionError, Sessions, Step, describe


class OpenEnvToolConfig(BaseModel):
    """Options under ``config:`` besides ``type``/``timeout`` (none: the server's options live in the
    entry's ``openenv:`` block, so a misplaced key is reported rather than ignored)."""

    model_config = ConfigDict(extra="forbid")


class Binding:
    """What the tools of one entry share: the sessions, and the server the plugin started (if any)."""

    def __init__(self, sessions: Sessions, local: servers.LocalServer | None) -> None:
        self.sessions, self.local, self.users = sessions, local, 0

    def close(self) -> None:
        self.users -= 1
        if self.users <= 0 and self.local is not None:
            servers.release(self.local)
            self.local = None


class OpenEnvTool(Tool):
    """One tool of an OpenEnv server (an MCP tool, or the environment's action)."""

    config_model: ClassVar[type[BaseModel] | None] = OpenEnvToolConfig

    def __init__(self, config: Mapping[str, Any] | None, tool_schema: Mapping[str, Any] | None, *,
                 binding: Binding, mcp_name: str | None, rewarded: bool) -> None:
        super().__init__(config, tool_schema)
        self.binding, self.mcp_name, self.rewarded = binding, mcp_name, rewarded
        self._closed = False
        binding.users += 1

    @classmethod
    async def from_config(cls, config: Mapping[str, Any], tool_schema: Mapping | None,
                          section: Mapping[str, Any]) -> list[Tool]:
        if tool_schema is not None:
            raise ToolConfigError("tools[].tool_schema is not used with OpenEnv tools: schemas come from the server")
        block, app, app_dir = parse_block(dict(section), getattr(section, "base_dir", None))
        local = await servers.acquire(app, app_dir, block.startup_timeout_s) if app else None
        base_url = local.base_url if local else str(block.base_url)
        binding = Binding(Sessions(base_url, block.connect_timeout_s, block.message_timeout_s, block.max_sessions),
                          local)
        binding.users += 1  # held while building, so a failure below stops a started server once
        try:
            try:
                listed, schema = await binding.sessions.list_tools()
            except Exception as exc:
                raise ToolConfigError(f"OpenEnv server {base_url}: cannot list its tools: {describe(exc)}") from None
            if listed == []:
                raise ToolConfigError(f"OpenEnv server {base_url}: its MCP environment lists no tools")
            if listed:
                specs = [(t["name"], t.get("description") or "", t.get("input_schema") or {"type": "object"})
                         for t in listed]
            else:
                action = dict(schema.get("action") or {})
                action.get("properties", {}).pop("metadata", None)
                specs = [(block.action_tool, action.pop("description", "") or "Act in the environment.", action)]
            return [cls(config, {"type": "function", "function": {"name": name, "description": text,
                                                                  "parameters": params}},
                        binding=binding, mcp_name=name if listed else None, rewarded=i == 0)
                    for i, (name, text, params) in enumerate(specs)]
        finally:
            binding.close()

    def _key(self, instance_id: str) -> str:
        return trajectory_of(instance_id)  # one session for all the trajectory's tools

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id)
        key = self._key(instance_id)
        try:
            session = await self.binding.sessions.acquire(key, instance_id, create_kwargs)
        except BaseException:
            self._instances.pop(instance_id, None)
            raise
        self.state(instance_id).update(key=key, session=session)
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any],
                      **execute_kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        session: Session = self.state(instance_id)["session"]
        if session.last is not None and session.last.done:
            return ToolResponse.error("Error: the episode is over (the environment reported done); "
                                      "give your final answer."), 0.0, {"done": True}
        action = ({"type": "call_tool", "tool_name": self.mcp_name, "arguments": arguments}
                  if self.mcp_name is not None else dict(arguments))
        try:
            step = await session.send("step", action)
        except SessionError as exc:
            return ToolResponse.error(f"Error: {exc}"), 0.0, {}
        metrics = {"done": step.done, **({"reward": step.reward} if step.reward is not None else {})}
        return _response(step, self.mcp_name is not None), 0.0, metrics

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        """The reward of the session's last observation, from the first tool only (once per trajectory);
        a failed session is an error, not a zero."""
        if not self.rewarded:
            return 0.0
        session: Session = self.state(instance_id)["session"]
        if session.broken is not None:
            raise SessionError(f"no reward: the OpenEnv session failed ({session.broken})")
        return (session.last.reward if session.last is not None else None) or 0.0

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        state = self._instances.pop(instance_id, None)
        if state is not None and "key" in state:
            await self.binding.sessions.release(state["key"], instance_id)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.binding.close()


def _response(step: Step, mcp: bool) -> ToolResponse:
    """An MCP call's result (its text content, or its error), or a whole observation as JSON."""
    obs = step.observation
    if not mcp:
        shown = {k: v for k, v in obs.items() if k not in ("reward", "done") and not (k == "metadata" and not v)}
        return ToolResponse(text=json.dumps(shown, default=str))
    error = obs.get("error")
    if error:
        return ToolResponse.error(f"Error: {error.get('message') or error}")
    result = obs.get("result") or {}
    if not isinstance(result, dict):
        return ToolResponse(text=json.dumps(result, default=str))
    texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
    text = "\n".join(texts) if texts else json.dumps(result.get("data"), default=str)
    return ToolResponse.error(text) if result.get("is_error") else ToolResponse(text=text)

"""The ``openenv`` environment session: one OpenEnv episode per trajectory.

When the routes are built (``prepare``) the server is started (``app``) or reached (``base_url``) and
its ``/schema`` read. Per trajectory: an episode is opened within the server's capacity and reset
with the sample's ``extra_info.reset_kwargs``; its tools are what that episode offers (an MCP tool
environment's ``list_tools`` after this reset, so they may differ per episode; any other environment's
action as one tool, ``action_tool``); each call is one ``step``; a step whose observation says
``done`` ends the trajectory; the score is the last observation's reward (none when it carries none;
an error when the episode failed); the episode is closed at the end.
"""

from __future__ import annotations

import json
from typing import Any

from toolrl.schemas import Sample, ToolCall, ToolResponse
from toolrl.sessions import EnvironmentSession, Reset, SessionContext, StepResult
from toolrl.trajectory import Trajectory

from toolrl_openenv import server as servers
from toolrl_openenv.config import OpenEnvBlock, app_to_start
from toolrl_openenv.episode import Episode, EpisodeError, Observed, Slots, describe, is_mcp, open_episode


class OpenEnvSession(EnvironmentSession):
    Options = OpenEnvBlock

    def __init__(self, options: OpenEnvBlock, context: SessionContext) -> None:
        super().__init__(options, context)
        # Each round trip has its own deadline; the session's covers waiting for a free server session.
        self.timeout = options.queue_timeout_s + options.connect_timeout_s + options.message_timeout_s
        self.episode: Episode | None = None
        self.mcp = False

    @classmethod
    async def prepare(cls, options: OpenEnvBlock, context: SessionContext) -> None:
        server = await context.shared.get("server", lambda: _server(options, context), _stop)
        await context.shared.get("schema", lambda: _schema(server[0], options.message_timeout_s))
        await context.shared.get("slots", _slots(options.max_sessions))

    async def reset(self, sample: Sample) -> Reset:
        o, shared = self.options, self.context.shared
        (base_url, _), schema = await shared.get("server", _unprepared), await shared.get("schema", _unprepared)
        self.slots: Slots = await shared.get("slots", _unprepared)
        self.episode = await open_episode(base_url, o.connect_timeout_s, o.message_timeout_s, self.slots,
                                          o.queue_timeout_s, dict(sample.extra_info.get("reset_kwargs") or {}),
                                          compression=o.ws_compression)
        self.mcp = is_mcp(schema)
        if not self.mcp:
            action = dict(schema.get("action") or {})
            action.get("properties", {}).pop("metadata", None)
            return Reset(tools=[_schema_of(o.action_tool, action.pop("description", "") or "Act in the environment.",
                                           action)])
        opened = self.episode.last
        listed = (await self.episode.send("step", {"type": "list_tools"})).observation.get("tools") or []
        self.episode.last = opened  # listing the tools is no step of the episode: its reward is not the score
        if not listed:
            raise EpisodeError(f"OpenEnv server {base_url}: this episode's MCP environment lists no tools")
        return Reset(tools=[_schema_of(t["name"], t.get("description") or "", t.get("input_schema") or
                                       {"type": "object"}) for t in listed])

    async def step(self, call: ToolCall) -> StepResult:
        assert self.episode is not None
        action = ({"type": "call_tool", "tool_name": call.name, "arguments": call.arguments} if self.mcp
                  else dict(call.arguments))
        observed = await self.episode.send("step", action)  # EpisodeError: the trajectory ends (infra_error)
        metrics = {"reward": observed.reward} if observed.reward is not None else {}
        return StepResult(response=_response(observed, self.mcp), done=observed.done, metrics=metrics)

    async def score(self, trajectory: Trajectory) -> float | None:
        """The last observation's reward; None (no reward term) when it carries none. A failed
        episode is an error, not a zero."""
        if self.episode is None or self.episode.broken is not None:
            why = self.episode.broken if self.episode is not None else "never opened"
            raise EpisodeError(f"no reward: the OpenEnv session failed ({why})")
        return self.episode.last.reward if self.episode.last is not None else None

    async def close(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            await episode.close()
            await self.slots.release()


async def _server(options: OpenEnvBlock, context: SessionContext) -> tuple[str, servers.LocalServer | None]:
    app, app_dir = app_to_start(options, context.base_dir)
    local = await servers.acquire(app, app_dir, options.startup_timeout_s) if app else None
    return (local.base_url if local else str(options.base_url)), local


async def _stop(started: tuple[str, servers.LocalServer | None]) -> None:
    if started[1] is not None:
        servers.release(started[1])


async def _schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(f"{base_url}/schema")
            response.raise_for_status()
            return response.json()
    except Exception as exc:
        raise EpisodeError(f"OpenEnv server {base_url}: cannot read its /schema: {describe(exc)}") from None


def _slots(limit: int | None) -> Any:
    async def make() -> Slots:
        return Slots(limit)

    return make


async def _unprepared() -> Any:
    raise EpisodeError("the openenv session kind was not prepared (its routes were not built)")


def _schema_of(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _response(observed: Observed, mcp: bool) -> ToolResponse:
    """An MCP call's result (its text content, or its error), or a whole observation as JSON."""
    obs = observed.observation
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
